"""sok1x's CUDA kernels: the .cu sources (package data, one file per kernel family) and the one
helper that compiles and loads them (compiler.py).

Installed as `sok1x.cuda_kernels`. Importing it needs neither PyCUDA nor a GPU (only
load_module() does), so CPU-only tools can list and compile the sources.

    source_names()          the kernel families, e.g. ["hash_table.cu", "routing.cu", ...]
    compile_cubin(name, arch, options=())      nvcc -> cubin bytes, through the disk cache
    load_module(name, options=())              pycuda Module for the current context's device
    load_every_kernel(names)                   every kernel of those families loaded, at init
"""
import os

from .compiler import (  # noqa: F401  (the package's API)
    KERNEL_DIR,
    KernelCompileError,
    compile_cubin,
    compile_text,
    find_nvcc,
    load_every_kernel,
    load_module,
    nvcc_architectures,
)


def source_names():
    """Returns the sorted file names of the kernel families (.cu) shipped with the package."""
    return sorted(name for name in os.listdir(KERNEL_DIR) if name.endswith(".cu"))


def header_names():
    """Returns the sorted file names of the shared headers (.cuh)."""
    return sorted(name for name in os.listdir(KERNEL_DIR) if name.endswith(".cuh"))
