"""Paths, tool loading, shrunk archs and data helpers shared by the tests."""

import importlib.util
import os.path as osp

from perf.models import SHRUNK_ARCHS

# docs/DESIGN.md's shrunk archs for CPU tests (not released variants), as the measuring tools' smoke runs use them
STVIT_T, HATNET_T = SHRUNK_ARCHS["stvit"], SHRUNK_ARCHS["hatnet"]

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(REPO, "configs/demo/mask-rcnn_stvit-t_fpn_tiny-coco.py")
SEG_CFG = osp.join(REPO, "configs/demo/upernet_hat-net-t_tiny-ade20k.py")


def load_tool(name):
    # tools/ is not a package (and tools/test.py would shadow the stdlib ``test``): load by path
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", osp.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flat_metrics(metrics: dict) -> dict:
    """An evaluator's metrics with ``per_class`` spread into ``per_class/METRIC/CLASS`` keys (None -> NaN), for
    ``pytest.approx(..., nan_ok=True)``, which refuses nested dicts."""
    flat = {k: v for k, v in metrics.items() if k != "per_class"}
    for metric, values in (metrics.get("per_class") or {}).items():
        flat.update({f"per_class/{metric}/{c}": float("nan") if v is None else v for c, v in values.items()})
    return flat


def load_cfg(config, opts):
    """The config as tools/test.py reads it with ``--cfg-options *opts``."""
    from tasks.config import load_config

    return load_config(config, load_tool("test").parse_args([config, "ckpt", "--cfg-options", *opts]).cfg_options)


def random_checkpoint(config, opts, path):
    """A plain mm checkpoint of the config's model with its initial (random) weights."""
    import torch

    from tasks import build_task

    torch.manual_seed(0)
    module, _ = build_task(load_cfg(config, opts), init_weights=True)
    torch.save({"state_dict": module.model.state_dict()}, path)
    return str(path)


def write_image_info(coco_root, split="val2017", name="image_info_test.json"):
    """A test-dev style image-info file next to ``split``'s annotations: its images and categories, no
    annotations (as COCO's ``image_info_test-dev2017.json``)."""
    import json

    ann_dir = osp.join(coco_root, "annotations")
    with open(osp.join(ann_dir, f"instances_{split}.json")) as f:
        ann = json.load(f)
    with open(osp.join(ann_dir, name), "w") as f:
        json.dump({k: ann[k] for k in ("images", "categories")}, f)
    return f"annotations/{name}"
