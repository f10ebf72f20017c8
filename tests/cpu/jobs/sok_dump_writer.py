"""A faithful NumPy writer and reader of SOK v2's dump files, written from SOK's own code
(HugeCTR 2f2016fa8, sparse_operation_kit/dump_load.py: write_file_head, get_save_rounds,
save_table_to_filesystem_static / _dynamic, save_optimizer_to_filesysyem_*), independent of
sok1x: what SOK's processes would write, given each rank's shard as SOK holds it."""
import string

import numpy as np

ROUND_BYTES = 1024 * 1024 * 64  # SOK's save_buffer_size_bytes
DTYPE_INDEX = {np.dtype(np.int32): 0, np.dtype(np.int64): 1, np.dtype(np.uint32): 2,
               np.dtype(np.uint64): 3, np.dtype(np.float16): 4, np.dtype(np.float32): 5,
               np.dtype(np.float64): 6}


def stem(variable_name):
    """SOK's table_name: var.name with each string.punctuation character replaced by "_"."""
    for c in string.punctuation:
        variable_name = variable_name.replace(c, "_")
    return variable_name


def head(file_type, var_name, dtype):
    """write_file_head with SOK's SOK_var_info(): emb_name is never set, so it is ""."""
    return ("".rjust(256, " ").encode() + file_type.to_bytes(4, "big", signed=False)
            + var_name.rjust(32, " ").encode()
            + DTYPE_INDEX[np.dtype(dtype)].to_bytes(4, "big", signed=False))


def _rounds(rows, dim, size, round_bytes):
    """get_save_rounds on one rank (before the allgather of num_rounds)."""
    if rows * dim * size <= round_bytes:
        return 1, rows
    per = int(np.floor(round_bytes / (dim * size)))
    return int(np.ceil(rows / per)), per


def spread_file(file_type, var_name, shards, dim, round_bytes=ROUND_BYTES):
    """The bytes of one file of a table spread over len(shards) ranks: shards[r] is rank r's
    array (keys [n] or rows [n, dim]) in its own order; the rounds come from each rank's rows
    (SOK computes them from the weight's, or the state's, shape, float32)."""
    plans = [_rounds(len(s), dim, 4, round_bytes) for s in shards]
    count = max(p[0] for p in plans)
    out = [head(file_type, var_name, shards[0].dtype)]
    for i in range(count):
        for shard, (_, per) in zip(shards, plans):
            start, end = min(i * per, len(shard)), min((i + 1) * per, len(shard))
            out.append(np.ascontiguousarray(shard[start:end]).tobytes())
    return b"".join(out)


def one_rank_file(file_type, var_name, array):
    """A file the one owning rank writes whole (a localized table)."""
    return head(file_type, var_name, array.dtype) + np.ascontiguousarray(array).tobytes()


def table_files(name, shards, dim, localized, dynamic, optimizer_name=None, slots=(),
                round_bytes=ROUND_BYTES):
    """{file name: bytes} of one table. shards: per rank (keys, weights, {slot: rows}) as SOK's
    rank holds them (a DynamicVariable's as export gives, sorted here by key as SOK does; a
    localized table: one entry, its rank's). localized Variables get SOK's uint64 0..n-1 keys."""
    base = stem(name)
    if dynamic:
        ordered = []
        for keys, weights, states in shards:
            order = np.argsort(keys, kind="stable")
            ordered.append((keys[order], weights[order],
                            {s: rows[order] for s, rows in states.items()}))
        shards = ordered
    files = {}
    if localized:
        keys, weights, states = shards[0]
        if not dynamic:
            keys = np.arange(len(weights), dtype=np.uint64)
        files[base + "-key"] = one_rank_file(0, "", keys)
        files[base + "-weight"] = one_rank_file(1, "", weights)
        for slot in slots:
            files["%s-%s-%s" % (base, optimizer_name, slot)] = one_rank_file(2, slot, states[slot])
        return files
    files[base + "-key"] = spread_file(0, "", [s[0] for s in shards], dim, round_bytes)
    files[base + "-weight"] = spread_file(1, "", [s[1] for s in shards], dim, round_bytes)
    for slot in slots:
        files["%s-%s-%s" % (base, optimizer_name, slot)] = spread_file(
            2, slot, [s[2][slot] for s in shards], dim, round_bytes)
    return files


def read(data):
    """SOK's reader (read_file_head, then np.fromfile past 296 bytes): (file type, slot name,
    array)."""
    file_type = int.from_bytes(data[256:260], "big")
    var_name = data[260:292].decode().strip()
    index = int.from_bytes(data[292:296], "big")
    dtype = [d for d, i in DTYPE_INDEX.items() if i == index][0]
    return file_type, var_name, np.frombuffer(data[296:], dtype=dtype)
