"""The file format of one rank's shard of one table (DESIGN D8).

    magic  b"SOK1XSHD"                    8 bytes
    header length                          uint32 little-endian
    header                                 UTF-8 JSON: version, table, dtype, dim, rows, slots
                                           [[name, initial value], ...], rank, world_size,
                                           chunk_rows
    chunks of up to chunk_rows rows, each:
        keys                               int64 [n] (global keys)
        values                             float32 [n, dim]
        one array per slot, in header order float32 [n, dim]
        update times                       float64 [n] (seconds since the epoch, 0 = never)

Everything is little-endian. A chunk holds every array of its rows, so a reader streams a file
chunk by chunk in bounded memory. The file's size and crc32 are in the checkpoint's manifest
(engine/checkpoint/manifest.py), which is written after every shard, so the shard itself carries
no checksum.
"""
import json
import struct

import numpy as np

from sok1x.errors import CheckpointError

MAGIC = b"SOK1XSHD"
VERSION = 2
DTYPE = "float32"
_LENGTH = struct.Struct("<I")


def row_bytes(dim, slot_count):
    """Bytes one row takes in a shard file: key, values, each slot, update time."""
    return 8 + 4 * int(dim) * (1 + int(slot_count)) + 8


def chunk_rows(dim, slot_count, chunk_bytes):
    """Rows per chunk so that one chunk's arrays take at most `chunk_bytes` (at least 1 row)."""
    return max(1, int(chunk_bytes) // row_bytes(dim, slot_count))


def encode_header(table_name, dim, rows, slots, rank, world_size, rows_per_chunk):
    """Returns the bytes that open a shard file (magic, length, JSON header). slots: list of
    (name, initial value)."""
    header = json.dumps({
        "version": VERSION, "table": table_name, "dtype": DTYPE, "dim": int(dim),
        "rows": int(rows), "slots": [[name, float(initial)] for name, initial in slots],
        "rank": int(rank), "world_size": int(world_size), "chunk_rows": int(rows_per_chunk),
    }, sort_keys=True).encode("utf-8")
    return MAGIC + _LENGTH.pack(len(header)) + header


def file_size(header_bytes, dim, slot_count, rows):
    """The size of a shard file whose encoded header takes `header_bytes`."""
    return int(header_bytes) + int(rows) * row_bytes(dim, slot_count)


def read_header(read, where):
    """Returns (header dict, its encoded length in bytes) read through `read(n) -> bytes`;
    raises CheckpointError naming `where` if it is not a sok1x shard of this version."""
    start = len(MAGIC) + _LENGTH.size
    opening = read(start)
    if len(opening) < start or opening[:len(MAGIC)] != MAGIC:
        raise CheckpointError("%s is not a sok1x checkpoint shard (no %r header): wrong file, "
                              "or it was cut short" % (where, MAGIC))
    length = _LENGTH.unpack_from(opening, len(MAGIC))[0]
    text = read(length)
    if len(text) != length:
        raise CheckpointError("%s is shorter than its own header: the file is truncated"
                              % where)
    try:
        header = json.loads(text.decode("utf-8"))
        header["dim"], header["rows"] = int(header["dim"]), int(header["rows"])
        header["chunk_rows"] = int(header["chunk_rows"])
        header["slots"] = [(str(name), float(initial)) for name, initial in header["slots"]]
        version, table, dtype = header["version"], header["table"], header["dtype"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError("%s: its header is damaged (%s): the file is corrupt"
                              % (where, exc)) from None
    if version != VERSION:
        raise CheckpointError("%s has format version %r; this sok1x reads version %d"
                              % (where, version, VERSION))
    if header["chunk_rows"] < 1 or header["rows"] < 0 or header["dim"] < 1:
        raise CheckpointError("%s: its header is damaged (rows %d, dim %d, chunk_rows %d)"
                              % (where, header["rows"], header["dim"], header["chunk_rows"]))
    del table, dtype
    return header, start + length


def check_header(header, where, table_name, dim, slots):
    """Raises CheckpointError naming `where` unless the header is of table `table_name`, dtype
    float32, `dim` and the slots (name, initial) the manifest lists."""
    if header["table"] != table_name:
        raise CheckpointError("%s holds table %r, not %r: the checkpoint's files are mixed up"
                              % (where, header["table"], table_name))
    if header["dtype"] != DTYPE:
        raise CheckpointError("%s holds %s rows; table %s holds %s" % (
            where, header["dtype"], table_name, DTYPE))
    if header["dim"] != int(dim):
        raise CheckpointError("%s holds rows of dim %d; table %s has dim %d"
                              % (where, header["dim"], table_name, dim))
    if [tuple(s) for s in header["slots"]] != [tuple(s) for s in slots]:
        raise CheckpointError("%s holds slots %s; its manifest lists %s"
                              % (where, header["slots"], slots))


def chunk_layout(rows, dim, slot_count):
    """Returns [(dtype, shape)] of the arrays of a chunk of `rows` rows, in file order."""
    rows, dim = int(rows), int(dim)
    return ([("<i8", (rows,)), ("<f4", (rows, dim))] + [("<f4", (rows, dim))] * int(slot_count)
            + [("<f8", (rows,))])


def split_chunk(buffer, rows, dim, slot_count):
    """Returns (keys, values, [slot arrays], times): views into `buffer` (uint8, exactly one
    chunk of `rows` rows)."""
    arrays, offset = [], 0
    for dtype, shape in chunk_layout(rows, dim, slot_count):
        count = int(np.prod(shape))
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += array.nbytes
        arrays.append(array)
    return arrays[0], arrays[1], arrays[2:-1], arrays[-1]
