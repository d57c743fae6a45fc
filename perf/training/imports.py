"""Start-up of the package and the tools (tools/benchmark_startup.py --imports): fresh processes of one command in
two checkouts, this one and a baseline, alternating, with their wall and CPU time."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from ..child import ROOT

# what every tool and training process starts with: the package, and a tool's whole start (imports, arguments)
COMMANDS = {
    "import backbones": ["-c", "import backbones"],
    "tools/train.py --help": ["tools/train.py", "--help"],
}


def run_once(root: Path, args: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``python ARGS`` in a fresh process, in the checkout ``root`` and
    importing its packages (PYTHONPATH ``root``)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=root, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def compare(baseline: Path, rounds: int, log=print) -> dict:
    """Each command of ``COMMANDS`` ``rounds`` times in this checkout and in ``baseline``, round-robin (which goes
    first alternates). Returns {command: {'this': [(wall, cpu), ...], 'baseline': [...]}}."""
    runs = {c: {"this": [], "baseline": []} for c in COMMANDS}
    for r in range(rounds):
        for command, args in COMMANDS.items():
            order = (("this", ROOT), ("baseline", baseline))
            for name, root in order if r % 2 == 0 else order[::-1]:
                runs[command][name].append(run_once(root, args))
                wall, cpu = runs[command][name][-1]
                log(f"round {r}: {command:24s} {name:8s} wall {wall:5.2f} s, CPU {cpu:5.2f} s")
    return runs
