#!/bin/bash
# device run 1 (2026-11-30, nvidia-h200): the framework pass, every workload but mlperf26
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels,sok1x_kernels_replayed,torch_dedup SOK1X_FRAMEWORK_ARGS="--repeats 5" SOK1X_FRAMEWORK_LIMIT_S=90 bash bench/pass.sh --limit 575 framework=seed,dlrm,dlrm26,dlrm26_hash,dlrm26_dynamic,dlrm26_hybrid,dlrm26_split,dlrm26_full
