"""`python -m pygpt_runtime ...`: the pygpt-run command."""
from pygpt_runtime.command import main

main()
