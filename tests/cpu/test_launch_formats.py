"""Every kernel the cuda backend prepares is launched with arguments laid out as its C signature
asks (no GPU needed): a launch format that disagrees with its kernel (an int32 where an int64
goes, a SplitRows of three fields where the struct has four) shifts every later argument and
corrupts memory on the device, and only a GPU run would show it.

For each `prepared(source, name, format)` in sok1x/backend/cuda (and its wrappers, which name the
source for their callers), the format's packed layout (PyCUDA packs as Python's struct does, with
native alignment) must tile the kernel's parameters exactly as nvcc laid them out: the offset and
size of each parameter, read from the cubin's .nv.info.<kernel> section (EIATTR_KPARAM_INFO), a
struct parameter covered by consecutive fields. Kernel names made by concatenation with a
variable (rows.py's "take_rows_" + suffix) are checked against every kernel of that prefix.

Run it against the installed package, from outside the checkout:
    pip install . && cd /tmp && python -m pytest -q <repo>/tests/cpu/test_launch_formats.py
"""
import ast
import fnmatch
import os
import struct

import pytest
from mpi_jobs import lane_a_only

from sok1x import cuda_kernels

pytestmark = [lane_a_only(), pytest.mark.skipif(
    cuda_kernels.find_nvcc() is None, reason="nvcc not found (set SOK1X_NVCC or CUDA_HOME)")]
CUDA_BACKEND = os.path.join(os.path.dirname(cuda_kernels.KERNEL_DIR), "backend", "cuda")
# Functions that call prepared() for their callers: (module, function) -> its kernel source.
WRAPPERS = {("optimizers.py", "_kernel"): "optimizers.cu",
            ("kernel_launch.py", "_rows_kernel"): "rows.cu"}
_KPARAM_INFO, _SVAL = 0x17, 0x04


def kernel_parameters(cubin):
    """{kernel: [(offset, size)] of its parameters, by offset} from an ELF64 cubin's
    .nv.info.<kernel> sections."""
    section_offset, = struct.unpack_from("<Q", cubin, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, section_offset + i * entry_size)
                for i in range(count)]
    names_at = sections[names_index][4]
    out = {}
    for name_at, _, _, _, offset, size, _, _, _, _ in sections:
        end = cubin.index(b"\0", names_at + name_at)
        name = cubin[names_at + name_at:end].decode()
        if not name.startswith(".nv.info."):
            continue
        params, at = [], offset
        while at < offset + size:
            form, attribute = cubin[at], cubin[at + 1]
            if form != _SVAL:  # a value of its own: 2 bytes after the header
                at += 4
                continue
            length, = struct.unpack_from("<H", cubin, at + 2)
            if attribute == _KPARAM_INFO:
                _, _, param_offset, info = struct.unpack_from("<IHHI", cubin, at + 4)
                params.append((param_offset, (info >> 18) & 0x3FFF))
            at += 4 + length
        out[name[len(".nv.info."):]] = sorted(params)
    return out


def format_fields(arg_format):
    """[(offset, size)] of each field PyCUDA packs for `arg_format` (native alignment)."""
    fields, offset = [], 0
    for code in arg_format:
        size = struct.calcsize(code)
        offset = -(-offset // size) * size
        fields.append((offset, size))
        offset += size
    return fields


class _Values(ast.NodeVisitor):
    """Evaluates the string expressions of a module: constants, +, * by an int, and names bound
    to such expressions at module level or in the enclosing function; anything else (a name
    bound otherwise, a % format) becomes the glob "*"."""

    def __init__(self, scopes):
        self.scopes = scopes

    def value(self, node):
        literal = _literal(node)
        if isinstance(literal, (str, int)):
            return literal
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = self.value(node.left), self.value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(node.op, ast.Mult) and {type(left), type(right)} == {str, int}:
                return left * right
            return "*"
        if isinstance(node, ast.Name):
            for scope in self.scopes:
                if node.id in scope:
                    return self.value(scope[node.id])
        return "*"


def _literal(node):
    """A constant's value (Python 3.7's parser makes Str and Num nodes, later ones Constant),
    else None."""
    if type(node).__name__ in ("Constant", "Str", "Num", "NameConstant"):
        for field in ("value", "s", "n"):
            if hasattr(node, field):
                return getattr(node, field)
    return None


def _assignments(body):
    return {target.id: node.value for node in body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def prepared_calls():
    """[(module, line, source, name pattern, format)] of every kernel the cuda backend
    prepares with a format known from its source."""
    calls = []
    for module in sorted(os.listdir(CUDA_BACKEND)):
        if not module.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(CUDA_BACKEND, module)).read())
        module_scope = _assignments(tree.body)
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
        for function in functions:
            values = _Values([_assignments(function.body), module_scope])
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                    continue
                wrapper = [source for (m, f), source in WRAPPERS.items()
                           if call.func.id == f and (m == module or f != "_kernel")]
                if call.func.id == "prepared" and (module, function.name) not in WRAPPERS:
                    args = [values.value(a) for a in call.args]
                elif wrapper and (module, function.name) not in WRAPPERS:
                    args = [wrapper[0]] + [values.value(a) for a in call.args]
                else:
                    continue
                if len(args) == 3 and all(isinstance(a, str) for a in args) and \
                        "*" not in args[0] and "*" not in args[2]:
                    calls.append((module, call.lineno) + tuple(args))
    return calls


CALLS = prepared_calls()


def test_the_backends_prepared_kernels_are_all_found():
    """The scan sees the backend's kernels, so the check below cannot pass by finding none."""
    assert len(CALLS) >= 60, CALLS
    names = {call[3] for call in CALLS}
    assert {"take_rows_*", "update_lazy_adam*", "init_rows_tagged_float32",
            "hash_find_or_insert_values", "host_region_counts"} <= names, names


@pytest.mark.parametrize("source", sorted({call[2] for call in CALLS}))
def test_launch_formats_match_the_kernels(source):
    parameters = kernel_parameters(cuda_kernels.compile_cubin(source, "sm_90"))
    problems = []
    for module, line, _, pattern, arg_format in (c for c in CALLS if c[2] == source):
        kernels = [name for name in parameters if fnmatch.fnmatchcase(name, pattern)]
        if not kernels:
            problems.append("%s:%d: no kernel %s in %s" % (module, line, pattern, source))
        fields = format_fields(arg_format)
        for name in kernels:
            covered = []
            for offset, size in parameters[name]:
                inside = [(o, s) for o, s in fields if offset <= o < offset + size]
                if sum(s for _, s in inside) != size or not inside or inside[0][0] != offset:
                    covered = None
                    break
                covered += inside
            if covered != fields:
                problems.append("%s:%d: %s's format %r packs %s; the kernel's parameters are %s"
                                % (module, line, name, arg_format, fields, parameters[name]))
    assert not problems, "\n".join(problems)
