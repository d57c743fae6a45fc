#!/usr/bin/env python
"""Our backbones against the official model code: same weights, same input, timed in one process.

  python tools/compare_official.py --official PATH/STViT/models/stvit.py --size 800x1344
  python tools/compare_official.py --official PATH/HAT-Net/HAT_Net.py --size 448x672

The official files (hhb072/STViT ``models/stvit.py``, yun-liu/HAT-Net ``HAT_Net.py``) are not part of this
repository: clone the repositories and pass the model file; the family is recognised from its classes. Its
model code runs unchanged. Only the loop over its stages is ours: it returns each stage's last-block output,
the tensors our backbones return. Packages the files import at the top but this project does not install
(timm; for STViT also fvcore and scipy, which it uses only in its own test code) get minimal stand-ins.

Our backbone is built with the official model's weights, loaded by ``backbones.load_pretrained`` exactly as a
released checkpoint is. Printed: the outputs' largest relative difference (evaluation mode), the median
seconds per iteration of each model (train mode = forward + backward of the four stage outputs), timed
round-robin so that machine noise hits both alike, the speedup, and each model's peak memory alone in a
child process (max RSS on CPU, ``torch.cuda.max_memory_allocated`` on CUDA).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))

from benchmark import FAMILIES, measure_peak_gib, report_child_peak, time_models  # noqa: E402

from backbones import load_pretrained  # noqa: E402
from backbones._common import DropPath  # noqa: E402

REPOS = "hhb072/STViT (models/stvit.py) or yun-liu/HAT-Net (HAT_Net.py)"


def _unavailable(name):
    def fail(*args, **kwargs):
        raise RuntimeError(f"{name} is a stand-in of tools/compare_official.py; install the package to use it")

    return fail


def _to_2tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x, x)


# Module -> attributes of its stand-in, for the top-level imports of the two official files.
_STANDINS = {
    "timm": {},
    "timm.models": {},
    "timm.models.layers": dict(DropPath=DropPath, to_2tuple=_to_2tuple, trunc_normal_=nn.init.trunc_normal_),
    "timm.models.registry": dict(register_model=lambda fn: fn),
    "timm.models.vision_transformer": dict(_cfg=lambda **kwargs: dict(kwargs)),
    "fvcore": {},
    "fvcore.nn": dict(
        FlopCountAnalysis=_unavailable("fvcore.nn.FlopCountAnalysis"),
        flop_count_table=_unavailable("fvcore.nn.flop_count_table"),
    ),
    "scipy": {},
    "scipy.io": {},
}


def load_official(path) -> tuple[types.ModuleType, str]:
    """The official model file as a module, and its family ('stvit' or 'hatnet')."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"official model file {path} not found: clone {REPOS} and pass that file")
    absent = {top for top in {name.split(".")[0] for name in _STANDINS} if importlib.util.find_spec(top) is None}
    standins = {}
    for name, attrs in _STANDINS.items():
        if name.split(".")[0] in absent:
            standins[name] = types.ModuleType(name)
            standins[name].__dict__.update(attrs)
    saved = {name: sys.modules.get(name) for name in standins}
    sys.modules.update(standins)
    try:  # the stand-ins are needed only while the file's imports run
        spec = importlib.util.spec_from_file_location(f"official_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    if hasattr(module, "StokenAttention") and hasattr(module, "STViT"):
        return module, "stvit"
    if hasattr(module, "HAT_Net"):
        return module, "hatnet"
    raise SystemExit(f"{path} defines neither STViT (with StokenAttention) nor HAT_Net: pass the model file of {REPOS}")


class OfficialStages(nn.Module):
    """An official classification model's stage outputs: its own modules, in its own order, without the head."""

    def __init__(self, model: nn.Module, family: str):
        super().__init__()
        self.model, self.family = model, family

    def forward(self, x):
        m, outs = self.model, []
        if self.family == "stvit":
            x = m.pos_drop(m.patch_embed(x))
            stages = [(layer.blocks, layer.downsample) for layer in m.layers]
        else:
            x = m.patch_embed(x)
            stages = list(zip(m.blocks, (m.ds2, m.ds3, m.ds4, None)))
        for blocks, downsample in stages:
            for block in blocks:
                x = block(x)
            outs.append(x)
            if downsample is not None:
                x = downsample(x)
        return tuple(outs)


def build_official(module, family: str, arch: str, stoken_size=None) -> OfficialStages:
    name = f"stvit_{arch}" if family == "stvit" else f"HAT_Net_{arch}"
    builder = getattr(module, name, None)
    if builder is None:
        prefix = "stvit_" if family == "stvit" else "HAT_Net_"
        known = sorted(k[len(prefix) :] for k in vars(module) if k.startswith(prefix))
        raise SystemExit(f"the official file has no {name}(); its variants: {', '.join(known)}")
    torch.manual_seed(0)
    if family == "stvit":
        model = builder(SimpleNamespace(drop=0.0, drop_path=0.0))  # its training script's args
        for layer, size in zip(model.layers, stoken_size or ()):
            for block in layer.blocks:  # read at every forward: the same switch as our stoken_size argument
                block.attn.stoken_size = (size, size)
    else:
        model = builder()
    return OfficialStages(model, family)


def build_pair(args):
    module, family = load_official(args.official)
    if args.stoken_size and family != "stvit":
        raise SystemExit("--stoken-size sets STViT's super-token sizes; the official file is HAT-Net's")
    official = build_official(module, family, args.arch, args.stoken_size)
    ours = FAMILIES[family](args.arch, **(dict(stoken_size=args.stoken_size) if args.stoken_size else {}))
    load_pretrained(ours, official.model.state_dict())
    return family, official.to(args.device), ours.to(args.device)


def max_relative_difference(a_outs, b_outs) -> float:
    return max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(a_outs, b_outs))


def peak_memory_gib(which: str, args) -> float:
    """Peak memory of the official model or ours alone (a child process on CPU)."""
    return measure_peak_gib(
        lambda: (_one_of_pair(which, args), _input(args)),
        args,
        [sys.executable, __file__, *args.argv, "--_child", which],
    )


def _one_of_pair(which: str, args) -> nn.Module:
    return dict(zip(("official", "ours"), build_pair(args)[1:]))[which]


def _input(args):
    torch.manual_seed(1)
    return torch.randn(args.batch, 3, *args.size, device=args.device)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", required=True, help=f"the model file of {REPOS}")
    p.add_argument("--arch", default="small")
    p.add_argument("--size", default="448x672", type=lambda s: tuple(int(v) for v in s.lower().split("x")))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument(
        "--stoken-size",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="STViT super-token sizes per stage for both models, e.g. 8,4,2,1",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    p.add_argument("--json", help="also write the result to this JSON file")
    p.add_argument("--_child", choices=["official", "ours"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = [a for a in (sys.argv[1:] if argv is None else argv)]
    return args


def run(args) -> dict:
    family, official, ours = build_pair(args)
    x = _input(args)
    with torch.no_grad():
        try:
            official_outs = official.eval()(x)
        except RuntimeError as e:  # HAT-Net's official window grids must divide every stage map
            raise SystemExit(
                f"the official {family} model cannot run at {args.size[0]}x{args.size[1]}: "
                f"{str(e).splitlines()[0]} (official HAT-Net needs multiples of 224)"
            ) from e
        diff = max_relative_difference(official_outs, ours.eval()(x))
    times = time_models({"official": official, "ours": ours}, x, args)
    del official, ours
    result = dict(
        family=family,
        arch=args.arch,
        size=f"{args.size[0]}x{args.size[1]}",
        batch=args.batch,
        mode=args.mode,
        precision=args.precision,
        stoken_size=args.stoken_size,
        device=args.device,
        max_relative_difference=diff,
        official_seconds=times["official"],
        ours_seconds=times["ours"],
        speedup=times["official"] / times["ours"],
    )
    if not args.no_memory:
        result["official_peak_gib"] = peak_memory_gib("official", args)
        result["ours_peak_gib"] = peak_memory_gib("ours", args)
    return result


def main(argv=None):
    args = parse_args(argv)
    if args._child:  # one model's peak memory in isolation
        report_child_peak(_one_of_pair(args._child, args), _input(args), args)
        return
    r = run(args)
    peaks = f"{r['official_peak_gib']:.2f} / {r['ours_peak_gib']:.2f}" if "ours_peak_gib" in r else "n/a"
    print(
        "| model | input | mode | official s/iter | ours s/iter | speedup | peak GiB official / ours "
        "| max rel. diff |\n|---|---|---|---|---|---|---|---|"
    )
    print(
        f"| {r['family']}-{r['arch']} | {r['size']} | {r['mode']} | {r['official_seconds']:.2f} "
        f"| {r['ours_seconds']:.2f} | {r['speedup']:.2f}x | {peaks} | {r['max_relative_difference']:.1e} |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
