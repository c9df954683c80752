"""Builds pygpt and its C++ extension `pygpt._C` (the kernels, registered as torch.ops.pygpt.*).

The extension compiles against the PyTorch already installed, so the build must see it:

    pip install torch==2.13.0 && pip install --no-build-isolation .

Environment:
    PYGPT_NATIVE_ARCH=0   build for the generic x86-64/ARM baseline instead of -march=native
                          (use it when the built package will run on another machine).
"""
import glob
import os
import sys

from setuptools import find_packages, setup

INSTALL_HINT = (
    "pygpt compiles its kernels against an installed PyTorch, which this build environment lacks.\n"
    "Install torch first and build without isolation:\n\n"
    "    pip install torch==2.13.0 && pip install --no-build-isolation .\n"
)

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit(INSTALL_HINT)


def kernel_extension() -> CppExtension:
    """The CPU build: framework-free kernels in csrc/cpu plus their torch bindings."""
    sources = sorted(glob.glob("csrc/cpu/*.cpp") + glob.glob("csrc/bindings/*.cpp"))
    # Keep in step with the kernel flags in CMakeLists.txt (-fno-trapping-math lets GCC vectorise
    # the exp loops).
    compile_args = ["-O3", "-g0", "-fopenmp", "-fno-trapping-math"]
    if os.environ.get("PYGPT_NATIVE_ARCH", "1") != "0":
        compile_args.append("-march=native")
    return CppExtension(
        name="pygpt._C",
        sources=sources,
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args=compile_args,
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )


setup(
    name="pygpt",
    version="0.1.0",
    description="A small GPT trained and served on its own C++ kernels",
    packages=find_packages(include=["pygpt", "pygpt.*"]),
    package_data={"pygpt": ["data/tinyshakespeare.txt"]},
    python_requires=">=3.9",
    # Built against the installed torch; any version in this range that is already installed
    # satisfies it, so pip never downloads another one. Rebuild after upgrading torch.
    install_requires=["torch>=2.13.0,<2.15", "numpy", "safetensors", "tqdm",
                      "tokenizers", "onnx", "onnxscript", "onnxruntime", "matplotlib"],
    extras_require={"test": ["pytest"]},
    ext_modules=[kernel_extension()],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
