"""tools/build_mmcv.py's unity units, on a small tree laid out like mmcv's ops and compiled by the real compiler
and ninja: every function of every source ends up in the linked library, the helpers of the same names and the
min/max macros stay apart as in mmcv 2.1.0, and a bundle that does not compile falls back to the units one by one."""

import ctypes
import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests._tools import load_tool

build_mmcv = load_tool("build_mmcv")
CXX = shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None or shutil.which("ninja") is None, reason="needs a C++ compiler and ninja")

# Each source defines a function of its own, returning its index. roi_align and roi_align_rotated define a struct
# of the same name (as mmcv's do), psamask a min macro that breaks std::min in what follows it.
PRECALC = "template <typename T> struct PreCalc { T w; };\n"
SOURCES = {
    "nms.cpp": "",
    "info.cpp": "",
    "pybind.cpp": "",
    "cpu/nms.cpp": "",
    "cpu/psamask.cpp": "#define min(a, b) (((a) < (b)) ? (a) : (b))\n",
    "cpu/roi_align.cpp": PRECALC,
    "cpu/roi_align_rotated.cpp": PRECALC,
    "cpu/rotated_feature_align.cpp": "",
    "cpu/voxelization.cpp": "#include <algorithm>\nint clamp_to(int a, int b) { return std::min(a, b); }\n",
}


def function_name(rel):
    return "f_" + rel.replace("/", "_").removesuffix(".cpp")


def make_tree(tmp_path, extra=None):
    """A source tree and a build.ninja in the form torch's cpp_extension writes."""
    src, build_dir = tmp_path / "src", tmp_path / "build"
    ops = src / "mmcv/ops/csrc/pytorch"
    edges = []
    for index, (rel, head) in enumerate({**SOURCES, **(extra or {})}.items()):
        path = ops / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'{head}extern "C" int {function_name(rel)}() {{ return {index}; }}\n')
        edges.append(f"build {build_dir / 'obj' / rel.replace('.cpp', '.o')}: compile {path}")
    build_dir.mkdir()
    (build_dir / "build.ninja").write_text(
        "ninja_required_version = 1.3\ncxx = c++\n\ncflags = -O1 -fPIC -c\npost_cflags = -std=c++17\n\n"
        "rule compile\n  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags\n"
        "  depfile = $out.d\n  deps = gcc\n\n" + "\n".join(edges) + "\n"
    )  # ninja makes the objects' folders
    return src, build_dir


def compile_and_link(tmp_path, src, build_dir, sources):
    """Builds as setup.py does and links the objects it expects, one per source."""
    log, console = io.BytesIO(), io.StringIO()
    build_mmcv.compile_units(build_dir, src, 2, log, build_mmcv.Progress(console, time.monotonic()))
    objects = [build_dir / "obj" / rel.replace(".cpp", ".o") for rel in sources]
    library = tmp_path / "ops.so"
    subprocess.run([CXX, "-shared", *map(str, objects), "-o", str(library)], check=True)
    return ctypes.CDLL(str(library)), log.getvalue().decode(), console.getvalue()


def test_groups_follow_mmcv_conflicts():
    ops = Path("/x/mmcv/ops/csrc/pytorch")
    groups = build_mmcv.unity_groups(ops, [str(ops / rel) for rel in SOURCES] + ["/elsewhere/cuda.cpp"])
    rel = {name: [Path(s).relative_to(ops).as_posix() for s in members] for name, members in groups.items()}
    assert rel == {
        "dispatchers": ["info.cpp", "nms.cpp"],  # pybind.cpp on its own
        "cpu_kernels": ["cpu/nms.cpp", "cpu/voxelization.cpp", "cpu/psamask.cpp"],  # the macros last
        "cpu_rotated": ["cpu/roi_align_rotated.cpp", "cpu/rotated_feature_align.cpp"],  # roi_align on its own
    }


def test_bundled_build_links_every_function(tmp_path):
    src, build_dir = make_tree(tmp_path)
    library, log, console = compile_and_link(tmp_path, src, build_dir, SOURCES)
    for index, rel in enumerate(SOURCES):
        assert getattr(library, function_name(rel))() == index, rel
    assert "unity unit dispatchers: 2 sources" in log and "one by one" not in log
    ninja = (build_dir / "build.ninja").read_text()
    assert ninja.count(": unity ") == 3 and ninja.count(": compile ") == 2  # pybind.cpp and cpu/roi_align.cpp
    assert "5/5 units compiled" in console


def test_a_bundle_that_does_not_compile_falls_back_to_single_units(tmp_path):
    # two dispatchers with a static helper of the same name: fine apart, a redefinition together
    helper = "static int helper() { return 0; }\n"
    src, build_dir = make_tree(tmp_path, {"carafe.cpp": helper, "focal_loss.cpp": helper})
    sources = [*SOURCES, "carafe.cpp", "focal_loss.cpp"]
    library, log, console = compile_and_link(tmp_path, src, build_dir, sources)
    for index, rel in enumerate(sources):
        assert getattr(library, function_name(rel))() == index, rel
    assert "a unity unit failed to compile: compiling the units one by one" in log
    assert ": unity " not in (build_dir / "build.ninja").read_text()
    assert re.search(r"\b1/9 units compiled.*\n(.*\n)*.*9/9 units compiled", console)  # the 9 left, shown again
