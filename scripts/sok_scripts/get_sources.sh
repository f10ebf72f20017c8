#!/usr/bin/env bash
# Puts SOK's own test scripts, the ones run.py runs on sok1x, into DEST from a HugeCTR clone:
#     bash scripts/sok_scripts/get_sources.sh HUGECTR_CLONE DEST
# v1/: the TF1 demo tests of SOK's v1 API (unit_test/test_scripts/tf1), as of the commit before
#      SOK's v1 was removed (7db464771, "Sok experiment to offical"); v2/: the function tests of
#      its v2 API (sparse_operation_kit/test/function_test) as of 2f2016fa8, the commit the
#      counts in docs/migration.md were taken at.
set -euo pipefail
clone=$1 dest=$2
mkdir -p "$dest/v1" "$dest/v2"
git -C "$clone" archive 7db464771~1 sparse_operation_kit/unit_test/test_scripts/tf1 \
  | tar -x -C "$dest/v1" --strip-components=4
git -C "$clone" archive 2f2016fa8 sparse_operation_kit/sparse_operation_kit/test/function_test \
  | tar -x -C "$dest/v2" --strip-components=4
