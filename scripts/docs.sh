#!/usr/bin/env bash
# Builds the documentation (docs/, MkDocs with mkdocstrings) with every warning an error:
#     bash scripts/docs.sh VENV [OUT]
# VENV: a virtual environment (Python 3.9+) into which the tools of requirements-docs.txt are
# installed. The API pages read the docstrings of sok1x as it installs (graph_ops, cuda_kernels
# and launch become subpackages), so this checkout is installed without dependencies into a
# temporary folder that only the build reads: nothing is imported, TensorFlow is not needed.
# OUT: where the site goes (default: a temporary folder, removed afterwards). The runnable
# examples of the pages run in tests/cpu/test_docs_examples.py, not here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: scripts/docs.sh VENV [OUT]}
python=$venv/bin/python
[ -x "$python" ] || { echo "docs.sh: $python not found: make the venv first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${2:-$work/site}
"$python" -m pip install -q -r "$root/requirements-docs.txt"
"$python" -m pip install -q --no-deps --no-compile --target "$work/sok1x-site" "$root"
cd "$root"
started=$SECONDS
SOK1X_DOCS_SITE=$work/sok1x-site "$python" -m mkdocs build --strict --site-dir "$out"
echo "docs.sh: built $(find "$out" -name '*.html' | wc -l) pages into $out in $((SECONDS - started)) s"
