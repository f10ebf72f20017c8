"""SOK's and DeepRec's own example and tutorial programs, ported with only the imports, the data
(synthetic) and the sizes changed (legacy_examples/sok_ports, legacy_examples/deeprec_ports), run
as real MPI jobs at 1 and 2 CPU ranks: each must train to its end, and where it prints its loss,
every loss is finite and the last steps' mean is below the first steps' (a loss that
TensorFlow's LoggingTensorHook logs is read from stderr)."""
import math
import os
import re
import socket
import sys

import numpy as np
import pytest
from mpi_jobs import lane_a_only, mpiexec, run_stoppable

import tensorflow as tf

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "legacy_examples"))
LIMIT_S = 120
TF2 = int(tf.__version__.split(".")[0]) >= 2
EVERY_RANK, TWICE_A_RANK, RANK_0 = 1, 2, 0
NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"  # a printed float, nan and inf too
# port: (needs Horovod, needs TensorFlow 2 (an eager TF2 program), loss pattern or None,
#        the text of its last output, and how often it shows: per rank, or once (rank 0))
PORTS = {
    "deeprec_ports/sok_dlrm.py": (True, False, r"Iteration:\d+\s+loss:(" + NUMBER + ")",
                                  "Training time", EVERY_RANK),
    "deeprec_ports/group_embedding_dcnv2.py": (True, False, r"loss = (" + NUMBER + r"), steps",
                                               "Training completed.", EVERY_RANK),
    "sok_ports/amp_tf1.py": (True, False, r"step \d+, loss (" + NUMBER + ")", "[INFO]: step 9,",
                             RANK_0),
    "sok_ports/lookup_sparse_distributed_example.py": (True, True, None, "grad2:", EVERY_RANK),
    "sok_ports/lookup_sparse_dynamic_example.py": (True, True, None, "grad:", TWICE_A_RANK),
    "sok_ports/lookup_sparse_localized_example.py": (True, True, None, "v2 after:", EVERY_RANK),
    "sok_ports/dynamic_variable_example.py": (True, True, None, "embedding after:", EVERY_RANK),
    "sok_ports/all2all_dense_embedding_example.py": (True, True, None, "param after:",
                                                     EVERY_RANK),
    "sok_ports/dense_demo_horovod.py": (True, True, r"Iteration: \d+, loss=(" + NUMBER + ")",
                                        "Iteration: 9,", EVERY_RANK),
    "sok_ports/amp_tf2.py": (False, True, r"step \d+, loss (" + NUMBER + ")", "[INFO]: step 9,",
                             EVERY_RANK),
    "sok_ports/run_sok_MirroredStrategy.py": (False, True, r"Iteration: \d+, loss=(" + NUMBER +
                                              ")", "Iteration: 9,", EVERY_RANK),
    "sok_ports/run_sok_MultiWorker_mpi.py": (False, True, r"Iteration: \d+, loss=(" + NUMBER +
                                             ")", "Average iteration time", RANK_0),
    # (its loss logged every 4 steps barely moves in 25 steps at SOK's learning rates)
    "sok_ports/dlrm/main.py": (False, True, None, "finish 25 steps training for DLRM", RANK_0),
    # (SOK's synthetic data, random labels; it logs its loss every 1000 steps, of 30)
    "sok_ports/dlrm_benchmark/main.py": (True, True, None, "main time:", EVERY_RANK),
    # (random labels, as SOK's example has them: its loss need not fall; its files are checked)
    "sok_ports/hps_sok_train.py": (True, True, None, "generate hps weight success!", RANK_0),
}
# Command-line options a port also runs with (each a case of its own, beside its defaults).
# DenseDemo's Keras optimizers: TF 2.11+'s own in sok.OptimizerScope (OptimizerV2 before 2.11).
OPTIONS = {
    "sok_ports/dense_demo_horovod.py": (("--optimizer", "sgd"), ("--optimizer", "adam")),
}


def hps_files_hold_the_trained_tables(folder):
    """hps_sok_train.py's HPS files (dlrm_sparse.model/table<i>/key, emb_vector), converted by
    the example's own code from sok.dump's SOK-format files: per table the keys int64, distinct,
    in [0, 120) and nearly all of them (random samples over 100 to 120 keys), one 4-wide
    float32 vector each, and the vectors trained (Adam at learning rate 1 moves them well past
    the initializer's [-0.05, 0.05])."""
    for table in range(3):
        where = os.path.join(folder, "dlrm_sparse.model", "table%d" % table)
        keys = np.fromfile(os.path.join(where, "key"), np.int64)
        vectors = np.fromfile(os.path.join(where, "emb_vector"), np.float32)
        assert len(np.unique(keys)) == len(keys) and 90 <= len(keys) < 120, keys
        assert keys.min() >= 0 and keys.max() < 120, keys
        assert vectors.size == 4 * len(keys), (vectors.size, len(keys))
        assert np.isfinite(vectors).all() and (np.abs(vectors) > 0.5).mean() > 0.5, vectors


# What a port leaves in its working folder, checked after it ends: port -> check(folder).
FILE_CHECKS = {"sok_ports/hps_sok_train.py": hps_files_hold_the_trained_tables}
# Ports that show a gap sok1x still has: they must keep failing until it is closed (strict).
KNOWN_GAPS = {}


def _horovod():
    try:
        import horovod.tensorflow  # noqa: F401
        return True
    except ImportError:
        return False


def losses(text, pattern):
    """The losses a port printed, in order (both ranks' lines where both print)."""
    return [float(value) for value in re.findall(pattern, text)]


def _cases():
    """(port, ranks, options): its defaults at 1 and 2 ranks, each of its OPTIONS at 2; a
    known gap at 1 rank only, expected to fail (strict)."""
    for port in sorted(PORTS):
        if port in KNOWN_GAPS:
            yield pytest.param(port, 1, (), marks=pytest.mark.xfail(strict=True,
                                                                    reason=KNOWN_GAPS[port]))
        else:
            tf2_only = PORTS[port][1]
            marks = () if tf2_only else (lane_a_only("a TensorFlow 1 program, run on 1.15"),)
            for options in ((),) + OPTIONS.get(port, ()):
                # an option's run at 2 ranks only: the exchange is there, and CI's time is short
                for ranks in ((1, 2) if not options else (2,)):
                    label = "-".join([port, str(ranks)] + [o.lstrip("-") for o in options])
                    yield pytest.param(port, ranks, options, id=label, marks=marks)


# Ports whose workers talk over TensorFlow's gRPC on localhost, on ports SOK fixes at 12345 and up.
GRPC_PORTS = ["sok_ports/run_sok_MultiWorker_mpi.py", "sok_ports/dlrm/main.py"]
SOK_GRPC_PORT = 12345


@pytest.mark.parametrize("port", GRPC_PORTS)
def test_a_grpc_port_trains_beside_a_job_on_soks_ports(port, tmp_path, monkeypatch):
    """Another job holds localhost:12345 and 12346 (SOK's ports for 2 workers): the port picks
    free ones and trains to its end at 2 ranks, as two CI jobs on one host must."""
    if not TF2:
        pytest.skip("%s is a TensorFlow 2 eager program (SOK's TF2 API)" % port)
    held = []
    for number in range(2):
        sock = socket.socket()
        try:
            sock.bind(("", SOK_GRPC_PORT + number))
            sock.listen(1)
            held.append(sock)
        except OSError:  # another process holds it already: held all the same
            sock.close()
    _, _, _, done_line, printed_by = PORTS[port]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    monkeypatch.chdir(tmp_path)
    try:
        done = run_stoppable([mpiexec(), "-n", "2", sys.executable,
                              os.path.join(EXAMPLES, port)], env, LIMIT_S)
    finally:
        for sock in held:
            sock.close()
    assert done.returncode == 0, done.explain()
    assert done.stdout.count(done_line) == (2 * printed_by if printed_by else 1), done.explain()


@pytest.mark.parametrize("port,ranks,options", list(_cases()))
def test_port_trains_to_the_end(port, ranks, options, tmp_path, monkeypatch):
    needs_horovod, tf2_only, pattern, done_line, printed_by = PORTS[port]
    if tf2_only and not TF2:
        pytest.skip("%s is a TensorFlow 2 eager program (SOK's TF2 API)" % port)
    if needs_horovod and not _horovod():
        pytest.skip("%s uses Horovod, which this environment lacks" % port)
    # Unbuffered, and losses matched as numbers: the ranks' prints share one pipe and may
    # interleave (block-buffered, a loss ran into the other rank's line: "5.58[INFO]: ...").
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    monkeypatch.chdir(tmp_path)  # where a port writes its files
    done = run_stoppable([mpiexec(), "-n", str(ranks), sys.executable,
                          os.path.join(EXAMPLES, port)] + list(options), env, LIMIT_S)
    assert done.returncode == 0, done.explain()
    expected = ranks * printed_by if printed_by else 1
    assert done.stdout.count(done_line) == expected, done.explain()
    if pattern is not None:
        found = losses(done.stdout + "\n" + done.stderr, pattern)  # TF's log goes to stderr
        assert len(found) >= 6, done.explain()
        assert all(math.isfinite(v) for v in found), found
        third = len(found) // 3
        assert sum(found[-third:]) / third < sum(found[:third]) / third, found
    if port in FILE_CHECKS:
        FILE_CHECKS[port](str(tmp_path))
