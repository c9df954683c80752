"""Builds pygpt and its C++ extension `pygpt._C` (the kernels, registered as torch.ops.pygpt.*).

The extension compiles against a PyTorch that the build imports: `pip install .` builds in an
isolated environment with the torch pyproject.toml pins, `pip install --no-build-isolation .`
against the torch already installed. Either way the package then requires exactly that torch
release (install_requires torch==<its public version>), and pygpt/_build_info.py records the
version, which `import pygpt` checks against the running torch.

Besides pygpt, the build installs pygpt_runtime (export/pygpt_runtime, the torch-free ONNX
runner that pygpt's own code imports, with the server's playground page) and the console
commands pygpt-train, pygpt-generate, pygpt-export, pygpt-classify, pygpt-tag, pygpt-answer,
pygpt-fill-mask, pygpt-translate, pygpt-run and pygpt-serve (whose FastAPI, uvicorn and prometheus_client the
"serve" extra adds).

The CPU kernels (csrc/cpu) are compiled once per instruction set, on x86-64 for the baseline,
AVX2 + FMA (x86-64-v3) and AVX-512 (x86-64-v4), and the first kernel call picks the best one the
CPU runs (csrc/dispatch): one build runs, and runs well, on every x86-64 machine. Each ISA's
objects are merged into one relocatable object whose only global symbol is its kernel table, so
no two ISAs' copies of an inline or template function can be mixed up by the linker. Elsewhere
(ARM) the kernels are compiled once, for the baseline.

Environment:
    PYGPT_CUDA=0|1        leave out / force the CUDA kernels (default: built when torch is a
                          CUDA build and the CUDA toolkit is found). TORCH_CUDA_ARCH_LIST picks
                          the GPU architectures, e.g. "8.0;9.0".
"""
import glob
import importlib.util
import os
import platform
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

INSTALL_HINT = (
    "pygpt compiles its kernels against an installed PyTorch, which this build environment lacks.\n"
    "Build in pip's isolated environment (`pip install .`), or install torch first and build\n"
    "without isolation:\n\n"
    "    pip install torch==2.13.0 && pip install --no-build-isolation .\n"
)

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit(INSTALL_HINT)


# pygpt-serve's (export/pyproject.toml's "serve")
SERVE = ["fastapi>=0.110", "uvicorn[standard]>=0.29", "prometheus_client>=0.20"]
BUILD_INFO = "_build_info.py"  # written beside pygpt/_C, read by pygpt/__init__.py


def torch_release() -> str:
    """The public version of the torch being built against ("2.13.0" for "2.13.0+cpu"): what the
    package requires, since pip's `torch==2.13.0` accepts every local build of that release."""
    return str(torch.__version__).split("+")[0]


def build_cuda() -> bool:
    """The CUDA kernels join the build when torch is a CUDA build and nvcc's toolkit is found;
    PYGPT_CUDA=1 forces them (and fails clearly when that is impossible), PYGPT_CUDA=0 leaves
    them out."""
    wanted = os.environ.get("PYGPT_CUDA", "auto")
    possible = torch.version.cuda is not None and CUDA_HOME is not None
    if wanted == "1" and not possible:
        sys.exit(f"PYGPT_CUDA=1, but the CUDA kernels cannot be built here: torch {torch.__version__} "
                 f"is {'a CUDA' if torch.version.cuda else 'a CPU-only'} build and CUDA_HOME is "
                 f"{CUDA_HOME or 'not found'}. Install a CUDA build of torch and the CUDA toolkit, "
                 "or unset PYGPT_CUDA.")
    if wanted not in ("auto", "0", "1"):
        sys.exit(f"PYGPT_CUDA must be 0, 1 or unset, got {wanted!r}")
    return possible if wanted == "auto" else wanted == "1"


def pip_cuda_include_dirs() -> list:
    """Headers of the CUDA libraries that torch's pip wheels install (site-packages/nvidia/*/
    include): ATen's CUDA headers include cuBLAS and cuSPARSE ones, which a minimal CUDA toolkit
    may lack."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(d for root in spec.submodule_search_locations
                  for d in glob.glob(os.path.join(root, "*", "include")))


CXX_ARGS = ["-O3", "-g0", "-fopenmp"]
# The kernels' own flags; keep in step with CMakeLists.txt. -fno-trapping-math lets GCC turn the
# selects of their branch-free math (exp_fast's range clamps) into blends: without it, AVX2 code
# (which has no mask registers) leaves the softmax's exp loop scalar.
KERNEL_ARGS = CXX_ARGS + ["-fno-trapping-math"]
CPU_ISAS = ({"avx512": ["-march=x86-64-v4", "-mprefer-vector-width=512"],
             "avx2": ["-march=x86-64-v3"], "base": []}
            if platform.machine().lower() in ("x86_64", "amd64") else {"base": []})


def torch_libstdcxx() -> list:
    """Link flags naming the libstdc++ this process (torch) has loaded, so the extension uses that
    very library. A compiler that can only link libstdc++ statically (one seen on a GPU machine's
    image) otherwise puts a private copy of some of libstdc++ into the extension: its streams'
    locale was never set up there, and the first error message that formats a number crashed the
    process. Where the compiler links libstdc++ as a shared library anyway, this changes nothing."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            loaded = {line.split()[-1] for line in f if "/libstdc++.so" in line}
    except OSError:
        return []
    return ["-Wl,--push-state,--no-as-needed", min(loaded), "-Wl,--pop-state"] if loaded else []


def kernel_extension():
    """The torch bindings (csrc/bindings; the *_cuda.cpp ones only in a CUDA build), the ISA
    dispatcher (csrc/dispatch) and, in a CUDA build, the CUDA kernels (csrc/cuda). The CPU kernels
    join as one object per ISA (BuildWithCpuIsas)."""
    cuda = build_cuda()
    bindings = [f for f in glob.glob("csrc/bindings/*.cpp") if cuda or not f.endswith("_cuda.cpp")]
    sources = sorted(bindings + glob.glob("csrc/dispatch/*.cpp"))
    common = dict(name="pygpt._C", include_dirs=[os.path.abspath("csrc")],
                  extra_link_args=["-fopenmp", *torch_libstdcxx()], py_limited_api=True)
    if not cuda:
        return CppExtension(sources=sources, extra_compile_args=CXX_ARGS, **common)
    common["include_dirs"] += pip_cuda_include_dirs()
    return CUDAExtension(sources=sources + sorted(glob.glob("csrc/cuda/*.cu")),
                         extra_compile_args={"cxx": CXX_ARGS, "nvcc": ["-O3"]}, **common)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        sys.exit(f"building pygpt's CPU kernels needs `{name}` (GNU binutils), which is not on "
                 "PATH; install binutils")
    return path


class BuildWithCpuIsas(BuildExtension):
    """Compiles csrc/cpu/*.cpp once per ISA of CPU_ISAS (-DPYGPT_CPU_ISA=<isa> puts each copy in
    its own namespace), merges each ISA's objects with `ld -r` (section groups dissolved, so no
    inline function is shared across ISAs) and keeps only its kernel table global (objcopy)."""

    def run(self):
        super().run()
        if self.inplace:  # --inplace and editable installs: the source tree is the package
            self.write_build_info(self.get_finalized_command("build_py").get_package_dir("pygpt"))

    def build_extension(self, ext):
        self.write_build_info(os.path.dirname(self.get_ext_fullpath(ext.name)))
        ext.extra_objects = [self.isa_object(isa, flags) for isa, flags in CPU_ISAS.items()]
        super().build_extension(ext)

    @staticmethod
    def write_build_info(package_dir: str) -> None:
        """pygpt/_build_info.py beside the extension: the torch version it is compiled against."""
        os.makedirs(package_dir, exist_ok=True)
        with open(os.path.join(package_dir, BUILD_INFO), "w", encoding="utf-8") as f:
            f.write('"""Written by setup.py when it built pygpt._C: the torch it was compiled '
                    'against."""\n'
                    f"TORCH_VERSION = {str(torch.__version__)!r}\n")

    def isa_object(self, isa: str, flags: list) -> str:
        out = os.path.join(self.build_temp, "cpu_isa", isa)
        objects = self.compiler.compile(sorted(glob.glob("csrc/cpu/*.cpp")), output_dir=out,
                                        macros=[("PYGPT_CPU_ISA", isa)],
                                        include_dirs=[os.path.abspath("csrc")],
                                        extra_postargs=KERNEL_ARGS + flags)
        merged = os.path.join(out, f"pygpt_cpu_kernels_{isa}.o")
        subprocess.check_call([tool("ld"), "-r", "--force-group-allocation", "-o", merged,
                               *objects])
        subprocess.check_call([tool("objcopy"), f"--keep-global-symbol=pygpt_cpu_kernels_{isa}",
                               merged])
        return merged


setup(
    name="pygpt",
    version="0.1.0",
    description="A small GPT trained and served on its own C++ kernels",
    packages=find_packages(include=["pygpt", "pygpt.*"]) + ["pygpt_runtime", "pygpt_runtime.serve"],
    package_dir={"pygpt_runtime": "export/pygpt_runtime"},
    package_data={"pygpt": ["corpus/tinyshakespeare.txt"], "pygpt_runtime.serve": ["playground/*"]},
    python_requires=">=3.9",
    # Exactly the torch release the extension is compiled against (import pygpt refuses another).
    install_requires=[f"torch=={torch_release()}", "numpy", "safetensors", "tqdm",
                      "tokenizers", "onnx", "onnxscript", "onnxruntime", "matplotlib",
                      "sacrebleu>=2.4"],
    extras_require={
        "serve": SERVE,
        # the server's tests: an HTTP client, OpenAI's client, a browser driver (Debian's
        # chromium and chromium-driver drive it; .ci/run installs them)
        "test": ["pytest", "hypothesis", *SERVE, "httpx>=0.28", "openai>=1.0",
                 "selenium>=4.20", "transformers>=5.24", "seqeval>=1.2"]},
    entry_points={"console_scripts": [
        "pygpt-train=pygpt.train:main", "pygpt-generate=pygpt.generate:main",
        "pygpt-export=pygpt.export:main", "pygpt-classify=pygpt.classify:main",
        "pygpt-tag=pygpt.tag:main", "pygpt-answer=pygpt.answer:main",
        "pygpt-fill-mask=pygpt.fill_mask:main", "pygpt-translate=pygpt.translate:main",
        "pygpt-run=pygpt_runtime.command:main", "pygpt-serve=pygpt_runtime.serve.command:main"]},
    ext_modules=[kernel_extension()],
    cmdclass={"build_ext": BuildWithCpuIsas},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
