"""The repository's style, checked by the README's test command: ruff's lint rules (ruff.toml) over every
file, and ``ruff format --check`` (one formatting style over the whole repository)."""

import os
import shutil
import subprocess
import sys

from tests._tools import REPO


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
