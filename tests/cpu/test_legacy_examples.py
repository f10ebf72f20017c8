"""Every program of legacy_examples/ runs as a real 2-rank MPI job on the cpu backend, as a user
starts it, and does what its docstring says: the loss it prints falls, the DLRM model's AUC rises
above chance and a second run goes on from the first's checkpoint, the SOK v2 program's load gives
back the rows it dumped, the Horovod program resumes too (skipped where Horovod is absent). Each
uses only TensorFlow 1.15's names (and DeepRec's, which sok1x.deeprec.install() adds)."""
import ast
import importlib.util
import os
import re
import sys

import pytest
from mpi_jobs import mpiexec, run_stoppable
from test_compat import TF115_API, dotted_chains

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "legacy_examples")
# DeepRec's names, which sok1x.deeprec.install() adds to stock TensorFlow.
DEEPREC_NAMES = {"compat.v1.feature_column.group_embedding_column_scope",
                 "compat.v1.nn.group_embedding_lookup_sparse",
                 "compat.v1.config.experimental.enable_distributed_strategy"}
# How each example binds TensorFlow: the name -> its prefix in the 1.15 API list.
ROOTS = {"deeprec_group_embedding.py": {"tf": "compat.v1."}}
TIMEOUT_S = 240


def run_example(name, *args):
    """Runs legacy_examples/NAME on 2 ranks, cpu backend; returns its stdout, failing the test
    with the job's output when it exits non-zero."""
    command = [mpiexec(), "-n", "2", sys.executable, os.path.join(EXAMPLES, name),
               "--backend", "cpu"] + [str(a) for a in args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    finished = run_stoppable(command, env, TIMEOUT_S)
    assert finished.returncode == 0, finished.explain()
    return finished.stdout


def figures(stdout, word):
    """The numbers printed after `word` (e.g. "loss") on the progress lines, in order."""
    return [float(v) for v in re.findall(r"\b%s (-?[0-9.]+)" % word, stdout)]


def assert_progress(stdout, tag, count):
    """`count` progress lines with loss and samples/s, a loss that fell, and a done line."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("[sok1x %s] step" % tag)]
    assert len(lines) == count, stdout
    assert all("samples/s" in ln for ln in lines), stdout
    losses = figures(stdout, "loss")
    assert losses[-1] < 0.8 * losses[0], stdout
    assert "[sok1x %s] done:" % tag in stdout, stdout


def test_demo():
    assert_progress(run_example("demo_tf1.py", "--steps", 40, "--log_every", 10), "demo", 4)


def test_dlrm_trains_and_resumes_from_its_checkpoint(tmp_path):
    folder = tmp_path / "dlrm"
    first = run_example("dlrm_tf1.py", "--steps", 40, "--log_every", 10, "--save_every", 20,
                        "--checkpoint_dir", folder)
    assert_progress(first, "dlrm", 4)
    assert "starting at step 0 of 40" in first, first
    assert figures(first, "auc")[-1] > 0.6, first
    second = run_example("dlrm_tf1.py", "--steps", 50, "--log_every", 10,
                         "--checkpoint_dir", folder)
    assert "starting at step 40 of 50 (restored" in second, second
    losses = figures(second, "loss")
    assert len(losses) == 1 and losses[0] < figures(first, "loss")[0], (first, second)


def test_sok_v2_trains_and_loads_what_it_dumped(tmp_path):
    out = run_example("sok_v2_tf1.py", "--steps", 40, "--log_every", 10,
                      "--dump_dir", tmp_path / "dump")
    assert_progress(out, "v2", 4)
    assert "rows equal" in out, out
    # sok.dump's default for SOK v2's tables: SOK's own files, and sok1x's marker of them
    names = os.listdir(str(tmp_path / "dump"))
    assert "sok1x-sok-files.json" in names and "sok1x-checkpoint.json" not in names, names
    assert len([n for n in names if n.endswith("-key")]) == 2, names


def test_deeprec_group_embedding():
    assert_progress(run_example("deeprec_group_embedding.py", "--steps", 80, "--log_every", 20),
                    "deeprec", 4)


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed (scripts/install_horovod.sh builds it)")
def test_horovod_keeps_horovod_for_dense_gradients(tmp_path):
    folder = tmp_path / "hvd"
    first = run_example("horovod_tf1.py", "--steps", 40, "--log_every", 10,
                        "--checkpoint_dir", folder)
    assert_progress(first, "horovod", 4)
    second = run_example("horovod_tf1.py", "--steps", 50, "--log_every", 10,
                         "--checkpoint_dir", folder)
    assert "starting at step 40 of 50" in second, second


def test_examples_use_only_tensorflow_1_15_names():
    with open(TF115_API) as handle:
        api = {line.strip() for line in handle if line.strip() and not line.startswith("#")}
    modules = {name.rsplit(".", i)[0] for name in api for i in range(1, name.count(".") + 1)}
    missing, seen = [], 0
    for name in sorted(os.listdir(EXAMPLES)):
        if not name.endswith(".py"):
            continue
        roots = ROOTS.get(name, {"tf": "", "tf1": "compat.v1."})
        with open(os.path.join(EXAMPLES, name)) as handle:
            tree = ast.parse(handle.read(), name)
        for chain, line in dotted_chains(tree):
            root, rest = chain.split(".", 1)
            if root not in roots:
                continue
            full = roots[root] + rest
            seen += 1
            if full in DEEPREC_NAMES:
                continue
            if full not in api and full not in modules and full.rsplit(".", 1)[0] not in api:
                missing.append("%s:%d %s (as %s)" % (name, line, chain, full))
    assert seen > 50, "the scan found too few TensorFlow names"
    assert not missing, "names not in TensorFlow 1.15:\n" + "\n".join(missing)
