"""Every public module path and name of SOK v1 (its last v1 tree, HugeCTR 7db464771~1) and SOK v2
(HugeCTR 2f2016fa8) resolves through sok1x (the import name sparse_operation_kit becomes sok1x),
listed module by module from SOK's sources (scripts/sok_scripts/get_sources.sh names the commits);
and the names sok1x lacked before behave as SOK's do, against TensorFlow as the reference."""
import importlib

import numpy as np
import pytest

import sok1x
from sok1x.graph_ops.tf_compat import tf1

# SOK module (relative to sparse_operation_kit) -> its public names, as its sources define or
# re-export them (SOK v1 first, then SOK v2 and the v1 tree's experiment preview of it).
SOK_V1 = {
    "": "All2AllDenseEmbedding DistributedEmbedding GraphKeys Init OptimizerScope Saver "
        "get_embedding split_embedding_variable_from_others tf",
    "core": "EmbeddingVariable in_tensorflow2",
    "core.context_scope": "OptimizerScope",
    "core.embedding_variable_v1": "EmbeddingVariable",
    "core.embedding_variable_v2": "EmbeddingVariable",
    "core.graph_keys": "GraphKeys",
    "core.initialize": "Init",
    "core.inplace_initializer": "InPlaceInitializer",
    "embeddings": "",
    "embeddings.all2all_dense_embedding": "All2AllDenseEmbedding",
    "embeddings.distributed_embedding": "DistributedEmbedding",
    "embeddings.embedding_ops": "CommToolSet embedding_lookup get_global_replica_id",
    "embeddings.get_embedding_op": "get_embedding",
    "embeddings.tf_distributed_embedding": "TFDistributedEmbedding",
    "kit_lib": "in_tensorflow2",
    "operations": "unique unsorted_segment_sum",
    "operations.compat_ops_lib": "unique_op unsorted_segment_sum_op",
    "optimizers": "Adam split_embedding_variable_from_others",
    "optimizers.adam": "Adam",
    "saver": "",
    "saver.Saver": "Saver",
    "tf": "keras unique unsorted_segment_sum",
    "tf.keras": "mixed_precision optimizers",
    "tf.keras.mixed_precision": "LossScaleOptimizer",
    "tf.keras.mixed_precision.loss_scale_optimizer": "LossScaleOptimizer",
    "tf.keras.optimizers": "Adam LazyAdamOptimizer",
    "tf.keras.optimizers.adam": "Adam",
    "tf.keras.optimizers.lazy_adam": "LazyAdamOptimizer",
    "experiment": "DistributedVariable DynamicVariable LocalizedVariable OptimizerWrapper SGD "
                  "Variable all2all_dense_embedding assign dump export init load lookup_sparse "
                  "set_comm_tool",
}
SOK_V2 = {
    "": "DistributedVariable DynamicVariable LocalizedVariable OptimizerWrapper SGD Variable "
        "all2all_dense_embedding assign dump export filter_variables incremental_model_dump "
        "init load lookup_sparse set_comm_tool sparse_read_and_evict",
    "communication": "allreduce check_comm_tool global_gpu_id id_in_rank local_rank "
                     "num_gpu_per_rank num_gpus num_ranks rank set_comm_tool",
    "distributed_variable": "DistributedVariable LocalizedVariable Variable",
    "dump_load": "dump incremental_model_dump load",
    "dynamic_variable": "DynamicVariable assign export",
    "lookup": "all2all_dense_embedding lookup_sparse sparse_read_and_evict",
    "optimizer": "OptimizerWrapper OptimizerWrapperV1 OptimizerWrapperV2 SGD",
}
for _prefix in ("communication", "distributed_variable", "dump_load", "dynamic_variable",
                "lookup", "optimizer"):
    SOK_V1["experiment." + _prefix] = SOK_V2[_prefix]
# Public-looking names of SOK's modules left out above, and why: none is API a program calls.
NOT_API = {
    "kit_lib": "the native library's op bindings (plugin_init, create_var, ...) and paths",
    "operations.compat_ops_lib": "the compat library's handle and its paths",
    "core.embedding_layer_handle": "the layers' internal handles (sok1x's layers hold tables)",
    "core.initialize": "MirroredStrategy / MultiWorkerMirroredStrategy: TensorFlow's own names",
    "embeddings.embedding_ops": "embedding_lookup_sparse: the layer's own call; the layer is API",
    "embeddings.tf_distributed_embedding": "module-level demo data under __main__",
    "optimizers.base_optimizer, optimizers.optimizer, optimizers.utils":
        "SOK's optimizer plumbing; sok1x.optimizers.Adam and split_... are the API",
    "tf.keras.optimizers.common": "helpers of SOK's optimizers, no public name",
    "": "lib_path, raw_ops, load_library, ops, syspath, tf_version: the library loader's names",
    "communication": "alltoall, allgather, broadcast, CommToolBase, HorovodTool: Horovod's own "
                     "collectives behind SOK's tool (use hvd.* beside sok1x); allreduce's "
                     "'max'/'min' likewise",
    "dump_load": "SOK's file helpers (read_file_head, save_table_to_filesystem_*, ...)",
    "lookup": "isVariable, group_lookup, lookup_sparse_impl, to_list: the lookup's own helpers",
    "utils": "SOK_IndexedSlices, get_nano_time: internal helpers",
    "distributed_variable, dynamic_variable": "variable_count, dynamic_variable_count: counters",
}

CASES = sorted(set((module, name) for table in (SOK_V1, SOK_V2)
                   for module, names in table.items() for name in [""] + names.split()))


@pytest.mark.parametrize("module,name", CASES)
def test_sok_name_resolves(module, name):
    loaded = importlib.import_module("sok1x." + module if module else "sok1x")
    if name:
        assert getattr(loaded, name) is not None
        # `from sparse_operation_kit.<module> import <name>` is the spelling programs use
        exec("from %s import %s" % (loaded.__name__, name), {})


def _run(fetches):
    with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        return sess.run(fetches)


def test_sok_tf_unique_and_segment_sum_are_tensorflows():
    with tf1.Graph().as_default():
        keys = tf1.constant([7, 3, 7, 9, 3, 3], tf1.int64)
        data = tf1.constant(np.arange(12, dtype=np.float32).reshape(6, 2))
        ours = (sok1x.tf.unique(keys), sok1x.tf.unsorted_segment_sum(data, [0, 2, 0, 1, 2, 2], 3))
        theirs = (tf1.unique(keys), tf1.math.unsorted_segment_sum(data, [0, 2, 0, 1, 2, 2], 3))
        _run(sok1x.Init(backend="cpu"))
        (unique_ours, seg_ours), (unique_theirs, seg_theirs) = _run((ours, theirs))
    np.testing.assert_array_equal(unique_ours.y, unique_theirs.y)
    np.testing.assert_array_equal(unique_ours.idx, unique_theirs.idx)
    np.testing.assert_array_equal(seg_ours, seg_theirs)
    assert sok1x.operations.unique is sok1x.tf.unique


def test_tf_distributed_embedding_looks_up_its_table():
    from sok1x.embeddings.tf_distributed_embedding import TFDistributedEmbedding
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    keys = np.array([[1, 9], [0, 1]], np.int64)
    with tf1.Graph().as_default():
        layer = TFDistributedEmbedding(10, 4, initializer=table)
        out = layer(tf1.constant(keys))
        assert out.shape.as_list() == [2, 2, 4]
        grad = tf1.gradients(tf1.reduce_sum(out), layer.embedding_weights)[0]
        vectors, grad = _run((out, tf1.convert_to_tensor(grad)))
    np.testing.assert_array_equal(vectors, table[keys])
    np.testing.assert_array_equal(grad[:, 0], np.bincount(keys.ravel(), minlength=10))
    with pytest.raises(ValueError, match="shape"):
        TFDistributedEmbedding(10, 4, initializer=table[:5])


def test_get_embedding_makes_once_per_graph():
    with tf1.Graph().as_default():
        first = sok1x.get_embedding("Emb", sok1x.All2AllDenseEmbedding,
                                    max_vocabulary_size_per_gpu=8, embedding_vec_size=4,
                                    slot_num=1, nnz_per_slot=1)
        assert sok1x.get_embedding("Emb") is first
        with pytest.raises(ValueError, match="Other"):
            sok1x.get_embedding("Other")
    with tf1.Graph().as_default(), pytest.raises(ValueError, match="Emb"):
        sok1x.get_embedding("Emb")


def test_core_names():
    from sok1x.core import EmbeddingVariable, GraphKeys, InPlaceInitializer
    with tf1.Graph().as_default():
        layer = sok1x.All2AllDenseEmbedding(8, 4, 1, 1)
        layer(tf1.zeros([2, 1, 1], tf1.int64))
        assert isinstance(layer.embedding_variable, EmbeddingVariable)
        assert not isinstance(tf1.Variable([1.0]), EmbeddingVariable)
    assert GraphKeys.SparseOperationKitEmbeddingLayers == "SparseOperationKitEmbeddingLayers"
    init = InPlaceInitializer(mean=0.0, stddev=0.05)
    back = InPlaceInitializer.deserialize(init.serialize())
    assert (back.mean, back.stddev) == (0.0, 0.05)


def test_communication_needs_sok1x_up():
    from sok1x import communication
    if not sok1x.engine.runtime.is_initialized():
        with pytest.raises(RuntimeError, match="sok1x.init"):
            communication.rank()
    with pytest.raises(ValueError, match="horovod"):
        communication.set_comm_tool("nccl")
