import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The golden vectors and the released variants' key manifest, committed with the tests (tests/data/README.md).
GOLDEN_DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT))

# Deterministic, single-threaded-per-test defaults: the CI machine has 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def reference_dir():
    if not (GOLDEN_DATA / "official_keys.json").is_file():
        pytest.fail(
            f"golden vectors not found in {GOLDEN_DATA}: they are part of the repository; restore them "
            "with `git checkout -- tests/data`"
        )
    return GOLDEN_DATA
