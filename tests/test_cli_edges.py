"""What a user of the command lines meets at the edges: --help shows each module's whole
description and every flag's default (generate, fill_mask, classify); a tiny positive
temperature samples greedily instead of crashing; a prompt that is not UTF-8 is one `error:`
line; Ctrl-C stops generation with exit status 130 after the text so far; a closed pipe
(`| head`) ends generate and classify quietly with status 141."""

import importlib
import signal
import subprocess
import sys

import pytest

import pygpt.classify
import pygpt.generate
import pygpt.train
from test_cli import help_text


def option_blocks(text):
    """--help's option entries, each with its wrapped help lines."""
    blocks = []
    for line in text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            blocks.append(line)
        elif blocks:
            blocks[-1] += " " + line.strip()
    return blocks


@pytest.mark.parametrize("module, first_words", [
    ("generate", "Sample text from a checkpoint"),
    ("fill_mask", "`python -m pygpt.fill_mask --ckpt runs/bert --text \"To be, or not to be: that"),
    ("classify", "`python -m pygpt.classify --ckpt runs/cls --data test.tsv`: a fine-tuned"),
])
def test_help_shows_whole_description_and_every_default(module, first_words, capsys):
    """The description is the module docstring whole (it was once cut at the first colon, in
    "ROMEO:"), and every flag but --help says its default (or that it is required)."""
    main = importlib.import_module(f"pygpt.{module}").main
    text = help_text(main, capsys)
    assert first_words in text
    doc = importlib.import_module(f"pygpt.{module}").__doc__
    assert doc.strip().splitlines()[-1].strip() in text  # its last line too
    for block in option_blocks(text)[1:]:
        assert "default" in block or "required" in block, block


def test_generate_cli_tiny_temperature_is_greedy(trained, capsys):
    base = ["--ckpt", str(trained[0]), "--prompt", "First", "--max-new-tokens", "30"]
    pygpt.generate.main(base + ["--greedy"])
    greedy = capsys.readouterr().out
    for temperature in ("1e-30", "1e-320"):
        pygpt.generate.main(base + ["--temperature", temperature, "--seed", "1"])
        assert capsys.readouterr().out == greedy, temperature


def test_generate_cli_refuses_a_prompt_that_is_not_utf8(trained):
    """argv bytes that are not UTF-8 reach Python as lone surrogates (b"\\xff" -> "\\udcff")."""
    done = subprocess.run([sys.executable, "-m", "pygpt.generate", "--ckpt", str(trained[0]),
                           "--prompt", b"Fir\xffst"], capture_output=True, timeout=300)
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        "error: --prompt is not valid UTF-8 (byte 0xff at character 3)"]


def _generating(ckpt):
    """A `python -m pygpt.generate` process that writes a long text to a pipe."""
    return subprocess.Popen([sys.executable, "-m", "pygpt.generate", "--ckpt", str(ckpt),
                             "--prompt", "First", "--max-new-tokens", "10000000", "--seed", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_generate_cli_ctrl_c_stops_cleanly(trained):
    proc = _generating(trained[0])
    head = proc.stdout.read(200)  # generation is under way
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.decode().splitlines() == ["interrupted"]
    text = (head + rest).decode()
    assert text.startswith("First") and text.endswith("\n") and len(text) > 200


def test_generate_cli_into_a_closed_pipe_exits_quietly(trained):
    proc = _generating(trained[0])
    proc.stdout.read(50)
    proc.stdout.close()  # as `| head -c 50` does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b""


class _ClosedPipe:
    """A stdout whose reader went away."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_classify_into_a_closed_pipe_exits_quietly(tmp_path, monkeypatch, capsys):
    rows = ["label\ttext"] + [f"{'yes' if n % 2 else 'no'}\t{'a zebra' if n % 2 else 'a cat'} {n}"
                              for n in range(40)]
    data = tmp_path / "train.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "cls"
    pygpt.train.main(["--arch", "bert", "--task", "classify", "--data", str(data), "--out",
                      str(out), "--tokenizer", "char", "--n-layer", "1", "--n-embd", "16",
                      "--n-head", "2", "--block-size", "16", "--max-iters", "2",
                      "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "4", "--quiet"])
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    for args in (["--text", "a zebra"], ["--data", str(data)]):
        with pytest.raises(SystemExit) as info:
            pygpt.classify.main(["--ckpt", str(out), *args])
        assert info.value.code == 141, args
    assert capsys.readouterr().err == ""
