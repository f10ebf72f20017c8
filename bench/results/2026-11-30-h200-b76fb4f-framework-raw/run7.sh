#!/bin/bash
# device run 7 (2026-11-30, nvidia-h200): the final tree's replayed steps beside PyTorch
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels_replayed,torch_dedup SOK1X_FRAMEWORK_ARGS="--repeats 5" SOK1X_FRAMEWORK_LIMIT_S=80 bash bench/pass.sh --limit 470 framework=dlrm,dlrm26,dlrm26_hash,dlrm26_full
