#!/usr/bin/env bash
# Creates .venv/ in the project root and installs the pinned stack (see setup.cfg).
# Idempotent: a second run only checks a stamp and exits; the compiled mmcv wheel is kept in
# $DENSE_VIT_CACHE (default ~/.cache/dense-vit) so that a fresh clone does not rebuild it.
# The console gets one line per step (and pip's errors); the mmcv build and the background install write logs
# in the cache.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
CACHE="${DENSE_VIT_CACHE:-$HOME/.cache/dense-vit}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
mkdir -p "$CACHE"
START=$SECONDS
step() { printf '[setup] %s (%d:%02d elapsed)\n' "$1" $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)); }

# The stamp covers everything that decides what gets installed.
STAMP_SRC="$(cat "$ROOT/setup.cfg" "$ROOT/tools/setup_env.sh" "$ROOT/tools/build_mmcv.py")"
STAMP_HASH="$(printf '%s' "$STAMP_SRC" | sha256sum | cut -d' ' -f1)"
if [[ -f "$VENV/.setup-stamp" && "$(cat "$VENV/.setup-stamp")" == "$STAMP_HASH" ]]; then
    echo "[setup] .venv is up to date ($VENV)"
    exit 0
fi

# pip -qq: errors only (the package index's notes would fill the console); a failure still stops the script.
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -qq)
step "creating $VENV with pip"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"${PIP[@]}" install --upgrade "pip>=24" "setuptools>=77,<82" wheel ninja

PARTS="$(mktemp -d)"
trap 'rm -rf "$PARTS"' EXIT

# pip install REQS... by two pip processes, each installing half of what pip resolves for REQS: one pip uses one
# core to unpack and byte-compile. Halves balanced by the wheels' unpacked bytes and Python files.
install_in_halves() {
    "${PIP[@]}" install --dry-run --report "$PARTS/report.json" "$@"
    "$VENV/bin/python" - "$PARTS" <<'PYEOF'
import json, sys, urllib.parse, urllib.request, zipfile
from pathlib import Path
parts = Path(sys.argv[1])
def work(item):  # for the wheels on this disk; a download's size is not known in advance
    url = item["download_info"]["url"]
    if not url.startswith("file:"):
        return 0
    with zipfile.ZipFile(urllib.request.url2pathname(urllib.parse.urlparse(url).path)) as wheel:
        entries = wheel.infolist()
    # byte-compiling a Python file costs pip about as much as unpacking 1.5 MB (fitted on torch's halves)
    return sum(e.file_size for e in entries) + 1_500_000 * sum(e.filename.endswith(".py") for e in entries)
items = json.loads((parts / "report.json").read_text())["install"]
halves, load = ([], []), [0, 0]
for weight, pin in sorted(((work(i), f"{i['metadata']['name']}=={i['metadata']['version']}") for i in items), reverse=True):
    k = load.index(min(load))
    halves[k].append(pin)
    load[k] += weight
for k, pins in enumerate(halves):
    (parts / f"half{k}.txt").write_text("".join(f"{pin}\n" for pin in pins))
PYEOF
    "${PIP[@]}" install --no-deps -r "$PARTS/half0.txt" & local first=$!
    "${PIP[@]}" install --no-deps -r "$PARTS/half1.txt" || { wait "$first"; return 1; }
    wait "$first"
    "${PIP[@]}" install "$@"  # installs nothing: checks that the halves made the whole
}

# torch first (about 30 wheels, 2.7 GB with its CUDA libraries): mmcv is compiled against it.
step "installing torch 2.14.1"
install_in_halves torch==2.14.1 torchvision==0.29.1

# Everything else the project needs except mmcv: setup.cfg's requirements and test extras.
mapfile -t OTHERS < <("$VENV/bin/python" - "$ROOT/setup.cfg" <<'PYEOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
reqs = cfg["options"]["install_requires"].split() + cfg["options.extras_require"]["test"].split()
print("\n".join(r for r in reqs if r.split("=")[0].split(">")[0].split("<")[0] not in ("torch", "torchvision", "mmcv")))
PYEOF
)

# mmcv 2.1.0 with its compiled ops. No binary wheel exists for this torch, so build one from the sdist
# (tools/build_mmcv.py: C++20, no debug information, a precompiled torch header, units compiled together,
# progress on the console).
if "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
        && command -v nvcc >/dev/null; then
    FLAVOUR="cuda$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda)')"
    export FORCE_CUDA=1
else
    FLAVOUR=cpu
fi
WHEEL_DIR="$CACHE/mmcv-2.1.0-torch2.14.1-$FLAVOUR"
if ! ls "$WHEEL_DIR"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    # one pip in the background while mmcv compiles: the compile keeps both cores busy from the second minute on
    step "installing the other requirements in the background (log: $CACHE/pip-others.log)"
    "${PIP[@]}" install "${OTHERS[@]}" >"$CACHE/pip-others.log" 2>&1 &
    OTHERS_PID=$!
    step "building mmcv 2.1.0 ($FLAVOUR ops), once; the wheel is cached in $WHEEL_DIR (log: $CACHE/mmcv-build.log)"
    BUILD="$PARTS/build"
    mkdir -p "$BUILD"
    trap 'rm -rf "$PARTS" "$WHEEL_DIR.tmp"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation mmcv==2.1.0 -d "$BUILD"
    tar -xzf "$BUILD"/mmcv-2.1.0.tar.gz -C "$BUILD"
    mkdir -p "$WHEEL_DIR.tmp"
    if ! "$VENV/bin/python" "$ROOT/tools/build_mmcv.py" "$BUILD/mmcv-2.1.0" "$WHEEL_DIR.tmp" \
            --log "$CACHE/mmcv-build.log" --jobs "${MAX_JOBS:-$(nproc)}"; then
        echo "[setup] the mmcv build failed; the end of $CACHE/mmcv-build.log:" >&2
        tail -n 40 "$CACHE/mmcv-build.log" >&2
        exit 1
    fi
    rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"   # the cache only ever holds a finished wheel
    if ! wait "$OTHERS_PID"; then
        echo "[setup] installing the requirements failed; $CACHE/pip-others.log:" >&2
        tail -n 40 "$CACHE/pip-others.log" >&2
        exit 1
    fi
else
    # one pip: most of these are small and pip's resolution is most of their time, so halves gain nothing here
    step "using the cached mmcv wheel in $WHEEL_DIR; installing the other requirements"
    "${PIP[@]}" install "${OTHERS[@]}"
fi
step "installing mmcv and the project"
# mmcv's wheel and the project itself, editable, with its pinned requirements and the test tools (one resolution)
"${PIP[@]}" install --no-build-isolation "$WHEEL_DIR"/mmcv-2.1.0-*.whl -e "$ROOT[test]"
# mmcv's compiled ops load, and mmdet and mmseg accept this mmcv (each checks its version range on import)
"$VENV/bin/python" -W ignore -c "import mmcv.ops, mmdet, mmseg; print('[setup] ok: mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmseg', mmseg.__version__)"
echo "$STAMP_HASH" > "$VENV/.setup-stamp"
step "done"
