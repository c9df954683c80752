"""pygpt.plot: loss pictures from hand-written metrics.jsonl files. Checks the PNG is real and of
the expected size, several runs overlay, labels and CLI defaults, clear errors for missing, empty
and damaged metrics, and that nothing leaks into pyplot or the user's matplotlib backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import pytest

import pygpt.plot
from pygpt.plot import DPI, FIGSIZE, main, plot_runs, read_metrics
from pygpt.storage.run_files import LOSS_PLOT, METRICS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[1]


def write_run(folder: Path, n: int = 4, tokens_per_step: int = 768, scale: float = 1.0,
              extra: str = "") -> Path:
    """A run folder whose metrics.jsonl holds n evaluations of a falling loss (plus `extra`)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(1, n + 1):
        step = 100 * i
        lines.append(json.dumps({
            "step": step, "tokens": step * tokens_per_step, "lr": 1e-3,
            "train_loss": scale * (4.0 / i + 1.2), "val_loss": scale * (4.0 / i + 1.4),
            "val_ppl": 10.0, "tokens_per_s": 12000.0, "val_bpc": 2.0}))  # extra keys tolerated
    (folder / METRICS).write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return folder


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (round(FIGSIZE[1] * DPI), round(FIGSIZE[0] * DPI))
    assert image[..., :3].std() > 0.05  # not a blank canvas
    assert not list(path.parent.glob(f".{path.name}.tmp-*"))  # the atomic write cleaned up


@pytest.fixture(autouse=True)
def no_figures_left():
    assert plt.get_fignums() == []
    yield
    assert plt.get_fignums() == []


def test_one_run(tmp_path):
    run = write_run(tmp_path / "baby")
    out = plot_runs([run], tmp_path / "loss.png")
    assert out == tmp_path / "loss.png"
    assert_png(out)


def test_several_runs_overlay_and_labels(tmp_path):
    runs = [write_run(tmp_path / "a", n=3), write_run(tmp_path / "b", n=6, tokens_per_step=3072),
            write_run(tmp_path / "c", n=1, scale=0.9)]
    out = plot_runs(runs, tmp_path / "sub" / "runs.png", labels=["small", "big", "one point"])
    assert_png(out)
    with pytest.raises(ValueError, match="2 labels for 3 runs"):
        plot_runs(runs, tmp_path / "x.png", labels=["a", "b"])
    with pytest.raises(ValueError, match="no runs"):
        plot_runs([], tmp_path / "x.png")


def test_default_labels_unique(tmp_path):
    runs = [tmp_path / "exp1" / "out", tmp_path / "exp2" / "out", tmp_path / "solo"]
    assert pygpt.plot._unique_labels(runs) == ["exp1/out", "exp2/out", "solo"]
    deep = [tmp_path / "x" / "a" / "out", tmp_path / "y" / "a" / "out", tmp_path / "z" / "out"]
    assert pygpt.plot._unique_labels(deep) == ["x/a/out", "y/a/out", "z/out"]
    assert pygpt.plot._unique_labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
    assert pygpt.plot._unique_labels([tmp_path / "a", tmp_path / "a"]) == ["a (1)", "a (2)"]


def test_tolerates_missing_optional_keys_and_bad_values(tmp_path):
    """Records without tokens or a loss are left out of that curve; NaN/inf loss is a gap."""
    run = write_run(tmp_path / "r", extra='\n{"step": 500, "train_loss": 1.0}\n'
                                          '{"step": 600, "val_loss": NaN, "train_loss": Infinity}\n')
    assert len(read_metrics(run)) == 6
    assert pygpt.plot._series(read_metrics(run), "tokens", "train_loss")[0] == [76800, 153600,
                                                                                230400, 307200]
    assert_png(plot_runs([run], tmp_path / "loss.png"))


def test_missing_metrics(tmp_path):
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match="empty_run"):
        plot_runs([write_run(tmp_path / "ok"), tmp_path / "empty_run"], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("content, where", [
    ("", "line 1: no records"),
    ("\n  \n", "line 1: no records"),
    ('{"step": 1, "val_loss": 2.0}\n{"step": 2, "val_lo', "line 2 is not valid JSON"),
    ('[1, 2]\n', "line 1: expected a JSON object"),
    ('{"step": 1, "val_loss": 2.0}\n' + "[" * 100000 + "\n", "line 2 is not valid JSON"),
    ('{"step": 1, "val_loss": 2.0}\n{"step": ' + "1" * 5000 + "}\n", "line 2 is not valid JSON"),
    ('{"val_loss": 2.0}\n', "line 1: expected a JSON object with a numeric \"step\""),
    ('{"step": 1}\n{"step": 2, "lr": 0.1}\n', "no record has a train_loss or val_loss"),
])
def test_bad_metrics(tmp_path, content, where):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / METRICS).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        plot_runs([tmp_path / "run"], tmp_path / "x.png")
    assert str(tmp_path / "run" / METRICS) in str(info.value)
    assert where in str(info.value)
    assert not (tmp_path / "x.png").exists()


def test_cli_default_paths(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = write_run(tmp_path / "r1")
    main([str(run)])
    assert capsys.readouterr().out.strip() == str(run / LOSS_PLOT)
    assert_png(run / LOSS_PLOT)

    write_run(tmp_path / "r2")
    main(["r1", "r2", "--labels", "first", "second"])
    assert capsys.readouterr().out.strip() == "runs.png"
    assert_png(tmp_path / "runs.png")

    main(["r1", "--out", "pics/mine.png"])
    assert capsys.readouterr().out.strip() == str(Path("pics/mine.png"))
    assert_png(tmp_path / "pics" / "mine.png")


def test_cli_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*nothing_here"):
        main(["nothing_here"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / METRICS).write_text("oops\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"^error: .*metrics.jsonl, line 1"):
        main(["bad"])
    with pytest.raises(SystemExit, match=r"^error: 1 labels for 2 runs"):
        main([str(write_run(tmp_path / "a")), str(write_run(tmp_path / "b")), "--labels", "x"])
    os.mkfifo(tmp_path / "fifo.png")  # a reader's pipe, never replaced by the picture
    with pytest.raises(SystemExit, match=r"^error: .*fifo.png is not a regular file"):
        main([str(tmp_path / "a"), "--out", "fifo.png"])
    assert (tmp_path / "fifo.png").is_fifo()
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
    with pytest.raises(SystemExit, match=r"^error: .*link.png is a symbolic link"):
        main([str(tmp_path / "a"), "--out", "link.png"])
    assert (tmp_path / "link.png").is_symlink()
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "runs.png" in capsys.readouterr().out


def test_import_keeps_backend(tmp_path):
    """In a fresh interpreter with another backend chosen, importing and using pygpt.plot does not
    switch it (and never imports pyplot)."""
    write_run(tmp_path / "r")
    code = ("import sys, matplotlib; before = matplotlib.get_backend(); import pygpt.plot; "
            f"pygpt.plot.plot_runs([{str(tmp_path / 'r')!r}], {str(tmp_path / 'p.png')!r}); "
            "assert matplotlib.get_backend() == before == 'svg', (before, matplotlib.get_backend()); "
            "assert 'matplotlib.pyplot' not in sys.modules")
    env = {**os.environ, "MPLBACKEND": "svg",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "export")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path, timeout=60)
    assert_png(tmp_path / "p.png")
