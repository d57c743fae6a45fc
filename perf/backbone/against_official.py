"""Ours against the official model code (tools/compare_official.py): the same weights on the same input, timed in
one process; the loading is ``perf.official``'s."""

from __future__ import annotations

import torch

from backbones.families import get

from ..memory import peak_memory_gib
from ..models import Setting, ours_and_official
from ..official import load_official, max_relative_difference
from ..timing import time_models


def compare_official(args) -> dict:
    """Our backbone against the official model file ``args.official`` (tools/compare_official.py's flags: the
    arch, size, batch, mode, precision, stoken size, device, warm-up and repeats): the outputs' largest relative
    difference, both models' median seconds per iteration timed round-robin, the speedup and, unless
    ``args.no_memory``, each model's peak memory in a child process."""
    module, family = load_official(args.official)
    options = Setting.of(args, family=family).options  # the family's own options given as flags (--stoken-size)
    arch = args.arch or get(family).measured_variant()
    ours, official = (m.to(args.device) for m in ours_and_official(module, family, arch, options))
    cannot = f"the official {family} model cannot run at {args.size[0]}x{args.size[1]}"
    if problem := ours.plain_size_problem(*args.size):
        raise SystemExit(f"{cannot}: {problem}; choose a size that avoids it")
    torch.manual_seed(1)
    x = torch.randn(args.batch, 3, *args.size, device=args.device)
    with torch.no_grad():
        try:
            official_outs = official.eval()(x)
        except RuntimeError as e:  # a limit of the official code that our model does not state
            raise SystemExit(f"{cannot}: {str(e).splitlines()[0]}") from e
        diff = max_relative_difference(official_outs, ours.eval()(x))
    models = {"official": official, "ours": ours}
    times = time_models(models, x, args.mode, args.precision, args.warmup, args.repeat)
    del official, ours, models
    result = dict(
        family=family,
        arch=arch,
        size=f"{args.size[0]}x{args.size[1]}",
        batch=args.batch,
        mode=args.mode,
        precision=args.precision,
        options=options,
        device=args.device,
        max_relative_difference=diff,
        official_seconds=times["official"],
        ours_seconds=times["ours"],
        speedup=times["official"] / times["ours"],
    )
    if not args.no_memory:
        setting = Setting.of(args, family=family, arch=arch)
        result["official_peak_gib"] = peak_memory_gib("official", setting)
        result["ours_peak_gib"] = peak_memory_gib("ours", setting)
    return result


def result_table(r: dict) -> str:
    """``compare_official``'s result as a one-row Markdown table."""
    peaks = f"{r['official_peak_gib']:.2f} / {r['ours_peak_gib']:.2f}" if "ours_peak_gib" in r else "n/a"
    return (
        "| model | input | mode | official s/iter | ours s/iter | speedup | peak GiB official / ours "
        "| max rel. diff |\n|---|---|---|---|---|---|---|---|\n"
        f"| {r['family']}-{r['arch']} | {r['size']} | {r['mode']} | {r['official_seconds']:.2f} "
        f"| {r['ours_seconds']:.2f} | {r['speedup']:.2f}x | {peaks} | {r['max_relative_difference']:.1e} |"
    )
