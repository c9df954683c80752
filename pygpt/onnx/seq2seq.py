"""An encoder-decoder (arch seq2seq) checkpoint to ONNX, in the layout and names Optimum and
onnxruntime use for encoder-decoders: three graphs, run by pygpt_runtime.onnx_seq2seq.

- encoder_model.onnx: `input_ids`, `attention_mask` (batch, src) int64 (1 on real tokens, right
  padding) -> `last_hidden_state` (batch, src, n_embd).
- decoder_model.onnx, the first step (or teacher forcing over a whole prefix): `input_ids`
  (batch, seq) from position 0, `encoder_hidden_states`, `encoder_attention_mask` -> `logits`
  (batch, seq, vocab) and, per decoder layer i, `present.{i}.decoder.key` / `.value` (the
  self-attention cache, (batch, heads, seq, qk or v width)) and `present.{i}.encoder.key` /
  `.value` (the cross-attention keys and values of the encoder's output, computed here once).
- decoder_with_past_model.onnx, every later step: `input_ids` (batch, seq) after the past,
  `encoder_attention_mask`, `past_key_values.{i}.decoder.key` / `.value` and
  `past_key_values.{i}.encoder.key` / `.value` -> `logits` and `present.{i}.decoder.key` /
  `.value` (the past extended by seq positions; the encoder's are reused as they are).

Two decoder graphs rather than one: the first step computes the cross-attention keys and values
from the encoder's output and later steps must not, which one graph could only do with an If
node; as two, each graph is a plain trace of Seq2Seq.decode with a DecoderCache. Positions follow
from the past's length. Our attention and layer norm ops are translated as in the GPT export
(pygpt.onnx.graph). Every graph is checked against PyTorch on a padded batch before anything is
written; `int8` adds the three graphs with onnxruntime-quantized weights; the folder gets the
tokenizer and runner.json, and changes as a whole (pygpt.onnx.graph.write_export).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch

from pygpt.models import Seq2Seq
from pygpt.nn import KVCache
from pygpt.nn.decoder_block import DecoderCache
from pygpt.onnx.graph import models_entry, to_onnx, write_export
from pygpt.onnx.int8 import Int8Settings
from pygpt.decoding.translate_texts import SPECIALS
from pygpt.tokenizer import require_specials

PARTS = {"encoder": "encoder_model", "decoder": "decoder_model",
         "decoder_with_past": "decoder_with_past_model"}  # graph -> file stem
KV = ("key", "value")


def io_names(n_layer: int) -> dict[str, tuple[list[str], list[str]]]:
    """(inputs, outputs) of each graph."""
    dec = [f"{{}}.{i}.decoder.{n}" for i in range(n_layer) for n in KV]
    both = [f"{{}}.{i}.{side}.{n}" for i in range(n_layer) for side in ("decoder", "encoder")
            for n in KV]
    return {"encoder": (["input_ids", "attention_mask"], ["last_hidden_state"]),
            "decoder": (["input_ids", "encoder_hidden_states", "encoder_attention_mask"],
                        ["logits", *(name.format("present") for name in both)]),
            "decoder_with_past": (["input_ids", "encoder_attention_mask",
                                   *(name.format("past_key_values") for name in both)],
                                  ["logits", *(name.format("present") for name in dec)])}


class _Encoder(torch.nn.Module):
    def __init__(self, model: Seq2Seq):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask.sum(dim=1))


class _FirstStep(_Encoder):
    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask):
        cache = self.model.new_decoder_cache()
        logits = self.model.decode(input_ids, encoder_hidden_states,
                                   encoder_attention_mask.sum(dim=1), cache)
        return logits, [t for i in range(len(cache)) for kv in cache.layer(i)
                        for t in (kv.k, kv.v)]


class _NextStep(_Encoder):
    def forward(self, input_ids, encoder_attention_mask, past):
        """past: per layer, decoder key, value, encoder key, value."""
        cache = DecoderCache(0)
        cache.self_attn = KVCache.from_tensors([past[j:j + 2] for j in range(0, len(past), 4)])
        cache.cross_attn = KVCache.from_tensors([past[j + 2:j + 4]
                                                 for j in range(0, len(past), 4)])
        # The memory is not read: the full cross-attention cache stands for it.
        logits = self.model.decode(input_ids, past[2], encoder_attention_mask.sum(dim=1), cache)
        return logits, [t for pair in cache.self_attn.tensors() for t in pair]


def _example(model: Seq2Seq, lengths: tuple[int, ...], prefix: int, step: int,
             seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded source batch (rows of the given lengths), the encoder's output on it, a
    decoder prefix of `prefix` positions, the past it leaves, and `step` positions after it:
    what the graphs are traced and checked with (distinct sizes, so none is specialised)."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    src = torch.randint(cfg.vocab_size, mask.shape, generator=gen) * mask
    tgt = torch.randint(cfg.vocab_size, (len(lengths), prefix + step), generator=gen)
    with torch.no_grad():
        hidden = _Encoder(model)(src, mask)
        _, past = _FirstStep(model)(tgt[:, :prefix], hidden, mask)
    return {"src": src, "mask": mask, "hidden": hidden, "prefix": tgt[:, :prefix],
            "past": past, "step": tgt[:, prefix:]}


def _args(ex: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {"encoder": (ex["src"], ex["mask"]),
            "decoder": (ex["prefix"], ex["hidden"], ex["mask"]),
            "decoder_with_past": (ex["step"], ex["mask"], list(ex["past"]))}


def _builders(model: Seq2Seq) -> dict[str, object]:
    """Each graph's fp32 file name -> the function exporting it to a path."""
    from torch.export import Dim

    block = model.config.block_size
    batch, src = Dim("batch", min=1, max=4096), Dim("src", min=1, max=block)
    seq, past = Dim("seq", min=1, max=block), Dim("past", min=1, max=block)
    n_past = 4 * model.config.decoder_layers
    dynamic = {"encoder": {"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}},
               "decoder": {"input_ids": {0: batch, 1: seq},
                           "encoder_hidden_states": {0: batch, 1: src},
                           "encoder_attention_mask": {0: batch, 1: src}},
               "decoder_with_past": {"input_ids": {0: batch, 1: seq},
                                     "encoder_attention_mask": {0: batch, 1: src},
                                     "past": [{0: batch, 2: past if j % 4 < 2 else src}
                                              for j in range(n_past)]}}
    modules = {"encoder": _Encoder, "decoder": _FirstStep, "decoder_with_past": _NextStep}
    names = io_names(model.config.decoder_layers)
    examples = _args(_example(model, (4, 2), prefix=3, step=2))
    return {f"{PARTS[part]}.onnx":
            (lambda path, part=part, args=args: to_onnx(modules[part](model), args, path,
                                                        *names[part], dynamic[part],
                                                        model.config.block_size))
            for part, args in examples.items()}


def _check_against_torch(model: Seq2Seq, folder: Path, tol: float = 1e-4) -> None:
    """Each graph on another padded batch must give PyTorch's outputs (logits and caches at the
    real positions), or the export fails."""
    import numpy as np
    import onnxruntime as ort

    ex = _example(model, (5, 1, 3), prefix=2, step=1, seed=1)
    real = ex["mask"].bool().numpy()
    modules = {"encoder": _Encoder, "decoder": _FirstStep, "decoder_with_past": _NextStep}
    for part, args in _args(ex).items():
        session = ort.InferenceSession(str(folder / f"{PARTS[part]}.onnx"),
                                       providers=["CPUExecutionProvider"])
        with torch.no_grad():
            expected = modules[part](model)(*args)
        flat_args = [*args[:-1], *args[-1]] if part == "decoder_with_past" else list(args)
        got = session.run(None, {name: t.numpy() for name, t in
                                 zip(io_names(model.config.decoder_layers)[part][0], flat_args)})
        expected = [expected] if part == "encoder" else [expected[0], *expected[1]]
        for name, e, g in zip(io_names(model.config.decoder_layers)[part][1], expected, got):
            e = e.numpy()
            if name == "last_hidden_state" or name.endswith(("encoder.key", "encoder.value")):
                if e.ndim == 4:  # (batch, heads, src, width): the source positions second
                    e, g = e.transpose(0, 2, 1, 3), g.transpose(0, 2, 1, 3)
                e, g = e[real], g[real]  # padded source positions are no one's
            err = float(np.abs(g - e).max())
            if not err <= tol:
                raise RuntimeError(f"the exported {PARTS[part]} disagrees with PyTorch: {name} "
                                   f"max error {err:.3g}")


def export_seq2seq(model: Seq2Seq, tokenizer, out_dir: Union[str, Path],
                   quantize: Optional[Int8Settings] = None) -> list[Path]:
    """Exports a loaded seq2seq with its tokenizer into out_dir (module docstring; with
    quantize, the int8 copies too); returns the files written."""
    require_specials(tokenizer.special_tokens, SPECIALS, "a translator's runner")
    model.eval()
    cfg = model.config
    runner_config = {"family": "seq2seq", "task": "translate",
                     "models": models_entry({part: f"{stem}.onnx" for part, stem in PARTS.items()},
                                            quantize),
                     "vocab_size": cfg.vocab_size, "block_size": cfg.block_size,
                     "io": io_names(cfg.decoder_layers)}
    return write_export(Path(out_dir), _builders(model),
                        lambda folder: _check_against_torch(model, folder), quantize, tokenizer,
                        runner_config)
