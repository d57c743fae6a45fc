"""Pieces shared by the feature extractor families: input checks, options, stage freezing, outputs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..checkpoints.pretrained import load_pretrained
from ..ops import table

MIN_INPUT_SIZE = 32
NUM_STAGES = 4


# Feature maps are NCHW; the attention math reads them NHWC. Under fast paths they are channels_last in memory
# (``table.to_internal``), so these permutes are free views there.
def nhwc(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H, W, C) view (contiguous when x is channels_last)."""
    return x.permute(0, 2, 3, 1)


def nchw(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W, C) -> (B, C, H, W) view (channels_last memory when x is contiguous)."""
    return x.permute(0, 3, 1, 2)


def shape_dependent_branches_traced() -> bool:
    """True while torch.jit traces the model (the ONNX export): code that skips work for some input sizes
    (padding to whole windows, masks) must then take the general branch, since the trace records only the
    branch taken at the export size."""
    return torch.jit.is_tracing()


def pad_to_multiple(x: torch.Tensor, multiple: tuple[int, int], dims: tuple[int, int] = (2, 3)) -> torch.Tensor:
    """x zero-padded at the end of its height and width dims (``dims``) to multiples of ``multiple`` (h, w):
    whole super tokens / windows (the official right/bottom padding). Unpadded when they divide, except while
    tracing (``shape_dependent_branches_traced``)."""
    pads = [(-x.shape[d]) % m for d, m in zip(dims, multiple)]
    if not shape_dependent_branches_traced() and not any(pads):
        return x
    spec = [0] * (2 * (x.dim() - dims[0]))  # F.pad lists (start, end) pairs from the last dim backwards
    for d, p in zip(dims, pads):
        spec[2 * (x.dim() - 1 - d) + 1] = p
    return F.pad(x, spec)


class Probe(nn.Identity):
    """A named point in a forward where a quantity of the paper passes (an identity): forward hooks on it see
    the quantity (``backbones.models.attention_maps`` records through them)."""


class DropPath(nn.Module):
    """Stochastic depth per sample (identical in effect to timm's DropPath, without the dependency)."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"


def drop_path_rates(drop_path_rate: float, depths: Sequence[int]) -> list[list[float]]:
    """The linear stochastic-depth rule of both papers, split per stage. ``drop_path_rate`` must lie in [0, 1):
    the last block drops with exactly that probability, and 1 would drop every sample (NaN outputs in training)."""
    if isinstance(drop_path_rate, bool) or not isinstance(drop_path_rate, (int, float)) or not 0 <= drop_path_rate < 1:
        raise ValueError(
            f"drop_path_rate must be a number in [0, 1) (the last block's stochastic-depth rate, e.g. 0.1); "
            f"got {drop_path_rate!r}"
        )
    rates = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()  # also under torch.device("meta")
    out, start = [], 0
    for d in depths:
        out.append(rates[start : start + d])
        start += d
    return out


def check_input(x: torch.Tensor, model_name: str, weight_dtype: torch.dtype | None = None) -> None:
    """A clear error for an input the backbone cannot take (shape, channels, size, dtype) instead of one from
    deep inside torch. ``weight_dtype``: the model's parameter dtype, which the input must match outside
    autocast."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(
            f"{model_name} expects a 4-D image batch (B, 3, H, W); got {shape}. "
            "Add a batch dimension with x.unsqueeze(0) for a single image."
        )
    if x.shape[1] != 3:
        raise ValueError(
            f"{model_name} expects 3 input channels (RGB); got {x.shape[1]} in shape "
            f"{tuple(x.shape)}. Convert grayscale/RGBA images to RGB first."
        )
    if x.shape[2] < MIN_INPUT_SIZE or x.shape[3] < MIN_INPUT_SIZE:
        raise ValueError(
            f"{model_name} needs inputs of at least {MIN_INPUT_SIZE}x{MIN_INPUT_SIZE} pixels "
            f"(stride 32 output); got {x.shape[2]}x{x.shape[3]}. Resize or pad the image."
        )
    if not x.is_floating_point():
        raise ValueError(
            f"{model_name} expects a floating-point image batch, normalised as in training; got {x.dtype}. "
            "Convert it first, e.g. x.float() and the mean/std normalisation of the config's data preprocessor."
        )
    if weight_dtype is not None and x.dtype != weight_dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(
            f"{model_name}: the input is {x.dtype} but the weights are {weight_dtype}. Convert one to the other "
            f"(x.float() for float32 weights, or model.to({x.dtype})), or run under torch.autocast."
        )


def check_out_indices(out_indices: Sequence[int]) -> tuple[int, ...]:
    """``out_indices`` checked (distinct stages 0..3) and sorted."""
    if not isinstance(out_indices, Sequence) or isinstance(out_indices, str):
        raise ValueError(
            f"out_indices must be a sequence of stage indices in 0..{NUM_STAGES - 1}, e.g. (0, 1, 2, 3) or "
            f"({out_indices!r},) for one stage; got {out_indices!r}"
        )
    out_indices = tuple(int(i) for i in out_indices)
    if (
        not out_indices
        or any(i not in range(NUM_STAGES) for i in out_indices)
        or len(set(out_indices)) != len(out_indices)
    ):
        raise ValueError(f"out_indices must be distinct stage indices in 0..{NUM_STAGES - 1}; got {out_indices}")
    return tuple(sorted(out_indices))


def check_frozen_stages(frozen_stages: int) -> int:
    """``frozen_stages`` checked: -1 (nothing), 0 (the stem) .. 4 (the stem and every stage)."""
    if isinstance(frozen_stages, bool) or not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= NUM_STAGES:
        raise ValueError(
            f"frozen_stages must be an int in -1..{NUM_STAGES} (-1 freezes nothing, 0 the stem, k the stem and "
            f"stages 0..k-1); got {frozen_stages!r}"
        )
    return frozen_stages


def check_flag(name: str, value) -> bool:
    """A switch argument checked to be a bool: a string such as 'no' would otherwise count as True."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_arch_lengths(arch: dict, keys: Sequence[str], family: str) -> None:
    for key in keys:
        value = arch[key]
        if not isinstance(value, (list, tuple)) or len(value) != NUM_STAGES:
            raise ValueError(
                f"{family} arch '{key}' must list one value per stage ({NUM_STAGES} values); got {value!r}"
            )


class StagedBackbone(nn.Module):
    """Behaviour common to every family: options, output bookkeeping, output norms, freezing, ``norm_eval``,
    activation checkpointing, pretrained weights.

    A family subclass sets the class attributes ``family``, ``archs`` (its released variants) and
    ``skipped_key_patterns`` (official checkpoint keys without a counterpart, read by ``load_pretrained``); its
    constructor calls ``_setup_options`` first, builds its modules, then calls ``_setup_outputs`` and
    ``_finish``; it implements ``stem_modules()`` and ``stage_modules(i)`` (what ``frozen_stages`` freezes) and
    ``forward``, which runs each stage's blocks through ``_run_blocks`` and its outputs through ``_output``.

    The constructor arguments every family takes (besides its ``arch`` and its own):

    Args:
        out_indices: the stages (0-3, strides 4/8/16/32) whose outputs ``forward`` returns, in order.
        drop_path_rate: the largest stochastic-depth rate, in [0, 1), reached by the last block (linear rule of the
            papers).
        with_cp: activation checkpointing of the blocks in training (less memory, one more forward): True / False
            for every stage, or 4 bools, one per stage (e.g. ``[False, False, True, True]``).
        frozen_stages: -1 freezes nothing; 0 the stem; k (up to 4) the stem and stages 0..k-1 (eval mode, no
            gradients).
        norm_eval: keep the BatchNorms in eval mode (running statistics) while training.
        pretrained: a checkpoint path or a loaded checkpoint object, loaded strictly by ``load_pretrained``.
        norm_out: add a norm (the family's ``make_norm``) to each output (not in the official models; new,
            untrained weights).
    """

    family: str = ""
    archs: dict[str, dict] = {}
    skipped_key_patterns: tuple[str, ...] = ()
    arch: dict
    out_indices: tuple[int, ...]
    frozen_stages: int
    norm_eval: bool
    with_cp: bool | tuple[bool, ...]
    norm_out: bool
    stage_channels: list[int]
    feature_info: list[dict]

    def _setup_options(
        self, arch: dict, out_indices: Sequence[int], frozen_stages: int, norm_eval: bool, with_cp
    ) -> None:
        """Record the resolved ``arch`` and the common options (``out_indices``, ``frozen_stages`` and ``with_cp``
        checked)."""
        self.arch = arch
        self.out_indices = check_out_indices(out_indices)
        self.frozen_stages = check_frozen_stages(frozen_stages)
        self.norm_eval, self.with_cp = check_flag("norm_eval", norm_eval), check_with_cp(with_cp)

    def _setup_outputs(
        self,
        stage_channels: Sequence[int],
        block_name: str,
        stage_entries: Sequence[str],
        norm_out: bool = False,
        make_norm: Callable[[int], nn.Module] | None = None,
    ) -> None:
        """The output norms (``norm_out``: ``make_norm(channels)`` at each selected stage, ``out_norms``) and
        ``feature_info`` (timm style): per stage its channels, its stride and the name of the module whose output
        it is (``self.get_submodule(info['module'])``, e.g. to register a forward hook).

        Args:
            stage_channels: the channels of the four stages.
            block_name: the name of block j of stage i, as ``block_name.format(stage=i, block=j)``.
            stage_entries: the name of the module that starts each stage (the stem for stage 0): a stage
                without blocks outputs what it computes.
            norm_out: add the output norms.
            make_norm: the family's output norm for a number of channels (needed with ``norm_out``).
        """
        self.stage_channels = list(stage_channels)
        self.norm_out = check_flag("norm_out", norm_out)
        if norm_out:
            self.out_norms = nn.ModuleList(
                [make_norm(c) if i in self.out_indices else nn.Identity() for i, c in enumerate(self.stage_channels)]
            )
        names = []
        for i, depth in enumerate(self.arch["depths"]):
            if norm_out and i in self.out_indices:
                names.append(f"out_norms.{i}")
            else:
                names.append(block_name.format(stage=i, block=depth - 1) if depth else stage_entries[i])
        self.feature_info = [
            dict(num_chs=c, reduction=4 * 2**i, module=name)
            for i, (c, name) in enumerate(zip(self.stage_channels, names))
        ]

    def _finish(self, pretrained) -> None:
        """The end of a family's constructor: freeze ``frozen_stages``, then load ``pretrained`` (if given)."""
        self._freeze()
        if pretrained is not None:
            load_pretrained(self, pretrained)

    def _output(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Stage ``i``'s output from its last feature map: normed with ``norm_out``, and in the standard
        contiguous NCHW layout: consumers such as mmcv's RoIAlign index their input's memory as NCHW and
        silently misread channels_last tensors."""
        return (self.out_norms[i](x) if self.norm_out else x).contiguous()

    @property
    def out_channels(self) -> list[int]:
        return [self.stage_channels[i] for i in self.out_indices]

    @property
    def out_strides(self) -> list[int]:
        return [4 * 2**i for i in self.out_indices]

    def output_shapes(self, height: int, width: int) -> list[tuple[int, int, int]]:
        """(C, H, W) of each selected output for an input of height x width (detectron2 style)."""
        return [
            (self.stage_channels[i], -(-height // s), -(-width // s))
            for i, s in zip(self.out_indices, self.out_strides)
        ]

    def plain_size_problem(self, height: int, width: int) -> str | None:
        """Why the plain formulation (``backbones.fast_paths(False)``), like the official code, cannot compute this
        model's outputs for a height x width input, or None when it can (the measuring tools mark such sizes n/a
        instead of comparing against them). A family whose plain path has no such limit keeps this."""
        return None

    def _stem_dtype(self) -> torch.dtype | None:
        """The dtype of the stem's weights, which the input must have (``check_input``); None without any."""
        p = next((p for m in self.stem_modules() for p in m.parameters()), None)
        return None if p is None else p.dtype

    # --- freezing -------------------------------------------------------------------------------------
    def stem_modules(self) -> list[nn.Module]:
        raise NotImplementedError

    def stage_modules(self, i: int) -> list[nn.Module]:
        raise NotImplementedError

    def frozen_modules(self) -> list[nn.Module]:
        """mmdet convention: -1 freezes nothing, 0 the stem, k the stem and stages 1..k (0-based 0..k-1)."""
        if self.frozen_stages < 0:
            return []
        mods = list(self.stem_modules())
        for i in range(min(self.frozen_stages, NUM_STAGES)):
            mods += self.stage_modules(i)
        return mods

    def _freeze(self) -> None:
        for m in self.frozen_modules():
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    # --- blocks ---------------------------------------------------------------------------------------
    def _run_blocks(self, blocks: nn.ModuleList, x: torch.Tensor, stage: int) -> torch.Tensor:
        """x through ``blocks``, the blocks of stage ``stage`` (0-3), checkpointed if ``with_cp`` says so."""
        with_cp = self.with_cp if isinstance(self.with_cp, bool) else self.with_cp[stage]
        for blk in blocks:
            if with_cp and x.requires_grad:
                # the recomputation in backward runs the block with the op set of this forward (a compiled
                # graph has its ops fixed already)
                fn = blk if torch.compiler.is_compiling() else functools.partial(table.run_with, table.active(), blk)
                x = checkpoint(fn, x, use_reentrant=False)
            else:
                x = blk(x)
        return x


def check_with_cp(with_cp) -> bool | tuple[bool, ...]:
    """``with_cp`` as the backbones take it: one bool for every stage, or one bool per stage (a sequence of 4,
    e.g. ``[False, False, True, True]`` to checkpoint only the deep stages), returned as a tuple."""
    if isinstance(with_cp, bool):
        return with_cp
    if isinstance(with_cp, Sequence) and len(with_cp) == NUM_STAGES and all(isinstance(b, bool) for b in with_cp):
        return tuple(with_cp)
    raise ValueError(
        f"with_cp must be True, False or a list of {NUM_STAGES} bools, one per stage (e.g. [False, False, True, "
        f"True] checkpoints stages 2 and 3); got {with_cp!r}"
    )


def resolve_arch(arch, presets: dict, family: str, required: Sequence[str], defaults: dict) -> dict:
    if isinstance(arch, str):
        key = arch.lower()
        if key not in presets:
            raise ValueError(
                f"Unknown {family} arch '{arch}'. Valid names: {sorted(presets)}; "
                f"or pass a dict with keys {list(required)}."
            )
        arch = presets[key]
    elif not isinstance(arch, dict):
        raise TypeError(f"{family} arch must be a preset name or a dict; got {type(arch).__name__}")
    missing = [k for k in required if k not in arch]
    unknown = [k for k in arch if k not in required and k not in defaults]
    if missing or unknown:
        raise ValueError(
            f"{family} arch dict: missing keys {missing}, unknown keys {unknown}; "
            f"required {list(required)}, optional {list(defaults)}."
        )
    full = dict(defaults)
    full.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in arch.items()})
    return full
