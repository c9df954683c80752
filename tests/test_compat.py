"""Checkpoints of the previous format still load, resume and export (pygpt.storage.compat): a format 2
translator, saved by the code before the model config held only its family's fields and before
label smoothing moved to the training settings, gives the logits it gave then and resumes to
exactly the metrics the format 2 code recorded for the same two steps."""
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

import pygpt
import pygpt.train
from pygpt.storage import checkpoint
from pygpt.export import export
from pygpt.storage.run_files import CONFIG, METRICS, RUNNER_CONFIG

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "seq2seq-format2"


def copy_run(tmp_path: Path) -> Path:
    """The fixture as a run folder of this machine: its training files are the fixture's own."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    config = json.loads((run / CONFIG).read_text())
    config["train"].update(src_data=str(run / "src.txt"), tgt_data=str(run / "tgt.txt"),
                           out=str(run))
    (run / CONFIG).write_text(json.dumps(config, indent=2))
    return run


def test_format2_translator_loads_with_its_logits():
    saved = json.loads((FIXTURE / CONFIG).read_text())
    assert saved["format"] == 2 and saved["model"]["label_smoothing"] == 0.1  # really format 2
    config = checkpoint.read_config(FIXTURE)
    assert "label_smoothing" not in config["model"]
    assert config["train"]["label_smoothing"] == 0.1
    model, _ = pygpt.load(FIXTURE)
    recorded = load_file(str(FIXTURE / "expected_logits.safetensors"))
    src, tgt = recorded["src"], recorded["tgt"]
    with torch.no_grad():
        logits = model(src, torch.tensor([7, 5]), tgt).logits
    # Recorded on 2 threads; other thread counts sum in another order (an ulp or two).
    torch.testing.assert_close(logits, recorded["logits"], atol=1e-6, rtol=1e-6)


def test_format2_translator_resumes_exactly(tmp_path):
    run = copy_run(tmp_path)
    # (recorded with one thread, as here: the same sums in the same order)
    pygpt.train.main(["--resume", "--out", str(run), "--max-iters", "6", "--threads", "1",
                      "--quiet"])
    last = json.loads((run / METRICS).read_text().splitlines()[-1])
    expected = json.loads((FIXTURE / "expected_resume.json").read_text())
    assert {k: last[k] for k in expected} == expected
    config = json.loads((run / CONFIG).read_text())
    assert config["format"] == checkpoint.FORMAT and config["step"] == 6
    assert config["train"]["label_smoothing"] == 0.1 and "label_smoothing" not in config["model"]
    assert "pooling" not in config["model"]  # a translator's config holds its own fields only


def test_format2_translator_exports(tmp_path):
    written = export(FIXTURE, tmp_path / "onnx")
    assert tmp_path / "onnx" / RUNNER_CONFIG in written
    assert json.loads((tmp_path / "onnx" / RUNNER_CONFIG).read_text())["family"] == "seq2seq"
