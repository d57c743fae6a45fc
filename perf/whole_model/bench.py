"""Whole-model speed of a config's detector / segmentor next to the Swin-T baseline's (``tools/benchmark.py
--config``): inference images/s at batch 1 on a ready batch and through the test dataloader, the training step
(forward, backward and the step of the config's optimizer, ``TRAIN_BATCH`` images) and peak memory.

Both models get the same input: one image of ``size`` (default: the config's test scale) with random ground
truth for the training step, and the config's test images for the loaded inference (the baseline reads them
through the same dataloader section), and detectors the same work per image: each keeps its ``max_per_img``
detections (``keep_max_detections``). Timings are taken round-robin (each round times every model once), so that
the noise of a shared machine hits both alike; the median and the spread (min-max) over the rounds are reported.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from ..timing import timed_call
from .subject import Subject, baseline_config, build_subject, default_size

PHASES = ("infer", "infer_loaded", "train")


def measure(subjects: list[Subject], device: str, warmup: int, rounds: int) -> dict:
    """{name: {phase: [seconds per round] or the reason it was not measured}}, round-robin over the subjects."""
    for s in subjects:
        if not isinstance(s.loader, str):
            s.start_loading()
    times = {s.name: {p: [] for p in PHASES} for s in subjects}
    for phase in PHASES:
        todo = [s for s in subjects if phase != "infer_loaded" or not isinstance(s.loader, str)]
        for s in subjects:
            if s not in todo:
                times[s.name][phase] = s.loader
        for r in range(warmup + rounds):
            for s in todo:
                seconds = timed_call(getattr(s, phase), device)
                if r >= warmup:
                    times[s.name][phase].append(seconds)
    return times


def peak_gib(config: str, size, device: str, cfg_options=None) -> float:
    """Peak memory (GiB) of two training steps and one inference of the config's model: on CUDA
    ``max_memory_allocated`` in this process, on CPU the peak RSS of a child process that builds only this model."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        _steps(build_subject("", config, size, device, cfg_options))
        return torch.cuda.max_memory_allocated() / 2**30
    from ..child import last_json, run_module

    args = json.dumps(dict(config=config, size=list(size), cfg_options=cfg_options or {}))
    return last_json(run_module("perf.whole_model.bench", args))["max_rss_gib"]


def _steps(s: Subject) -> None:
    s.train()
    s.train()
    s.infer()


def _child(args_json: str) -> None:
    """``python -m perf.whole_model.bench ARGS``: ``peak_gib``'s CPU child; the peak RSS as the last line (JSON)."""
    from ..memory import peak_rss_gib

    args = json.loads(args_json)
    _steps(build_subject("", args["config"], args["size"], "cpu", args["cfg_options"]))
    print(json.dumps({"max_rss_gib": peak_rss_gib()}))


def benchmark(
    config: str,
    baseline: str | None = "swin-t",
    size=None,
    device: str = "cpu",
    warmup: int = 1,
    rounds: int = 3,
    memory: bool = True,
    cfg_options=None,
) -> list[dict]:
    """Rows of ``config``'s model ('ours') and the baseline's: params, images/s of inference on a ready batch and
    with loading (median, min, max over ``rounds``), train-step seconds (median, min, max) and peak GiB.

    Args:
        config: our detection / segmentation config.
        baseline: ``'swin-t'`` (mmdet's Swin-T Mask R-CNN or mmseg's Swin-T UPerNet, after the config's task), a
            config path, or None for ours alone.
        size: (H, W) of the ready batch (default: ``default_size`` of the config).
        device: 'cpu' or 'cuda'.
        warmup: untimed rounds first.
        rounds: timed rounds.
        memory: measure peak memory (on CPU in a child process per model).
        cfg_options: overrides of ``config`` (not of the baseline's, whose test data is ours).
    """
    from tasks.config.load import load_config

    cfg = load_config(config, cfg_options)
    size = tuple(size) if size else default_size(cfg)
    subjects = [build_subject("ours", config, size, device, cfg_options)]
    if baseline:
        path = baseline_config(cfg.default_scope) if baseline == "swin-t" else baseline
        subjects.append(
            build_subject("Swin-T" if baseline == "swin-t" else Path(path).stem, path, size, device, data_from=cfg)
        )
    times = measure(subjects, device, warmup, rounds)
    rows = []
    for s in subjects:
        row = dict(
            model=s.name,
            config=s.config,
            size=f"{size[0]}x{size[1]}",
            device=device,
            rounds=rounds,
            params_m=sum(p.numel() for p in s.model.parameters()) / 1e6,
            detections=s.detections,
        )
        for phase, values in times[s.name].items():
            if isinstance(values, str):
                row[phase] = values
            elif phase == "train":
                row[phase] = dict(median=statistics.median(values), min=min(values), max=max(values))
            else:  # images/s: one image per call
                row[phase] = dict(median=1 / statistics.median(values), min=1 / max(values), max=1 / min(values))
        rows.append(row)
    del subjects
    for row in rows:
        row["peak_gib"] = (
            peak_gib(row["config"], size, device, cfg_options if row["model"] == "ours" else None) if memory else None
        )
    return rows


if __name__ == "__main__":
    _child(sys.argv[1])
