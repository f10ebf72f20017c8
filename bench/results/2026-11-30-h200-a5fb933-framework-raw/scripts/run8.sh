#!/bin/bash
# device run 8 (2026-11-30, nvidia-h200): more replayed classes in one step than are kept
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp && PYTHONPATH=/tmp/site timeout 240 python3 -m pytest -q -p no:cacheprovider -x $repo/tests/gpu/test_replayed_step_cuda.py -k "more_classes or shape_classes or bit_for_bit" 2>&1 | tail -25
