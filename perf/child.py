"""Child processes of the measurements (a model's peak memory alone, a compile that may crash or hang): started
with this package importable, answering with one JSON line, the last of their stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout holding perf/, backbones/ and tasks/


def python_env(extra: dict | None = None) -> dict:
    """This process's environment with the checkout first on PYTHONPATH (an uninstalled checkout, as on the GPU
    machine, imports the packages from there; what PYTHONPATH held stays after it), and ``extra`` on top."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(extra or {})}


def run_module(
    module: str, *args: str, timeout: float | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m module args`` in a child process (stdout and stderr captured, exit status not checked), with
    the variables of ``env`` added to its environment."""
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=python_env(env), timeout=timeout)


def last_json(done: subprocess.CompletedProcess) -> dict:
    """The JSON object on the last line of a finished child's stdout; its stderr's end in the error otherwise."""
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(done.args[:3])} failed (exit status {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1])
