"""`python -m pygpt.train --arch seq2seq`: a tiny translator trained on made-up sentence pairs
(letter strings and their reversals) through the command line writes a checkpoint that
`python -m pygpt.translate` uses; a stopped and resumed run ends with the weights of a straight
one; metrics.jsonl holds numbers only, with val_loss and val_bleu; bad data and flag
combinations are one-line errors that leave --out untouched; two ranks under torchrun step like
one process of twice the gradient accumulation."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pygpt import translate
from pygpt.storage.checkpoint import load
from pygpt.config import TrainConfig
from pygpt.training.optim import lr_at
from pygpt.tokenizer import SEQ2SEQ_SPECIALS
from pygpt.train import main
from pygpt.tasks.seq2seq import held_out

LETTERS = "abcdefgh"
TINY = ["--arch", "seq2seq", "--tokenizer", "char", "--n-layer", "1", "--n-embd", "32",
        "--n-head", "2", "--block-size", "16", "--max-tokens", "300", "--warmup-iters", "2",
        "--eval-iters", "2", "--bleu-sentences", "6", "--threads", "1", "--quiet"]


def _sentences(n: int, seed: int) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    return [" ".join("".join(LETTERS[i] for i in torch.randint(8, (int(k),), generator=g))
                     for k in torch.randint(1, 5, (int(torch.randint(1, 3, (1,), generator=g)),),
                                            generator=g))
            for _ in range(n)]


def _write(path: Path, lines: list[str]) -> Path:
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pairs")
    src, val = _sentences(300, seed=1), _sentences(20, seed=2)
    return {"src": _write(d / "train.src.gz", src),
            "tgt": _write(d / "train.tgt", [s[::-1] for s in src]),
            "val_src": _write(d / "val.src", val),
            "val_tgt": _write(d / "val.tgt", [s[::-1] for s in val])}


def _pairs(data: dict[str, Path], val: bool = False) -> list[str]:
    flags = ["--src-data", str(data["src"]), "--tgt-data", str(data["tgt"])]
    return flags + (["--val-src", str(data["val_src"]), "--val-tgt", str(data["val_tgt"])]
                    if val else [])


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_trains_a_checkpoint_that_translates(data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "mt"
    monkeypatch.chdir(data["src"].parent)  # relative data paths are stored absolute
    loud = [flag for flag in TINY if flag != "--quiet"]  # the progress output shows samples
    main([*loud, "--src-data", data["src"].name, "--tgt-data", data["tgt"].name,
          "--max-iters", "6", "--eval-interval", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "python -m pygpt.translate --ckpt" in printed and "BLEU" in printed
    assert printed.count("  source: ") == 2 * 3  # 3 samples at each of the 2 evaluations
    saved = json.loads((out / "config.json").read_text())["train"]
    assert (saved["src_data"], saved["tgt_data"]) == (str(data["src"]), str(data["tgt"]))
    records = _records(out)
    assert [r["step"] for r in records] == [3, 6]
    for record in records:
        assert {"val_loss", "val_bleu", "val_bleu_lc", "val_chrf", "val_ppl"} <= set(record)
        assert all(isinstance(v, (int, float)) for v in record.values()), record
    assert (out / "loss.png").stat().st_size > 0
    translate.main(["--ckpt", str(out), "--text", "abc de", "--beam", "2"])
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_resumed_run_equals_straight_run(data, tmp_path):
    flags = [*TINY, *_pairs(data, val=True), "--dropout", "0.1", "--eval-interval", "2",
             "--tokenizer", "bpe", "--vocab-size", "300"]  # joint BPE over both sides
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    main([*flags, "--max-iters", "6", "--out", str(straight)])
    main([*flags, "--max-iters", "4", "--out", str(resumed)])
    learned = (resumed / "tokenizer.json").read_bytes()
    main(["--resume", "--max-iters", "6", "--out", str(resumed), "--quiet"])
    assert (resumed / "tokenizer.json").read_bytes() == learned  # the run's own, not relearned
    _, tokenizer = load(resumed)
    assert tokenizer.kind == "bpe" and set(SEQ2SEQ_SPECIALS) <= set(tokenizer.special_tokens)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    timing = ("tokens_per_s", "elapsed_s")
    assert ([{k: v for k, v in r.items() if k not in timing} for r in _records(straight)] ==
            [{k: v for k, v in r.items() if k not in timing} for r in _records(resumed)])


def test_inverse_sqrt_schedule():
    cfg = TrainConfig(lr=1e-3, min_lr=2e-4, warmup_iters=100, schedule="inverse_sqrt",
                      max_iters=10)  # it has no end: max_iters does not matter
    assert lr_at(0, cfg) == pytest.approx(1e-5) and lr_at(99, cfg) == pytest.approx(1e-3)
    assert lr_at(399, cfg) == pytest.approx(1e-3 * (100 / 400) ** 0.5)
    assert lr_at(10 ** 6, cfg) == 2e-4  # never below min_lr


def test_held_out_pairs_are_a_fixed_pick():
    mask = held_out(1000)
    assert mask.sum() == 50 and (mask == held_out(1000)).all()
    assert held_out(2).sum() == 1 and held_out(100_000).sum() == 2000
    with pytest.raises(ValueError, match="too few"):
        held_out(1)


def _refused(argv: list[str], match: str, out: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(out)])
    message = str(e.value.code)
    assert "\n" not in message and match in message, message
    assert not out.exists()  # checked before the folder is made, or the folder removed again


@pytest.mark.parametrize("make, match", [
    (lambda d, t: _write(t / "short.tgt", ["ba"] * 299), "has 300 lines but"),
    (lambda d, t: t / "missing.tgt", "no data file at"),
    (lambda d, t: _write(t / "empty.tgt", []), "is empty"),
    (lambda d, t: _write(t / "blank.tgt.gz", [""] * 300), "no usable training pairs"),
])
def test_bad_data_is_a_one_line_error(data, tmp_path, make, match):
    argv = [*TINY, "--src-data", str(data["src"]), "--tgt-data", str(make(data, tmp_path))]
    _refused(argv, match, tmp_path / "out")


@pytest.mark.parametrize("flags, match", [
    (["--arch", "seq2seq", "--src-data", "{src}"], "--src-data needs --tgt-data"),
    (["--arch", "seq2seq", "--src-data", "{src}", "--tgt-data", "{tgt}", "--val-tgt", "{tgt}"],
     "--val-tgt needs --val-src"),
    (["--arch", "seq2seq"], "needs --src-data and --tgt-data"),
    (["--arch", "seq2seq", "--data", "{tgt}"], "--data is for --arch gpt or bert"),
    (["--src-data", "{src}", "--tgt-data", "{tgt}"], "--src-data is for --arch seq2seq; gpt trains on --data"),
    (["--arch", "bert", "--max-tokens", "100"], "--max-tokens is for --arch seq2seq; bert trains"),
    (["--arch", "seq2seq", "--src-data", "{src}", "--tgt-data", "{tgt}", "--batch-size", "8"],
     "--batch-size is for --arch gpt or bert; seq2seq trains on sentence pairs"),
    (["--arch", "seq2seq", "--src-data", "{src}", "--tgt-data", "{tgt}", "--tokenizer",
      "wordpiece"], "bpe or char"),
    (["--arch", "seq2seq", "--src-data", "{src}", "--tgt-data", "{tgt}", "--max-tokens", "0"],
     "max_tokens must be at least 1"),
])
def test_bad_flag_combinations_are_refused(data, tmp_path, flags, match):
    argv = [f.format(src=data["src"], tgt=data["tgt"]) for f in flags]
    _refused([*argv, "--quiet"], match, tmp_path / "out")


def test_two_ranks_match_one_process_with_twice_the_accumulation(data, tmp_path):
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    flags = [*TINY, *_pairs(data, val=True), "--max-iters", "4", "--eval-interval", "4",
             "--bleu-sentences", "0", "--dropout", "0"]
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    for cmd in ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node=2", "-m", "pygpt.train", *flags, "--out", str(ddp)],
                [sys.executable, "-m", "pygpt.train", *flags, "--grad-accum", "2",
                 "--out", str(single)]):
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    a, b = load_file(ddp / "model.safetensors"), load_file(single / "model.safetensors")
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-5, msg=name)
    assert _records(ddp)[0]["val_loss"] == pytest.approx(_records(single)[0]["val_loss"],
                                                         abs=1e-5)
