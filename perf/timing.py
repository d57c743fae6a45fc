"""Timing: one benchmark iteration as a callable, timed with CUDA events (CUDA) or perf_counter (CPU), models
timed round-robin, and inference throughput as the STViT paper measures it."""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext

import torch

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_step(model, x, mode: str, precision: str):
    """One iteration as a callable: inference under no_grad, or forward + backward of the sum of the stage
    outputs' means. bf16 / fp16 run under autocast; fp16 training scales the loss with a GradScaler and
    unscales the gradients (its inf/NaN check), as Lightning's ``16-mixed`` does before an optimizer step.
    The call does not wait for CUDA kernels: time it with ``timed_call``. ``step.scaler`` is the GradScaler
    (None without one). In train mode ``step.forward`` (the model and the loss, building the graph) and
    ``step.backward`` (the gradients of that loss) are the two halves of ``step``, to be called in turn and
    timed apart (``time_phases``); both are None in inference."""
    dtype = AMP_DTYPES.get(precision)
    autocast = torch.autocast(x.device.type, dtype=dtype) if dtype else nullcontext()
    model.train(mode == "train")
    scaler = holder = None
    if precision == "fp16" and mode == "train":
        scaler = torch.amp.GradScaler(x.device.type)
        holder = torch.optim.SGD(model.parameters(), lr=0.0)  # unscale_ reads its param groups; never stepped
    pending = []  # the outputs and their loss between forward() and backward(), freed after backward as in a step

    def forward():
        model.zero_grad(set_to_none=True)
        with autocast:
            outs = model(x)
        pending.append((outs, sum(o.float().mean() for o in outs)))

    def backward():
        if not pending:
            raise RuntimeError("step.backward() called without a step.forward() before it")
        outs, loss = pending.pop()
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(holder)
            scaler.update()

    def step():
        if mode == "train":
            forward()
            backward()
        else:
            with torch.no_grad(), autocast:
                model(x)

    step.scaler = scaler
    step.forward, step.backward = (forward, backward) if mode == "train" else (None, None)
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


def repeated(step, device, warmup: int, repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``step`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    return [timed_call(step, device) for _ in range(repeat)]


def _round_robin(calls: dict, device, warmup: int, repeat: int) -> dict:
    """{name: [(seconds of each call) per round]}: each name's calls (callables run in turn, e.g. a step's
    forward and backward) timed one by one, round-robin over the names (each round times every name once) after
    ``warmup`` untimed rounds, so that the machine's noise hits every model alike."""
    for _ in range(warmup):
        for parts in calls.values():
            for call in parts:
                call()
    times = {k: [] for k in calls}
    for _ in range(repeat):
        for k, parts in calls.items():
            times[k].append(tuple(timed_call(call, device) for call in parts))
    return times


def time_models(models: dict, x, mode: str, precision: str, warmup: int, repeat: int) -> dict:
    """{name: median seconds per iteration} of every model on input ``x``, timed round-robin."""
    steps = {k: (make_step(m, x, mode, precision),) for k, m in models.items()}
    return {
        k: statistics.median(t for (t,) in rounds)
        for k, rounds in _round_robin(steps, x.device, warmup, repeat).items()
    }


def time_phases(models: dict, x, precision: str, warmup: int, repeat: int) -> dict:
    """{name: {"step", "forward", "backward": median seconds}} of every model's training step on input ``x``
    and of its two halves (``make_step``'s ``forward`` and ``backward``), each half timed on its own in every
    round, round-robin; ``step`` is the median of the rounds' sums. On a GPU each half waits for its kernels,
    so nothing of one overlaps the other."""
    steps = {k: make_step(m, x, "train", precision) for k, m in models.items()}
    times = _round_robin({k: (s.forward, s.backward) for k, s in steps.items()}, x.device, warmup, repeat)
    return {
        k: dict(
            step=statistics.median(f + b for f, b in rounds),
            forward=statistics.median(f for f, _ in rounds),
            backward=statistics.median(b for _, b in rounds),
        )
        for k, rounds in times.items()
    }


def throughput(model, x, warmup: int, repeat: int, precision: str = "fp32") -> float:
    """Images per second of inference as the STViT paper's ``throughput()`` measures it: eval mode, no_grad,
    ``warmup`` iterations, then ``repeat`` iterations timed together (one wait for the GPU at the end)."""
    step = make_step(model, x, "infer", precision)  # eval mode: mmdet's Swin-T's train() returns None
    for _ in range(warmup):
        step()
    seconds = timed_call(lambda: [step() for _ in range(repeat)], x.device)
    return repeat * x.shape[0] / seconds


def compiled(model, x, mode: str, precision: str, backend: str = "inductor"):
    """``torch.compile(model)``, compiled by one step here so that the compile time is reported (stderr) and
    returned, not timed. Returns (compiled model, seconds of compiling and the first step)."""
    t0 = time.perf_counter()
    model = torch.compile(model, backend=backend)
    timed_call(make_step(model, x, mode, precision), x.device)  # waits for the GPU too
    seconds = time.perf_counter() - t0
    print(f"note: torch.compile + first step: {seconds:.0f} s", file=sys.stderr)
    return model, seconds
