"""The tree passes ruff with the project's ruff.toml (pyflakes, pycodestyle and bugbear, for
Python 3.7): an unused import, an undefined name or a line past 100 characters fails CI here
rather than in review. Skipped where ruff is not installed (the TensorFlow 1.15 lane)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_tree_passes_ruff():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed in this environment")
    result = subprocess.run([ruff, "check", "--no-cache", "--quiet", ROOT], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True)
    assert result.returncode == 0, result.stdout
