"""pygpt_runtime: run a pygpt model exported to ONNX with onnxruntime and numpy only (no torch,
no pygpt), the deployment side of `python -m pygpt.export`.

    pygpt-run --model out/onnx/ --prompt "ROMEO:"       # also: python -m pygpt_runtime ...

run_onnx.py generates (gpt) and fills masks or classifies (bert, onnx_bert.py);
onnx_seq2seq.py translates (seq2seq, with onnx_search.py's beam search); onnx_text.py opens an
export folder and runs its graphs; text.py holds its tokenizer and the streaming decoder (what
pygpt shares: it imports neither onnxruntime nor numpy); runner_config.py reads and checks its
runner.json; json_file.py reads a JSON file (this package's and pygpt's) to a value or one
error line; cli_checks.py holds the command-line rules; command.py picks the runner by the
family an export's runner.json names; serve/ is the HTTP server (pygpt-serve).
"""
