"""The data scan at COCO scale (tools/benchmark_check_data.py): a generated COCO-layout set of JPEGs of COCO's
sizes, and ``tools/check_data.py`` timed on it as a whole command."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..child import ROOT
from .startup import PAPER_CFG, write_annotations


def _write_jpeg(job: tuple[str, int, int, int]) -> int:
    """One image of natural-looking size on disk: a smooth random field with noise (JPEG of about 140 KiB at
    640x480, COCO's images average 160 KiB); returns its bytes."""
    from PIL import Image

    path, width, height, seed = job
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 16 + 1, width // 16 + 1, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC)).astype(np.int16)
    pixels = np.clip(base + rng.normal(0, 14, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=90)
    return os.path.getsize(path)


def make_coco_set(root: Path, images: int, workers: int = 2) -> dict:
    """``root/annotations/instances_train2017.json`` (COCO's ids and names, 7 polygons per image on average) and
    ``root/train2017/*.jpg`` at the file's sizes; kept when complete. Returns the set's figures."""
    ann_file = root / "annotations" / "instances_train2017.json"
    if not ann_file.exists():
        write_annotations(ann_file, images, 7 * images)
    info = json.loads(ann_file.read_text())["images"]
    (root / "train2017").mkdir(parents=True, exist_ok=True)
    jobs = [(str(root / "train2017" / i["file_name"]), i["width"], i["height"], i["id"]) for i in info]
    todo = [j for j in jobs if not os.path.exists(j[0])]
    with multiprocessing.Pool(workers) as pool:
        pool.map(_write_jpeg, todo, chunksize=16)
    sizes = [os.path.getsize(j[0]) for j in jobs]
    return {"images": len(jobs), "mean_kib": round(float(np.mean(sizes)) / 1024, 1)}


def time_check_data(root: Path, workers: int, config: str = str(PAPER_CFG)) -> dict:
    """``tools/check_data.py CONFIG --splits train`` on ``root`` in a child process: its wall time, and what the
    report says (files read, problems, the tool's own images/s)."""
    report = root / "report.json"
    command = [sys.executable, "tools/check_data.py", config, "--splits", "train", "--workers", str(workers)]
    command += ["--no-progress", "--out", str(report), "--cfg-options", f"train_dataloader.dataset.data_root={root}/"]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the tool and its workers
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tools/check_data.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(report.read_text())
    files = result["splits"]["train"]["files"]
    return {
        "seconds": round(seconds, 2),
        "files": files,
        "images_per_second": round(files / seconds, 1),
        "cpu_seconds": round(cpu, 1),
        # what the CPU time allows on the cores the tool's workers use, were they the tool's alone
        "images_per_second_by_cpu": round(files / (cpu / workers), 1),
        "problems": len(result["problems"]),
        "load_1min": os.getloadavg()[0],
    }
