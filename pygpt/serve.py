"""`python -m pygpt.serve --model EXPORT_DIR`: the HTTP server of an ONNX export, the same as the
torch-free runtime's `pygpt-serve` (pygpt_runtime.serve_command), which it runs; neither imports
torch."""
from pygpt_runtime.serve_command import main

if __name__ == "__main__":
    main()
