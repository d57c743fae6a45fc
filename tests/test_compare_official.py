"""tools/compare_official.py and perf/official.py. The official model files are not in this repository: the
comparisons run when STVIT_OFFICIAL_FILE / HATNET_OFFICIAL_FILE name a local copy (hhb072/STViT models/stvit.py,
yun-liu/HAT-Net HAT_Net.py); the loading and error paths always run."""

import os
import sys

import pytest

from backbones import FAMILIES
from perf.official import load_official

from ._tools import FAMILY_DATA, load_tool

compare = load_tool("compare_official")

OFFICIAL = {name: os.environ.get(f"{name.upper()}_OFFICIAL_FILE") for name in FAMILIES}


def test_missing_file_names_the_repositories(tmp_path):
    with pytest.raises(SystemExit, match="not found: clone") as refused:
        compare.main(["--official", str(tmp_path / "stvit.py"), "--no-memory"])
    assert "hhb072/STViT (models/stvit.py)" in str(refused.value) and "yun-liu/HAT-Net" in str(refused.value)


def test_other_file_is_refused_and_import_standins_are_removed(tmp_path):
    other = tmp_path / "resnet.py"
    other.write_text(
        "from timm.models.layers import DropPath, to_2tuple, trunc_normal_\n"
        "from timm.models.registry import register_model\n"
        "from fvcore.nn import FlopCountAnalysis\n"
        "import scipy.io as sio\n"
        "assert to_2tuple(3) == (3, 3)\n"
        "class ResNet: pass\n"
    )
    before = set(sys.modules)
    with pytest.raises(SystemExit, match="defines the official classes of no family") as refused:
        load_official(other)
    assert "STViT: STViT, StokenAttention" in str(refused.value) and "HAT-Net: HAT_Net" in str(refused.value)
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("timm", "fvcore")}


@pytest.mark.parametrize(
    "family,extra", [(name, extra) for name in FAMILIES for extra in [[], *FAMILY_DATA[name]["official_options"]]]
)
def test_official_and_ours_agree_and_are_timed(family, extra, tmp_path):
    if not OFFICIAL[family]:
        pytest.skip(f"{family.upper()}_OFFICIAL_FILE is not set")
    size = FAMILY_DATA[family]["official_size"]
    out = tmp_path / "r.json"
    compare.main(["--official", OFFICIAL[family], "--size", size, "--repeat", "1", "--json", str(out), *extra])
    import json

    r = json.loads(out.read_text())
    assert r["family"] == family and r["max_relative_difference"] < 1e-4
    assert r["official_seconds"] > 0 and r["ours_seconds"] > 0 and 0 < r["ours_peak_gib"] < 24


def test_unknown_variant_and_unsupported_size_are_named():
    if not OFFICIAL["stvit"] or not OFFICIAL["hatnet"]:
        pytest.skip("STVIT_OFFICIAL_FILE and HATNET_OFFICIAL_FILE are not set")
    with pytest.raises(SystemExit, match="no stvit_huge.*small"):
        compare.main(["--official", OFFICIAL["stvit"], "--arch", "huge", "--no-memory"])
    with pytest.raises(SystemExit, match="official hatnet model cannot run at 112x112"):
        compare.main(["--official", OFFICIAL["hatnet"], "--size", "112x112", "--no-memory"])
    with pytest.raises(SystemExit, match="--stoken-size: HAT-Net takes no option stoken_size"):
        compare.main(["--official", OFFICIAL["hatnet"], "--stoken-size", "8,4,2,1", "--no-memory"])
