"""The kernel names a cubin holds, read from its ELF symbol table (no CUDA needed).

A cubin is an ELF64 file; each kernel is a global function symbol in `.symtab`. Reading the names
from the binary rather than the source finds kernels that macros make (rows.cu's take_rows_*).
"""
import struct

_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB = 2
_STT_FUNC = 2
_STB_GLOBAL = 1


def kernel_names(cubin):
    """Returns the sorted names of the global functions (the kernels) in `cubin` (bytes);
    raises ValueError when it is not a little-endian ELF64 file."""
    data = bytes(cubin)
    if data[:4] != _ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 cubin")
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
                for i in range(count)]
    names = set()
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != _SHT_SYMTAB or not symbol_size:
            continue
        strings_offset = sections[link][4]
        for start in range(offset, offset + size, symbol_size):
            name_at, info = struct.unpack_from("<IB", data, start)
            if info & 0xF == _STT_FUNC and info >> 4 == _STB_GLOBAL:
                end = data.index(b"\0", strings_offset + name_at)
                names.add(data[strings_offset + name_at:end].decode())
    return sorted(names)
