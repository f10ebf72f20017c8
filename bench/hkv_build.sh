#!/bin/bash
# Builds bench/kernels/hkv_grid.cu against a HierarchicalKV checkout into one binary that
# bench/dynamic_table.py --hkv runs beside sok1x (a measuring reference; nothing of it is in
# sok1x). HKV is header-only: no cmake, one nvcc call (~minutes on 2 cores):
#     bash bench/hkv_build.sh HKV_CHECKOUT OUT_BINARY
# HKV_CHECKOUT: github.com/NVIDIA-Merlin/HierarchicalKV (measured at ae24eec, 2026-05-13); its
# include/ and benchmark/ folders are all the build reads.
set -euo pipefail
hkv=${1:?HierarchicalKV checkout}
out=${2:?output binary}
here=$(cd "$(dirname "$0")" && pwd)
nvcc -O3 -std=c++17 -arch=sm_90 --cudart static -w \
    -I"$hkv/include" -I"$hkv/benchmark" "$here/kernels/hkv_grid.cu" -o "$out"
