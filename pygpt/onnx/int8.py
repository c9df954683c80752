"""Dynamic int8 quantization of an exported graph, by onnxruntime's own quantizer, with the
choices that matter: the weights' type (QInt8, or QUInt8, which onnxruntime's tracker reports
as the more accurate for some small BERTs on some CPUs), per-channel scales (one per output
column instead of one per tensor), and parts of the model left in float32 (`exclude`): the
output layer (`head`: the GPT's LM head, BERT's masked-LM decoder and classifier, the
translator's output projection), the attention projections, the MLPs, or the embedding tables.

Which node belongs to which part is read from the names the exporter records on each node: the
module path of its scope and the classes of its modules (pygpt.nn's MultiHeadAttention, MLP,
Embeddings), so the choice is by what a node computes, not by guessed node names.
"""
from __future__ import annotations

import ast
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

PARTS = ("head", "attention", "mlp", "embeddings")  # what --int8-exclude may name
WEIGHT_TYPES = ("qint8", "quint8")
# A node's part: a class of its scope's modules, or (the head) the end of a module path.
_CLASSES = {"attention": "pygpt.nn.attention.MultiHeadAttention", "mlp": "pygpt.nn.mlp.MLP",
            "embeddings": "pygpt.nn.embedding.Embeddings"}
_HEAD_PATHS = ("lm_head", "mlm.decoder", "classifier", "out")


@dataclass(frozen=True)
class Int8Settings:
    """How the int8 graphs are made (recorded in runner.json under "int8"). per_channel None:
    the family's choice (Family.int8_per_channel), which the export fills in (resolved)."""
    weights: str = "qint8"
    per_channel: Optional[bool] = None
    exclude: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_TYPES:
            raise ValueError(f"the int8 weights must be one of {', '.join(WEIGHT_TYPES)}, got "
                             f"{self.weights!r}")
        unknown = [p for p in self.exclude if p not in PARTS]
        if unknown:
            raise ValueError(f"--int8-exclude takes {', '.join(PARTS)}, got {unknown[0]!r}")
        object.__setattr__(self, "exclude", tuple(sorted(set(self.exclude))))

    def resolved(self, per_channel: bool) -> "Int8Settings":
        """These settings, per_channel where they leave the scales to the family."""
        return self if self.per_channel is not None else replace(self, per_channel=per_channel)

    def record(self) -> dict[str, Any]:
        return {"weights": self.weights, "per_channel": self.scales_per_channel(),
                "exclude": list(self.exclude)}

    def scales_per_channel(self) -> bool:
        """Whether the weights get a scale per output channel (not per tensor)."""
        if self.per_channel is None:
            raise ValueError("int8 settings whose scales are left to the family must be "
                             "resolved by it first")
        return self.per_channel


def node_part(node: Any) -> str:
    """The part (one of PARTS) that an ONNX node of our export computes, or "" for none."""
    meta = {p.key: p.value for p in node.metadata_props}
    classes = meta.get("namespace", "")
    try:
        scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
    except (ValueError, SyntaxError):
        scopes = []
    if any(p == h or p.endswith("." + h) for p in scopes if isinstance(p, str)
           for h in _HEAD_PATHS):
        return "head"
    return next((part for part, cls in _CLASSES.items() if f": {cls}/" in classes + "/"), "")


def nodes_of(graph_path: Path, parts: tuple[str, ...]) -> list[str]:
    """The names of the nodes of the graph file that compute any of parts."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    # The quantizer first splits each Gemm into {name}_MatMul and {name}_Add: name those too.
    return [name for n in model.graph.node if node_part(n) in parts
            for name in ([n.name, f"{n.name}_MatMul", f"{n.name}_Add"] if n.op_type == "Gemm"
                         else [n.name])]


def fold_transposed_weights(model: Any) -> int:
    """Gives every MatMul that multiplies by Transpose(a weight) its own transposed copy of the
    weight, as a constant: the quantizer quantizes only a constant weight, and a head tied to
    the token embedding reads the shared table through a Transpose (the table itself stays, in
    float32, for the embedding's Gather). Returns how many MatMuls were given one."""
    import onnx
    from onnx import numpy_helper

    weights = {w.name: w for w in model.graph.initializer}
    transposed = {n.output[0]: n for n in model.graph.node
                  if n.op_type == "Transpose" and n.input[0] in weights}
    folded = 0
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in transposed:
            continue
        source = transposed[node.input[1]]
        perm = next((list(a.ints) for a in source.attribute if a.name == "perm"), None)
        array = numpy_helper.to_array(weights[source.input[0]])
        copy = numpy_helper.from_array(array.transpose(perm).copy(),
                                       f"{source.input[0]}.transposed.{folded}")
        model.graph.initializer.append(copy)
        node.input[1] = copy.name
        folded += 1
    used = {name for n in model.graph.node for name in n.input}
    kept = [n for n in model.graph.node if n.op_type != "Transpose" or n.output[0] in used]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    onnx.checker.check_model(model)
    return folded


def quantize_int8(src: Path, dst: Path, settings: Int8Settings) -> None:
    """dst: src with its weights quantized to int8 by onnxruntime's dynamic quantizer, as
    settings say (a tied head too, through its own transposed copy: fold_transposed_weights)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice is noise here
    model = onnx.load(str(src))
    fold_transposed_weights(model)
    # 7-bit weights (reduce_range): an x86 CPU without VNNI (AVX2, AVX-512 before VNNI) adds
    # u8 x s8 products in pairs into int16, which full 8-bit weights saturate; the export runs
    # on any CPU, so it keeps every one accurate (the translator's int8 test kept 13 of 20 fp32
    # translations on a Zen 3 without it, 16 required).
    quantize_dynamic(model, str(dst), per_channel=settings.scales_per_channel(),
                     reduce_range=True,
                     weight_type=QuantType.QInt8 if settings.weights == "qint8"
                     else QuantType.QUInt8,
                     nodes_to_exclude=nodes_of(src, settings.exclude) if settings.exclude else [])
