"""Every code block of docs/ marked runnable runs as the page says: a block preceded by
`<!-- runnable: ranks=N -->` is written to a file and run as `mpiexec -n N python FILE`, from a
folder outside the checkout so the installed sok1x is the one imported; it must exit 0 (each
block asserts what it shows). A page that marks a block wrongly fails the marker check."""
import os
import re
import sys

import pytest
from mpi_jobs import mpiexec, run_stoppable

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
MARKER = re.compile(r"<!-- runnable: ranks=(\d+) -->\n```python\n(.*?)\n```", re.S)
LOOSE_MARKER = re.compile(r"<!-- runnable")
TIMEOUT_S = 180


def runnable_blocks():
    """(page, index, ranks, source) for every marked block of every page under docs/."""
    blocks = []
    for folder, _, files in os.walk(DOCS):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(folder, name)
            with open(path) as handle:
                text = handle.read()
            page = os.path.relpath(path, DOCS)
            for index, match in enumerate(MARKER.finditer(text)):
                blocks.append((page, index, int(match.group(1)), match.group(2)))
    return blocks


def test_every_marker_marks_a_python_block():
    for folder, _, files in os.walk(DOCS):
        for name in files:
            if name.endswith(".md"):
                with open(os.path.join(folder, name)) as handle:
                    text = handle.read()
                assert len(LOOSE_MARKER.findall(text)) == len(MARKER.findall(text)), (
                    "%s: a runnable marker not directly followed by a ```python block" % name)
    assert len(runnable_blocks()) >= 5, "docs/ lost its runnable examples"


BLOCKS = runnable_blocks()


@pytest.mark.parametrize("page, index, ranks, source", BLOCKS,
                         ids=["%s-%d" % (page, index) for page, index, _, _ in BLOCKS])
def test_runnable_block(tmp_path, page, index, ranks, source):
    script = tmp_path / "block.py"
    script.write_text(source + "\n")
    command = [mpiexec(), "-n", str(ranks), sys.executable, str(script)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    old = os.getcwd()
    os.chdir(str(tmp_path))
    try:
        finished = run_stoppable(command, env, TIMEOUT_S)
    finally:
        os.chdir(old)
    assert finished.returncode == 0, "%s, block %d:\n%s" % (page, index, finished.explain())
