"""SOK v2's own dump files, byte for byte as SOK's dump_load.py defines them (HugeCTR
2f2016fa8, sparse_operation_kit/dump_load.py), so SOK's readers (HPS conversion, a user's
tools) read sok1x's dumps and a folder SOK dumped loads into sok1x at any rank count.

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
This module is the layout only; sok_write.py and sok_read.py move the bytes, sok_marker.py
makes a dump appear whole.
"""
import collections
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

SokTable = collections.namedtuple("SokTable", "name stem dim dynamic key_limit owner slots")
SokTable.__doc__ = """One table in SOK's files: name (the engine table), stem (SOK's file stem),
dim, dynamic (a DynamicVariable: a hash table, rows by key), key_limit (a sok1x.Variable's
number of keys, None for a DynamicVariable), owner (the rank holding every row of a localized
table, None when spread), slots: (file suffix "<Optimizer>-<slot>", slot name, engine slot
(name, initial value)) per optimizer slot written or read."""

SokFile = collections.namedtuple("SokFile", "suffix file_type slot_name")
SokFile.__doc__ = """One of a table's files: its name's suffix after "<stem>-", SOK's file type
and slot name (its header's)."""


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


def files_of(table):
    """The SokFiles of `table` (a SokTable): key, weight, then one per slot."""
    return ([SokFile("key", KEY_FILE, ""), SokFile("weight", WEIGHT_FILE, "")]
            + [SokFile(suffix, STATE_FILE, slot) for suffix, slot, _ in table.slots])


def file_name(stem, suffix):
    """'<stem>-<suffix>': the name SOK gives a table's file."""
    return "%s-%s" % (stem, suffix)


def encode_header(file_type, slot_name, dtype):
    """Returns SOK's 296-byte file header (see the module docstring)."""
    index = [np.dtype(d) for d in DTYPES].index(np.dtype(dtype))
    return (" " * TABLE_NAME_BYTES).encode() + int(file_type).to_bytes(INT_BYTES, "big") + \
        slot_name.rjust(SLOT_NAME_BYTES, " ").encode() + index.to_bytes(INT_BYTES, "big")


def open_file(path, file_type, slot_name=""):
    """Checks SOK file `path`'s header; returns (dtype, number of values after it). Raises
    CheckpointError naming the file when it is missing, short, of another type or slot, or
    ragged."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
    except OSError as error:
        raise CheckpointError("SOK dump file %s cannot be read: %s" % (path, error)) from None
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
    if (size - HEADER_BYTES) % dtype.itemsize:
        raise CheckpointError("SOK dump file %s: %d bytes after the header are not whole %s "
                              "values" % (path, size - HEADER_BYTES, dtype.name))
    return dtype, (size - HEADER_BYTES) // dtype.itemsize


def rounds(rows, dim, itemsize):
    """SOK's save rounds of a rank's [rows, dim] array: (rounds, rows per round)."""
    if rows * dim * itemsize <= ROUND_BYTES:
        return 1, rows
    per_round = ROUND_BYTES // (dim * itemsize)
    return -(-rows // per_round), per_round


def segments(rows_per_rank, dim, owner):
    """Where each rank's rows go in a table's files, in file order: [(rank, first row, stop
    row, first row in the file)]. rows_per_rank: every rank's row count; owner: the rank that
    writes a localized table alone (its rows in one piece), None for SOK's rounds (float32
    rows: the rounds of every file of the table follow the weight file's)."""
    if owner is not None:
        count = rows_per_rank[owner]
        return [(owner, 0, count, 0)] if count else []
    plans = [rounds(count, dim, 4) for count in rows_per_rank]
    out, at = [], 0
    for index in range(max(plan[0] for plan in plans)):
        for rank, (count, (_, per_round)) in enumerate(zip(rows_per_rank, plans)):
            first, stop = min(index * per_round, count), min((index + 1) * per_round, count)
            if stop > first:
                out.append((rank, first, stop, at))
                at += stop - first
    return out
