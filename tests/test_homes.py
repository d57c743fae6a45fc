"""One home per name: every name of backbones/, tasks/ and perf/ is imported from the module that defines it, never
through a module that only imports it (a re-export "for compatibility"), and no module gives a name a second one
(``Old = New``); the one front door is ``backbones/__init__.py``, whose ``__all__`` names code outside backbones/
takes from ``backbones``."""

import ast
import functools
from pathlib import Path

from tests._tools import REPO

PACKAGES = ("backbones", "tasks", "perf")
FRONT_DOOR = Path("backbones/__init__.py")


def _module_file(root: Path, dotted: str) -> Path | None:
    base = root.joinpath(*dotted.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def _tree(path: Path) -> ast.Module:
    return _parse(path.read_text(), str(path))


@functools.cache  # each file is read by several checks
def _parse(text: str, name: str) -> ast.Module:
    return ast.parse(text, name)


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (also inside if / try / with blocks), not those it imports."""
    names = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    visit(block)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(_tree(path).body)
    return names


def _all(path: Path) -> list[str]:
    for node in _tree(path).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def second_homes(root: Path) -> list[str]:
    """Each import of a project name from a module that does not define it, each ``__all__`` entry defined
    elsewhere and each top-level ``Old = New``, as ``file:line: what``. tests/data/ is left out: its files are
    copied into a package."""
    api, defined, found = set(_all(root / FRONT_DOOR)), {}, []
    files = [
        p for f in (*PACKAGES, "tools", "tests") for p in sorted((root / f).rglob("*.py")) if "data" not in p.parts
    ]
    for path in files:
        rel = path.relative_to(root)
        tree = _tree(path)
        found += [
            f"{rel}:{node.lineno}: {node.targets[0].id} = {node.value.id}, a second name"
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and isinstance(node.targets[0], ast.Name)
        ]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            here = list(rel.parent.parts)
            parts = here[: len(here) - node.level + 1] if node.level else []
            parts += node.module.split(".") if node.module else []
            module = ".".join(parts)
            source = _module_file(root, module) if parts and parts[0] in PACKAGES else None
            if source is None:
                continue
            outside = rel.parts[0] != "backbones"
            for alias in node.names:
                name = alias.name
                if _module_file(root, f"{module}.{name}") or (outside and module == "backbones" and name in api):
                    continue
                if outside and name in api:
                    found.append(f"{rel}:{node.lineno}: {name} from {module}; take it from backbones")
                elif name not in defined.setdefault(source, _defined(source)):
                    found.append(f"{rel}:{node.lineno}: {name} from {module}, which only imports it")
        if rel != FRONT_DOOR:
            elsewhere = set(_all(path)) - defined.setdefault(path, _defined(path))
            found += [f"{rel}: __all__ lists {name}, defined elsewhere" for name in sorted(elsewhere)]
    return found


def test_every_name_is_imported_from_its_one_home():
    found = second_homes(Path(REPO))
    assert not found, "import each name from the module that defines it:\n" + "\n".join(found)


def test_the_check_sees_a_re_export_an_alias_and_a_second_door(tmp_path):
    (tmp_path / "backbones").mkdir()
    (tmp_path / "backbones/__init__.py").write_text('from .errors import Error\n__all__ = ["Error"]\n')
    (tmp_path / "backbones/errors.py").write_text("class Error(Exception):\n    pass\n")
    (tmp_path / "backbones/weights.py").write_text("from .errors import Error\nOldError = Error\n")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/a.py").write_text(
        "from backbones import Error\nfrom backbones.errors import Error\nfrom backbones.weights import Error\n"
        "from backbones.weights import OldError\n"
    )
    alias = "backbones/weights.py:2: OldError = Error, a second name"
    assert sorted(second_homes(tmp_path)) == [
        alias,
        "tasks/a.py:2: Error from backbones.errors; take it from backbones",
        "tasks/a.py:3: Error from backbones.weights; take it from backbones",
    ]
    (tmp_path / "backbones/__init__.py").write_text("")  # Error is no front-door name now
    assert sorted(second_homes(tmp_path)) == [
        alias,
        "tasks/a.py:1: Error from backbones, which only imports it",
        "tasks/a.py:3: Error from backbones.weights, which only imports it",
    ]
