import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
sys.path.insert(0, str(ROOT))

# Deterministic, single-threaded-per-test defaults: the CI machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def reference_dir():
    if not REFERENCE.is_dir():
        pytest.fail(f"golden vectors not found at {REFERENCE}; the tests need ../shared/reference/")
    return REFERENCE
