"""What importing costs: pygpt's training and torch commands never load onnxruntime (pygpt shares
the runtime's text pieces, pygpt_runtime.text, not its graph runs), the runtime modules pygpt
imports load neither onnxruntime nor numpy, and the plain runner (pygpt-run, every family's)
loads no part of the server (FastAPI, its extra). Each import runs in a fresh interpreter, where
sys.modules holds only what it loaded."""
import pkgutil
import subprocess
import sys

import pygpt

# Every command of pygpt (its top-level modules), and the training loop, tokenizers and families
# a run imports.
TORCH_SIDE = sorted(f"pygpt.{m.name}" for m in pkgutil.iter_modules(pygpt.__path__)
                    if not m.ispkg and not m.name.startswith("_"))
TORCH_SIDE += ["pygpt", "pygpt.training.loop", "pygpt.tokenizer", "pygpt.families"]
# The runtime modules pygpt imports on its training and command paths.
LIGHT_RUNTIME = ["pygpt_runtime.text", "pygpt_runtime.runner_config",
                 "pygpt_runtime.families", "pygpt_runtime.cli_checks"]
# pygpt-run, with the runner of every family.
PLAIN_RUNNER = ["pygpt_runtime.command", "pygpt_runtime.run_onnx", "pygpt_runtime.onnx_bert",
                "pygpt_runtime.onnx_seq2seq"]
SERVER = ("fastapi", "starlette", "uvicorn", "pydantic")


def loaded_by(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of the watched top-level packages a fresh interpreter holds after importing
    modules."""
    probe = "".join(f"import {m}\n" for m in modules) + (
        f"import sys; print(' '.join(w for w in {watched!r} if w in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_training_and_the_torch_commands_do_not_import_onnxruntime():
    assert {"pygpt.train", "pygpt.generate", "pygpt.translate", "pygpt.export"} <= set(TORCH_SIDE)
    assert loaded_by(TORCH_SIDE, ("onnxruntime",)) == []


def test_the_runtime_text_pieces_import_neither_onnxruntime_nor_numpy():
    assert loaded_by(LIGHT_RUNTIME, ("onnxruntime", "numpy")) == []


def test_the_plain_runner_imports_no_server_part():
    assert loaded_by(PLAIN_RUNNER, SERVER) == []


def test_the_probe_sees_an_import():
    assert loaded_by(["pygpt_runtime.onnx_text"], ("onnxruntime", "numpy")) == [
        "onnxruntime", "numpy"]
    assert loaded_by(["pygpt_runtime.serve.app"], SERVER) == list(SERVER[:2]) + ["pydantic"]
