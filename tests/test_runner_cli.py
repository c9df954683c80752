"""The torch-free runner's command line (pygpt-run, export/pygpt_runtime) where a user meets it: it
refuses exactly the sampling values pygpt.generate refuses, with the same words; a tiny temperature
is greedy in both; a missing, truncated or damaged export file, a prompt that is not UTF-8, and a
BPE export without HF `tokenizers` installed are one `error:` line; Ctrl-C exits 130 after the text
so far and a closed pipe exits quietly."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import RUNNER_COMMAND
import pygpt.generate
from pygpt import export as exporter
from pygpt.config import ModelConfig, TrainConfig
from pygpt.storage.run_files import ONNX_FP32, RUNNER_CONFIG, TOKENIZER
from pygpt.training import train
from pygpt_runtime import run_onnx



@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(checkpoint folder, export folder) of a tiny char model trained for a few steps."""
    root = tmp_path_factory.mktemp("runner")
    ckpt, onnx_dir = root / "ckpt", root / "onnx"
    train(ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16),
          TrainConfig(out=str(ckpt), max_iters=20, eval_interval=20, eval_iters=1, batch_size=4,
                      warmup_iters=2), progress=False)
    exporter.export(ckpt, onnx_dir)
    return ckpt, onnx_dir


@pytest.fixture
def export_copy(exported, tmp_path):
    """A copy of the export folder, free to damage."""
    return Path(shutil.copytree(exported[1], tmp_path / "onnx"))


def _error(main, argv, capsys) -> str:
    """The one `error:` line main(argv) exits with, having printed nothing."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert capsys.readouterr().out == ""
    message = str(info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize("bad", [
    ["--top-k", "0"], ["--top-k", "-2"], ["--top-p", "2"], ["--top-p", "0"], ["--top-p", "nan"],
    ["--max-new-tokens", "-1"], ["--temperature", "0"], ["--temperature", "-0.5"],
    ["--temperature", "nan"], ["--temperature", "inf"], ["--prompt", ""],
], ids=" ".join)
def test_both_command_lines_refuse_the_same_values(exported, bad, capsys):
    ckpt, onnx_dir = exported
    torch_side = _error(pygpt.generate.main, ["--ckpt", str(ckpt), *bad], capsys)
    runner_side = _error(run_onnx.main, ["--model", str(onnx_dir), *bad], capsys)
    assert torch_side == runner_side


def test_tiny_temperature_is_greedy_in_the_runner(exported, capsys):
    base = ["--model", str(exported[1]), "--prompt", "First", "--max-new-tokens", "30"]
    run_onnx.main(base + ["--greedy"])
    greedy = capsys.readouterr().out
    for temperature in ("1e-30", "1e-320"):
        run_onnx.main(base + ["--temperature", temperature, "--seed", "1"])
        assert capsys.readouterr().out == greedy, temperature


@pytest.mark.parametrize("damage", ["missing", "truncated", "garbage", "runner.json",
                                    "tokenizer"])
def test_damaged_export_is_one_error_line(export_copy, damage, capsys):
    model = export_copy / ONNX_FP32
    if damage == "missing":
        model.unlink()
    elif damage == "truncated":
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    elif damage == "garbage":
        data = bytearray(model.read_bytes())
        data[:64] = os.urandom(64)
        model.write_bytes(bytes(data))
    elif damage == "runner.json":
        (export_copy / RUNNER_CONFIG).write_text('{"models": ', encoding="utf-8")
    else:
        (export_copy / TOKENIZER).unlink()
    message = _error(run_onnx.main, ["--model", str(export_copy), "--prompt", "First"], capsys)
    damaged = {"runner.json": RUNNER_CONFIG, "tokenizer": TOKENIZER}.get(damage, ONNX_FP32)
    assert str(export_copy / damaged) in message


def _run(args, **kwargs):
    return subprocess.run([*RUNNER_COMMAND, *args], capture_output=True,
                          timeout=120, **kwargs)


def test_prompt_that_is_not_utf8_is_one_error_line(exported):
    done = _run(["--model", str(exported[1]), "--prompt", b"Fir\xffst"])
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode().splitlines() == [
        "error: --prompt is not valid UTF-8 (byte 0xff at character 3)"]


def test_bpe_export_without_tokenizers_says_to_install_it(export_copy, tmp_path):
    """The runner reads a BPE or WordPiece tokenizer.json with HF `tokenizers`; where it is not
    installed, it says so in one line instead of a ModuleNotFoundError traceback."""
    config = json.loads((export_copy / RUNNER_CONFIG).read_text())
    config["tokenizer"]["kind"] = "bpe"
    (export_copy / RUNNER_CONFIG).write_text(json.dumps(config))
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "tokenizers.py").write_text("raise ModuleNotFoundError(\"No module named "
                                           "'tokenizers'\")\n")
    done = _run(["--model", str(export_copy), "--prompt", "First"],
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)})
    assert done.returncode == 1 and done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pip install tokenizers" in lines[0]


def _generating(onnx_dir):
    return subprocess.Popen([*RUNNER_COMMAND, "--model", str(onnx_dir), "--prompt",
                             "First", "--max-new-tokens", "10000000", "--seed", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ctrl_c_stops_the_runner_cleanly(exported):
    proc = _generating(exported[1])
    head = proc.stdout.read(200)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.decode().splitlines() == ["interrupted"]
    text = (head + rest).decode()
    assert text.startswith("First") and text.endswith("\n") and len(text) > 200


def test_runner_into_a_closed_pipe_exits_quietly(exported):
    proc = _generating(exported[1])
    proc.stdout.read(50)
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and err == b""


def test_help_shows_the_description_and_every_default(capsys):
    from test_cli_edges import option_blocks

    with pytest.raises(SystemExit) as info:
        run_onnx.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "pygpt-run --model out/onnx/ --prompt \"ROMEO:\"" in text
    for block in option_blocks(text)[1:]:
        assert "default" in block or "required" in block, block
