"""pygpt against Hugging Face transformers on a GPT-2-small-shaped model (12 layers, 768 wide,
12 heads, context 1024, vocab 50257: 124M parameters), both built from the same random weights
(made locally: a transformers GPT2LMHeadModel saved and converted by pygpt.hf), measured in one
process, alternated, at each thread count:

- training: tokens/s and memory (growth of the process's peak RSS over the steps: the second
  library measured starts from the first one's peak, so run with and without --hf-first, or read its
  figure as a lower bound) of one AdamW step at batch 4 x
  context 256 (pygpt: our kernels and the fused linear + cross-entropy; transformers: its
  default SDPA attention);
- greedy decoding: tokens/s at batch 1 and 8 from a 32-token prompt for 128 tokens (pygpt's
  cached decode and its torch-free ONNX runner, fp32 and int8; transformers' generate with its
  cache).

    python benchmarks/bench_hf_gpt2.py --threads 1,2
    python benchmarks/bench_hf_gpt2.py --small      # a tiny model, a smoke run of every path

Ratios are pygpt / transformers (> 1: pygpt faster; memory: < 1 pygpt smaller)."""
import argparse
import gc
import resource
import statistics
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


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, repeats):
    """The median seconds of fn() over repeats calls, and the RSS growth of the first (MB)."""
    gc.collect()
    before = peak_rss_mb()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak_rss_mb() - before


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
    p.add_argument("--hf-first", action="store_true",
                   help="measure transformers' training step before pygpt's (memory: see above)")
    args = p.parse_args()
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
            hf.train(), ours.train()
            steps = {"ours": train_step(ours, False, x, y), "hf": train_step(hf, True, x, y)}
            measured = {name: timed(steps[name], args.repeats)
                        for name in (("hf", "ours") if args.hf_first else ("ours", "hf"))}
            (t_ours, m_ours), (t_hf, m_hf) = measured["ours"], measured["hf"]
            tokens = batch * context
            print(f"threads {n} train B={batch}x{context}: pygpt {tokens / t_ours:.0f} tok/s "
                  f"(+{m_ours:.0f} MB), transformers {tokens / t_hf:.0f} tok/s (+{m_hf:.0f} MB): "
                  f"speed {t_hf / t_ours:.2f}x")
            hf.eval(), ours.eval()
            for rows in (1, 8):
                ids = torch.randint(0, config["vocab_size"], (rows, prompt), generator=g)
                with torch.inference_mode():
                    t_hf, _ = timed(lambda: hf.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                        min_new_tokens=new, do_sample=False, pad_token_id=0), args.repeats)
                    t_ours, _ = timed(lambda: ours.generate(ids, new,
                                                            sampling=Sampling(greedy=True)),
                                      args.repeats)
                line = (f"threads {n} decode batch {rows}: transformers {rows * new / t_hf:.1f} "
                        f"tok/s; pygpt cached {rows * new / t_ours:.1f} ({t_hf / t_ours:.2f}x)")
                for variant, runner in runners.items():
                    def run():
                        for _ in run_onnx.stream(runner, np.asarray(ids), new, greedy=True):
                            pass
                    t_onnx, _ = timed(run, args.repeats)
                    line += f"; runner {variant} {rows * new / t_onnx:.1f} ({t_hf / t_onnx:.2f}x)"
                print(line)


if __name__ == "__main__":
    main()
