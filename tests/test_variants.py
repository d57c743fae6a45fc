"""The presets are the released variants: every official key maps onto one of our tensors of the same
shape, and the parameter counts equal the official ones."""

import json

import pytest
import torch

from backbones import HATNet, STViT
from backbones.checkpoints.pretrained import checkpoint_filter

VARIANTS = {
    "stvit_small": (STViT, "small"),
    "stvit_base": (STViT, "base"),
    "stvit_large": (STViT, "large"),
    "hatnet_tiny": (HATNet, "tiny"),
    "hatnet_small": (HATNet, "small"),
    "hatnet_medium": (HATNet, "medium"),
    "hatnet_large": (HATNet, "large"),
}
# Official trainable parameters that belong to the classifier, not to the backbone.
HEAD_PARAMS = (
    "head.weight",
    "head.bias",
    "proj.weight",
    "proj.bias",
    "norm.weight",
    "norm.bias",
    "classifier.1.weight",
    "classifier.1.bias",
)


@pytest.fixture(scope="module")
def manifest(reference_dir):
    return json.loads((reference_dir / "official_keys.json").read_text())


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_official_keys_and_param_count(manifest, variant):
    cls, arch = VARIANTS[variant]
    model = cls(arch)
    official = manifest[variant]["keys"]
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    kept, skipped = checkpoint_filter({k: torch.empty(0) for k in official}, model)
    assert set(kept) == set(ours), set(kept) ^ set(ours)
    for key in kept:
        assert official[key] == ours[key], key
    head = sum(torch.Size(official[k]).numel() for k in HEAD_PARAMS if k in official)
    ours_total = sum(p.numel() for p in model.parameters())
    assert ours_total + head == manifest[variant]["params_total"]
    assert all(k in skipped for k in HEAD_PARAMS if k in official)
