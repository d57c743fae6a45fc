#!/usr/bin/env bash
# Creates .venv/ in the project root and installs the pinned stack (see setup.cfg).
# Idempotent: a second run only checks a stamp and exits; the compiled mmcv wheel is kept in
# $DENSE_VIT_CACHE (default ~/.cache/dense-vit) so that a fresh clone does not rebuild it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
CACHE="${DENSE_VIT_CACHE:-$HOME/.cache/dense-vit}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
mkdir -p "$CACHE"

# The stamp covers everything that decides what gets installed.
STAMP_SRC="$(cat "$ROOT/setup.cfg" "$ROOT/tools/setup_env.sh")"
STAMP_HASH="$(printf '%s' "$STAMP_SRC" | sha256sum | cut -d' ' -f1)"
if [[ -f "$VENV/.setup-stamp" && "$(cat "$VENV/.setup-stamp")" == "$STAMP_HASH" ]]; then
    echo "[setup] .venv is up to date ($VENV)"
    exit 0
fi

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=24" "setuptools>=77,<82" wheel ninja
# torch first: mmcv is compiled against it. On x86_64 pip takes these from the local disk.
"${PIP[@]}" install -q torch==2.14.1 torchvision==0.29.1

# mmcv 2.1.0 with its compiled ops. No binary wheel exists for this torch, so build one from the
# sdist. Torch >= 2.10 headers require C++20 while mmcv's setup.py hard-codes -std=c++17.
if "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
        && command -v nvcc >/dev/null; then
    FLAVOUR="cuda$("$VENV/bin/python" -c 'import torch; print(torch.version.cuda)')"
    export FORCE_CUDA=1
else
    FLAVOUR=cpu
fi
WHEEL_DIR="$CACHE/mmcv-2.1.0-torch2.14.1-$FLAVOUR"
if ! ls "$WHEEL_DIR"/mmcv-2.1.0-*.whl >/dev/null 2>&1; then
    echo "[setup] building mmcv 2.1.0 ($FLAVOUR ops); this takes ~12 minutes on 2 cores, once"
    BUILD="$(mktemp -d)"
    "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation mmcv==2.1.0 -d "$BUILD"
    tar -xzf "$BUILD"/mmcv-2.1.0.tar.gz -C "$BUILD"
    sed -i 's/-std=c++14/-std=c++20/g; s/-std=c++17/-std=c++20/g' "$BUILD/mmcv-2.1.0/setup.py"
    mkdir -p "$WHEEL_DIR.tmp"
    (cd "$BUILD/mmcv-2.1.0" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" \
        "${PIP[@]}" wheel -q --no-deps --no-build-isolation . -w "$WHEEL_DIR.tmp")
    rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"   # the cache only ever holds a finished wheel
    rm -rf "$BUILD"
fi
"${PIP[@]}" install -q "$WHEEL_DIR"/mmcv-2.1.0-*.whl

# The project itself, editable, with its pinned requirements and the test tools.
"${PIP[@]}" install -q --no-build-isolation -e "$ROOT[test]"
"$VENV/bin/python" -c "import mmcv.ops, mmdet, mmseg, lightning, torchmetrics; print('[setup] ok: mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmseg', mmseg.__version__)"
echo "$STAMP_HASH" > "$VENV/.setup-stamp"
