"""The shape of the backbones/ package: no import circle (tests/test_layering.py: no training framework), and
feature_info names real modules."""

import ast
from pathlib import Path

import pytest
import torch

from backbones import HATNet, STViT
from tests._tools import HATNET_T, STVIT_T

PACKAGE = Path(__file__).resolve().parents[1] / "backbones"


def _module_names() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py")}


def _imported(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in the file, at module level or inside functions."""
    package = "backbones"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from .x import y (the package is one level deep)
                base = f"{package}.{base}" if base else package
            if base != package:
                out.append((base, node.lineno))
            else:  # ``from . import x`` / ``from backbones import x``: a submodule, or a name of __init__
                out += [
                    (f"{base}.{alias.name}" if alias.name in _module_names() else base, node.lineno)
                    for alias in node.names
                ]
    return out


def _intra_package_graph() -> dict[str, set[str]]:
    modules = _module_names()
    graph = {}
    for path in PACKAGE.glob("*.py"):
        edges = set()
        for name, _ in _imported(path):
            parts = name.split(".")
            if parts[0] != "backbones":
                continue
            target = parts[1] if len(parts) > 1 and parts[1] in modules else "__init__"
            if target != path.stem:
                edges.add(target)
        graph[path.stem] = edges
    return graph


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


def test_cycle_finder_sees_function_level_imports(tmp_path):
    """The checker itself: a circle hidden inside a function is found."""
    graph = {"a": {"b"}, "b": set()}
    assert _find_cycle(graph) is None
    graph["b"].add("a")
    assert _find_cycle(graph) == ["a", "b", "a"]
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from .stvit import STViT\n    from . import hatnet\n")
    assert {n for n, _ in _imported(f)} >= {"backbones.stvit", "backbones.hatnet"}


def test_backbones_import_graph_is_acyclic():
    graph = _intra_package_graph()
    assert "pretrained" in graph["stvit"] and "pretrained" in graph["hatnet"]  # the graph is really read
    assert _find_cycle(graph) is None, f"import circle in backbones/: {' -> '.join(_find_cycle(graph))}"


@pytest.mark.parametrize("norm_out", [False, True])
@pytest.mark.parametrize("cls,arch", [(STViT, STVIT_T), (HATNet, HATNET_T)], ids=["stvit", "hatnet"])
def test_feature_info_names_the_modules_that_compute_the_outputs(cls, arch, norm_out):
    model = cls(arch, out_indices=(1, 2, 3), norm_out=norm_out).eval()
    captured = {}
    for i, info in enumerate(model.feature_info):
        module = model.get_submodule(info["module"])
        module.register_forward_hook(lambda m, args, out, i=i: captured.__setitem__(i, out))
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert sorted(captured) == [0, 1, 2, 3]
    for i, out in zip(model.out_indices, outs):
        assert model.feature_info[i]["num_chs"] == out.shape[1]
        torch.testing.assert_close(captured[i], out, rtol=0, atol=0)
