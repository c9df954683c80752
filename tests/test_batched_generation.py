"""Batched generation (pygpt.decoding.sampling.stream_batch, GPT.generate_batch): prompts of different
lengths decoded together give each prompt the tokens it gets alone, for every position encoding
(absolute ones re-prefill a row whose window passes the context, relative ones roll each row's
cache), on both kernel sets, with and without the cache; sampling with one generator per row
draws what each row would alone; bad prompts get clear errors. Tiny models only."""

import dataclasses

import pytest
import torch

from helpers import ARCHS, TINY, make_model, rand_tokens
from pygpt.decoding.sampling import Sampling

GREEDY = Sampling(greedy=True)
ENCODINGS = {**{name: ARCHS[name] for name in ("learned", "sinusoidal", "relative", "alibi")},
             "rotary": dataclasses.replace(TINY, pos_encoding="rotary"),
             "none": dataclasses.replace(TINY, pos_encoding="none")}


def _prompts(lengths, vocab):
    return [rand_tokens(1, n, vocab=vocab, seed=10 + i)[0] for i, n in enumerate(lengths)]


def _alone(model, prompts, n, **options):
    return [model.generate(p[None], n, **options)[0] for p in prompts]


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_batch_equals_one_prompt_at_a_time(encoding, kernels):
    """Prompts of 1, 3 and 17 tokens (17 > the context of 16) and a repeat of the 3, greedy,
    well past the context so every row's window slides (at different steps)."""
    cfg = ENCODINGS[encoding]
    model = make_model(cfg, kernels, spread=0.3).eval()
    prompts = _prompts([1, 3, 17, 3], cfg.vocab_size)
    n = 2 * cfg.block_size + 7
    batched = model.generate_batch(prompts, n, sampling=GREEDY)
    for b, (got, want) in enumerate(zip(batched, _alone(model, prompts, n, sampling=GREEDY))):
        assert torch.equal(got, want), f"{encoding}: row {b} (prompt {len(prompts[b])})"


@pytest.mark.parametrize("encoding", ["learned", "rotary", "alibi"])
def test_batch_without_cache_and_lists_of_ids(encoding):
    """--no-cache decoding batched, prompts given as lists of ids: the same tokens as alone."""
    cfg = ENCODINGS[encoding]
    model = make_model(cfg, spread=0.3).eval()
    prompts = _prompts([5, 2, 9], cfg.vocab_size)
    n = cfg.block_size + 5
    batched = model.generate_batch([p.tolist() for p in prompts], n, sampling=GREEDY,
                                   use_cache=False)
    alone = _alone(model, prompts, n, sampling=GREEDY, use_cache=False)
    assert all(torch.equal(a, b) for a, b in zip(batched, alone))


def test_sampling_with_one_generator_per_row():
    """Each row sampled from its own generator draws exactly what it draws alone with it."""
    model = make_model(ENCODINGS["rotary"], spread=0.3).eval()
    prompts = _prompts([4, 1, 7], TINY.vocab_size)
    sampling = Sampling(temperature=0.9, top_k=20)
    gens = [torch.Generator().manual_seed(s) for s in (3, 4, 5)]
    batched = model.generate_batch(prompts, 25, sampling=sampling, generator=gens)
    for b, p in enumerate(prompts):
        alone = model.generate(p[None], 25, sampling=sampling,
                               generator=torch.Generator().manual_seed(3 + b))[0]
        assert torch.equal(batched[b], alone)
    # One generator for all rows: reproducible from its seed.
    again = [model.generate_batch(prompts, 10, sampling=sampling,
                                  generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*again))


def test_stream_batch_yields_a_token_per_row_and_keeps_mode():
    model = make_model(TINY).train()
    steps = list(model.stream_batch([[1, 2], [3]], 4, sampling=GREEDY))
    assert len(steps) == 4 and all(s.shape == (2,) for s in steps)
    assert model.training
    out = model.generate_batch([[1, 2], [3]], 0)
    assert [o.tolist() for o in out] == [[1, 2], [3]]


def test_bad_prompts_are_refused():
    model = make_model(TINY)
    with pytest.raises(ValueError, match="at least one prompt"):
        model.generate_batch([], 3)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        model.generate_batch([[1], []], 3)
    with pytest.raises(ValueError, match="prompt 0 must be a 1-D"):
        model.generate_batch([torch.zeros(1, 2, dtype=torch.long)], 3)
    with pytest.raises(ValueError, match="2 generators for 3 prompts"):
        model.generate_batch([[1], [2], [3]], 3, generator=[torch.Generator()] * 2)


# --- python -m pygpt.generate with several prompts ---------------------------------------------

def _alone_cli(ckpt, prompt, extra, capsys):
    import pygpt.generate

    pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", prompt] + extra)
    return capsys.readouterr().out


@pytest.mark.parametrize("extra", [["--greedy"], ["--seed", "3", "--top-k", "5"],
                                   ["--greedy", "--no-cache"]])
def test_cli_prompts_decode_together_as_alone(trained, tmp_path, capsys, extra):
    """--prompt twice plus a --prompt-file of two lines: four samples in order, each the text
    the same command prints for that prompt alone (with --seed too)."""
    import pygpt.generate

    ckpt = trained[0]
    (tmp_path / "prompts.txt").write_text("First\nA\n", encoding="utf-8")
    extra = ["--max-new-tokens", "30"] + extra
    pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "Th", "--prompt", "\n",
                         "--prompt-file", str(tmp_path / "prompts.txt")] + extra)
    out = capsys.readouterr().out
    want = "".join(f"=== prompt {i + 1} ===\n" + _alone_cli(ckpt, p, extra, capsys)
                   for i, p in enumerate(["Th", "\n", "First", "A"]))
    assert out == want


@pytest.mark.parametrize("text, pattern", [
    ("First\n\nA\n", "line 2 is empty"),
    ("", "holds no prompt"),
    ("First\nCaf\u00e9\n", "prompt 2: 1 character.* not in the tokenizer's vocabulary: '\u00e9'"),
])
def test_cli_bad_prompt_files(trained, tmp_path, capsys, text, pattern):
    import pygpt.generate

    path = tmp_path / "prompts.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match=rf"^error: .*{pattern}"):
        pygpt.generate.main(["--ckpt", str(trained[0]), "--prompt-file", str(path)])
    with pytest.raises(SystemExit, match=r"^error: --prompt-file .*missing.*No such file"):
        pygpt.generate.main(["--ckpt", str(trained[0]), "--prompt-file", str(tmp_path / "missing")])
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(SystemExit, match=r"^error: --prompt-file .* not UTF-8"):
        pygpt.generate.main(["--ckpt", str(trained[0]), "--prompt-file", str(path)])
    assert capsys.readouterr().out == ""
