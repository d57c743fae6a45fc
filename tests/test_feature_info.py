"""feature_info of both families names the modules whose outputs are the stage outputs (the package's import
circles: tests/test_import_cycles.py; no training framework: tests/test_layering.py)."""

import pytest
import torch

from tests._tools import SHRUNK


@pytest.mark.parametrize("norm_out", [False, True])
@pytest.mark.parametrize("cls,arch", SHRUNK)
def test_feature_info_names_the_modules_that_compute_the_outputs(cls, arch, norm_out):
    model = cls(arch, out_indices=(1, 2, 3), norm_out=norm_out).eval()
    captured = {}
    for i, info in enumerate(model.feature_info):
        module = model.get_submodule(info["module"])
        module.register_forward_hook(lambda m, args, out, i=i: captured.__setitem__(i, out))
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 96))
    assert sorted(captured) == [0, 1, 2, 3]
    for i, out in zip(model.out_indices, outs):
        assert model.feature_info[i]["num_chs"] == out.shape[1]
        torch.testing.assert_close(captured[i], out, rtol=0, atol=0)
