"""python -m pygpt.attention (in-process main calls) on a tiny trained GPT run and on tiny BERT
and translator checkpoints: it writes a PNG of a layer's heads (or of every layer; any part of a
translator); --explain prints tables whose numbers are the tensors of
pygpt.inspect.attention_maps; bad input ends in one error line and writes nothing."""
import dataclasses
import math
import os
import re

import pytest
import torch
from matplotlib.image import imread

from helpers import spread_
from seq2seq_helpers import CFG as MT_CFG, tokenizer as mt_tokenizer
from pygpt.storage import checkpoint
from pygpt.attention import main
from pygpt.config import ModelConfig
from pygpt.families import build
from pygpt.inspect import attention_explain
from pygpt.families import attention_maps
from pygpt.tokenizer import CharTokenizer

LETTERS = "abcdefgh"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Checkpoints of a BERT (ALiBi positions) and a translator (rotary), random weights."""
    root = tmp_path_factory.mktemp("attn")
    bert_tok = CharTokenizer.from_text(LETTERS + " ", specials=True)
    bert_cfg = ModelConfig(arch="bert", vocab_size=bert_tok.vocab_size, block_size=16,
                           n_layer=2, n_head=3, n_embd=24, norm="post", embed_norm=True,
                           final_norm=False, pos_encoding="alibi")
    mt_cfg = dataclasses.replace(MT_CFG, pos_encoding="rotary")
    out = {}
    for name, cfg, tok in (("bert", bert_cfg, bert_tok), ("mt", mt_cfg, mt_tokenizer())):
        torch.manual_seed(0)
        checkpoint.save(root / name, spread_(build(cfg)).eval(), tok)
        out[name] = root / name
    return out


def run(capsys, *args):
    main([str(a) for a in args])
    return capsys.readouterr().out


def is_png(path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(path).shape
    return width, height


def test_a_gpt_layer_and_every_layer(trained, tmp_path, capsys):
    out = run(capsys, "--ckpt", trained[0], "--text", "First", "--out", tmp_path / "a.png")
    assert out == f"wrote {tmp_path / 'a.png'}\n"
    one = is_png(tmp_path / "a.png")
    run(capsys, "--ckpt", trained[0], "--text", "First", "--layer", "all", "--out",
        tmp_path / "sub" / "all.png")
    assert is_png(tmp_path / "sub" / "all.png") == one  # one layer, two heads: the same grid


@pytest.mark.parametrize("part", [None, "encoder", "decoder", "cross"])
def test_a_translators_parts(folders, tmp_path, capsys, part):
    args = ["--part", part] if part else []
    run(capsys, "--ckpt", folders["mt"], "--text", "abc", "--target", "cba", "--layer", "1",
        "--out", tmp_path / "t.png", *args)
    is_png(tmp_path / "t.png")


def parse_table(text, title, head=None):
    """The numbers of the table whose title line starts with title (and names head, if given),
    column blocks joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)
                 and (head is None or f"(head {head}" in line))
    blocks, rows = [], []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if line.startswith(" "):  # a header: a new block of columns
            rows = []
            blocks.append(rows)
            continue
        rows.append([float(cell) for cell in line.split()[1:]])
    return torch.tensor([sum((block[i] for block in blocks), []) for i in range(len(blocks[0]))])


def agrees(printed, tensor):
    tensor = tensor.detach().float()
    assert printed.shape == tensor.shape
    finite = torch.isfinite(tensor)
    assert torch.equal(torch.isfinite(printed), finite)
    assert torch.equal(printed[~finite], tensor[~finite])
    assert (printed[finite] - tensor[finite]).abs().max() <= 0.5e-4 + 1e-6


@pytest.mark.parametrize("which", ["gpt", "bert", "mt"])
def test_explain_prints_the_tensors(which, trained, folders, tmp_path, capsys):
    ckpt, text, extra = {"gpt": (trained[0], "Firs", []),
                         "bert": (folders["bert"], "ab cd", ["--layer", "1"]),
                         "mt": (folders["mt"], "abc", ["--target", "cb"])}[which]
    out = run(capsys, "--ckpt", ckpt, "--text", text, "--explain", "--out", tmp_path / "e.png",
              *extra)
    model, tok = checkpoint.load(ckpt)
    maps = attention_maps(model, tok, [text], ["cb"] if which == "mt" else None)[0]
    layer = maps.parts["cross" if which == "mt" else "self"][1 if which == "bert" else 0]
    for h in range(layer.n_head):
        agrees(parse_table(out, f"Q (head {h},"), layer.q[h])
        agrees(parse_table(out, f"K (head {h},"), layer.k[h])
        agrees(parse_table(out, f"V (head {h},"), layer.v[h])
        agrees(parse_table(out, f"scaled scores Q K^T / sqrt({layer.q.shape[-1]}) (head {h};"),
               layer.scores[h])
        logits = layer.scores[h]
        if which == "bert":  # ALiBi: the bias is printed and added
            agrees(parse_table(out, f"position bias (head {h})"), layer.bias[h])
            logits = logits + layer.bias[h]
        agrees(parse_table(out, "masked scores", h), torch.where(layer.visible, logits, -math.inf))
        agrees(parse_table(out, f"softmax: the attention weights (head {h};"), layer.probs[h])
        agrees(parse_table(out, f"head {h} output"), layer.heads[h])
    agrees(parse_table(out, "concatenation"), layer.concat)
    agrees(parse_table(out, "output = concatenation W_O^T"), layer.output)
    if layer.w_o.numel() <= attention_explain.MAX_PRINTED_W_O:
        agrees(parse_table(out, "W_O^T"), layer.w_o.mT)
    assert ("position bias" in out) == (which == "bert")
    assert out.endswith(f"wrote {tmp_path / 'e.png'}\n")


def test_dtype_runs_the_layers_under_autocast(folders, tmp_path, capsys):
    """--dtype bfloat16: the printed weights are those of attention_maps under CPU autocast,
    which differ from float32's (so the flag reaches the model)."""
    def printed(*dtype):
        out = run(capsys, "--ckpt", folders["bert"], "--text", "ab cd", "--layer", "1",
                  "--explain", "--out", tmp_path / "d.png", *dtype)
        return parse_table(out, "softmax: the attention weights (head 0;")

    model, tok = checkpoint.load(folders["bert"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        maps = attention_maps(model, tok, ["ab cd"])[0]
    low = printed("--dtype", "bfloat16")
    agrees(low, maps.parts["self"][1].probs[0])
    assert not torch.allclose(low, printed(), atol=1e-3)


@pytest.mark.parametrize("args,match", [
    (["--layer", "1"], r"--layer 1: the model's self attention has layers 0..0"),
    (["--layer", "one"], r"--layer one: .*layers 0..0"),
    (["--text", ""], "the text is empty"),
    (["--text", "Fir€"], "not in the tokenizer's vocabulary"),
    (["--text", "First Citizen"], "13 tokens; the model takes at most 8"),
    (["--target", "x"], "--target is for a translator"),
    (["--part", "cross"], "no 'cross' attention; it has self"),
    (["--explain", "--layer", "all"], "--explain works through one layer"),
    (["--explain", "--text", "First"], "--explain takes inputs of at most 4 tokens; this one "
                                       "has 5"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--ckpt", "NOT_A_RUN"], "is not a checkpoint"),
    (["--ckpt", "MISSING"], "no checkpoint folder"),
])
def test_bad_input_is_one_error_line_and_writes_nothing(args, match, trained, tmp_path,
                                                        monkeypatch):
    monkeypatch.setattr(attention_explain, "MAX_TOKENS", 4)
    (tmp_path / "NOT_A_RUN").mkdir()
    args = [str(tmp_path / a) if a in ("NOT_A_RUN", "MISSING") else a for a in args]
    base = {"--ckpt": str(trained[0]), "--text": "Fir"}
    for flag, value in base.items():
        if flag not in args:
            args = [flag, value, *args]
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", str(tmp_path / "x.png")])
    message = str(e.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert re.search(match, message), message
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_an_out_that_is_no_regular_file_is_left_alone(kind, trained, tmp_path):
    out = tmp_path / "x.png"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(tmp_path / "elsewhere.png")
    with pytest.raises(SystemExit) as e:
        main(["--ckpt", str(trained[0]), "--text", "Fir", "--out", str(out)])
    message = str(e.value.code)
    assert message.startswith(f"error: {out} is ") and "\n" not in message, message
    assert (out.is_fifo() if kind == "fifo" else out.is_symlink())
    assert not (tmp_path / "elsewhere.png").exists()
