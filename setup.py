"""Builds pygpt and its C++ extension `pygpt._C` (the kernels, registered as torch.ops.pygpt.*).

The extension compiles against the PyTorch already installed, so the build must see it:

    pip install torch==2.13.0 && pip install --no-build-isolation .

Environment:
    PYGPT_NATIVE_ARCH=0   build for the generic x86-64/ARM baseline instead of -march=native
                          (use it when the built package will run on another machine).
    PYGPT_CUDA=0|1        leave out / force the CUDA kernels (default: built when torch is a
                          CUDA build and the CUDA toolkit is found). TORCH_CUDA_ARCH_LIST picks
                          the GPU architectures, e.g. "8.0;9.0".
"""
import glob
import importlib.util
import os
import sys

from setuptools import find_packages, setup

INSTALL_HINT = (
    "pygpt compiles its kernels against an installed PyTorch, which this build environment lacks.\n"
    "Install torch first and build without isolation:\n\n"
    "    pip install torch==2.13.0 && pip install --no-build-isolation .\n"
)

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit(INSTALL_HINT)


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


def kernel_extension():
    """The framework-free kernels (csrc/cpu, and csrc/cuda in a CUDA build) plus their torch
    bindings (csrc/bindings; the *_cuda.cpp ones only in a CUDA build)."""
    cuda = build_cuda()
    bindings = [f for f in glob.glob("csrc/bindings/*.cpp") if cuda or not f.endswith("_cuda.cpp")]
    sources = sorted(glob.glob("csrc/cpu/*.cpp") + bindings)
    # Keep in step with the kernel flags in CMakeLists.txt.
    cxx_args = ["-O3", "-g0", "-fopenmp"]
    if os.environ.get("PYGPT_NATIVE_ARCH", "1") != "0":
        cxx_args.append("-march=native")
    common = dict(name="pygpt._C", include_dirs=[os.path.abspath("csrc")],
                  extra_link_args=["-fopenmp"], py_limited_api=True)
    if not cuda:
        return CppExtension(sources=sources, extra_compile_args=cxx_args, **common)
    common["include_dirs"] += pip_cuda_include_dirs()
    return CUDAExtension(sources=sources + sorted(glob.glob("csrc/cuda/*.cu")),
                         extra_compile_args={"cxx": cxx_args, "nvcc": ["-O3"]}, **common)


setup(
    name="pygpt",
    version="0.1.0",
    description="A small GPT trained and served on its own C++ kernels",
    packages=find_packages(include=["pygpt", "pygpt.*"]),
    package_data={"pygpt": ["corpus/tinyshakespeare.txt"]},
    python_requires=">=3.9",
    # Built against the installed torch; any version in this range that is already installed
    # satisfies it, so pip never downloads another one. Rebuild after upgrading torch.
    install_requires=["torch>=2.13.0,<2.15", "numpy", "safetensors", "tqdm",
                      "tokenizers", "onnx", "onnxscript", "onnxruntime", "matplotlib",
                      "sacrebleu>=2.4"],
    extras_require={"test": ["pytest"]},
    ext_modules=[kernel_extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
