"""The repository's style, checked by the README's test command: ruff's lint rules (ruff.toml) over every
file, and ``ruff format --check`` (one formatting style over the whole repository)."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from backbones import FAMILIES
from tests._tools import REPO

ROOT = Path(REPO)


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # the ruff of this interpreter's environment (setup.cfg's test extras), else one on PATH
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert ruff, 'ruff is not installed: pip install -e ".[test]" (tools/setup_env.sh does)'
    return subprocess.run([ruff, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_passes():
    out = _ruff("check", ".")
    assert out.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix .`):\n{out.stdout}"


def test_ruff_format_check_passes():
    out = _ruff("format", "--check", ".")
    assert out.returncode == 0, f"files not formatted (run `ruff format .`):\n{out.stdout}"


def test_tools_are_thin_command_lines_and_nothing_edits_sys_path():
    # tools/ holds argument parsing plus calls into backbones/, tasks/ and perf/; every package is imported
    # normally (the checkout on sys.path as the working directory or the installed package), never by path edits
    long = {p.name: n for p in (ROOT / "tools").glob("*.py") if (n := len(p.read_text().splitlines())) > 250}
    assert not long, f"tools above 250 lines (move the logic into a package): {long}"
    edits = [
        str(p.relative_to(ROOT))
        for folder in ("tools", "tests", "backbones", "tasks", "perf", "configs")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "test_style.py" and "sys.path." in p.read_text()
    ]
    assert not edits, f"sys.path edits: {edits}"


def test_package_files_stay_short():
    # a file in tasks/ or perf/ has one purpose; past 300 lines it has two: split it by purpose (CONTRIBUTING.md)
    files = [p for folder in ("tasks", "perf") for p in (ROOT / folder).rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > 300}
    assert len(files) > 40 and not long, f"files above 300 lines (split them by purpose): {long}"


_FAMILY_NAME = re.compile(r"stvit|hat_?net|hat-net", re.I)


def _conditions(tree: ast.AST):
    """The expressions that choose a branch: if / elif / while / ternary tests, comprehension filters,
    comparisons (``==``, ``in`` ...), match subjects, patterns and guards."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            yield node.test
        elif isinstance(node, ast.comprehension):
            yield from node.ifs
        elif isinstance(node, ast.Compare):
            yield node
        elif isinstance(node, ast.match_case):
            yield node.pattern
            if node.guard is not None:
                yield node.guard
        elif isinstance(node, ast.Match):
            yield node.subject


def _family_names(expr: ast.AST):
    for n in ast.walk(expr):
        text = n.value if isinstance(n, ast.Constant) else getattr(n, "id", None) or getattr(n, "attr", None)
        if isinstance(text, str) and _FAMILY_NAME.search(text):
            yield text


def test_no_branch_on_a_family_name_outside_its_file():
    # what differs between families comes from their record (backbones/families.py), so that a new family is its
    # file plus one registration; names in docstrings, comments, help texts and config paths are fine
    family_files = {Path(sys.modules[f.cls.__module__].__file__).resolve() for f in FAMILIES.values()}
    files = [p for folder in ("backbones", "tasks", "perf", "tools") for p in sorted((ROOT / folder).rglob("*.py"))]
    branches = [
        f"{p.relative_to(ROOT)}:{cond.lineno}: {name!r}"
        for p in files
        if p.resolve() not in family_files
        for cond in _conditions(ast.parse(p.read_text(), str(p)))
        for name in _family_names(cond)
    ]
    assert len(files) > 100 and len(family_files) >= 2 and not branches, f"branches on a family name: {branches}"
