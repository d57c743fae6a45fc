"""One run of the GPU report (tools/gpu_report.py): the chosen sections measured in order, the Markdown written
after each one, so that a run cut short leaves the sections done."""

from __future__ import annotations

import datetime

import torch

from backbones.checkpoints.atomic import write_text

from ..lineup import titles
from ..models import swin_source
from .markdown import render
from .plan import FULL, QUICK, Budget, Models
from .sections import compile_section, exactness, throughput, training

SECTIONS = dict(exactness=exactness, training=training, throughput=throughput, compile=compile_section)


def gpu_report(
    command: str,
    sections: list[str],
    device: str = "cuda",
    quick: bool = False,
    budget_s: float | None = None,
    threads: int | None = None,
    official: list[str] = (),
    families: list[str] | None = None,
    out: str | None = None,
) -> str:
    """Measure ``sections`` (names of ``SECTIONS``) and return the report; ``command`` is the command line it
    records. The other arguments are the tool's flags of the same names."""
    plan = QUICK if quick else FULL
    if budget_s is not None:
        plan = plan._replace(budget_s=budget_s)
    device = torch.device(device)
    threads = threads or (1 if quick and device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    models = Models(official, plan.shrunk, families)
    budget = Budget(plan.budget_s)
    ctx = dict(
        plan=plan,
        device=device,
        quick=quick,
        budget=budget,
        notes=[],
        command=command,
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        swin_source=swin_source(),
        families=titles(families),
    )
    done = {}
    for name in sections:
        extra = (threads,) if name == "compile" else ()
        done[name] = SECTIONS[name](models, plan, device, budget, ctx["notes"], *extra)
        if out:
            write_text(out, render(ctx, done))
    ctx["finished"] = True
    report = render(ctx, done)
    if out:
        write_text(out, report)
    return report
