"""A job restarted from a checkpoint trains on as one that never stopped (issue 44): the step
state sok1x keeps for the optimizer of its tables (a TF 2.11+ Keras optimizer's twin, a
sok1x.OptimizerWrapper's own step counters) comes back with the tables through
tf.compat.v1.train.Saver, MonitoredTrainingSession, tf.compat.v1.train.Checkpoint and
sok.dump / sok.load with the optimizer (both file formats). Adam driven by a decaying schedule
(or by its bias correction alone), interrupted after STOP steps and restored in a new graph,
against the same job uninterrupted; rank-agnostic. Graph mode; tests/cpu/test_optimizer_
restarts_eagerly.py restores executing eagerly."""
import json
import os

import numpy as np
import pytest
from mpi4py import MPI
from tf_support import initialized_session, tf1

import sok1x as sok

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
ROWS, DIM, STEPS, STOP = 16, 4, 6, 3
keras_v2 = tf1.keras.optimizers


@pytest.fixture(scope="module", autouse=True)
def sok1x_up():
    sok.init(backend="cpu", use_legacy_optimizer=False)  # keep TensorFlow's tf.keras optimizers


def _new_keras_adam():
    """TF 2.11+'s tf.keras.optimizers.Adam (the test skips where there is none); its bias
    correction drives it: in graph mode its own variable of a schedule's rate reads its step
    count in its initializer, which TensorFlow may run first (a restore eagerly, in
    tests/cpu/test_optimizer_restarts_eagerly.py, has a schedule)."""
    import tensorflow as tf
    if tf.keras.optimizers.Adam is keras_v2.Adam:
        pytest.skip("this TensorFlow's tf.keras.optimizers.Adam is OptimizerV2 (no twin)")
    return tf.keras.optimizers.Adam(0.1, beta_1=0.5, beta_2=0.8)


def _schedule():
    return keras_v2.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.6)


# name -> (make the optimizer the program holds, whether to apply it through OptimizerWrapper)
OPTIMIZERS = {
    "new_keras_adam_wrapped": (_new_keras_adam, True),
    "new_keras_adam_applied_directly": (_new_keras_adam, False),
    "keras_v2_adam_wrapped": (lambda: keras_v2.Adam(_schedule(), beta_1=0.5, beta_2=0.8), True),
    "v1_adam_wrapped": (lambda: tf1.train.AdamOptimizer(0.1, beta1=0.5, beta2=0.8), True),
    "sok1x_adam": (lambda: sok.optimizers.Adam(0.1, beta_1=0.5, beta_2=0.8), False),
}
WAYS = ["saver", "monitored", "checkpoint", "dump", "dump_sok_files"]


def _batches():
    rng = np.random.default_rng(44)
    return [rng.integers(0, ROWS, size=(2 * SIZE, 3)) for _ in range(STEPS)]


class _Job:
    """The model of one graph: a sok1x.Variable, a sum lookup, Adam; `optimizer` is what the
    program holds (the wrapper, or the Keras optimizer applied directly)."""

    def __init__(self, name):
        make, wrapped = OPTIMIZERS[name]
        initial = np.random.default_rng(3).uniform(-1, 1, (ROWS, DIM)).astype(np.float32)
        self.keys = tf1.placeholder(tf1.int64, [None, 3])
        self.table = sok.Variable(initial)
        pooled = sok.lookup_sparse(self.table, tf1.RaggedTensor.from_tensor(self.keys),
                                   combiners="sum")
        loss = tf1.reduce_sum(tf1.square(pooled - 0.5))
        grads = tf1.gradients(loss, [self.table])
        self.optimizer = make()
        if wrapped:
            self.optimizer = sok.OptimizerWrapper(self.optimizer)
        step = tf1.train.get_or_create_global_step()
        with tf1.control_dependencies([self.optimizer.apply_gradients(zip(grads, [self.table]))]):
            self.train = step.assign_add(1)
        self.export = sok.export(self.table)

    def run(self, sess, batches):
        for batch in batches:
            sess.run(self.train, {self.keys: batch.reshape(SIZE, -1, 3)[RANK]})

    def rows(self, sess):
        """The whole table, gathered from every rank."""
        table = np.zeros([ROWS, DIM], np.float32)
        for keys, values in COMM.allgather(sess.run(self.export)):
            table[keys] = values
        return table


def _uninterrupted(name):
    with tf1.Graph().as_default() as graph:
        job = _Job(name)
        with initialized_session(graph) as sess:
            job.run(sess, _batches())
            return job.rows(sess)


def _checkpointed(job):
    """What tf.compat.v1.train.Checkpoint holds: the optimizer the program holds (on TF 1.15,
    which cannot track the wrapper, the optimizer it wraps)."""
    optimizer = job.optimizer
    if not hasattr(type(optimizer), "_track_trackable"):
        if not isinstance(optimizer, sok.OptimizerWrapper):
            pytest.skip("TensorFlow 1.15 has no public Trackable for sok1x.optimizers.Adam to be")
        optimizer = optimizer.optimizer
    return tf1.train.Checkpoint(optimizer=optimizer, step=tf1.train.get_global_step())


def _save_and_restore(way, name, folder, batches):
    """Trains batches[:STOP], saves `way`, then in a new graph restores and trains the rest;
    returns the table."""
    prefix = os.path.join(folder, "model")
    sok_format = "sok" if way == "dump_sok_files" else "sharded"
    for phase in (0, 1):
        with tf1.Graph().as_default() as graph:
            job = _Job(name)
            if way == "monitored":
                with tf1.train.MonitoredTrainingSession(
                        checkpoint_dir=folder, save_checkpoint_secs=None,
                        save_checkpoint_steps=1000, save_summaries_steps=None,
                        log_step_count_steps=None, hooks=[sok.InitHook(backend="cpu")]) as sess:
                    job.run(sess, batches[:STOP] if phase == 0 else batches[STOP:])
                    if phase:
                        return job.rows(sess)
                continue
            saver = tf1.train.Saver() if way == "saver" else None
            checkpoint = _checkpointed(job) if way == "checkpoint" else None
            with_optimizer = job.optimizer if way.startswith("dump") else None
            dump = sok.dump(prefix, [job.table], with_optimizer, file_format=sok_format)
            load = sok.load(prefix, [job.table], with_optimizer, file_format=sok_format)
            with initialized_session(graph) as sess:
                if phase == 0:
                    job.run(sess, batches[:STOP])
                    if saver is not None:
                        saver.save(sess, prefix)
                    else:
                        sess.run(dump)
                    if checkpoint is not None:  # TensorFlow's own files: one set a rank
                        path = checkpoint.save(os.path.join(
                            folder, "objects-rank%d" % RANK, "model"), session=sess)
                    continue
                if saver is not None:
                    saver.restore(sess, prefix)
                else:
                    sess.run(load)
                if checkpoint is not None:
                    checkpoint.restore(path).assert_consumed().run_restore_ops(sess)
                job.run(sess, batches[STOP:])
                return job.rows(sess)


_whole = {}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_restarted_job_trains_as_one_that_never_stopped(shared_dir, name, way):
    if name not in _whole:
        _whole[name] = _uninterrupted(name)
    folder = shared_dir if way != "monitored" else os.path.join(shared_dir, "rank%d" % RANK)
    got = _save_and_restore(way, name, folder, _batches())
    np.testing.assert_allclose(got, _whole[name], rtol=1e-6, atol=1e-7)


def _state(job, sess):
    """(table rows, the wrapper's step counters) of a job."""
    return job.rows(sess), sess.run([v for _, v in job.optimizer.step_variables([job.table])])


def _corrupt_step_records(path):
    """Rank 0 spoils every step record in dump folder `path` (either format)."""
    COMM.Barrier()
    if RANK == 0:
        bad = ["int64", "two"]
        manifest = os.path.join(path, "sok1x-checkpoint.json")
        if os.path.exists(manifest):
            with open(manifest) as handle:
                content = json.load(handle)
            for entry in content["tables"].values():
                for record in entry.get("optimizer_steps", {}).values():
                    record["iterations"] = bad
            with open(manifest, "w") as handle:
                json.dump(content, handle)
        for name in os.listdir(path):
            if name.endswith("sok1x_steps.json"):
                with open(os.path.join(path, name), "w") as handle:
                    json.dump({"iterations": bad}, handle)
    COMM.Barrier()


@pytest.mark.parametrize("file_format", ["sharded", "sok"])
def test_step_records_of_another_optimizer_corrupt_or_disagreeing_are_refused(
        shared_dir, file_format):
    """A load refuses, on every rank and changing no table and no counter: the steps of another
    kind of optimizer, tables dumped at different steps, a step record that is not one. A load
    without the optimizer leaves the counters."""
    adam_path, path = os.path.join(shared_dir, "v1_adam"), os.path.join(shared_dir, "dump")
    with tf1.Graph().as_default() as graph:  # Adam's beta powers
        job = _Job("v1_adam_wrapped")
        dump = sok.dump(adam_path, [job.table], job.optimizer, file_format=file_format)
        with initialized_session(graph) as sess:
            job.run(sess, _batches()[:1])
            sess.run(dump)
    with tf1.Graph().as_default() as graph:  # a count of steps
        job = _Job("keras_v2_adam_wrapped")
        other = sok.Variable(np.ones((ROWS, DIM), np.float32))
        dumps = [sok.dump(path, [table], job.optimizer, file_format=file_format)
                 for table in (job.table, other)]
        loads = {"another kind of optimizer": sok.load(adam_path, [job.table], job.optimizer,
                                                        file_format=file_format),
                 "dumped at different steps": sok.load(path, [job.table, other],
                                                       job.optimizer, file_format=file_format)}
        bare = sok.load(path, [job.table], file_format=file_format)
        with initialized_session(graph) as sess:
            for batch, dump in zip(_batches(), dumps):
                job.run(sess, [batch])
                sess.run(dump)  # the table at step 1, `other` at step 2
            job.run(sess, _batches()[2:3])
            before = _state(job, sess)
            assert before[1] == [3]
            for problem, load in sorted(loads.items()):
                with pytest.raises(Exception, match=problem):
                    sess.run(load)
                after = _state(job, sess)
                np.testing.assert_array_equal(after[0], before[0])
                assert after[1] == before[1]
            _corrupt_step_records(path)
            with pytest.raises(Exception, match="corrupt optimizer step record"):
                sess.run(loads["dumped at different steps"])
            after = _state(job, sess)
            np.testing.assert_array_equal(after[0], before[0])
            assert after[1] == before[1]
            sess.run(bare)  # no optimizer: the rows, not the counters
            assert _state(job, sess)[1] == before[1]
    COMM.Barrier()
