"""Installs sok1x as one package: cuda_kernels, graph_ops and launch become sok1x subpackages."""
from setuptools import setup

PACKAGES = {
    "sok1x": "sok1x",
    "sok1x.comm": "sok1x/comm",
    "sok1x.backend": "sok1x/backend",
    "sok1x.backend.cpu": "sok1x/backend/cpu",
    "sok1x.backend.cuda": "sok1x/backend/cuda",
    "sok1x.engine": "sok1x/engine",
    "sok1x.engine.lookup": "sok1x/engine/lookup",
    "sok1x.engine.tables": "sok1x/engine/tables",
    "sok1x.engine.checkpoint": "sok1x/engine/checkpoint",
    "sok1x.common": "sok1x/common",
    "sok1x.v1": "sok1x/v1",
    "sok1x.v2": "sok1x/v2",
    "sok1x.deeprec": "sok1x/deeprec",
    "sok1x.optimizers": "sok1x/optimizers",
    "sok1x.tf": "sok1x/tf",
    "sok1x.tf.keras": "sok1x/tf/keras",
    "sok1x.core": "sok1x/core",
    "sok1x.embeddings": "sok1x/embeddings",
    "sok1x.experiment": "sok1x/experiment",
    "sok1x.operations": "sok1x/operations",
    "sok1x.saver": "sok1x/saver",
    "sok1x.cuda_kernels": "cuda_kernels",
    "sok1x.graph_ops": "graph_ops",
    "sok1x.launch": "launch",
}

setup(
    name="sok1x",
    version="0.1.0",
    description="Model-parallel GPU embedding tables for TensorFlow 1.x-style training programs "
    "(SparseOperationKit's API)",
    python_requires=">=3.7",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    package_data={"sok1x.cuda_kernels": ["*.cu", "*.cuh", "*.c"], "sok1x.graph_ops": ["*.cc"]},
    install_requires=["numpy>=1.17", "mpi4py>=3"],
    extras_require={
        "gpu": ["pycuda"],
        "test": ["pytest", "pytest-timeout", "vermin"],
    },
    entry_points={"console_scripts": ["sok1x-run = sok1x.launch.runner:main",
                                      "sok1x-build-ops = sok1x.graph_ops.op_library:main"]},
)
