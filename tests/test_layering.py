"""backbones/ is pure PyTorch: it imports nothing of Lightning, mmengine's config code or this repository's
tasks/, tools/ and perf/ (reading training checkpoints and configs is tasks/'s job), at module level or inside
functions."""

import ast
import pathlib
import subprocess
import sys

from tests._tools import REPO

BACKBONES = pathlib.Path(REPO) / "backbones"
FORBIDDEN = ("lightning", "pytorch_lightning", "mmengine.config", "mmengine.Config", "tasks", "tools", "tests", "perf")


def imported_names(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import in a file, anywhere in it; ``from a import b`` gives both
    ``a`` and ``a.b`` (so ``from mmengine import Config`` is seen)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return names


def _forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def test_backbones_source_imports_no_lightning_mmengine_config_or_tasks():
    files = sorted(BACKBONES.rglob("*.py"))
    assert len(files) > 5
    bad = [
        f"{p.relative_to(REPO)}:{line}: {name}" for p in files for line, name in imported_names(p) if _forbidden(name)
    ]
    assert bad == []


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from mmengine.config import Config\n    import lightning as L\n")
    assert [name for _, name in imported_names(sample) if _forbidden(name)] == [
        "mmengine.config",
        "mmengine.config.Config",
        "lightning",
    ]


def test_importing_every_backbones_module_loads_no_lightning_and_no_tasks():
    code = (
        "import pkgutil, importlib, sys\nimport backbones\n"
        'for m in pkgutil.walk_packages(backbones.__path__, "backbones."):\n'
        "    importlib.import_module(m.name)\n"
        'print(sorted({n.split(".")[0] for n in sys.modules}))\n'
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    top_level = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
    assert "backbones" in top_level
    assert not top_level & {"lightning", "pytorch_lightning", "lightning_fabric", "tasks"}


def test_tasks_import_nothing_of_the_measurement_package():
    # perf/ measures the library; the library must run without it (perf/__init__.py)
    files = sorted((pathlib.Path(REPO) / "tasks").rglob("*.py"))
    bad = [
        f"{p.relative_to(REPO)}:{line}: {n}"
        for p in files
        for line, n in imported_names(p)
        if n.split(".")[0] == "perf"
    ]
    assert len(files) > 5 and bad == []
