"""What both backends check before a copy between two device arrays (backend.copy_array)."""


def copy_array_error(dst, src, contiguous):
    """The ValueError of copy_array(dst, src) (either backend) where the two differ in dtype or
    size or they are not both C-contiguous (`contiguous`), else None."""
    if src.dtype == dst.dtype and src.size == dst.size and contiguous:
        return None
    return ValueError("copy_array: a %s %s array into a %s %s one (one dtype and size, "
                      "C-contiguous)" % (src.dtype, list(src.shape), dst.dtype, list(dst.shape)))
