"""Host arrays as a framework takes them in place: C-contiguous and 64-byte aligned."""
import numpy as np

ALIGNMENT = 64  # TensorFlow refuses (aborts on) tensors whose data is not 64-byte aligned


def exportable(array):
    """Returns `array` as to_dlpack hands it over without a copy: C-contiguous and 64-byte
    aligned (copied if it is not). The engine passes rows it will recognise (distinct_rows)
    through it, so the framework hands the same memory back."""
    array = np.asarray(array)
    if not array.flags.c_contiguous or array.ctypes.data % ALIGNMENT:
        raw = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        aligned = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        aligned[...] = array
        array = aligned
    return array
