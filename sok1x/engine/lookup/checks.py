"""Input checks of the embedding ops. Each returns an InvalidInputError (or None) instead of
raising, so the error can ride along with the step's first exchange and be raised on every rank
together (D7), before any table changes."""
import numpy as np

from sok1x.errors import InvalidInputError

KEY_DTYPES = (np.int64, np.int32)


V1_LIMIT = ("max_vocabulary_size_per_gpu * world_size",
            "raise max_vocabulary_size_per_gpu or use use_hashtable=True")
VARIABLE_LIMIT = ("the number of rows of the sok1x.Variable", "keys are row ids 0..rows-1")


def check_keys(layer, keys, key_limit=None, limit_name=V1_LIMIT):
    """Checks an array of keys: integer dtype, no negative key, and (without a hash table) every
    key below `key_limit` = max_vocabulary_size_per_gpu * world_size (limit_name: what the limit
    is and the advice, for the message). Returns the error or None."""
    if keys.dtype not in KEY_DTYPES:
        return InvalidInputError("%s: keys must be int64 or int32, got %s" % (layer, keys.dtype))
    if keys.size == 0:
        return None
    flat = keys.reshape(-1)
    smallest = int(flat.min())
    if smallest < 0:
        where = int(np.argmax(flat < 0))
        return InvalidInputError(
            "%s: key %d at flat position %d is negative; keys must be >= 0"
            % (layer, smallest, where))
    if key_limit is not None:
        largest = int(flat.max())
        if largest >= key_limit:
            where = int(np.argmax(flat >= key_limit))
            return InvalidInputError(
                "%s: key %d at flat position %d is beyond %s = %d; %s"
                % (layer, largest, where, limit_name[0], key_limit, limit_name[1]))
    return None


def check_keys_by_bounds(layer, keys, bounds, key_limit, to_host, limit_name=V1_LIMIT):
    """As check_keys, from the (min, max) `bounds` of backend array `keys` (backend.index_bounds,
    one wait for a whole step): the keys are read to the host (to_host) only to name a bad one."""
    if keys.dtype not in KEY_DTYPES:
        return InvalidInputError("%s: keys must be int64 or int32, got %s" % (layer, keys.dtype))
    if keys.size == 0:
        return None
    smallest, largest = int(bounds[0]), int(bounds[1])
    if smallest < 0 or (key_limit is not None and largest >= key_limit):
        return check_keys(layer, to_host(keys), key_limit, limit_name)
    return None


def check_dense_shape(layer, keys, slot_num, nnz_per_slot):
    """Checks that dense keys are [batch, slot_num, nnz_per_slot]. Returns the error or None."""
    if keys.ndim != 3 or keys.shape[1:] != (slot_num, nnz_per_slot):
        return InvalidInputError(
            "%s: keys must have shape [batch, slot_num=%d, nnz_per_slot=%d], got %s"
            % (layer, slot_num, nnz_per_slot, list(keys.shape)))
    return None


def check_sparse_shape(layer, indices, values, dense_shape, slot_num, max_nnz):
    """Checks the shapes of a SparseTensor's parts against [batch * slot_num, max_nnz] (the
    positions inside are checked from their bounds by the caller). Returns error or None."""
    if dense_shape.shape != (2,):
        return InvalidInputError(
            "%s: the SparseTensor must be 2-D [batch * slot_num, max_nnz], got dense_shape %s"
            % (layer, list(dense_shape)))
    rows, width = int(dense_shape[0]), int(dense_shape[1])
    if rows % slot_num:
        return InvalidInputError(
            "%s: dense_shape[0]=%d is not a multiple of slot_num=%d" % (layer, rows, slot_num))
    if width > max_nnz:
        return InvalidInputError(
            "%s: dense_shape[1]=%d exceeds max_nnz=%d" % (layer, width, max_nnz))
    if tuple(indices.shape) != (values.shape[0], 2) or len(values.shape) != 1:
        return InvalidInputError(
            "%s: indices must be [nnz, 2] beside values [nnz], got %s and %s"
            % (layer, list(indices.shape), list(values.shape)))
    return None


def first_error(*errors):
    """Returns the first error that is not None, or None."""
    for error in errors:
        if error is not None:
            return error
    return None
