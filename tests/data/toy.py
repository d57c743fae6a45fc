"""The toy family: the smallest complete backbone family, one file as docs/backbones.md describes it, kept with
the tests. tests/test_toy_family.py drops it into a copy of ``backbones/`` with the one line that imports it, as
a contributor adds a family, and runs the tools on it; tests/test_family_registry.py registers it for a while.

Its "official code" is this file too: ``ToyNet(arch, head=True)`` is the classification model whose head the
backbone leaves out (``head.*``, a linear layer on the pooled last stage)."""

import re

import torch
from torch import nn

from backbones.families import Classifier, Family, OfficialCode, register
from backbones.models.base import (
    NUM_STAGES,
    DropPath,
    Probe,
    StagedBackbone,
    check_input,
    drop_path_rates,
    resolve_arch,
)
from backbones.models.heads import LinearHead

NUM_CLASSES = 10  # the official head's classes


class ToyBlock(nn.Module):
    """A residual 3x3 conv gated by a softmax over the map's positions, passed through a probe point."""

    def __init__(self, dim: int, drop_path: float = 0.0):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)
        self.weights = Probe()  # (B, H*W): the softmax over positions
        self.drop_path = DropPath(drop_path)

    def forward(self, x):
        B, _, H, W = x.shape
        w = self.weights(x.flatten(2).mean(1).softmax(-1))
        return x + self.drop_path(self.conv(x) * w.reshape(B, 1, H, W))


class ToyNet(StagedBackbone):
    """A tiny 4-stage conv feature extractor (stride 4 stem, stride 2 downsamples)."""

    family = "toy"
    archs = {"one": dict(dims=[8, 16, 32, 64], depths=[1, 1, 2, 1])}
    skipped_key_patterns = (r"^head\.",)

    def __init__(self, arch="one", out_indices=(0, 1, 2, 3), drop_path_rate=0.0, with_cp=False, frozen_stages=-1,
                 norm_eval=False, pretrained=None, norm_out=False, head=False):  # fmt: skip
        super().__init__()
        arch = resolve_arch(arch, SIZES, "Toy", ("dims", "depths"), {})
        self._setup_options(arch, out_indices, frozen_stages, norm_eval, with_cp)
        dims, depths = arch["dims"], arch["depths"]
        rates = drop_path_rates(drop_path_rate, depths)
        self.stem = nn.Conv2d(3, dims[0], 4, 4)
        self.downs = nn.ModuleList(nn.Conv2d(dims[i], dims[i + 1], 2, 2) for i in range(NUM_STAGES - 1))
        self.stages = nn.ModuleList(
            nn.ModuleList(ToyBlock(c, r) for r in stage_rates) for c, stage_rates in zip(dims, rates)
        )
        if head:  # the "official classification model": the same stages plus a head the backbone leaves out
            self.head = nn.Linear(dims[-1], NUM_CLASSES)
        entries = ["stem"] + [f"downs.{i}" for i in range(NUM_STAGES - 1)]
        self._setup_outputs(dims, "stages.{stage}.{block}", entries, norm_out, lambda c: nn.GroupNorm(1, c))
        self._finish(pretrained)

    def stem_modules(self):
        return [self.stem]

    def stage_modules(self, i):
        return ([self.downs[i - 1]] if i else []) + [self.stages[i]]

    def forward(self, x):
        return self.forward_stages(x, self.out_indices)

    def forward_stages(self, x, indices, until=NUM_STAGES - 1):
        check_input(x, "ToyNet")
        x, outs = self.stem(x), []
        for i in range(until + 1):
            x = self._run_blocks(self.stages[i], x if i == 0 else self.downs[i - 1](x), i)
            if i in indices:
                outs.append(self._output(i, x))
        return tuple(outs)


SIZES = {**ToyNet.archs, "shrunk": ToyNet.archs["one"]}


def _weights_record(module, shape, probs):
    return dict(kind="toy", weights=probs.reshape(shape[0], *shape[-2:]), size=tuple(shape[-2:]))


def _official_stages(model, x):
    return model.stem(x), list(zip(model.stages, [*model.downs, None]))


def _official_extras(sd):
    channels = next(v.shape[0] for k, v in sd.items() if k == f"downs.{NUM_STAGES - 2}.weight")
    return {"head.weight": torch.zeros(NUM_CLASSES, channels), "head.bias": torch.zeros(NUM_CLASSES)}


FAMILY = register(
    Family(
        name="toy",
        cls=ToyNet,
        type_name="ToyNet",
        title="Toy",
        sizes=SIZES,
        released=("one",),
        key_pattern=re.compile(r"^stages\.\d+\.\d+\.|^stem\."),
        signature_keys=("stages.{}.0.conv.weight", r"^stages\.{}\.(\d+)\."),
        attention_modules=lambda m: {(i, j): b for i, s in enumerate(m.stages) for j, b in enumerate(s)},
        probes={"weights": _weights_record},
        official_extras=_official_extras,
        official=OfficialCode(
            repo="toy (tests/data/toy.py)",
            classes=("ToyNet",),
            prefix="toy_",
            build=lambda builder, options: builder(),
            stages=_official_stages,
        ),
        classifier=Classifier(
            head=LinearHead,
            official_keys={"head.": "head.fc."},
            first_conv="stem",
            weights={"one": ""},
            origin_url="tests/data/toy.py",
            paper_ids="none",
        ),
    )
)
