#!/usr/bin/env python
"""Speed, memory and FLOPs of the backbones at detection / segmentation input sizes.

  python tools/benchmark.py --family stvit --arch small --size 800x1344 --mode train [--compare]
  python tools/benchmark.py --table     # docs/performance.md's speed table (448x672 and 800x1344, train, fp32)
  python tools/benchmark.py --variants  # params and GMACs of the released variants at 224x224
  python tools/benchmark.py --throughput --device cuda --precision bf16  # images/s at 224x224, batch 64
  python tools/benchmark.py --scaling [--sizes 224x224 448x672 800x1344] [--plot scaling.png]  # cost vs size

Time: median seconds per iteration (forward, and backward of all stage outputs in train mode) after
warm-up. With --compare, every model is timed in this process, round-robin, on the same input, so the
ratios are fair on a noisy shared machine. Peak memory: max RSS of a child process that runs only that
model (CPU), or torch.cuda.max_memory_allocated (CUDA). GFLOPs are multiply-adds of one forward pass
counted with torch.utils.flop_counter (matmuls, convolutions, attention).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backbones import HATNet, STViT, fast_paths  # noqa: E402
from perf.memory import peak_rss_gib  # noqa: E402

FAMILIES = {"stvit": STViT, "hatnet": HATNet}
# docs/DESIGN.md's shrunk archs (not released variants): the CPU smoke runs of the measuring tools.
SHRUNK_ARCHS = {
    "stvit": dict(
        embed_dims=[32, 64, 128, 256],
        depths=[1, 1, 2, 1],
        num_heads=[1, 2, 4, 8],
        n_iter=[1, 1, 1, 1],
        stoken_size=[8, 4, 1, 1],
        layerscale=[False] * 4,
        init_values=1e-5,
    ),
    "hatnet": dict(
        dims=[32, 64, 128, 256],
        head_dim=32,
        expansions=[4, 4, 4, 4],
        grid_sizes=[8, 7, 7, 1],
        ds_ratios=[8, 4, 2, 1],
        depths=[1, 1, 2, 1],
        kernel_sizes=[3, 3, 3, 3],
    ),
}
BASELINES = ("reference", "swin-t", "resnet50")


class PlainPath(torch.nn.Module):
    """The wrapped backbone computing its plain formulation (``backbones.fast_paths(False)``): explicit N x N
    attention, identity-kernel convolutions for unfold/fold, the official NCHW layout, no row chunks or
    recomputation; the official code's arithmetic."""

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        with fast_paths(False):
            return self.backbone(x)


def build(name: str, family: str, arch: str, stoken_size=None, with_cp=False) -> torch.nn.Module:
    """ours | reference (ours on its plain path, same weights: same seed) | swin-t | resnet50 (mmdet)."""
    torch.manual_seed(0)
    if name in ("ours", "reference"):
        kwargs = dict(stoken_size=stoken_size) if stoken_size and family == "stvit" else {}
        model = FAMILIES[family](SHRUNK_ARCHS[family] if arch == "shrunk" else arch, with_cp=with_cp, **kwargs)
        return PlainPath(model) if name == "reference" else model
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    register_all_modules()
    if name == "swin-t":
        return MODELS.build(
            dict(
                type="SwinTransformer",
                embed_dims=96,
                depths=[2, 2, 6, 2],
                num_heads=[3, 6, 12, 24],
                window_size=7,
                out_indices=(0, 1, 2, 3),
                with_cp=with_cp,
            )
        )
    if name == "resnet50":
        return MODELS.build(
            dict(
                type="ResNet",
                depth=50,
                out_indices=(0, 1, 2, 3),
                frozen_stages=-1,
                norm_cfg=dict(type="BN", requires_grad=True),
                with_cp=with_cp,
            )
        )
    raise ValueError(f"unknown model {name!r}; choose ours or one of {BASELINES}")


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_step(model, x, mode: str, precision: str):
    """One iteration as a callable: inference under no_grad, or forward + backward of the sum of the stage
    outputs' means. bf16 / fp16 run under autocast; fp16 training scales the loss with a GradScaler and
    unscales the gradients (its inf/NaN check), as Lightning's ``16-mixed`` does before an optimizer step.
    The call does not wait for CUDA kernels: time it with ``timed_call``."""
    dtype = AMP_DTYPES.get(precision)
    autocast = torch.autocast(x.device.type, dtype=dtype) if dtype else nullcontext()
    model.train(mode == "train")
    scaler = holder = None
    if precision == "fp16" and mode == "train":
        scaler = torch.amp.GradScaler(x.device.type)
        holder = torch.optim.SGD(model.parameters(), lr=0.0)  # unscale_ reads its param groups; never stepped

    def step():
        if mode == "train":
            model.zero_grad(set_to_none=True)
            with autocast:
                outs = model(x)
            loss = sum(o.float().mean() for o in outs)
            if scaler is None:
                loss.backward()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(holder)
                scaler.update()
        else:
            with torch.no_grad(), autocast:
                model(x)

    step.scaler = scaler
    return step


def timed_call(fn, device) -> float:
    """Seconds that ``fn()`` takes on ``device``: on CUDA between two CUDA events (the kernels' time, waited
    for), else perf_counter."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(model, x, warmup: int, repeat: int, precision: str = "fp32") -> float:
    """Images per second of inference as the STViT paper's ``throughput()`` measures it: eval mode, no_grad,
    ``warmup`` iterations, then ``repeat`` iterations timed together (one wait for the GPU at the end)."""
    step = make_step(model.eval(), x, "infer", precision)
    for _ in range(warmup):
        step()
    seconds = timed_call(lambda: [step() for _ in range(repeat)], x.device)
    return repeat * x.shape[0] / seconds


def count_gmacs(model, x) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    # The counter knows aten ops only: the model runs its plain path (no oneDNN kernels the counter cannot see,
    # no row chunks whose halo rows are an implementation cost, not the model's), and SDPA its math backend.
    # STViT's plain unfold/fold are identity-kernel convolutions, whose copies count as MACs (0.2 % of STViT-S).
    with fast_paths(False), torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / 2e9


def time_models(models: dict, x, args) -> dict:
    steps = {k: make_step(m, x, args.mode, args.precision) for k, m in models.items()}
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    times = {k: [] for k in steps}
    for _ in range(args.repeat):
        for k, step in steps.items():  # round-robin: machine noise hits every model alike
            times[k].append(timed_call(step, x.device))
    return {k: statistics.median(v) for k, v in times.items()}


def peak_memory_gib(name: str, args) -> float:
    """Peak memory of one model's iterations; on CPU in a child process so models do not share a peak."""
    cmd = [sys.executable, __file__, "--_child", name] + _forward_args(args)
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return measure_peak_gib(lambda: _model_and_input(name, args), args, cmd)


def measure_peak_gib(build, args, child_cmd: list[str]) -> float:
    """Peak memory of the model that ``build()`` returns (with its input): on CUDA max_memory_allocated in
    this process; on CPU the max RSS reported by ``child_cmd``, a process that builds only that model and
    calls ``report_child_peak``."""
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model, x = build()
        make_step(model, x, args.mode, args.precision)()
        del model, x
        return torch.cuda.max_memory_allocated() / 2**30
    out = subprocess.run(
        child_cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["max_rss_gib"]


def report_child_peak(model, x, args) -> None:
    """In a child process: two steps of the model, then its peak RSS as the last line of stdout (JSON)."""
    step = make_step(model, x, args.mode, args.precision)
    step()
    step()
    print(json.dumps({"max_rss_gib": peak_rss_gib()}))


def _model_and_input(name, args):
    model = build(name, args.family, args.arch, args.stoken_size, args.with_cp).to(args.device)
    h, w = args.size
    x = torch.randn(args.batch, 3, h, w, device=args.device)
    return model, x


def compiled(model, x, args):
    """torch.compile(model), compiled by one step here so that the compile time is reported, not timed."""
    t0 = time.perf_counter()
    model = torch.compile(model)
    timed_call(make_step(model, x, args.mode, args.precision), x.device)  # waits for the GPU too
    print(f"note: torch.compile + first step: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return model


def _forward_args(args) -> list[str]:
    out = [
        "--family",
        args.family,
        "--arch",
        args.arch,
        "--size",
        f"{args.size[0]}x{args.size[1]}",
        "--batch",
        str(args.batch),
        "--mode",
        args.mode,
        "--device",
        args.device,
        "--precision",
        args.precision,
    ]
    if args.stoken_size:
        out += ["--stoken-size", ",".join(map(str, args.stoken_size))]
    return out + (["--with-cp"] if args.with_cp else []) + (["--compile"] if args.compile else [])


def run(args) -> list[dict]:
    names = ["ours"] + (list(BASELINES) if args.compare else [])
    models, rows, failed = {}, [], {}
    h, w = args.size
    for name in names:
        model, x = _model_and_input(name, args)
        try:  # a baseline that cannot run at this size is reported and left out
            with torch.no_grad():
                model.eval()
                model(x[:1])
        except RuntimeError as e:
            if name == "ours":
                raise SystemExit(f"benchmark failed at {h}x{w}: {e}") from e
            failed[name] = str(e).splitlines()[0]
            print(f"note: {name} cannot run at {h}x{w}: {failed[name]}", file=sys.stderr)
            continue
        models[name] = model
    timed = dict(models)
    if args.compile:  # the eager model is timed too, round-robin with the compiled one
        timed["ours"], timed["eager"] = compiled(models["ours"], x, args), models["ours"]
    times = time_models(timed, x, args)
    if args.compile:
        print(
            f"note: compiled {times['ours']:.3f} s/iter, eager {times['eager']:.3f} s/iter: "
            f"{times['eager'] / times['ours']:.2f}x",
            file=sys.stderr,
        )
    for name, model in models.items():
        rows.append(
            dict(
                model=name,
                family=args.family if name in ("ours", "reference") else name,
                arch=args.arch,
                size=f"{h}x{w}",
                batch=args.batch,
                mode=args.mode,
                precision=args.precision,
                stoken_size=args.stoken_size,
                params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                gmacs=count_gmacs(model, x[:1]),
                seconds=times[name],
            )
        )
    del models
    for row in rows:
        row["peak_gib"] = peak_memory_gib(row["model"], args) if not args.no_memory else float("nan")
        row["speedup_vs_reference"] = (times["reference"] / times[row["model"]]) if "reference" in times else None
        for base in ("swin-t", "resnet50"):
            row[f"speedup_vs_{base}"] = (times[base] / times[row["model"]]) if base in times else None
    return rows


# The papers' figures (params in M, GMACs at 224x224, classification models including their heads).
PAPER = {
    ("stvit", "small"): (25, 4.4),
    ("stvit", "base"): (52, 9.9),
    ("stvit", "large"): (95, 15.6),
    ("hatnet", "tiny"): (12.7, 2.0),
    ("hatnet", "small"): (25.7, 4.3),
    ("hatnet", "medium"): (42.9, 8.3),
    ("hatnet", "large"): (63.1, 11.5),
}


def classifier_head(family: str, channels: int) -> tuple[int, int]:
    """(params, MACs at 224) of the official classification head that the backbone leaves out:
    STViT: 1x1 conv to 1024 + BN + linear to 1000 at 7x7; HAT-Net: linear to 1000."""
    if family == "stvit":
        return channels * 1024 + 1024 + 2 * 1024 + 1024 * 1000 + 1000, channels * 1024 * 49 + 1024 * 1000
    return channels * 1000 + 1000, channels * 1000


def variants_table() -> str:
    lines = [
        "| variant | backbone params (M) | backbone GMACs | + official head: params (M) / GMACs "
        "| paper: params (M) / GMACs |",
        "|---|---|---|---|---|",
    ]
    for (family, arch), (p_params, p_gmacs) in PAPER.items():
        model = FAMILIES[family](arch)
        params = sum(p.numel() for p in model.parameters())
        macs = count_gmacs(model, torch.randn(1, 3, 224, 224)) * 1e9
        head_params, head_macs = classifier_head(family, model.stage_channels[-1])
        lines.append(
            f"| {family}-{arch} | {params / 1e6:.1f} | {macs / 1e9:.2f} | "
            f"{(params + head_params) / 1e6:.1f} / {(macs + head_macs) / 1e9:.2f} | {p_params} / {p_gmacs} |"
        )
    return "\n".join(lines)


# Inference throughput the STViT paper reports at 224x224 (images/s, its GPU, classification models).
PAPER_THROUGHPUT = {("stvit", "small"): 677, ("stvit", "base"): 361, ("stvit", "large"): 269}


def throughput_table(args) -> str:
    """Images per second of every released variant of --family (inference, --batch, --size, --device,
    --precision), next to the paper's figure where it gives one (at 224x224). Backbones only: no classifier
    head. On CUDA give --warmup and --repeat enough iterations for the kernels' autotuning to settle."""
    import copy

    lines = [
        "| backbone | input | batch | device | precision | images/s | paper images/s (224x224) |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, arch in PAPER:
        if family != args.family:
            continue
        a = copy.copy(args)
        a.arch, a.mode, a.stoken_size = arch, "infer", None
        model, x = _model_and_input("ours", a)
        images_per_s = throughput(model, x, a.warmup, a.repeat, a.precision)
        del model, x
        paper = PAPER_THROUGHPUT.get((family, arch)) if tuple(a.size) == (224, 224) else None
        lines.append(
            f"| {family}-{arch} | {a.size[0]}x{a.size[1]} | {a.batch} | {a.device} | {a.precision} "
            f"| {images_per_s:.4g} | {paper if paper else 'n/a'} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


TABLE_CONFIGS = (("stvit", None), ("stvit", "dense"), ("hatnet", None))


def speed_table(args) -> str:
    """One markdown table: every TABLE_CONFIGS row at 448x672 and 800x1344, train mode, with --compare."""
    import copy

    lines = [
        "| backbone | input | s/iter | vs reference | vs Swin-T | vs ResNet-50 | peak GiB (ref / Swin-T / R50) "
        "| GMACs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: f"{v:.2f}x" if v else "n/a"  # noqa: E731
    all_rows = []
    for size in ((448, 672), (800, 1344)):
        for family, stoken in TABLE_CONFIGS:
            a = copy.copy(args)
            a.family, a.arch, a.size, a.mode, a.compare = family, "small", size, "train", True
            a.stoken_size = args.dense_stoken_size if stoken == "dense" else None
            rows = run(a)
            all_rows += rows
            by = {r["model"]: r for r in rows}
            ours = by["ours"]
            name = {"stvit": "STViT-S", "hatnet": "HAT-Net-S"}[family]
            if stoken == "dense":
                name += f" stoken {','.join(map(str, a.stoken_size))}"
            peaks = " / ".join(f"{by[k]['peak_gib']:.2f}" if k in by else "n/a" for k in BASELINES)
            lines.append(
                f"| {name} | {size[0]}x{size[1]} | {ours['seconds']:.2f} "
                f"| {fmt(ours['speedup_vs_reference'])} "
                f"| {fmt(ours['speedup_vs_swin-t'])} | {fmt(ours['speedup_vs_resnet50'])} "
                f"| {ours['peak_gib']:.2f} ({peaks}) | {ours['gmacs']:.1f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1))
    return "\n".join(lines)


# --scaling: (label, build name, family, dense stoken sizes?). The reference STViT-S keeps the preset's global
# attention in stage 3 as explicit N x N matrices: the quadratic curve next to ours.
SCALING_MODELS = (
    ("STViT-S", "ours", "stvit", False),
    ("STViT-S dense", "ours", "stvit", True),
    ("HAT-Net-S", "ours", "hatnet", False),
    ("Swin-T (mmdet)", "swin-t", "stvit", False),
    ("reference STViT-S", "reference", "stvit", False),
    ("reference HAT-Net-S", "reference", "hatnet", False),
)
SCALING_SIZES = ((224, 224), (448, 448), (448, 672), (640, 960), (800, 1344))


def scaling(args) -> list[dict]:
    """Train-step seconds and peak memory of SCALING_MODELS at every size of --sizes (batch --batch, --arch for
    ours and the references): the models of one size are timed round-robin in this process; a model that
    cannot run at a size (the reference HAT-Net, like the official code, needs stage maps that divide by its
    grids) gets a row with its reason instead of numbers."""
    import copy

    rows = []
    for size in args.sizes:
        configs, models = {}, {}
        torch.manual_seed(1)
        x = torch.randn(args.batch, 3, *size, device=args.device)
        for label, name, family, dense in SCALING_MODELS:
            if args.arch != "small" and name != "swin-t":
                label += f" [{args.arch}]"
            a = copy.copy(args)
            a.size, a.family, a.mode, a.compare = size, family, "train", False
            a.stoken_size = args.dense_stoken_size if dense else None
            row = dict(
                model=label,
                impl=name,
                size=f"{size[0]}x{size[1]}",
                pixels=size[0] * size[1],
                seconds=None,
                peak_gib=None,
                note="",
            )
            rows.append(row)
            model = build(name, family, a.arch, a.stoken_size, a.with_cp).to(args.device)
            try:
                with torch.no_grad():
                    model.eval()  # mm backbones' train() returns None
                    model(x[:1])
            except RuntimeError as e:
                row["note"] = f"cannot run: {str(e).splitlines()[0][:100]}"
                continue
            models[label], configs[label] = model, (name, a, row)
        print(f"note: {size[0]}x{size[1]}: timing {', '.join(models)}", file=sys.stderr, flush=True)
        for label, seconds in time_models(models, x, args).items():
            configs[label][2]["seconds"] = seconds
        del models
        for name, a, row in configs.values():
            if not args.no_memory:
                row["peak_gib"] = peak_memory_gib(name, a)
        for row in rows[-len(SCALING_MODELS) :]:  # a run cut short still leaves the sizes done in its log
            print(f"note: {json.dumps(row)}", file=sys.stderr, flush=True)
    return rows


def scaling_tables(rows) -> str:
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    cells = {(r["model"], r["size"]): r for r in rows}
    out = []
    for title, key, fmt in (("s/iter (train step)", "seconds", "{:.3f}"), ("peak GiB", "peak_gib", "{:.2f}")):
        out += [f"| {title} | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
        for label in dict.fromkeys(r["model"] for r in rows):
            values = [cells[label, s][key] for s in sizes]
            out.append(f"| {label} | " + " | ".join(fmt.format(v) if v is not None else "n/a" for v in values) + " |")
        out.append("")
    notes = sorted({f"{r['model']} {r['size']}: {r['note']}" for r in rows if r["note"]})
    return "\n".join(out + notes)


def scaling_plot(rows, path, title=""):
    """Log-log plot of seconds and peak memory against pixels, one line per model, with dotted slopes 1 and 2
    (cost proportional to the pixels and to their square) through STViT-S's smallest point. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from backbones.atomic import atomic_write

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylabel in ((axes[0], "seconds", "seconds per train step"), (axes[1], "peak_gib", "peak GiB")):
        labels = list(dict.fromkeys(r["model"] for r in rows))
        for i, label in enumerate(labels):
            points = [(r["pixels"], r[key], r["impl"]) for r in rows if r["model"] == label and r[key] is not None]
            if points:
                px, ys, impl = zip(*points)
                ax.plot(px, ys, "--" if impl[0] == "reference" else "-", marker="o", color=f"C{i}", label=label)
        if not ax.get_lines():
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
            continue
        base = [(r["pixels"], r[key]) for r in rows if r["model"] == labels[0] and r[key] is not None]
        if len(base) > 1 and key == "seconds":
            (p0, y0), p1 = base[0], base[-1][0]
            for slope, style in ((1, ":"), (2, "-.")):
                ax.plot(
                    [p0, p1],
                    [y0, y0 * (p1 / p0) ** slope],
                    style,
                    color="grey",
                    linewidth=0.8,
                    label=f"slope {slope} (cost ~ pixels{'' if slope == 1 else '^2'})",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input pixels (H x W)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=90))
    return fig


def print_rows(rows):
    hdr = (
        f"{'model':10} {'arch':>6} {'size':>9} {'mode':>5} {'params(M)':>9} {'GMACs':>7} {'s/iter':>7} "
        f"{'peak GiB':>8} {'vs ref':>6}"
    )
    print(hdr)
    for r in rows:
        ratio = f"{r['speedup_vs_reference']:.2f}x" if r["speedup_vs_reference"] else "-"
        print(
            f"{r['model']:10} {r['arch']:>6} {r['size']:>9} {r['mode']:>5} {r['params_m']:9.1f} "
            f"{r['gmacs']:7.1f} {r['seconds']:7.2f} {r['peak_gib']:8.2f} {ratio:>6}"
        )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(FAMILIES), default="stvit")
    p.add_argument(
        "--arch", default="small", help="a preset of --family, or 'shrunk' (docs/DESIGN.md's CPU-test archs)"
    )
    p.add_argument(
        "--size",
        type=lambda s: tuple(int(v) for v in s.lower().split("x")),
        help="HxW (default 448x672; 224x224 with --throughput)",
    )
    p.add_argument("--batch", type=int, help="default 1; 64 with --throughput")
    p.add_argument("--mode", choices=["train", "infer"], default="train")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default="fp32",
        help="fp16: autocast, and in train mode a GradScaler as Lightning's 16-mixed",
    )
    p.add_argument(
        "--stoken-size",
        type=lambda s: [int(v) for v in s.split(",")],
        default=None,
        help="STViT super-token sizes per stage, e.g. 8,4,2,1",
    )
    p.add_argument("--with-cp", action="store_true", help="activation checkpointing")
    p.add_argument("--compare", action="store_true", help=f"also run {', '.join(BASELINES)}")
    p.add_argument(
        "--compile",
        action="store_true",
        help="time ours under torch.compile (inductor); baselines stay eager, GMACs count the eager model, "
        "peak RSS on CPU includes the compiler's",
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--variants", action="store_true", help="params / GMACs of every released variant at 224")
    p.add_argument(
        "--table",
        action="store_true",
        help="docs/performance.md's speed table: STViT-S (default and dense stoken sizes) and HAT-Net-S at "
        "448x672 and 800x1344, train, vs reference / Swin-T / ResNet-50, with peak memory",
    )
    p.add_argument(
        "--throughput",
        action="store_true",
        help="images/s of every released variant of --family in inference (224x224, batch 64 by "
        "default), next to the STViT paper's figures; e.g. --device cuda --precision bf16",
    )
    p.add_argument(
        "--scaling",
        action="store_true",
        help="train-step time and peak memory against the input size (--sizes) for STViT-S (preset and "
        "dense), HAT-Net-S, mmdet's Swin-T and the reference implementation, one round-robin run "
        "per size; a table, and with --plot a log-log figure",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        help="--scaling sizes, HxW each (spaces or commas; default "
        + ",".join(f"{h}x{w}" for h, w in SCALING_SIZES)
        + ")",
    )
    p.add_argument("--plot", help="--scaling: write the log-log plot to this PNG")
    p.add_argument(
        "--dense-stoken-size",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[8, 4, 2, 1],
        help="STViT super-token sizes of the table's dense-prediction rows (default 8,4,2,1)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's default)")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.size is None:
        args.size = (224, 224) if args.throughput else (448, 672)
    if args.batch is None:
        args.batch = 64 if args.throughput else 1
    sizes = [s for item in args.sizes or () for s in item.split(",") if s]
    try:
        args.sizes = [tuple(int(v) for v in s.lower().split("x")) for s in sizes] or list(SCALING_SIZES)
        assert all(len(s) == 2 for s in args.sizes)
    except (ValueError, AssertionError):
        p.error(f"--sizes {' '.join(sizes)}: each size is HxW, e.g. 448x672")
    if args.plot and not args.scaling:
        p.error("--plot draws the --scaling figure: add --scaling")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads()))
    if args._child:  # measure one model's peak RSS in isolation
        model, x = _model_and_input(args._child, args)
        if args.compile and args._child == "ours":
            model = torch.compile(model)
        report_child_peak(model, x, args)
        return
    if args.variants:
        print(variants_table())
        return
    if args.table:
        print(speed_table(args))
        return
    if args.throughput:
        print(throughput_table(args))
        return
    if args.scaling:
        rows = scaling(args)
        print(scaling_tables(rows))
        if args.plot:
            scaling_plot(
                rows,
                args.plot,
                f"train step, batch {args.batch}, {args.precision}, "
                f"{torch.get_num_threads()} threads, {args.device}; ours / reference arch {args.arch}",
            )
            print(f"wrote {args.plot}")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    rows = run(args)
    print_rows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
