"""Builds the framework-free kernels and their native C++ tests with CMake and runs them under
ctest: once optimised for this CPU as shipped (with the CUDA kernels and their tests too where
nvcc is installed: they compile everywhere and run, or skip, depending on a GPU; and the same
CUDA tests on the host CUDA emulator, which needs no GPU and no nvcc), and once for the generic
baseline ISA under AddressSanitizer + UndefinedBehaviorSanitizer (which also covers the kernels'
narrow-register code path that -march=native on an AVX-512 machine never compiles)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None,
                                reason="cmake/ctest not installed")


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("name, options", [
    ("release", ["-DPYGPT_SANITIZE=OFF", "-DPYGPT_NATIVE_ARCH=ON"]),
    ("asan-generic", ["-DPYGPT_SANITIZE=ON", "-DPYGPT_NATIVE_ARCH=OFF", "-DPYGPT_CUDA=OFF"]),
])
def test_ctest(name: str, options: list[str]) -> None:
    build = ROOT / "build" / f"native-{name}"
    _run(["cmake", "-S", ".", "-B", str(build), *options])
    _run(["cmake", "--build", str(build), f"-j{min(2, os.cpu_count() or 1)}"])
    _run(["ctest", "--test-dir", str(build), "--output-on-failure", f"-j{min(2, os.cpu_count() or 1)}"])
