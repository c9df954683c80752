"""The ONNX export: the graph building shared by every family (graph: the dynamo export call,
int8 quantization, writing an export folder as a whole) and each family's graphs (gpt, bert,
seq2seq); pygpt.export is its command line, pygpt_runtime (export/) runs what it writes."""
