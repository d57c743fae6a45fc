"""Paths, tool loading, the shrunk archs, the golden cases, numeric and checkpoint helpers, and data helpers
shared by the tests (fixtures live in conftest.py)."""

import argparse
import contextlib
import importlib.util
import os.path as osp
import re
import warnings

import pytest
import torch

from backbones import FAMILIES, HATNet, STViT

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(REPO, "configs/demo/mask-rcnn_stvit-demo_fpn_tiny-coco.py")
SEG_CFG = osp.join(REPO, "configs/demo/upernet_hat-net-demo_tiny-ade20k.py")

# Every registered family's 'shrunk' preset, for the tests that cover all families: parametrize("cls,arch", SHRUNK).
SHRUNK = [pytest.param(f.cls, f.sizes["shrunk"], id=f.name) for f in FAMILIES.values()]

# What the tests need of a family beyond its record, by family name (a new family adds its row):
# demo_config: its demo config (built on the 'shrunk' preset);
# official_extras(channels): the tensors a released checkpoint holds beyond the backbone's (its head and constants);
# fast_size: an input size at which every fast path of the 'shrunk' preset engages under the default limits;
# official_folds_per_block: the constant unfold / fold tensors per block of the official layout;
# official_size, official_options: tools/compare_official.py's input size and its option sets besides none;
# recipe: its configs' training recipe: the keys without weight decay, the (lr, weight decay)s, detection's
# trainer precision, whether its BatchNorms need synchronising, the backbone options of the COCO query configs
# and the arch changes that give the 'shrunk' preset layer-scale gammas;
# recorded_blocks: the (stage, block)s of the 'shrunk' preset whose attention record_attention records.
FAMILY_DATA = {
    "stvit": dict(
        demo_config=DET_CFG,
        official_extras=lambda c: {
            "proj.weight": torch.zeros(8, c, 1, 1),
            "head.weight": torch.zeros(3, 8),
            "layers.0.blocks.0.attn.unfold.weights": torch.eye(9).reshape(9, 1, 3, 3),
        },
        official_folds_per_block=2,
        official_size="128x160",
        official_options=[["--stoken-size", "4,2,2,1"]],
        fast_size=(333, 517),
        recipe=dict(
            no_decay_keys=("pos_embed", "gamma_1", "gamma_2"),
            optimizers={(1e-4, 0.05), (6e-5, 0.01), (1e-4, 1e-4)},
            det_precision="16-mixed",  # as Swin's detection code
            batchnorm=True,
            coco_query_options={"stoken_size": [8, 4, 2, 1]},  # stage 3 at COCO scale
            layerscale={"layerscale": [False, False, True, True]},  # the arch that has layer-scale gammas
        ),
        recorded_blocks=[(0, 0), (1, 0)],  # only stages with super tokens have an association to record
    ),
    "hatnet": dict(
        demo_config=SEG_CFG,
        official_extras=lambda c: {"classifier.1.weight": torch.zeros(3, c)},
        official_folds_per_block=0,
        official_size="224x224",  # its grids need maps that they divide
        official_options=[],
        fast_size=(448, 672),
        recipe=dict(
            no_decay_keys=(),
            optimizers={(1e-4, 1e-4), (6e-5, 0.01)},
            det_precision="32-true",
            batchnorm=False,  # GroupNorms only
            coco_query_options={},
            layerscale={},  # none
        ),
        recorded_blocks=[(0, 0), (1, 0), (2, 0), (2, 1), (3, 0)],  # every block: depths [1, 1, 2, 1]
    ),
}

# The session's tiny sets (conftest.py's ``tiny_data``), (train, val) images. 4 COCO training images make 2
# batches of 2; 8 ADE20K ones make 4 batches of 2 (2 per rank under 2-process DDP); 3 validation images split
# unevenly over 2 ranks (2 + 1).
TINY_COCO = (4, 3)
TINY_ADE20K = (8, 3)
IMAGE_INFO = "annotations/image_info_test.json"  # tiny COCO's val images without annotations (test-dev style)


@contextlib.contextmanager
def warnings_as_errors():
    """Every warning a user would see on the console is an error inside, except the dependencies' warnings that
    tasks/runtime/quiet.py filters by message and module. Python's default filters hide deprecations raised inside
    libraries (and so from users); they stay hidden here."""
    from tasks.runtime import quiet

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.filterwarnings("ignore", category=category)
        quiet.install()
        yield


def config_family(path) -> tuple:
    """The family record and the size letter of a config of ours, by its name: mm's naming spells the backbone
    field as the family's title in lower case and the size's letter (``mask-rcnn_hat-net-s_fpn_1x_coco.py``:
    ``(FAMILIES['hatnet'], 's')``; docs/backbones.md, "Names")."""
    for family in FAMILIES.values():
        found = re.search(rf"_{re.escape(family.title.lower())}-([a-z])_", osp.basename(path))
        if found:
            return family, found.group(1)
    raise AssertionError(f"{path}: no registered family's name in the file name")


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
    from tasks.config.load import load_config

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


# The models of the golden vectors in tests/data/ (made from the official code, tests/data/README.md).
GOLDEN_CASES = {
    "stvit_tiny_s8411.pt": (
        STViT,
        dict(
            embed_dims=[16, 32, 48, 64],
            depths=[1, 2, 2, 1],
            num_heads=[1, 2, 3, 4],
            n_iter=[1, 1, 1, 1],
            stoken_size=[8, 4, 1, 1],
            layerscale=[False, False, True, True],
            init_values=1e-5,
        ),
    ),
    "stvit_tiny_s4221_iter2.pt": (
        STViT,
        dict(
            embed_dims=[16, 32, 48, 64],
            depths=[1, 1, 2, 1],
            num_heads=[1, 2, 3, 4],
            n_iter=[2, 1, 1, 1],
            stoken_size=[4, 2, 2, 1],
            layerscale=[False] * 4,
            init_values=1e-5,
        ),
    ),
    "hatnet_tiny_g8771.pt": (
        HATNet,
        dict(
            dims=[16, 32, 48, 64],
            head_dim=8,
            expansions=[2, 2, 2, 2],
            grid_sizes=[8, 7, 7, 1],
            ds_ratios=[8, 4, 2, 1],
            depths=[1, 1, 2, 1],
            kernel_sizes=[3, 3, 5, 3],
        ),
    ),
}

# The reference README's tolerance: rtol=1e-4, atol=1e-5 relative to each tensor's scale.
ATOL = 1e-5


def assert_close(actual, expected, what, atol=ATOL):
    """``actual`` equals ``expected`` within the reference tolerance, relative to ``expected``'s scale."""
    scale = expected.abs().max().clamp_min(1e-12)
    torch.testing.assert_close(
        actual.to(expected.dtype) / scale, expected / scale, rtol=1e-4, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def grad_fns(y: torch.Tensor) -> set[str]:
    """Names of every autograd node that produced y."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn.name() not in seen:
            seen.add(fn.name())
            todo += [f for f, _ in fn.next_functions]
    return seen


def official_file(model, path, **extra):
    """A checkpoint laid out like the released ones (DeiT training script)."""
    sd = dict(model.state_dict())
    sd.update(FAMILY_DATA[model.family]["official_extras"](model.stage_channels[-1]))
    torch.save(
        {
            "model": sd,
            "optimizer": {"state": {}, "param_groups": []},
            "epoch": 299,
            "max_accuracy": 80.1,
            "args": argparse.Namespace(model="stvit_small", lr=1e-3, drop_path=0.1),
            **extra,
        },
        path,
    )
    return path


def report_tables(report: str) -> dict:
    """{section title: [row cells]} of a tools/gpu_report.py report's Markdown tables (header and separator
    dropped)."""
    tables = {}
    for chunk in report.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        rows = [
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in body.splitlines()
            if line.startswith("|")
        ]
        tables[title] = rows[2:]
    return tables


def report_number(cell: str) -> float:
    """A report cell's number (``'0.011 (0.011-0.012)'``, ``'1.03x'``, ``'1.7e-06'``); anything else fails."""
    match = re.fullmatch(r"([0-9.]+(?:e[-+]?\d+)?)x?(?: \(.*\))?", cell)
    assert match, f"not a number: {cell!r}"
    return float(match.group(1))
