

# --- Appended by scripts/sok_scripts/run.py to SOK's v1 utils.py: its two CuPy helpers (GPU
# data generation and a GPU row sort) in NumPy, same outputs (keys of slot s drawn from
# [s*vocab_per_slot, (s+1)*vocab_per_slot)). Appended, these later definitions win.
import numpy as np
def generate_random_samples(num_of_samples, vocabulary_size, slot_num, max_nnz, dtype=np.int64,
                            use_sparse_mask=True):
    if vocabulary_size // slot_num <= 2 * max_nnz:
        raise ValueError("Too small vocabulary_size")
    vocab_per_slot = vocabulary_size // slot_num
    if use_sparse_mask:
        mask = np.random.choice([-1, 1], size=(num_of_samples, slot_num, max_nnz))
        sum_ = np.sum(mask, axis=-1, keepdims=True)
        mask = np.where(np.broadcast_to(sum_ == -max_nnz, mask.shape) &
                        (np.arange(max_nnz) == 0), 1, mask)
    all_keys = (np.arange(slot_num).reshape(1, slot_num, 1) * vocab_per_slot +
                np.random.randint(0, vocab_per_slot, size=(num_of_samples, slot_num, max_nnz)))
    all_keys = all_keys.astype(np.int64)
    if use_sparse_mask:
        all_keys[mask == -1] = -1
    all_keys = np.sort(all_keys, axis=-1)[:, :, ::-1]
    all_labels = np.random.randint(low=0, high=2, size=(num_of_samples, 1))
    return all_keys, all_labels


def sort_embedding_variables_by_key(keys, embedding_values, embedding_vec_size,
                                    use_hashtable=True, gpu_num=None):
    keys = np.asarray(keys).astype(np.int64)
    values = np.asarray(embedding_values, dtype=np.float32).reshape(-1, embedding_vec_size)
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]
