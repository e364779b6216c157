"""ds_acco: ACCO (Accumulate While You Communicate) for DeepSpeed and PyTorch FSDP jobs."""

from setuptools import find_packages, setup

setup(
    name="ds_acco",
    version="0.1.0",
    description="Hide data-parallel communication behind computation in DeepSpeed and PyTorch FSDP training (ACCO).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ds_acco", "ds_acco.*"]),
    python_requires=">=3.10",
    install_requires=[
        # Install torch==2.13.0 first (see README); this range never pulls a newer build.
        "torch>=2.6,<2.14",
        # The DeepSpeed internals the adapter relies on are checked against these releases.
        "deepspeed>=0.19.0,<0.20",
        "pydantic>=2",
        "tqdm",
        # XXH3 hashes checkpoint files for their manifests ~4x faster than zlib.crc32 (the fallback).
        "xxhash>=3",
    ],
    entry_points={"console_scripts": ["ds_acco-run = ds_acco.run:main"]},
    extras_require={
        "mpi": ["mpi4py>=4", "mpich"],
        "hf": ["transformers>=4.46", "accelerate"],
        "bench": ["matplotlib"],
        # The benchmarks' external peer (examples/train_lm_torchft.py); pinned: its DiLoCo API is experimental.
        # About 3 MB with its OpenTelemetry dependencies; the tests run it, so dev installs it too.
        "peer": ["torchft==0.2.0"],
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.5", "hypothesis", "matplotlib", "torchft==0.2.0"],
    },
)
