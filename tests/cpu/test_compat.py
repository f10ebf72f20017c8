"""What sok1x promises about where it runs: TensorFlow 1.15's API only, Python 3.7 syntax, and a
framework-free engine. Checked on the installed package, so what ships is what is checked."""
import ast
import os
import shutil
import subprocess

import pytest
from without_modules import run_without

import sok1x

PACKAGE = os.path.dirname(sok1x.__file__)
# Every public name of TensorFlow 1.15 (a copy of the project's shared/data/tf115_api.txt, kept in
# the repository so that CI's fresh clone checks it too).
TF115_API = os.path.join(os.path.dirname(__file__), "..", "data", "tf115_api.txt")
# Names bound to TensorFlow modules in sok1x's sources, and the prefix in the 1.15 API list.
TF_ROOTS = {"tf": "", "tf1": "compat.v1.", "keras": "keras."}
FRAMEWORK_FREE = ("engine", "backend", "comm")


def package_sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def dotted_chains(tree):
    """Yields the longest attribute chains rooted at a TensorFlow module name, e.g.
    'tf1.train.SessionRunHook', with the line they are on; an assignment's target chain counts
    without the name it sets."""
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in TF_ROOTS:
            parts, top = [node.id], node
            while isinstance(parents.get(top), ast.Attribute) and parents[top].value is top:
                top = parents[top]
                parts.append(top.attr)
            if "__version__" in parts:  # tf.__version__ is in every release, a str after it
                parts = parts[:parts.index("__version__")]
            if isinstance(getattr(top, "ctx", None), ast.Store):
                parts = parts[:-1]  # `tf.x = ...` sets x (where it is missing, too): uses tf only
            if len(parts) > 1:
                yield ".".join(parts), node.lineno


def resolve_in_installed_tf(chain):
    import tensorflow as tf
    roots = {"tf": tf, "tf1": tf.compat.v1, "keras": tf.keras}
    parts = chain.split(".")
    obj = roots[parts[0]]
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def test_every_tensorflow_name_is_in_tf_1_15_and_the_tested_tf():
    if not os.path.exists(TF115_API):
        pytest.fail("tests/data/tf115_api.txt is missing")
    with open(TF115_API) as handle:
        api = {line.strip() for line in handle if line.strip() and not line.startswith("#")}
    modules = {name.rsplit(".", i)[0] for name in api for i in range(1, name.count(".") + 1)}
    missing, seen = [], 0
    for path in package_sources():
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for chain, line in dotted_chains(tree):
            root, rest = chain.split(".", 1)
            name = TF_ROOTS[root] + rest
            seen += 1
            # A module (tf.keras) holds API names; a method of an API class
            # (tf1.train.SessionRunHook.begin) is covered by the class.
            if name not in api and name not in modules and name.rsplit(".", 1)[0] not in api:
                missing.append("%s:%d %s (as %s)" % (os.path.relpath(path, PACKAGE), line, chain,
                                                     name))
                continue
            resolve_in_installed_tf(chain)
    assert seen > 20, "the scan found too few TensorFlow names to be looking at the right code"
    assert not missing, "names not in TensorFlow 1.15:\n" + "\n".join(missing)


def test_engine_backend_and_comm_never_import_tensorflow():
    offenders = []
    for path in package_sources():
        relative = os.path.relpath(path, PACKAGE)
        if relative.split(os.sep)[0] not in FRAMEWORK_FREE:
            continue
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in ("tensorflow", "keras") or name.startswith(
                        "sok1x.graph_ops") or name == "sok1x.layers":
                    offenders.append("%s:%d imports %s" % (relative, node.lineno, name))
    assert not offenders, "\n".join(offenders)


def test_engine_runs_without_tensorflow_installed():
    """Imports the engine in a process where `import tensorflow` fails."""
    result = run_without(("tensorflow", "keras"), (
        "import sok1x.engine.api, sok1x.engine.lookup.key_exchange, sok1x.backend.cpu\n"
        "import sok1x.comm.mpi\n"
        "print('ok')\n"))
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_python_3_7_syntax():
    vermin = shutil.which("vermin")
    if vermin is None:
        pytest.skip("vermin is not installed")
    result = subprocess.run([vermin, "--target=3.7-", "--no-tips", "--violations",
                             "--eval-annotations", PACKAGE], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
