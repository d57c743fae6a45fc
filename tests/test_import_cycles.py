"""No import circle inside any package of the project (backbones, tasks and its rooms, perf), counting the imports
inside functions too: a function-level import hides a circle from Python until the function runs, not from the
design."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("backbones", "tasks", "perf")


def _modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} of every module of ``packages`` (a package's own name for its __init__.py)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` (file ``path``) imports, at module level or inside functions:
    ``from a import b`` counts as importing ``a.b`` where that is a module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: climb level - 1 packages above this module's package
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def _graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    modules = _modules(root, packages)
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_sees_function_level_and_nested_relative_imports(tmp_path):
    """The checker itself: a circle hidden inside a function, through a ``..`` import of a sub-package, is found."""
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    room = tmp_path / "pkg" / "room"
    room.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (room / "__init__.py").write_text("")
    (tmp_path / "pkg" / "top.py").write_text("from .room import low\n")
    (room / "low.py").write_text("def f():\n    from ..top import g\n")
    graph = _graph(tmp_path, ("pkg",))
    assert graph["pkg.top"] == {"pkg.room.low"} and graph["pkg.room.low"] == {"pkg.top"}
    assert _find_cycle(graph) == ["pkg.room.low", "pkg.top", "pkg.room.low"]


def test_no_import_circle_in_any_package():
    graph = _graph()
    # the graph is really read: known edges of each package, a nested relative import and a function-level one
    assert "backbones.checkpoints.pretrained" in graph["backbones.models.base"]
    assert "tasks.config.load" in graph["tasks.training.trackers"]
    assert "perf.official" in graph["perf.models"]
    assert {p.split(".")[0] for p in graph} == set(PACKAGES) and "tasks.training.module" in graph
    cycle = _find_cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"
