#!/usr/bin/env python
"""GPT-2 small (124M: 12 layers, 768 wide, 12 heads, context 1024, vocabulary 50,257) training
on one GPU in bfloat16, five ways, in one process: the end-to-end figure of gpu_check.sh.

- pygpt on our kernels, as `python -m pygpt.train --dtype bfloat16` steps it (train_step:
  autocast, clipping, fused AdamW);
- pygpt on plain PyTorch ops (`--kernels torch`);
- a plain PyTorch GPT-2 written below: SDPA's flash attention, fused AdamW, bfloat16 autocast,
  what nanoGPT's model.py does;
- the same model through torch.compile;
- Hugging Face transformers' GPT2LMHeadModel with its SDPA attention.

Each takes the same random batches (batch x 1024 tokens), loss, clipping to 1.0 and AdamW
(fused, weight decay on matrices only). They run in turn in blocks of --block steps, after a first
untimed block each (compilation happens there), so a change in the machine's state hits all
alike; a step is timed from its start to the GPU's end of it (torch.cuda.synchronize). MFU is
nanoGPT's: 6 N + 12 L H Q T floating-point operations per token (N the parameters without the
position embeddings) over the GPU's peak bfloat16 dense rate (--peak-tflops; 989 for an H100 or
H200 SXM).

Usage:
  python benchmarks/gpu_gpt2.py --table gpt2.md              # on a GPU machine
  python benchmarks/gpu_gpt2.py --table gpt2.md --dry-run    # tiny, on the CPU, no compile
"""
import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pygpt.config import ModelConfig, TrainConfig
from pygpt.mixed_precision import autocast
from pygpt.models import GPT
from pygpt.training import make_optimizer, train_step

SHAPES = {"gpu": dict(vocab=50257, ctx=1024, layers=12, width=768, heads=12),
          "dry": dict(vocab=256, ctx=32, layers=2, width=32, heads=2)}


class PlainBlock(nn.Module):
    """A pre-norm GPT-2 block: SDPA attention, then the tanh-GELU MLP, each added back."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    """GPT-2 in plain PyTorch: learned positions, pre-norm blocks, a tied LM head; returns the
    mean next-token cross-entropy."""

    def __init__(self, vocab: int, ctx: int, layers: int, width: int, heads: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList(PlainBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass
class Contender:
    """One way of training: step(x, y) runs one optimizer step; N counts its parameters."""

    name: str
    step: Callable[[torch.Tensor, torch.Tensor], float]
    params: int


def adamw(model: nn.Module, device: str) -> torch.optim.Optimizer:
    """AdamW as pygpt's, for the models that are not pygpt's: decay on matrices only, fused on
    CUDA."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=6e-4,
                             betas=(0.9, 0.95), fused=device == "cuda" or None)


def plain_step(loss_of: Callable, model: nn.Module, device: str, dtype: str) -> Callable:
    optimizer = adamw(model, device)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        with autocast(device, dtype):
            loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()
    return step


def pygpt_contender(kernels: str, shape: dict, device: str, dtype: str) -> Contender:
    cfg = ModelConfig(vocab_size=shape["vocab"], block_size=shape["ctx"],
                      n_layer=shape["layers"], n_embd=shape["width"], n_head=shape["heads"],
                      activation="gelu_tanh")
    model = GPT(cfg, kernels=kernels).to(device)
    train_cfg = TrainConfig(device=device, dtype=dtype, lr=6e-4, beta2=0.95)
    optimizer = make_optimizer(model, train_cfg)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        return train_step(model, optimizer, [(x, y)], 6e-4, 1.0,
                          inputs=lambda b: {"idx": b[0], "targets": b[1]},
                          autocast=lambda: autocast(device, dtype))
    return Contender(f"pygpt --kernels {kernels}", step, _count(model, shape))


def contenders(shape: dict, device: str, dtype: str, compile_: bool) -> list[Contender]:
    result = [pygpt_contender("ext", shape, device, dtype),
              pygpt_contender("torch", shape, device, dtype)]
    plain = PlainGPT(**shape).to(device)
    result.append(Contender("plain PyTorch (SDPA, fused AdamW)",
                            plain_step(plain, plain, device, dtype), _count(plain, shape)))
    if compile_:
        twin = PlainGPT(**shape).to(device)
        compiled = torch.compile(twin)
        result.append(Contender("plain PyTorch, torch.compile",
                                plain_step(compiled, twin, device, dtype), _count(twin, shape)))
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(
        vocab_size=shape["vocab"], n_positions=shape["ctx"], n_embd=shape["width"],
        n_layer=shape["layers"], n_head=shape["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
    ).to(device)
    assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation
    result.append(Contender("transformers GPT2LMHeadModel (sdpa)",
                            plain_step(lambda x, y: hf(input_ids=x, labels=x).loss, hf, device,
                                       dtype), _count(hf, shape)))
    return result


def _count(model: nn.Module, shape: dict) -> int:
    """Parameters without the position embeddings (nanoGPT's N; a shared one counted once)."""
    unique = {id(p): p.numel() for p in model.parameters()}
    return sum(unique.values()) - shape["ctx"] * shape["width"]


def flops_per_token(n: int, shape: dict) -> float:
    """nanoGPT's estimate: 6 N for the matrices, 12 L H Q T for attention's two products."""
    return 6 * n + 12 * shape["layers"] * shape["width"] * shape["ctx"]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(runs: list[Contender], batches: list, block: int, rounds: int,
            device: str) -> dict[str, list[float]]:
    """Each contender's step times: a first untimed block each, then `rounds` blocks each in
    turn."""
    times = {c.name: [] for c in runs}
    for r in range(rounds + 1):
        for c in runs:
            for i in range(block):
                x, y = batches[(r * block + i) % len(batches)]
                sync(device)
                t0 = time.perf_counter()
                c.step(x, y)
                sync(device)
                if r > 0:
                    times[c.name].append(time.perf_counter() - t0)
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, required=True, help="write the markdown table here")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--block", type=int, default=5, help="steps per block (default 5)")
    p.add_argument("--rounds", type=int, default=3, help="timed blocks each (default 3)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the GPU's peak bfloat16 dense TFLOP/s for MFU (default 989: H100/H200)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, no compile")
    args = p.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    shape = SHAPES["dry" if args.dry_run else "gpu"]
    batch = 2 if args.dry_run else args.batch
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    tokens = [torch.randint(0, shape["vocab"], (batch, shape["ctx"]), device=device)
              for _ in range(4)]
    batches = [(x, torch.roll(x, -1, dims=1)) for x in tokens]
    runs = contenders(shape, device, "bfloat16", compile_=not args.dry_run)
    times = measure(runs, batches, args.block, args.rounds, device)
    tokens = batch * shape["ctx"]
    rows = ["| model | params (N) | ms/step | tokens/s | MFU | tokens/s vs plain |",
            "|---|--:|--:|--:|--:|--:|"]
    median = {name: statistics.median(t) for name, t in times.items()}
    plain = median["plain PyTorch (SDPA, fused AdamW)"]
    for c in runs:
        rate = tokens / median[c.name]
        mfu = flops_per_token(c.params, shape) * rate / (args.peak_tflops * 1e12)
        rows.append(f"| {c.name} | {c.params / 1e6:.1f}M | {median[c.name] * 1e3:.1f} | "
                    f"{rate:,.0f} | {mfu:.1%} | {plain / median[c.name]:.2f}x |")
    head = (f"GPT-2 small shape {shape}, batch {batch}, bfloat16 autocast, {args.rounds} "
            f"blocks of {args.block} steps each (medians)")
    text = "\n".join([head, "", *rows, ""])
    args.table.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
