#!/usr/bin/env python
"""The machine benchmarks/gpu_check.sh runs on: what the build needs to know about it (the GPU's
architecture for TORCH_CUDA_ARCH_LIST and CMake, the CUDA toolkit's root), what its report says
about it (device, driver, torch, CUDA, cuDNN, nvcc), and whether the extension built in place
registers every op that pygpt.ops.registry gives a kernel for on the device (the check .ci/run
makes of its CUDA build).

Usage:
  python benchmarks/gpu_env.py --arch                 # "9.0" on an H100; exit 1 without a GPU
  python benchmarks/gpu_env.py --cuda-home            # the CUDA toolkit to build against
  python benchmarks/gpu_env.py --json env.json        # the facts, for the report
  python benchmarks/gpu_env.py --check-ops cuda       # every CUDA op registered? (cpu: CPU ops)
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

import torch


def arch() -> str:
    """The compute capability of GPU 0 as TORCH_CUDA_ARCH_LIST writes it ("9.0")."""
    if not torch.cuda.is_available():
        sys.exit(f"gpu_env: torch {torch.__version__} sees no CUDA device")
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def cuda_home() -> str:
    """The CUDA toolkit root that holds the CUDA headers: CUDA_HOME, torch's guess, /usr/local/cuda,
    or the folder above nvcc's (nvcc may be a wrapper script elsewhere, as /usr/local/bin/nvcc)."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
    candidates = [os.environ.get("CUDA_HOME"), CUDA_HOME, "/usr/local/cuda",
                  nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    for candidate in filter(None, candidates):
        if os.path.isfile(os.path.join(candidate, "include", "cuda_runtime_api.h")):
            return candidate
    sys.exit(f"gpu_env: no CUDA toolkit with include/cuda_runtime_api.h among {candidates}")


def tool_line(cmd: list) -> str:
    """The last non-empty line a tool prints (nvcc's release line), or why there is none."""
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]} not found"
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln.strip() for ln in (done.stdout or done.stderr).splitlines() if ln.strip()]
    return lines[-1] if lines else f"{cmd[0]} printed nothing (exit {done.returncode})"


def facts() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True) if shutil.which("git") else None
    out = {"commit": commit.stdout.strip() if commit and commit.returncode == 0 else "unknown",
           "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cpus": os.cpu_count(),
           "host": platform.platform()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(device=props.name, capability=arch(), cuda_home=cuda_home(),
                   multiprocessors=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1),
                   cudnn=torch.backends.cudnn.version(),
                   driver=tool_line(["nvidia-smi", "--query-gpu=driver_version",
                                         "--format=csv,noheader"]),
                   nvcc=tool_line([os.environ.get("NVCC", "nvcc"), "--version"]),
                   ninja=shutil.which("ninja") or "not found: the build compiles a file at a time")
    else:
        out["device"] = "none (CPU only)"
    return out


def check_ops(device: str) -> None:
    """Exits 1 naming the raw ops without a kernel for the device's dispatch key, among those of the
    ops that have kernels of their own (the registry's `cuda` ops; the others are composed of
    them and run wherever they do)."""
    import pygpt.ops  # noqa: F401  (loads pygpt._C, which registers the ops)
    from pygpt.ops.registry import OPS

    key = "CUDA" if device == "cuda" else "CPU"
    wanted = [raw for op in OPS if op.cuda for raw in op.raw_ops]
    missing = [raw for raw in wanted
               if not torch._C._dispatch_has_kernel_for_dispatch_key(f"pygpt::{raw}", key)]
    if missing:
        sys.exit(f"no {key} kernel registered for {', '.join(missing)}")
    print(f"{len(wanted)} ops have {key} kernels registered (torch {torch.__version__})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--arch", action="store_true", help="print GPU 0's compute capability")
    what.add_argument("--cuda-home", action="store_true",
                      help="print the CUDA toolkit root to build against")
    what.add_argument("--json", metavar="PATH", help="write the machine's facts to PATH")
    what.add_argument("--check-ops", choices=["cuda", "cpu"],
                      help="check that the built extension registers the ops for this device")
    args = p.parse_args()
    if args.arch:
        print(arch())
    elif args.cuda_home:
        print(cuda_home())
    elif args.json:
        info = facts()
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(info, f, indent=1)
        print(json.dumps(info))
    else:
        check_ops(args.check_ops)


if __name__ == "__main__":
    main()
