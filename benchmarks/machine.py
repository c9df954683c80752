"""What the benchmarks say about the machine they run on, and the header and work folder every
end-to-end benchmark (bench_bert, bench_positions, bench_translate) starts with."""
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch


def busy_warning(threads):
    """Other work on the machine: runs with more threads than idle cores are not meaningful
    (intra-op threads wait at every op's barrier for a thread that is descheduled)."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load + max(threads) > cpus + 0.5:
        print(f"# WARNING: load average {load:.1f} on {cpus} CPUs before starting: timings with "
              f"more threads than idle cores ({max(0.0, cpus - load):.1f}) are unreliable")


def cpu_model() -> str:
    """lscpu's model name and the widest x86 vector ISA it lists (AVX-512 or AVX2), since the
    same model name covers machines with either."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = fields.get("Model name", platform.machine()).strip()
    flags = fields.get("Flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    return f"{name} ({isa})" if isa else name


def run_benchmark(name: str, args, bench: Callable, threads: str,
                  notes: Sequence[str] = (), folder_note: str = "logs in logs/") -> None:
    """Prints what ran where (command, CPU, threads, versions, `notes`), then bench(args, folder)
    in args.workdir (kept) or a temporary folder (removed)."""
    print(f"# {name}: " + shlex.join([sys.executable, *sys.argv]))
    print(f"# CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; threads: {threads}; "
          f"Python {platform.python_version()}, torch {torch.__version__}, {platform.platform()}")
    for note in notes:
        print(f"# {note}")
    if args.quick:
        print("# --quick: a smoke test; the numbers below mean nothing")
    if args.workdir is not None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        print(f"# workdir: {args.workdir} ({folder_note})")
        bench(args, Path(args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as work:
            bench(args, Path(work))


# What ATen and MKL are told for each of our ISAs, so that a forced ISA compares like with like.
ATEN_FOR_ISA = {"avx512": ("avx512", "AVX512"), "avx2": ("avx2", "AVX2"), "base": ("default", "SSE4_2")}


def use_isa(isa) -> None:
    """Runs our CPU kernels with `isa` (None: the best this CPU runs, nothing changed) and ATen
    and MKL with the same ISA: the process re-executes itself once with ATEN_CPU_CAPABILITY and
    MKL_ENABLE_INSTRUCTIONS set, since both read them at start-up."""
    if isa is None:
        return
    aten, mkl = ATEN_FOR_ISA[isa]
    wanted = {"ATEN_CPU_CAPABILITY": aten, "MKL_ENABLE_INSTRUCTIONS": mkl}
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})
    from pygpt import cpu_isa

    cpu_isa.set_isa(isa)


def isa_note() -> str:
    """Which ISA our kernels, ATen and MKL run with, for a benchmark's header."""
    from pygpt import cpu_isa

    return (f"our kernels: {cpu_isa.active()} (this CPU runs {', '.join(cpu_isa.supported())}); "
            f"ATen: {torch.backends.cpu.get_cpu_capability()}; MKL_ENABLE_INSTRUCTIONS="
            f"{os.environ.get('MKL_ENABLE_INSTRUCTIONS', 'unset')}")
