"""SOK v2's own dump files, written and read byte for byte as SOK's dump_load.py defines them
(HugeCTR 2f2016fa8, sparse_operation_kit/dump_load.py), so SOK's readers (HPS conversion, a
user's tools) read sok1x's dumps and a folder SOK dumped loads into sok1x at any rank count.

A folder holds, per table, files named from the variable's name with every punctuation
character made "_" (`emb:0` -> `emb_0`):
    <stem>-key                 the keys
    <stem>-weight              the rows [keys, dim], in the keys' order
    <stem>-<Optimizer>-<slot>  an optimizer slot's rows, in the same order (Optimizer: the last
                               of SGD, Adamax, Adadelta, Adagrad, Ftrl, Adam in its class name)
Each starts with SOK's 296-byte header: the table name right-justified in 256 bytes (SOK leaves
it empty: 256 spaces), the file type (key 0, weight 1, slot 2) as a big-endian uint32, the slot
name right-justified in 32 bytes, the data type's index (int32 0, int64 1, uint32 2, uint64 3,
float16 4, float32 5, float64 6) as a big-endian uint32; then the array's raw bytes.
Rows come as SOK's allgather writes them: in rounds of at most 64 MiB per rank, each round every
rank's slice in rank order (a rank's rows ascend by row, a DynamicVariable's by key); a table on
one rank ("localized") is written by that rank, a sok1x.Variable's keys as uint64 0..n-1.
Framework-free: the front door (sok1x/v2/sok_dump_files.py) finds the tables and slots.
"""
import os
import string

import numpy as np

from sok1x.errors import CheckpointError

TABLE_NAME_BYTES, SLOT_NAME_BYTES, INT_BYTES = 256, 32, 4
HEADER_BYTES = TABLE_NAME_BYTES + INT_BYTES + SLOT_NAME_BYTES + INT_BYTES  # 296
ROUND_BYTES = 64 * 1024 * 1024
KEY_FILE, WEIGHT_FILE, STATE_FILE = 0, 1, 2
DTYPES = (np.int32, np.int64, np.uint32, np.uint64, np.float16, np.float32, np.float64)
OPTIMIZER_NAMES = ("SGD", "Adamax", "Adadelta", "Adagrad", "Ftrl", "Adam")


def file_stem(variable_name):
    """Returns SOK's file stem of a variable name: each punctuation character becomes "_"."""
    return "".join("_" if c in string.punctuation else c for c in variable_name)


def optimizer_file_name(class_description):
    """Returns SOK's optimizer name in slot file names for str(type(optimizer)) (the last of
    OPTIMIZER_NAMES in it, as SOK's loop keeps); raises CheckpointError for none."""
    found = [name for name in OPTIMIZER_NAMES if name in class_description]
    if not found:
        raise CheckpointError("SOK's dump format names optimizer states only for %s; got %s"
                              % (", ".join(OPTIMIZER_NAMES), class_description))
    return found[-1]


def encode_header(file_type, slot_name, dtype):
    """Returns SOK's 296-byte file header (see the module docstring)."""
    index = [np.dtype(d) for d in DTYPES].index(np.dtype(dtype))
    return (" " * TABLE_NAME_BYTES).encode() + int(file_type).to_bytes(INT_BYTES, "big") + \
        slot_name.rjust(SLOT_NAME_BYTES, " ").encode() + index.to_bytes(INT_BYTES, "big")


def read_file(path, file_type, slot_name=""):
    """Returns the array in SOK file `path` (1-D, its header's dtype). Raises CheckpointError
    naming the file when it is missing, short, of another type or slot, or ragged."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            data = f.read()
    except OSError as error:
        raise CheckpointError("SOK dump file %s cannot be read: %s" % (path, error)) from error
    if len(head) != HEADER_BYTES:
        raise CheckpointError("SOK dump file %s is shorter than SOK's %d-byte header"
                              % (path, HEADER_BYTES))
    kind = int.from_bytes(head[TABLE_NAME_BYTES:TABLE_NAME_BYTES + INT_BYTES], "big")
    slot_at = TABLE_NAME_BYTES + INT_BYTES
    slot = head[slot_at:slot_at + SLOT_NAME_BYTES].decode("utf-8", "replace").strip()
    index = int.from_bytes(head[HEADER_BYTES - INT_BYTES:], "big")
    if kind != file_type or slot != slot_name or index >= len(DTYPES):
        raise CheckpointError("SOK dump file %s: its header says file type %d, slot %r, data type "
                              "%d; expected file type %d, slot %r" % (path, kind, slot, index,
                                                                      file_type, slot_name))
    dtype = np.dtype(DTYPES[index])
    if len(data) % dtype.itemsize:
        raise CheckpointError("SOK dump file %s: %d bytes after the header are not whole %s "
                              "values" % (path, len(data), dtype.name))
    return np.frombuffer(data, dtype=dtype)


def rounds(rows, dim, itemsize):
    """SOK's save rounds of a rank's [rows, dim] array: (rounds, rows per round)."""
    if rows * dim * itemsize <= ROUND_BYTES:
        return 1, rows
    per_round = ROUND_BYTES // (dim * itemsize)
    return -(-rows // per_round), per_round


def _write_gathered(host, path, header, array, round_plan):
    """Rank 0 writes header + every rank's rows of `array` in SOK's rounds (collective)."""
    count, per_round = round_plan
    out = open(path, "wb") if host.rank == 0 else None
    try:
        if out is not None:
            out.write(header)
        for i in range(count):
            piece = array[min(i * per_round, len(array)):min((i + 1) * per_round, len(array))]
            gathered = host.all_gather_v(piece)[0] if host.size > 1 else piece
            if out is not None:
                np.ascontiguousarray(gathered).tofile(out)
    finally:
        if out is not None:
            out.close()


def write_table(host, directory, stem, keys, weights, states, owner=None):
    """Writes one table's SOK files into `directory` (collective). keys: this rank's keys
    (int64, or uint64 for SOK's localized Variable); weights float32 [n, dim] in their order;
    states: [(file suffix "<Optimizer>-<slot>", slot name, float32 [n, dim])]. owner: None when
    every rank holds some rows (rank 0 writes them all, gathered), else the one rank holding
    them all, which writes alone. Raises CheckpointError on every rank for a table with no rows
    (SOK refuses those too)."""
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    dim = int(weights.shape[1])
    counts = [len(keys)] if host.size == 1 else host.all_gather_object(len(keys))
    if sum(counts) == 0:
        raise CheckpointError("%s: the table holds no rows; SOK's dump format cannot hold an "
                              "empty table" % stem)
    files = [("key", KEY_FILE, "", np.asarray(keys))]
    files.append(("weight", WEIGHT_FILE, "", weights))
    files += [(suffix, STATE_FILE, slot, np.ascontiguousarray(rows, dtype=np.float32))
              for suffix, slot, rows in states]
    if owner is not None:
        if host.rank == owner:
            for suffix, kind, slot, array in files:
                with open(os.path.join(directory, "%s-%s" % (stem, suffix)), "wb") as out:
                    out.write(encode_header(kind, slot, array.dtype))
                    np.ascontiguousarray(array).tofile(out)
        return
    plans = [rounds(len(keys), dim, 4)] if host.size == 1 else \
        host.all_gather_object(rounds(len(keys), dim, 4))
    count = max(plan[0] for plan in plans)
    for suffix, kind, slot, array in files:
        _write_gathered(host, os.path.join(directory, "%s-%s" % (stem, suffix)),
                        encode_header(kind, slot, array.dtype), array,
                        (count, rounds(len(keys), dim, 4)[1]))


def read_table(directory, stem, dim, slots):
    """Reads one table's SOK files: returns (keys int64 [n], weights float32 [n, dim],
    [states float32 [n, dim] per (file suffix, slot name) of `slots`]). Raises CheckpointError
    naming the file for a missing or malformed one, or rows of another dim."""
    def path(suffix):
        return os.path.join(directory, "%s-%s" % (stem, suffix))
    keys = read_file(path("key"), KEY_FILE)
    arrays = [read_file(path("weight"), WEIGHT_FILE)]
    arrays += [read_file(path(suffix), STATE_FILE, slot) for suffix, slot in slots]
    names = ["weight"] + [suffix for suffix, _ in slots]
    shaped = []
    for name, array in zip(names, arrays):
        if array.size != keys.size * dim:
            raise CheckpointError("SOK dump file %s holds %d values: not %d keys x dim %d"
                                  % (path(name), array.size, keys.size, dim))
        shaped.append(array.astype(np.float32).reshape(-1, dim))
    if keys.size and (keys.dtype.kind == "i" and keys.min() < 0 or
                      int(keys.max()) > np.iinfo(np.int64).max):
        raise CheckpointError("SOK dump file %s holds keys outside sok1x's int64 range"
                              % path("key"))
    return keys.astype(np.int64), shaped[0], shaped[1:]
