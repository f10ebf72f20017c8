"""SOK's v1 layers trained eagerly (TensorFlow 2, under tf.GradientTape: a tf.function step as
SOK's DenseDemo, and a step executed eagerly) against tf.nn.embedding_lookup(_sparse) on a plain
tf.Variable trained the same way (jobs/v1_eager_job.py), in MPI jobs at 1 and 2 ranks."""
import pytest
from mpi_jobs import run_passing_job, skip_before_tensorflow

import tensorflow as tf

TF2 = int(tf.__version__.split(".")[0]) >= 2


# Host staging at 2 ranks only: its eager path differs from zero-copy only in how inputs cross.
@pytest.mark.skipif(not TF2, reason="TensorFlow 1.15 does not execute eagerly by default "
                    "(SOK's v1 layers there are graph-mode programs, tests/mpi)")
@pytest.mark.parametrize("ranks,seam", [(1, "dlpack"), (2, "dlpack"), (2, "host")])
def test_v1_layers_eagerly(ranks, seam):
    run_passing_job(ranks, seam, "v1_eager_job.py", "V1 EAGER OK", timeout=240)


@pytest.mark.parametrize("ranks", [1, 2])
def test_v1_layers_with_new_keras_optimizers_in_optimizer_scope(ranks):
    """TF 2.11+ Keras SGD (with and without momentum), Adam and Adamax in sok.OptimizerScope,
    as SOK's DenseDemo applies them, against the same optimizers on the plain variable."""
    skip_before_tensorflow((2, 11), "TF 2.11+ Keras optimizers (tf.keras.optimizers before "
                           "2.11 are the OptimizerV2 ones the other cases train with)")
    run_passing_job(ranks, "dlpack", "v1_eager_job.py", "V1 EAGER OK", "new_keras", timeout=240)


def test_new_keras_adam_under_a_multi_worker_strategy_leaves_embedding_gradients_alone():
    """SOK's MultiWorker DenseDemo with --optimizer adam: under a MultiWorkerMirroredStrategy of
    one worker per rank, TF 2.11+ Keras Adam in sok.OptimizerScope trains the rows as the
    reference does (before, its twin all-reduced each rank's shard gradients over the workers
    and applied the mix)."""
    skip_before_tensorflow((2, 11), "TF 2.11+ Keras optimizers")
    run_passing_job(2, "dlpack", "v1_eager_job.py", "V1 EAGER OK", "multiworker", timeout=240)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_layer_in_a_strategy_of_two_devices_is_refused_naming_its_table(ranks):
    """sok1x trains one device per process: a v1 layer made in a MirroredStrategy over two
    devices of one process is refused with the table's name (it would be updated once per
    device), and the job goes on to make and use a layer outside it."""
    run_passing_job(ranks, "dlpack", "v1_eager_job.py", "V1 EAGER OK", "two_devices",
                    timeout=240)
