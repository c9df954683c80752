"""pygpt against Hugging Face transformers on a GPT-2-small-shaped model (12 layers, 768 wide,
12 heads, context 1024, vocab 50257: 124M parameters), both built from the same random weights
(made locally: a transformers GPT2LMHeadModel saved and converted by pygpt.hf), at each thread
count:

- training: tokens/s of one AdamW step at batch 4 x context 256 (pygpt: our kernels and the
  fused linear + cross-entropy; transformers: its default SDPA attention), the two libraries'
  steps alternated in one process; and the peak memory of such steps, each library in a fresh
  process of its own (peak RSS, and its growth over the process's RSS once the model is loaded);
- greedy decoding: tokens/s at batch 1 and 8 from a 32-token prompt for 128 tokens (pygpt's
  cached decode and its torch-free ONNX runner, fp32 and int8; transformers' generate with its
  cache), alternated call by call.

    python benchmarks/bench_hf_gpt2.py --threads 1,2
    python benchmarks/bench_hf_gpt2.py --small      # a tiny model, a smoke run of every path
    python benchmarks/bench_hf_gpt2.py --decode-only  # the decoding rows alone

Ratios are transformers' time / pygpt's (> 1: pygpt faster) and pygpt's memory / transformers'
(< 1: pygpt smaller)."""
import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from machine import busy_warning, cpu_model, isa_note
import pygpt
from pygpt.decoding.sampling import Sampling
from pygpt.export import export
from pygpt.hf import import_folder
from pygpt_runtime import run_onnx

GPT2_SMALL = dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257)
SMOKE = dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, vocab_size=512)


def alternated(fns: dict, repeats: int) -> dict:
    """The median seconds of each of fns, called in turn (one call of each per round) after a
    warm-up round."""
    times = {name: [] for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def status_mb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MB: VmRSS (now) or VmHWM
    (the peak; unlike getrusage's ru_maxrss it starts afresh at exec, where ru_maxrss keeps
    the parent's peak)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def memory_child(root: Path, library: str, threads: int, batch: int, context: int,
                 vocab: int) -> None:
    """In a fresh process: loads one library's model, runs two training steps, prints its peak
    RSS and the RSS it had once loaded (MB)."""
    torch.set_num_threads(threads)
    if library == "hf":
        import transformers

        model = transformers.GPT2LMHeadModel.from_pretrained(root / "hf")
    else:
        model, _ = pygpt.load(root / "run")
    model.train()
    x = torch.randint(0, vocab, (batch, context), generator=torch.Generator().manual_seed(1))
    loaded = status_mb("VmRSS")
    step = train_step(model, library == "hf", x, torch.roll(x, -1, 1))
    step()
    step()
    print(status_mb("VmHWM"), loaded)


def peak_memory(root: Path, library: str, threads: int, batch: int, context: int,
                vocab: int) -> tuple[float, float]:
    """(peak RSS, its growth over the loaded model's RSS) in MB, of memory_child."""
    out = subprocess.run([sys.executable, __file__, "--memory-child", library, "--root", str(root),
                          "--threads", str(threads), "--shape", f"{batch},{context},{vocab}"],
                         capture_output=True, text=True, check=True).stdout.split()
    peak, loaded = float(out[0]), float(out[1])
    return peak, peak - loaded


def train_step(model, hf: bool, x, y):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = model(x, labels=x).loss if hf else model(x, y).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def build(root: Path, config: dict):
    import transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config, bos_token_id=0,
                                                              eos_token_id=0))
    hf.save_pretrained(root / "hf")
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    (root / "hf" / "tokenizer.json").write_text(id_tokenizer(vocab))
    import_folder(root / "hf", root / "run")
    export(root / "run", root / "onnx", quantize="int8")
    return hf


def id_tokenizer(vocab):
    """A tokenizer.json of vocab: the benchmark feeds token ids, never text."""
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordPiece(vocab, unk_token="t0")).to_str()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--small", action="store_true", help="a tiny model: a smoke run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-only", action="store_true", help="skip the training measurements")
    p.add_argument("--memory-child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child is not None:
        batch, context, vocab = map(int, args.shape.split(","))
        return memory_child(Path(args.root), args.memory_child, int(args.threads), batch,
                            context, vocab)
    threads = [int(t) for t in args.threads.split(",")]
    config = SMOKE if args.small else GPT2_SMALL
    batch, context, prompt, new = (2, 32, 8, 8) if args.small else (4, 256, 32, 128)
    busy_warning(threads)
    print(f"# {cpu_model()}; {isa_note()}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = build(root, config)
        ours, _ = pygpt.load(root / "run")
        print(f"# {sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M parameters")
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, config["vocab_size"], (batch, context), generator=g)
        y = torch.roll(x, -1, 1)
        for n in threads:
            torch.set_num_threads(n)
            runners = {v: run_onnx.OnnxGPT(str(root / "onnx"), variant=v, threads=n)
                       for v in ("fp32", "int8")}
            if not args.decode_only:
                train_both(root, hf, ours, x, y, n, args.repeats, config["vocab_size"])
            hf.eval(), ours.eval()
            for rows in (1, 8):
                ids = torch.randint(0, config["vocab_size"], (rows, prompt), generator=g)
                decode_both(hf, ours, runners, ids, n, new, args.repeats)


def train_both(root: Path, hf, ours, x, y, n: int, repeats: int, vocab: int) -> None:
    """Prints the two libraries' training tokens/s (alternated) and peak memory (apart)."""
    batch, context = x.shape
    hf.train(), ours.train()
    t = alternated({"ours": train_step(ours, False, x, y), "hf": train_step(hf, True, x, y)},
                   repeats)
    memory = {lib: peak_memory(root, lib, n, batch, context, vocab) for lib in ("ours", "hf")}
    tokens = batch * context
    print(f"threads {n} train B={batch}x{context}: pygpt {tokens / t['ours']:.0f} tok/s, "
          f"transformers {tokens / t['hf']:.0f} tok/s: speed {t['hf'] / t['ours']:.2f}x; "
          f"peak RSS pygpt {memory['ours'][0]:.0f} MB (+{memory['ours'][1]:.0f} over the "
          f"loaded model), transformers {memory['hf'][0]:.0f} MB "
          f"(+{memory['hf'][1]:.0f}): {memory['ours'][0] / memory['hf'][0]:.2f}x "
          f"(growth {memory['ours'][1] / memory['hf'][1]:.2f}x)")


def decode_both(hf, ours, runners: dict, ids, n: int, new: int, repeats: int) -> None:
    """Prints greedy decoding tokens/s of transformers' generate, pygpt's cached decode and the
    runner's graphs, alternated call by call."""
    rows = len(ids)

    def run(runner):
        for _ in run_onnx.stream(runner, np.asarray(ids), new, greedy=True):
            pass

    with torch.inference_mode():
        t = alternated({
            "transformers": lambda: hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                min_new_tokens=new, do_sample=False, pad_token_id=0),
            "pygpt cached": lambda: ours.generate(ids, new, sampling=Sampling(greedy=True)),
            **{f"runner {v}": (lambda r=r: run(r)) for v, r in runners.items()}}, repeats)
    base = t.pop("transformers")
    print(f"threads {n} decode batch {rows}: transformers {rows * new / base:.1f} tok/s; "
          + "; ".join(f"{name} {rows * new / sec:.1f} ({base / sec:.2f}x)"
                      for name, sec in t.items()))


if __name__ == "__main__":
    main()
