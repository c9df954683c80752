"""benchmarks/gpu_sass.py, the GPU check's reading of the attention kernels' machine code, on
cuobjdump's own output (copied from `cuobjdump -res-usage` and `-sass` of attention_tc.cu built
by nvcc 13.0 for sm_90, cut short): each kernel's registers, stack, local memory and counts of
HMMA, LDSM and LDGSTS, per architecture; the table names kernels demangled; and the check fails
when no tensor-core kernel holds an HMMA."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_sass  # noqa: E402

TC = ("_ZN5pygpt4cuda48_GLOBAL__N__d847ab2c_15_attention_tc_cu_8b4bed3227attention_forward_tc_"
      "kernelI6__halfLi128EEEvNS1_8TcParamsE")
OLD = "_ZN5pygpt4cuda16attention_kernelILi64EEEvPKfS3_"
# What both outputs begin with, for each architecture in the binary.
HEADER = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit
"""

USAGE = HEADER + f"""
Resource usage:
 Common:
  GLOBAL:0
 Function {TC}:
  REG:170 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:648 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {OLD}:
  REG:124 STACK:16 SHARED:0 LOCAL:24 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

SASS = HEADER + f"""
\tcode for sm_90
\t.target\tsm_90

\t\tFunction : {TC}
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                      /* 0x00000a00ff017b82 */
                                                                                               /* 0x000fe20000000800 */
        /*0060*/              @!P0 BRA 0x180 ;                                                 /* 0x0000000000448947 */
        /*10d0*/                   LDGSTS.E.BYPASS.128 [R7], desc[UR20][R4.64], P0 ;           /* 0x0000000004077fae */
        /*1640*/                   LDGSTS.E.BYPASS.128 [R19], desc[UR20][R10.64], P0 ;         /* 0x000000000a137fae */
        /*2000*/                   LDSM.16.M88.4 R40, [R3] ;                                   /* 0x000000000328783b */
        /*2010*/                   LDSM.16.MT88.4 R44, [R5+0x800] ;                            /* 0x000800000528783b */
        /*54e0*/                   HMMA.16816.F32 R64, R40.reuse, R44, RZ ;                    /* 0x0000002c2840723c */
        /*54f0*/                   HMMA.16816.F32 R76, R40, R128, RZ ;                         /* 0x00000080284c723c */
        /*5510*/                   HMMA.16816.F32 R64, R36.reuse, R46, R64 ;                   /* 0x0000002e2440723c */
\t\t..........

\t\tFunction : {OLD}
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                      /* 0x00000a00ff017b82 */
        /*0010*/                   FFMA R3, R4, R5, R3 ;                                       /* 0x0000000504037223 */
\t\t..........
"""


def test_each_kernel_has_its_resources_and_instruction_counts():
    found = {k.name: k for k in gpu_sass.kernels(USAGE, SASS, "attention")}
    assert set(found) == {TC, OLD}
    tc, old = found[TC], found[OLD]
    assert (tc.arch, tc.registers, tc.stack, tc.shared, tc.local) == ("sm_90", 170, 0, 1024, 0)
    assert tc.counts == {"HMMA": 3, "LDSM": 2, "LDGSTS": 2}
    assert (old.registers, old.stack, old.local) == (124, 16, 24)
    assert old.counts == {"HMMA": 0, "LDSM": 0, "LDGSTS": 0}
    assert gpu_sass.kernels(USAGE, SASS, "layer_norm") == []


def test_the_table_names_kernels_demangled():
    rows = gpu_sass.table(gpu_sass.kernels(USAGE, SASS, "attention"))  # c++filt: binutils
    assert ("| sm_90 | `attention_forward_tc_kernel<__half, 128>` | 170 | 0 | 0 | 1024 | 3 | 2 | "
            "2 |") in rows


def fake_cuobjdump(tmp_path, sass: str) -> Path:
    """A cuobjdump that prints USAGE for -res-usage and sass for -sass."""
    (tmp_path / "usage.txt").write_text(USAGE)
    (tmp_path / "sass.txt").write_text(sass)
    tool = tmp_path / "cuobjdump"
    tool.write_text(f'#!/bin/sh\n[ "$1" = -res-usage ] && cat {tmp_path}/usage.txt || '
                    f'cat {tmp_path}/sass.txt\n')
    tool.chmod(0o755)
    return tool


@pytest.mark.parametrize("hmma, code", [(True, 0), (False, 1)])
def test_the_check_needs_hmma_in_a_tensor_core_kernel(tmp_path, hmma, code):
    sass = SASS if hmma else SASS.replace("HMMA.16816.F32", "FFMA")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_sass.py"), "--table",
                           str(tmp_path / "sass.md"), "--binary", str(tmp_path / "usage.txt"),
                           "--cuobjdump", str(fake_cuobjdump(tmp_path, sass))],
                          capture_output=True, text=True)
    assert done.returncode == code, done.stderr
    assert (tmp_path / "sass.md").read_text().count("\n") == 4  # header, rule, two kernels
    if not hmma:
        assert "no tensor-core attention kernel with HMMA instructions" in done.stderr
