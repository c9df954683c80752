"""How pygpt._C is linked: against the libstdc++ that torch runs with (setup.py's
torch_libstdcxx), never with a private copy of it. A compiler that links libstdc++ statically
once put part of it into the extension, where its streams' locale was never set up: the first
error message that formatted a number (a head dim, a shape) crashed the process."""
import shutil
import subprocess
import sys

import pytest

from pygpt import _C


def test_the_extension_defines_none_of_libstdcxx_streams():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (GNU binutils) is not installed")
    symbols = subprocess.run([nm, "-D", "-C", "--defined-only", _C.__file__], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    copied = [s for s in symbols if "std::basic_ostream" in s or "std::ostream::" in s]
    assert not copied, f"pygpt._C holds its own copy of libstdc++'s streams: {copied[:3]}"


def test_an_error_that_formats_numbers_is_raised_not_a_crash():
    code = ("import torch, pygpt.ops as ops\n"
            "try:\n"
            "    ops.layer_norm(torch.randn(3, 8), torch.ones(7))\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "7" in run.stdout and "8" in run.stdout, run.stdout
