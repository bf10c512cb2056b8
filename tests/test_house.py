"""The house: the core flat at the top of gitdrop/, each face in a package of its
own, and an import graph without circles (every import counted, also those made
inside a function)."""

import ast
import os

import gitdrop

ROOT = os.path.dirname(gitdrop.__file__)
FACES = ("gitdrop.cli", "gitdrop.mcp", "gitdrop.transports")


def modules() -> dict:
    out = {}
    for d, _dirs, files in os.walk(ROOT):
        if "__pycache__" in d:
            continue
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[name[:-9] if name.endswith(".__init__") else name] = path
    return out


def graph() -> dict:
    mods = modules()
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1]
                                    + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in mods else base
                    if target in mods and target not in (m, "gitdrop"):
                        edges[m].add(target)
            elif isinstance(node, ast.Import):
                edges[m].update(a.name for a in node.names if a.name in mods and a.name != m)
    return edges


def cycles(edges: dict) -> list:
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circles():
    assert cycles(graph()) == []


def test_the_core_imports_no_face():
    """The core may open a hub at a git URL (the remote client, a transport) but
    never imports the command line or the MCP server."""
    for m, targets in graph().items():
        if m.startswith(FACES) or m == "gitdrop.__main__":   # `python -m gitdrop` is the CLI
            continue
        assert not [t for t in targets if t.startswith(("gitdrop.cli", "gitdrop.mcp"))], m


def test_faces_live_in_their_packages():
    flat = {m.rpartition(".")[2] for m in modules() if m.count(".") == 1}
    assert not {n for n in flat if n.startswith(("cli", "mcp_"))} - {"cli", "mcp"}
    assert not flat & {"remote", "shell", "httpd", "demo"}


# Where each refusal takes its next step ("fix"): the position of the argument.
FIX_AT = {"_refuse": 3, "Refusal": 2, "UsageError": 1, "NotFound": 1, "Ambiguous": 1,
          "Conflict": 1, "Unreachable": 1}


def test_every_refusal_says_what_to_do_next():
    """Every rule refusal and usage, not-found or conflict error in the code names a
    next step: a refusal without one left an agent nowhere to go (found by calling
    every MCP tool with hostile values). The markers the write loop keeps to itself
    are the exception: Conflict("", "") never reaches a caller."""
    missing = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            kind = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) \
                else ""
            if kind not in FIX_AT or any(isinstance(a, ast.Starred) for a in node.args):
                continue
            at = FIX_AT[kind]
            fix = node.args[at] if len(node.args) > at else \
                next((k.value for k in node.keywords if k.arg == "fix"), None)
            empty = fix is None or isinstance(fix, ast.Constant) and fix.value == ""
            marker = kind == "Conflict" and all(isinstance(a, ast.Constant) and a.value == ""
                                               for a in node.args)
            if empty and not marker:
                missing.append(f"{name}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert not missing, "\n".join(missing)
