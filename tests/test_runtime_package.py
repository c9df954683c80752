"""The packaging of the two halves: pygpt_runtime (export/pygpt_runtime, the ONNX runner) imports
and answers its command line without torch or pygpt, and pygpt refuses to load its extension under
another torch release than the one it was built against, with one line saying how to rebuild."""
import importlib.metadata
import pkgutil
import subprocess
import sys

import pygpt_runtime
from helpers import RUNNER_COMMAND, torch_free_env
from pygpt import REBUILD, torch_mismatch
from pygpt._build_info import TORCH_VERSION

RUNTIME_MODULES = sorted(f"pygpt_runtime.{m.name}" for m in pkgutil.iter_modules(
    pygpt_runtime.__path__) if m.name != "__main__")


def test_every_runtime_module_imports_without_torch_or_pygpt():
    blocked = "import sys; sys.modules['torch'] = sys.modules['pygpt'] = None\n"
    imports = "".join(f"import {name}\n" for name in RUNTIME_MODULES)
    check = ("assert not [m for m, module in sys.modules.items() if module is not None and "
             "m.split('.')[0] in ('torch', 'pygpt')]")
    done = subprocess.run([sys.executable, "-c", blocked + imports + check],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pygpt_runtime.command" in RUNTIME_MODULES and len(RUNTIME_MODULES) >= 6


def test_the_command_answers_help_without_torch(tmp_path):
    done = subprocess.run([*RUNNER_COMMAND, "--help"], capture_output=True, text=True,
                          env=torch_free_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pygpt-run ")


def test_a_missing_export_is_one_error_line(tmp_path):
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(tmp_path / "nowhere"), "--prompt", "a"],
                          capture_output=True, text=True, env=torch_free_env(tmp_path), timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "no runner.json: not a pygpt ONNX export" in done.stderr


def test_the_extension_was_built_against_the_running_torch():
    assert torch_mismatch(TORCH_VERSION, importlib.metadata.version("torch")) is None


def test_another_torch_release_is_refused_in_one_line():
    assert torch_mismatch("2.13.0+cpu", "2.13.0") is None  # local labels: one release
    assert torch_mismatch("2.13.0", "2.13.0+cu126") is None
    message = torch_mismatch("2.13.0+cpu", "2.14.1")
    assert message is not None and "\n" not in message
    assert "built against torch 2.13.0+cpu" in message and "torch 2.14.1 is installed" in message
    assert REBUILD in message and "torch==2.13.0" in message
    assert REBUILD == "pip install --no-build-isolation --force-reinstall ."
