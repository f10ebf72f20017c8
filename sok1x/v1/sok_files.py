"""SOK v1's own dump files beside sok1x's: `<m_var_name>_keys.file` (the keys, int64, or uint32
for a layer with key_dtype uint32) and `<m_var_name>_values.file` (float32 [n, dim], row by
row), raw little-endian arrays as SOK's Saver.dump_to_file writes them, so programs that read
SOK's files (SOK's own tests do) find them. Written by rank 0 after gathering every rank's rows;
sok1x's checkpoint (the file restore_from_file reads) is the other one in the directory."""
import os

import numpy as np

from sok1x.engine import runtime
from sok1x.engine.tables import shard_rows
from sok1x.graph_ops.embedding_tag import table_of


def m_var_name(handle):
    """SOK v1's embedding variable name of a layer's handle (file names are made from it)."""
    return table_of(handle).name.replace("/", "_")


def write(path, handle):
    """Collective: gathers the table of layer handle `handle` and writes SOK's two files into
    directory `path` from rank 0."""
    table = table_of(handle)
    keys, values = shard_rows.gather_rows(table.name, getattr(handle, "num_rows", None))
    if runtime.get().rank != 0:
        return
    order = np.argsort(keys, kind="stable")
    key_dtype = np.uint32 if getattr(handle, "sok1x_key_dtype", "int64") == "uint32" else np.int64
    os.makedirs(path, exist_ok=True)
    prefix = os.path.join(path, m_var_name(handle))
    for suffix, array in (("_keys.file", keys[order].astype(key_dtype)),
                          ("_values.file", values[order].astype(np.float32))):
        temporary = prefix + suffix + ".tmp"
        with open(temporary, "wb") as f:
            f.write(np.ascontiguousarray(array).tobytes())
        os.replace(temporary, prefix + suffix)
