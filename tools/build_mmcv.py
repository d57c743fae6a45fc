"""Builds the mmcv 2.1.0 wheel with its compiled ops from an unpacked sdist, quietly and fast.

Run by tools/setup_env.sh with the virtual environment's Python (torch installed, the project not yet):

    python tools/build_mmcv.py SRC_DIR WHEEL_DIR --log LOG [--jobs N]

What it changes against a plain ``pip wheel`` of the sdist, and why:
- C++20: torch >= 2.10's headers need it; mmcv's setup.py hard-codes -std=c++14 / -std=c++17.
- No debug information at the interpreter's own optimisation level. setuptools *replaces* the interpreter's
  CFLAGS when ``CFLAGS`` is set, so it gets those flags with ``-g`` swapped for ``-g0`` (a bare ``-g0`` would
  build at -O0). Debug information made the wheel 32 MB instead of 1.4 MB and the compile twice as long.
- A GCC precompiled header of ``pytorch_cpp_helper.hpp``, which pulls in the torch headers that take most of each
  unit's time. It is built with exactly the units' flags from the generated build.ninja, beside the header in the
  temporary source tree (never in the wheel), and given to every C++ unit with ``-include``: GCC reads a ``.gch``
  only for a unit's first include, and 11 of the 77 units (RoIAlign, the rotated-box and sparse ops) start with
  other torch headers, and took three to four times as long as the others without it. The header only includes
  ``torch/types.h`` (which those units include anyway) and opens ``namespace at``. Checked with ``objdump -d``
  against a build without ``-include``: 76 units give the same code instruction for instruction; in pybind.cpp GCC
  clones another one of two template instantiations (an optimisation choice), the same bindings. ``-Winvalid-pch``
  makes GCC say in the log where it would not use the ``.gch``; GCC then reads the header as usual. nvcc units are
  not affected: they have flags of their own, and nvcc preprocesses with ``-E`` and no ``-fpch-preprocess``, which
  never reads a ``.gch``.
- The C++ units compiled a few at a time ("unity" units: one ``.cpp`` that includes several). With the precompiled
  header a unit of mmcv's takes seconds however little it holds: most of it is loading the header and generating
  the torch inline code that every unit uses, once per unit. The 56 dispatchers (``csrc/pytorch/*.cpp``) compile as
  one unit and 19 of the 20 CPU kernels as two (``UNITY_GROUPS``: the kernels with helpers of the same names apart,
  the one with ``min``/``max`` macros last), in a sixth of the compiler time the 75 units took one by one
  (docs/benchmarks/setup-and-demo-2026-12-06.md). ``pybind.cpp``
  (the bindings, the longest unit) and nvcc's units compile on their own. A bundle's object takes the place of its
  first unit's and the others get an empty object, so that setuptools links the objects it expects. The ops give
  the same results bit for bit (outputs and gradients); the machine code differs where a helper that several
  kernels use (``at::empty``, the rotated-box IoU) is now compiled once and called, not inlined into each. If a
  bundle does not compile (another compiler, another mmcv), the units are compiled one by one as before.
- The build's output goes to LOG; the console gets one progress line per step (units done of the total and
  the elapsed time), and this script exits non-zero when the build fails (setup_env.sh then shows LOG's tail).
Stdlib only: it runs before the project is installed.
"""

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HEADER = Path("mmcv/ops/csrc/common/pytorch_cpp_helper.hpp")
_STATUS = re.compile(rb"^\[(\d+)/(\d+)\]")


class Progress:
    """One console line per step: rewritten in place on a terminal, else a new line every tenth of the work."""

    def __init__(self, out, start: float):
        self.out, self.start, self.tty, self.shown = out, start, out.isatty(), -1

    def say(self, text: str, final: bool = False) -> None:
        elapsed = int(time.monotonic() - self.start)
        line = f"[setup] mmcv ops: {text} ({elapsed // 60}:{elapsed % 60:02d} elapsed)"
        self.out.write(("\r\033[K" + line + ("\n" if final else "")) if self.tty else line + "\n")
        self.out.flush()

    def units(self, done: int, total: int) -> None:
        tenth = done * 10 // total
        if self.tty or tenth > self.shown or done == total:
            self.shown = tenth
            self.say(f"{done}/{total} units compiled", final=done == total)


def release_cflags() -> str:
    """The interpreter's CFLAGS (optimisation level, defines, warnings) without debug information."""
    flags = [f for f in shlex.split(sysconfig.get_config_var("CFLAGS") or "") if not re.fullmatch(r"-g\d?", f)]
    return shlex.join([*flags, "-g0"])


def ninja_vars(build_ninja: Path) -> dict:
    """The top-level ``name = value`` variables of a build.ninja (torch writes cxx, cflags, post_cflags)."""
    found = {}
    for line in build_ninja.read_text().splitlines():
        if m := re.match(r"^(\w+) = (.*)$", line):
            found.setdefault(m.group(1), m.group(2))
    return found


def precompile_header(build_dir: Path, src: Path, log, progress: Progress) -> None:
    """Builds HEADER's .gch with the units' own compiler line and adds ``-include HEADER -Winvalid-pch`` to the
    C++ units' flags (see the module docstring)."""
    build_ninja = build_dir / "build.ninja"
    found = ninja_vars(build_ninja)
    header = (src / HEADER).resolve()
    quoted = shlex.quote(str(header))
    cmd = f"{found['cxx']} {found['cflags']} -x c++-header {quoted} -o {quoted}.gch {found['post_cflags']}"
    progress.say("precompiling the torch headers")
    log.write(f"[build_mmcv] precompiled header: {cmd}\n".encode())
    log.flush()
    if subprocess.run(cmd, shell=True, stdout=log, stderr=subprocess.STDOUT, cwd=build_dir).returncode != 0:
        log.write(b"[build_mmcv] the precompiled header failed to build: compiling without it\n")
        Path(f"{header}.gch").unlink(missing_ok=True)
        return
    text = build_ninja.read_text()
    build_ninja.write_text(text.replace("\npost_cflags = ", f"\npost_cflags = -include {quoted} -Winvalid-pch ", 1))


# Units compiled together, by their paths under mmcv/ops/csrc/pytorch/ ("DIR/*.cpp": the folder's other .cpp files).
# roi_align, roi_align_rotated and rotated_feature_align define PreCalc and bilinear_interpolate* helpers of the same
# names as other kernels, so they stay out of the kernels' bundle; psamask defines min/max macros, so it comes last.
UNITY_GROUPS = {
    "dispatchers": ("*.cpp",),
    "cpu_kernels": ("cpu/*.cpp",),
    "cpu_rotated": ("cpu/roi_align_rotated.cpp", "cpu/rotated_feature_align.cpp"),
}
# On their own: pybind.cpp, the longest unit, compiles beside the bundles; cpu/roi_align.cpp clashes with both.
UNITY_APART = ("pybind.cpp", "cpu/roi_align.cpp")
UNITY_LAST = ("cpu/psamask.cpp",)
_EDGE = re.compile(r"^build (\S+): compile (\S+)$")


def unity_groups(ops_dir: Path, sources: list) -> dict:
    """{group name: its sources in include order} among ``sources`` (the C++ units of build.ninja)."""
    rel = {Path(s).relative_to(ops_dir).as_posix(): s for s in sources if Path(s).is_relative_to(ops_dir)}
    named = set(UNITY_APART).union(*(p for p in UNITY_GROUPS.values()))
    groups = {}
    for name, patterns in UNITY_GROUPS.items():
        members = []
        for pattern in patterns:
            folder, _, file = pattern.rpartition("/")
            if file == "*.cpp":
                members += [r for r in rel if r.rpartition("/")[0] == folder and r.endswith(".cpp") and r not in named]
            elif pattern in rel:
                members.append(pattern)
        members.sort(key=lambda r: (r in UNITY_LAST, r))
        if len(members) > 1:
            groups[name] = [rel[r] for r in members]
    return groups


def bundle_units(build_dir: Path, src: Path, log) -> bool:
    """Rewrites build.ninja so that the groups of UNITY_GROUPS compile as one unit each (see the module docstring).
    Returns whether it changed anything."""
    build_ninja = build_dir / "build.ninja"
    lines = build_ninja.read_text().splitlines()
    edges = {m.group(2): (i, m.group(1)) for i, line in enumerate(lines) if (m := _EDGE.match(line))}
    groups = unity_groups(src / "mmcv/ops/csrc/pytorch", list(edges))
    if not groups:
        return False
    unity_dir = build_dir / "unity"
    unity_dir.mkdir(exist_ok=True)
    bundled, added = set(), []
    for name, members in groups.items():
        source = unity_dir / f"{name}.cpp"
        source.write_text("".join(f'#include "{m}"\n' for m in members))
        objects = [edges[m][1] for m in members]
        bundled.update(edges[m][0] for m in members)
        lead, rest = objects[0], " ".join(objects[1:])
        added += [f"build {' '.join(objects)}: unity {source}", f"  lead = {lead}", f"  rest = {rest}"]
        log.write(f"[build_mmcv] unity unit {name}: {len(members)} sources\n".encode())
    rule = (
        "rule unity\n"
        "  command = $cxx $cflags -c $in -o $lead $post_cflags"
        " && $cxx -x c++ -c /dev/null -o ${lead}.empty.o && for o in $rest; do cp ${lead}.empty.o $$o; done"
    )
    kept = [line for i, line in enumerate(lines) if i not in bundled]
    build_ninja.write_text("\n".join([*kept, rule, *added]) + "\n")
    return True


def run_ninja(build_dir: Path, jobs: int, log, progress: Progress) -> None:
    """ninja over build.ninja, its output to the log, the finished units to the console."""
    proc = subprocess.Popen(
        ["ninja", "-v", "-j", str(jobs)], cwd=build_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    for line in proc.stdout:
        log.write(line)
        if m := _STATUS.match(line):
            progress.units(int(m.group(1)), int(m.group(2)))
    log.flush()
    if proc.wait() != 0:
        raise RuntimeError(f"compiling mmcv's ops failed (ninja exit {proc.returncode})")


def compile_units(build_dir: Path, src: Path, jobs: int, log, progress: Progress) -> None:
    """Runs build.ninja with the unity units, or with the units one by one if a unity unit fails to compile."""
    plain = (build_dir / "build.ninja").read_text()
    if bundle_units(build_dir, src, log):
        try:
            run_ninja(build_dir, jobs, log, progress)
            return
        except RuntimeError:
            log.write(b"[build_mmcv] a unity unit failed to compile: compiling the units one by one\n")
            (build_dir / "build.ninja").write_text(plain)
            progress.shown = -1
    run_ninja(build_dir, jobs, log, progress)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the unpacked mmcv-2.1.0 sdist")
    parser.add_argument("wheel_dir", type=Path, help="where the wheel is written")
    parser.add_argument("--log", type=Path, required=True, help="the build's whole output")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler processes")
    args = parser.parse_args()

    src, wheel_dir = args.src.resolve(), args.wheel_dir.resolve()
    setup_py = src / "setup.py"
    setup_py.write_text(re.sub(r"-std=c\+\+1[47]", "-std=c++20", setup_py.read_text()))
    os.environ.update(MMCV_WITH_OPS="1", MAX_JOBS=str(args.jobs), CFLAGS=release_cflags())
    # The environment's own ninja (pip's, beside this interpreter): torch builds without ninja, one unit at a time
    # and without the steps above, when it finds none on PATH.
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

    console = os.fdopen(os.dup(1), "w")
    progress = Progress(console, time.monotonic())
    log = open(args.log, "wb", buffering=0)
    os.dup2(log.fileno(), 1)  # setup.py's and the compilers' chatter, Python's and the child processes'
    os.dup2(log.fileno(), 2)

    import torch.utils.cpp_extension as cpp_extension

    def build(build_directory, verbose, error_prefix):
        build_dir = Path(build_directory)
        precompile_header(build_dir, src, log, progress)
        compile_units(build_dir, src, args.jobs, log, progress)

    cpp_extension._run_ninja_build = build  # torch's step between writing build.ninja and running it
    os.chdir(src)
    sys.argv = ["setup.py", "-q", "bdist_wheel", "-d", str(wheel_dir)]
    try:
        runpy.run_path(str(setup_py), run_name="__main__")
        failure = None
    except SystemExit as err:  # setuptools exits with a message on a failed command
        failure = err if err.code else None
    except Exception as err:
        failure = err
    if failure is not None:
        log.write(f"[build_mmcv] failed: {failure!r}\n".encode())
        progress.say("build failed", final=True)
        return 1
    progress.say("wheel built", final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
