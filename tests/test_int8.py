"""int8 for every family (pygpt.onnx.int8): the int8 graphs of a GPT, a BERT (fill-mask and
classifier) and a translator run in onnxruntime and stay close to fp32 (softmax distributions,
argmax where fp32 is decided); the options change the graph as they say, counted node by node
(every weight MatMul quantized by default, a head tied to the token embedding too; --int8-exclude leaves exactly its part's in float32;
quint8 and qint8 weights; per-channel scales); runner.json records them; and pygpt-run --int8
runs every family's int8 graphs."""
import json
import subprocess

import numpy as np
import onnx
import pytest

import pygpt.export
from helpers import RUNNER_COMMAND
from seq2seq_helpers import reverser, tokenizer, words
from pygpt.storage import checkpoint
from pygpt.onnx.int8 import Int8Settings, node_part, quantize_int8
from pygpt_runtime import onnx_seq2seq, run_onnx
from pygpt_runtime.onnx_bert import OnnxBERT
from pygpt_runtime.onnx_search import Search
from test_export_bert import classifier, mlm  # noqa: F401  (the tiny BERT exports)


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-int8")
    checkpoint.save(root / "ckpt", reverser(), tokenizer())
    pygpt.export.export(root / "ckpt", root / "onnx", "int8")
    return root / "ckpt", root / "onnx"


@pytest.fixture(scope="module")
def gpt(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt-int8") / "onnx"
    pygpt.export.export(trained[0], out, "int8")
    return trained[0], out


def weight_matmuls(graph):
    """{node name: part} of the MatMuls (and Gemms, the quantizer's MatMul + Add) whose second
    input is a float weight (an initializer, or a Transpose of one: a head tied to the token
    embedding)."""
    weights = {i.name for i in graph.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    transposed = {n.output[0] for n in graph.graph.node
                  if n.op_type == "Transpose" and n.input[0] in weights}
    return {n.name: node_part(n) for n in graph.graph.node
            if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights | transposed}


def quantized(graph):
    """The names of the fp32 MatMuls (Gemms) that the quantizer turned into integer ones."""
    return {n.name.removesuffix("_quant").removesuffix("_MatMul") for n in graph.graph.node
            if n.op_type == "MatMulInteger"}


def quantized_gathers(graph):
    """The Gathers (embedding lookups) that read an 8-bit table."""
    small = {i.name for i in graph.graph.initializer
             if i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)}
    return [n.name for n in graph.graph.node if n.op_type == "Gather" and n.input[0] in small]


def graphs(folder):
    config = json.loads((folder / "runner.json").read_text())
    fp32 = config["models"]["fp32"]
    return [folder / f for f in (fp32.values() if isinstance(fp32, dict) else [fp32])]


@pytest.mark.parametrize("which", ["gpt", "mlm", "classifier", "translator"])
def test_options_change_the_graph_as_they_say(which, request, tmp_path):
    _, folder = request.getfixturevalue(which)
    for src in graphs(folder):
        fp32 = onnx.load(str(src))
        matmuls = weight_matmuls(fp32)
        assert {"attention", "mlp"} <= set(matmuls.values()), matmuls
        counts = {}
        for exclude in [(), ("attention",), ("mlp",), ("head",), ("embeddings",),
                        ("attention", "head", "mlp")]:
            dst = tmp_path / f"{src.stem}-{'-'.join(exclude)}.onnx"
            quantize_int8(src, dst, Int8Settings(per_channel=False, exclude=exclude))
            q = onnx.load(str(dst))
            assert quantized(q) == {n for n, part in matmuls.items() if part not in exclude}
            gathers = quantized_gathers(q)
            assert (gathers == []) == ("embeddings" in exclude or "Gather" not in
                                      {n.op_type for n in fp32.graph.node}), gathers
            counts[exclude] = len(quantized(q))
        assert counts[("attention",)] < counts[()] and counts[("mlp",)] < counts[()]
        if src.name != "encoder_model.onnx":  # a graph with a head (not the encoder): its
            assert "head" in matmuls.values()  # own, or tied to the embedding, is quantized
            assert counts[("head",)] == counts[()] - 1
        for weights, per_channel in [("qint8", False), ("quint8", True)]:
            dst = tmp_path / f"{src.stem}-{weights}-{per_channel}.onnx"
            quantize_int8(src, dst, Int8Settings(weights, per_channel))
            q = onnx.load(str(dst))
            inits = {i.name: i for i in q.graph.initializer}
            names = {n.input[1] for n in q.graph.node if n.op_type == "MatMulInteger"}
            want = onnx.TensorProto.INT8 if weights == "qint8" else onnx.TensorProto.UINT8
            assert names and all(inits[n].data_type == want for n in names)
            scales = [inits[n[: -len("_quantized")] + "_scale"] for n in names]
            assert all((list(s.dims) == [inits[n].dims[1]]) == per_channel
                       for s, n in zip(scales, names))
            assert all(list(s.dims) == [] for s in scales) != per_channel


def _tvd(a, b):
    def softmax(z):
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return 0.5 * np.abs(softmax(a) - softmax(b)).sum(-1)


def _close(logits32, logits8, decided_margin=1.0):
    """int8 logits close to fp32 ones: each distribution within a total variation of 0.1 and the
    same argmax wherever fp32's top two differ by more than decided_margin."""
    assert _tvd(logits32, logits8).max() < 0.1
    top2 = np.sort(logits32, -1)[..., -2:]
    decided = (top2[..., 1] - top2[..., 0]) > decided_margin
    assert (logits32.argmax(-1) == logits8.argmax(-1))[decided].all()


SETTINGS = [Int8Settings(), Int8Settings("quint8", True), Int8Settings(exclude=("attention",))]


@pytest.mark.parametrize("settings", SETTINGS, ids=["default", "quint8-per-channel", "no-attn"])
def test_every_family_stays_close_to_fp32(settings, gpt, mlm, classifier, translator,
                                          tmp_path):
    for name, (ckpt, _) in {"gpt": gpt, "mlm": mlm, "classifier": classifier,
                            "translator": translator}.items():
        out = tmp_path / name
        pygpt.export.export(ckpt, out, "int8", settings)
        per_channel = name in ("mlm", "classifier")  # a BERT's default (Family.int8_per_channel)
        assert json.loads((out / "runner.json").read_text())["int8"] == settings.resolved(
            per_channel).record()
        if name == "gpt":
            models = [run_onnx.OnnxGPT(str(out), v) for v in ("fp32", "int8")]
            ids = np.array([models[0].tokenizer.encode("ROMEO:\nWhat")[:8]])  # the context
            _close(*(m.step(ids, m.empty_past(1))[0] for m in models))
        elif name == "translator":
            models = [onnx_seq2seq.OnnxSeq2Seq(str(out), v) for v in ("fp32", "int8")]
            texts = words(20, seed=3)
            same = [a == b for a, b in zip(*(m.translate(texts, Search()) for m in models))]
            assert sum(same) >= 0.8 * len(texts)
        else:
            models = [OnnxBERT(str(out), v) for v in ("fp32", "int8")]
            rows = [models[0].tokenizer.encode(text)[:30] for text in
                    ("the big cat sits on a red mat", "a zebra runs", "dog")]
            _close(*(m.logits(rows) for m in models))


def test_the_cli_records_the_settings_and_the_runner_uses_int8(classifier, translator,
                                                               tmp_path, capsys):
    out = tmp_path / "cls"
    pygpt.export.main(["--ckpt", str(classifier[0]), "--out", str(out), "--quantize", "int8",
                       "--int8-weights", "quint8", "--int8-per-channel", "--int8-exclude",
                       "head", "attention"])
    assert json.loads((out / "runner.json").read_text())["int8"] == {
        "weights": "quint8", "per_channel": True, "exclude": ["attention", "head"]}
    for family, ckpt in (("bert", classifier[0]), ("seq2seq", translator[0])):
        for flags, per_channel in (([], family == "bert"), (["--int8-per-tensor"], False),
                                   (["--int8-per-channel"], True)):
            folder = tmp_path / f"{family}-{'-'.join(flags)}"
            pygpt.export.main(["--ckpt", str(ckpt), "--out", str(folder), "--quantize", "int8",
                               *flags])
            assert json.loads((folder / "runner.json").read_text())["int8"] == {
                "weights": "qint8", "per_channel": per_channel, "exclude": []}
    with pytest.raises(SystemExit):
        pygpt.export.main(["--ckpt", str(classifier[0]), "--quantize", "int8",
                           "--int8-per-tensor", "--int8-per-channel"])
    assert "--int8-per-channel: not allowed with argument --int8-per-tensor" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit, match="error: the --int8-\\* settings need --quantize int8"):
        pygpt.export.main(["--ckpt", str(classifier[0]), "--out", str(tmp_path / "x"),
                           "--int8-per-channel"])
    expected = OnnxBERT(str(out), "int8").classify(["a zebra on the mat"])
    printed = subprocess.run([*RUNNER_COMMAND, "--model", str(out), "--int8", "--text",
                              "a zebra on the mat"], capture_output=True, text=True, check=True)
    labels = json.loads((out / "runner.json").read_text())["labels"]
    assert printed.stdout.split()[0] == labels[int(expected[0].argmax())]
    printed = subprocess.run([*RUNNER_COMMAND, "--model", str(translator[1]), "--int8",
                              "--text", "abc de", "--greedy"], capture_output=True, text=True)
    assert printed.returncode == 0 and printed.stdout.strip(), printed.stderr
