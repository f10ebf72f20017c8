"""SOK v1's sparse_operation_kit.experiment (its last v1 releases' preview of the v2 API): the
same objects as sok1x's v2 names, and its modules communication, distributed_variable,
dynamic_variable, lookup, optimizer and dump_load as the sok1x modules of those names."""
import importlib
import sys

import sok1x
from sok1x.communication import set_comm_tool
from sok1x.distributed_variable import DistributedVariable, LocalizedVariable, Variable
from sok1x.dump_load import dump, load
from sok1x.dynamic_variable import DynamicVariable, assign, export
from sok1x.lookup import all2all_dense_embedding, lookup_sparse
from sok1x.optimizer import SGD, OptimizerWrapper

init = sok1x.init

for _name in ("communication", "distributed_variable", "dynamic_variable", "lookup",
              "optimizer", "dump_load"):
    sys.modules["%s.%s" % (__name__, _name)] = importlib.import_module("sok1x." + _name)
    globals()[_name] = sys.modules["%s.%s" % (__name__, _name)]

__all__ = ["DistributedVariable", "DynamicVariable", "LocalizedVariable", "OptimizerWrapper",
           "SGD", "Variable", "all2all_dense_embedding", "assign", "dump", "export", "init",
           "load", "lookup_sparse", "set_comm_tool"]
