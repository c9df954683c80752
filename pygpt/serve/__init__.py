"""`python -m pygpt.serve`: the HTTP server. --model serves an ONNX export through the torch-free
runtime's server (pygpt_runtime.serve); --ckpt serves a checkpoint of any family on pygpt's torch
model (checkpoint), with its GPT decode worker (gpt_worker), its BERT and translator tasks
(torch_tasks) and the attention maps route (attention). The command is pygpt.serve.command."""
