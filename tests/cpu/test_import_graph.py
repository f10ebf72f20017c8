"""sok1x's modules import each other without a circle (issue 16): each module is read, imports
made inside functions included, and the graph of sok1x modules must have no cycle. Checked on the
installed package, so the layout that ships is the one checked."""
import ast
import os

import sok1x

PACKAGE = os.path.dirname(sok1x.__file__)


def installed_modules():
    """Returns {dotted module name: source path} for every module of the installed package."""
    modules = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = ["sok1x"] + os.path.relpath(path, PACKAGE)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_modules(module, path, modules):
    """Yields the sok1x modules `module` imports anywhere in its source (functions included).
    `from package import name` counts as importing package.name when that is a module."""
    is_package = path.endswith("__init__.py")
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base + "." + alias.name if base + "." + alias.name in modules else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target in modules and target != module:
                yield target


def cycles(graph):
    """Returns the strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph[node]:
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_sok1x_imports_itself_through_others():
    modules = installed_modules()
    graph = {name: set(imported_modules(name, path, modules)) for name, path in modules.items()}
    assert "sok1x.common.handle_variable" in graph["sok1x.v1.layers"], \
        "the reader missed an import it must see"
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
