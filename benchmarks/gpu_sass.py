"""The attention kernels' machine code in the built CUDA extension, for benchmarks/gpu_check.sh:
per kernel (each template instance, each GPU architecture in the binary) its registers, stack
and local memory a thread (register spills show as STACK or LOCAL above 0), from `cuobjdump
-res-usage`, the same figures as `nvcc -Xptxas -v`; and how many tensor-core matrix products
(HMMA), ldmatrix loads (LDSM) and cp.async copies (LDGSTS) its SASS holds, from `cuobjdump
-sass`. Writes a markdown table; exits 1 when no tensor-core attention kernel (a name with
"_tc_") holds an HMMA, which is what the tensor-core kernels must show.

    python benchmarks/gpu_sass.py --table sass.md [--binary pygpt/_C.abi3.so] [--cuobjdump PATH]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

COUNTED = ("HMMA", "LDSM", "LDGSTS")  # the SASS opcodes counted, by prefix
ARCH = re.compile(r"^arch = (sm_\w+)")
RESOURCES = re.compile(r"^\s*Function (\S+):\s*$")
USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


class Kernel(NamedTuple):
    arch: str
    name: str  # mangled
    registers: int
    stack: int
    shared: int  # static shared memory (bytes); the dynamic part is set at launch
    local: int
    counts: dict[str, int]


def resource_usage(text: str) -> dict[tuple[str, str], tuple[int, int, int, int]]:
    """(arch, mangled name) -> (registers, stack, static shared, local) of `cuobjdump
    -res-usage`'s output."""
    found, arch, name = {}, "", None
    for line in text.splitlines():
        if m := ARCH.match(line):
            arch = m.group(1)
        elif m := RESOURCES.match(line):
            name = m.group(1)
        elif name is not None and (m := USAGE.search(line)):
            found[arch, name] = tuple(int(g) for g in m.groups())
            name = None
    return found


def opcode_counts(text: str) -> dict[tuple[str, str], dict[str, int]]:
    """(arch, mangled name) -> the number of each COUNTED opcode in its SASS (`cuobjdump -sass`'s
    output)."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    arch, current = "", None
    for line in text.splitlines():
        if m := ARCH.match(line):
            arch = m.group(1)
        elif m := SASS_FUNCTION.match(line):
            current = found.setdefault((arch, m.group(1)), dict.fromkeys(COUNTED, 0))
        elif current is not None and (m := INSTRUCTION.match(line)):
            opcode = m.group(1)
            for prefix in COUNTED:
                if opcode == prefix or opcode.startswith(prefix + "."):
                    current[prefix] += 1
    return found


def kernels(usage_text: str, sass_text: str, match: str) -> list[Kernel]:
    """The kernels whose mangled name holds match, with their resources and opcode counts."""
    usage, counts = resource_usage(usage_text), opcode_counts(sass_text)
    return [Kernel(arch, name, *usage[arch, name], counts.get((arch, name),
                                                              dict.fromkeys(COUNTED, 0)))
            for arch, name in sorted(usage) if match in name]


def readable(names: list[str]) -> dict[str, str]:
    """Each mangled name demangled by c++filt (where it is installed), without its namespaces
    and parameters: "attention_forward_tc_kernel<__half, 128>"."""
    filt = shutil.which("c++filt")
    plain = (subprocess.run([filt], input="\n".join(names), capture_output=True, text=True,
                            check=True).stdout.splitlines() if filt and names else names)
    out = {}
    for mangled, name in zip(names, plain):
        name = re.sub(r"^(?:void )?(?:[\w:]*::)?(?:\(anonymous namespace\)::)?", "", name)
        out[mangled] = re.sub(r"\(.*\)$", "", name)  # without the parameters
    return out


def table(found: list[Kernel]) -> list[str]:
    names = readable([k.name for k in found])
    rows = ["| arch | kernel | registers | stack | local | static shared | HMMA | LDSM | LDGSTS |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    rows += [f"| {k.arch} | `{names[k.name]}` | {k.registers} | {k.stack} | {k.local} | "
             f"{k.shared} | {k.counts['HMMA']} | {k.counts['LDSM']} | {k.counts['LDGSTS']} |"
             for k in found]
    return rows


def extension() -> Optional[Path]:
    """The extension built in place (pygpt/_C*.so), if there is one."""
    built = sorted(Path(__file__).resolve().parents[1].joinpath("pygpt").glob("_C*.so"))
    return built[0] if built else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, required=True, help="the markdown table to write")
    p.add_argument("--binary", type=Path, default=None,
                   help="the binary to read (default: the extension built in place)")
    p.add_argument("--cuobjdump", default=None,
                   help="the tool (default: $CUDA_HOME/bin/cuobjdump, else on PATH)")
    p.add_argument("--match", default="attention", help="kernels whose name holds this")
    args = p.parse_args()
    binary = args.binary or extension()
    home = os.environ.get("CUDA_HOME")
    tool = args.cuobjdump or (str(Path(home) / "bin" / "cuobjdump") if home and
                              (Path(home) / "bin" / "cuobjdump").exists()
                              else shutil.which("cuobjdump"))
    if binary is None or tool is None:
        sys.exit(f"error: {'no extension built in place' if binary is None else 'no cuobjdump'}")
    dump = [subprocess.run([tool, flag, str(binary)], capture_output=True, text=True,
                           check=True).stdout for flag in ("-res-usage", "-sass")]
    found = kernels(*dump, args.match)
    rows = table(found)
    args.table.write_text("\n".join(rows) + "\n", encoding="utf-8")
    print("\n".join(rows))
    if not any("_tc_" in k.name and k.counts["HMMA"] for k in found):
        sys.exit(f"error: no tensor-core {args.match} kernel with HMMA instructions in {binary}")


if __name__ == "__main__":
    main()
