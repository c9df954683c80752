"""`python -m pygpt.serve`: the server command (pygpt.serve.command)."""
from pygpt.serve.command import main

main()
