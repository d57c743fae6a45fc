"""Fault injection on files and inputs: writers killed mid-write, bad data, bad configs, untrusted checkpoints.

The faults are real (SIGKILL of a writing process, broken files on disk, a pickle that runs a command when
loaded); nothing of mmdet / mmseg / mmcv / Lightning / torch is mocked.
"""

import json
import logging
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest
import torch
from PIL import Image

from backbones.checkpoints.atomic import write_json
from backbones.checkpoints.export import save_torch
from tasks.data.tiny import make_ade20k, make_coco
from tasks.training.checkpoint_io import AtomicCheckpointIO
from tests._tools import DET_CFG, SEG_CFG, load_tool

train_tool, test_tool = load_tool("train"), load_tool("test")


# --- writers killed mid-write -------------------------------------------------------------------------------
# The writer is a child forked from the test process (no seconds of imports: it has torch and the writers already)
# that stops at a known point - right before the rename of a fully written temp file, or while torch.save is still
# streaming the checkpoint - and is SIGKILLed there. It runs with one thread: a forked child must not enter the
# parent's OpenMP pool, whose threads it does not have.
class _SlowToPickle:
    """Stops the pickler of a checkpoint that holds it: ``torch.save`` has written part of the file then."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        open(self.marker, "w").close()
        time.sleep(120)
        return (int, ())


def _write_v2(which, path, marker, payload):
    """A new version of ``path`` by the writer ``which``, stopped after creating ``marker``."""
    torch.set_num_threads(1)
    if which == "ckpt_streaming":
        AtomicCheckpointIO().save_checkpoint({**payload, "slow": _SlowToPickle(marker)}, path)

    def stop_at_rename(frame, event, arg):
        if event == "c_call" and arg is os.replace:
            open(marker, "w").close()
            time.sleep(120)

    sys.setprofile(stop_at_rename)
    if which == "ckpt":
        AtomicCheckpointIO().save_checkpoint(payload, path)
    elif which == "metrics":
        write_json(path, {"mIoU": 0.2})
    elif which == "export":
        save_torch(payload, path)


def _write_v1(which, path):
    if which.startswith("ckpt"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(3)}, path)
    elif which == "metrics":
        write_json(path, {"mIoU": 0.1})  # backbones.checkpoints.atomic's: the tools write their JSON results with it
    else:
        save_torch({"w": torch.ones(3)}, path)


def _read(which, path):
    return json.loads(open(path).read()) if which == "metrics" else torch.load(path, weights_only=True)


@pytest.mark.parametrize("which", ["ckpt", "ckpt_streaming", "metrics", "export"])
def test_kill_during_write_keeps_previous_file(which, tmp_path):
    path = tmp_path / ("metrics.json" if which == "metrics" else "last.ckpt")
    marker = tmp_path / "writing"
    _write_v1(which, path)
    before = path.read_bytes()
    payload = {"w": torch.full((100000,), 2.0)}  # made here: the child computes nothing
    p = multiprocessing.get_context("fork").Process(target=_write_v2, args=(which, str(path), str(marker), payload))
    p.start()
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and p.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), f"writer exited with {p.exitcode} before the injection point"
        temps = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
        assert temps, "the writer should be holding a temp file at this point"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.join()
    assert p.exitcode == -signal.SIGKILL
    assert path.read_bytes() == before  # the previous version, byte for byte
    old = _read(which, path)
    assert old == {"mIoU": 0.1} if which == "metrics" else torch.equal(old["w"], torch.ones(3))
    _write_v1(which, path)  # the next write removes the dead writer's temp file
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


# --- bad data -----------------------------------------------------------------------------------------------
@pytest.fixture()
def ade(tmp_path):
    make_ade20k(tmp_path, num_train=2, num_val=2, seed=0)
    return tmp_path / "tiny_ade20k"


@pytest.fixture()
def coco(tmp_path):
    make_coco(tmp_path, num_train=12, num_val=2, seed=0)
    return tmp_path / "tiny_coco"


def _datamodule(cfg_path, root, scope):
    from tasks.config.load import load_config
    from tasks.data.module import MMDataModule

    opts = {f"{s}_dataloader.dataset.data_root": f"{root}/" for s in ("train", "val", "test")}
    return MMDataModule(load_config(cfg_path, opts), scope)


def _all_samples(dm, split):
    from tasks.data.checks import CheckedDataset

    ds = CheckedDataset(dm.dataset(split), split)
    return [ds[i] for i in range(len(ds))]


def test_missing_image_names_the_file(coco):
    from tasks.data.checks import DataError

    ann = json.loads((coco / "annotations" / "instances_train2017.json").read_text())
    with_objects = {a["image_id"] for a in ann["annotations"]}
    name = next(i["file_name"] for i in ann["images"] if i["id"] in with_objects)
    victim = coco / "train2017" / name  # listed in the annotation file, gone from the disk
    victim.unlink()
    with pytest.raises(DataError, match=rf"{victim} does not exist"):
        _all_samples(_datamodule(DET_CFG, coco, "mmdet"), "train")


def test_truncated_jpeg_names_the_file(ade):
    from tasks.data.checks import DataError

    victim = sorted((ade / "images" / "training").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:2000])
    with pytest.raises(DataError, match=rf"{victim} is a truncated JPEG"):
        _all_samples(_datamodule(SEG_CFG, ade, "mmseg"), "train")


def test_unreadable_image_names_the_file(ade):
    from tasks.data.checks import DataError

    victim = sorted((ade / "images" / "validation").iterdir())[0]
    victim.write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=rf"(?s)validation.*{victim.name}.*could not be loaded"):
        _all_samples(_datamodule(SEG_CFG, ade, "mmseg"), "val")


def test_segmentation_label_above_num_classes_is_an_error(ade):
    from tasks.data.checks import DataError

    victim = sorted((ade / "annotations" / "validation").iterdir())[0]
    seg = np.array(Image.open(victim))
    seg[:4, :4] = 200  # 199 after reduce_zero_label, past ADE20K's 150 classes (the demo config keeps 5 of them)
    Image.fromarray(seg).save(victim)
    with pytest.raises(DataError, match=rf"{victim} has labels \[199\].*outside 0\.\.4"):
        _all_samples(_datamodule(SEG_CFG, ade, "mmseg"), "val")


def test_segmentation_map_of_another_size_than_its_image_is_an_error(ade):
    # mmseg trained on the misaligned pair and failed only in the validation metric, after training
    from tasks.data.checks import DataError

    victim = sorted((ade / "annotations" / "training").iterdir())[0]
    seg = np.array(Image.open(victim))
    Image.fromarray(seg[:-8, :-16]).save(victim)
    h, w = seg.shape
    with pytest.raises(DataError, match=rf"{victim} is {w - 16}x{h - 8} px, its image .*{victim.stem}\.jpg {w}x{h}"):
        _all_samples(_datamodule(SEG_CFG, ade, "mmseg"), "train")


@pytest.mark.parametrize(
    "cfg, data, scope, split", [(SEG_CFG, "ade", "mmseg", "val"), (DET_CFG, "coco", "mmdet", "train")]
)
def test_a_split_without_samples_names_the_section_and_paths(cfg, data, scope, split, request):
    # mmengine failed with "need at least one array to concatenate" from deep inside the dataset's build
    from tasks.data.checks import DataError

    root = request.getfixturevalue(data)
    if data == "ade":  # an empty folder
        for d in ("images", "annotations"):
            for f in (root / d / "validation").iterdir():
                f.unlink()
    else:  # every image without objects: dropped by filter_empty_gt
        ann_file = root / "annotations" / "instances_train2017.json"
        ann = json.loads(ann_file.read_text())
        ann_file.write_text(json.dumps({**ann, "annotations": []}))
    dm = _datamodule(cfg, root, scope)
    with pytest.raises(DataError, match=rf"{split}_dataloader: the dataset has no samples.*data_root '{root}/'"):
        dm.dataset(split)


@pytest.mark.parametrize("kind", ["gray", "rgba", "gray16", "rgb16"])
def test_grayscale_rgba_16bit_png_load_as_8bit_bgr(kind, tmp_path):
    from mmcv.transforms import LoadImageFromFile

    rng = np.random.default_rng(0)
    arr = {
        "gray": rng.integers(0, 256, (20, 30), dtype=np.uint8),
        "rgba": rng.integers(0, 256, (20, 30, 4), dtype=np.uint8),
        "gray16": rng.integers(0, 65536, (20, 30), dtype=np.uint16),
        "rgb16": rng.integers(0, 65536, (20, 30, 3), dtype=np.uint16),
    }[kind]
    path = str(tmp_path / f"{kind}.png")
    if kind == "rgb16":
        import cv2

        cv2.imwrite(path, arr)
    else:
        Image.fromarray(arr).save(path)
    img = LoadImageFromFile()(dict(img_path=path))["img"]
    assert img.shape == (20, 30, 3) and img.dtype == np.uint8


def test_coco_unknown_category_id_is_an_error(coco):
    from tasks.data.checks import DataError

    ann_file = coco / "annotations" / "instances_train2017.json"
    data = json.loads(ann_file.read_text())
    data["annotations"][0]["category_id"] = 99
    ann_file.write_text(json.dumps(data))
    with pytest.raises(
        DataError,
        match=rf"(?s){ann_file}.*not listed in its 'categories' \[1, 3, 7\]: 99 "
        rf"\(annotation ids \[{data['annotations'][0]['id']}\]\)",
    ):
        _datamodule(DET_CFG, coco, "mmdet").dataset("train")


def _rename_categories(coco, names):
    for split in ("train", "val"):
        ann_file = coco / "annotations" / f"instances_{split}2017.json"
        data = json.loads(ann_file.read_text())
        for cat, name in zip(data["categories"], names):
            cat["name"] = name
        ann_file.write_text(json.dumps(data))


def test_coco_without_any_config_class_names_classes_file_and_override(coco, tmp_path):
    """Category names that are not the config's classes: mmdet would drop every image (and mmengine fail with
    "need at least one array to concatenate"); the error comes at dataset build, and its override works."""
    import shlex

    from tasks.config.load import load_config
    from tasks.data.checks import DataError
    from tasks.data.module import MMDataModule

    _rename_categories(coco, ("cube", "ball", "cone"))
    ann_file = coco / "annotations" / "instances_train2017.json"
    opts = [f"{s}_dataloader.dataset.data_root={coco}/" for s in ("train", "val", "test")]
    with pytest.raises(DataError) as info:
        train_tool.main(
            [
                DET_CFG,
                "--work-dir",
                str(tmp_path / "w"),
                "--cfg-options",
                *opts,
                "trainer.max_steps=1",
                "trainer.enable_progress_bar=False",
            ]
        )
    msg = str(info.value)
    assert msg.startswith("train_dataloader: none of the config's classes ('square', 'disc', 'triangle')"), msg
    assert str(ann_file) in msg and "1 'cube', 3 'ball', 7 'cone'" in msg
    override = msg.split("--cfg-options ")[1].split(" (and")[0]
    for s in ("train", "val", "test"):
        assert f"\"{s}_dataloader.dataset.metainfo.classes=('cube', 'ball', 'cone')\"" in override
    assert "removes the spaces" not in msg

    args = train_tool.parse_args([DET_CFG, "--cfg-options", *opts, *shlex.split(override)])
    dm = MMDataModule(load_config(args.config, args.cfg_options), "mmdet")
    for split in ("train", "val"):
        assert dm.dataset(split).metainfo["classes"] == ("cube", "ball", "cone") and len(dm.dataset(split))

    # names with spaces cannot pass through mmengine's --cfg-options (it drops them): the config form is given
    _rename_categories(coco, ("cube", "ball", "traffic cone"))
    config_form = (
        r"(?s)7 'traffic cone'.*removes the spaces.*metainfo = dict\(classes=\('cube', 'ball', "
        r"'traffic cone'\)\).*test_dataloader = dict\(dataset=dict\(metainfo=metainfo\)\)"
    )
    with pytest.raises(DataError, match=config_form):
        _datamodule(DET_CFG, coco, "mmdet").dataset("val")


def test_coco_images_without_objects_are_skipped_and_logged(coco, caplog):
    n_images = len(json.loads((coco / "annotations" / "instances_train2017.json").read_text())["images"])
    with caplog.at_level(logging.WARNING, logger="tasks.data.module"):
        ds = _datamodule(DET_CFG, coco, "mmdet").dataset("train")
    assert len(ds) == n_images - 1  # make_tiny_data writes one image without objects per 12
    assert f"1 of {n_images} images" in caplog.text and "filter_empty_gt" in caplog.text


# --- bad configs --------------------------------------------------------------------------------------------
def test_misspelt_backbone_type_suggests_the_registered_name():
    from tasks import build_task
    from tasks.config.load import load_config

    with pytest.raises(KeyError, match=r"unknown type 'STVit'.*Did you mean 'STViT'"):
        build_task(load_config(DET_CFG, {"model.backbone.type": "STVit"}))


def test_detector_head_classes_other_than_the_datasets_are_an_error(data_opts, tmp_path):
    # mmdet's NumClassCheckHook: a head with fewer classes than the dataset trains the last ones as background
    opts = data_opts("tiny_coco", "model.roi_head.bbox_head.num_classes=2", "model.roi_head.mask_head.num_classes=2")
    with pytest.raises(ValueError) as e:
        train_tool.main([DET_CFG, "--work-dir", str(tmp_path), "--cfg-options", *opts])
    message = str(e.value)
    assert message.startswith("train_dataloader: the dataset has 3 classes ('square', 'disc', 'triangle')")
    assert "model.roi_head.bbox_head.num_classes=2, model.roi_head.mask_head.num_classes=2" in message
    assert "rpn_head" not in message and "set them to 3" in message
    assert not (tmp_path / "last.ckpt").exists()


def test_unknown_trainer_key_lists_valid_ones():
    from tasks.config.load import load_config
    from tasks.training.trainer import trainer_kwargs

    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_epoch'\]. Valid keys: .*max_epochs"):
        trainer_kwargs(load_config(SEG_CFG, {"trainer.max_epoch": 3}))


def test_cfg_options_are_literals_never_code(tmp_path):
    from tasks.config.load import load_config
    from tasks.training.trainer import trainer_kwargs

    marker = tmp_path / "pwned"
    code = f'__import__("os").system("touch {marker}")'
    args = train_tool.parse_args([SEG_CFG, "--cfg-options", f"trainer.max_epochs={code}"])
    kwargs = trainer_kwargs(load_config(args.config, args.cfg_options))
    assert isinstance(kwargs["max_epochs"], str) and kwargs["max_epochs"].startswith("__import__")  # a string
    assert not marker.exists()


# --- untrusted checkpoints ----------------------------------------------------------------------------------
class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture()
def evil(tmp_path):
    """A Lightning-looking checkpoint that runs `touch MARKER` when unpickled without weights_only."""
    marker = tmp_path / "code_ran"
    path = tmp_path / "evil.ckpt"
    torch.save(
        {
            "pytorch-lightning_version": "2.6.0",
            "state_dict": {"w": torch.ones(1)},
            "epoch": 0,
            "global_step": 0,
            "payload": RunsCode(marker),
        },
        path,
    )
    return path, marker


def test_evil_checkpoint_refused_by_checkpoint_io_and_test_tool(evil, tmp_path):
    from backbones.errors import CheckpointError
    from tasks.training.checkpoint_io import AtomicCheckpointIO

    path, marker = evil
    with pytest.raises(CheckpointError, match=r"Refusing to load.*posix\.system"):
        AtomicCheckpointIO().load_checkpoint(path)
    with pytest.raises(CheckpointError, match="Refusing to load"):
        test_tool.main([SEG_CFG, str(path), "--work-dir", str(tmp_path)])
    assert not marker.exists()


def test_evil_checkpoint_refused_by_train_resume(evil, tiny_data, tmp_path):
    from backbones.errors import CheckpointError

    path, marker = evil
    ade = tiny_data / "tiny_ade20k"
    with pytest.raises(CheckpointError, match="Refusing to load"):
        train_tool.main(
            [
                SEG_CFG,
                "--work-dir",
                str(tmp_path / "w"),
                "--resume",
                str(path),
                "--cfg-options",
                f"train_dataloader.dataset.data_root={ade}/",
                f"val_dataloader.dataset.data_root={ade}/",
                "trainer.enable_progress_bar=False",
            ]
        )
    assert not marker.exists()


def test_evil_checkpoint_refused_by_pretrained_init_and_export(evil, tmp_path):
    from mmengine.runner import load_checkpoint

    from backbones.errors import CheckpointError
    from tasks import build_task
    from tasks.config.load import load_config
    from tasks.deploy.export import export_backbone
    from tasks.training.checkpoint_io import apply_load_from

    path, marker = evil
    cfg = load_config(SEG_CFG)
    cfg.model.backbone.init_cfg = dict(type="Pretrained", checkpoint=str(path))
    with pytest.raises(CheckpointError, match="Refusing to load"):
        build_task(cfg)  # init_weights() -> backbones.load_pretrained
    with pytest.raises(CheckpointError, match="Refusing to load"):
        export_backbone(path, tmp_path / "out.pth")
    with pytest.raises(CheckpointError, match="Refusing to load"):
        apply_load_from(torch.nn.Linear(1, 1), str(path), resume=None)  # the config's load_from
    # mmengine's own loader (init_cfg=Pretrained of mm modules): torch.load's weights_only default
    with pytest.raises(Exception, match="Weights only load failed"):
        load_checkpoint(torch.nn.Linear(1, 1), str(path))
    assert not marker.exists()


def test_an_unwritable_output_path_is_named_and_nothing_is_left(tmp_path):
    from backbones.checkpoints.atomic import OutputError, check_writable

    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "sub" / "out.json"  # its folder cannot be made: a file is in the way
    with pytest.raises(OutputError, match=rf"cannot write '{bad}': Not a directory .*; give a path in a writable"):
        write_json(bad, {"a": 1})
    with pytest.raises(OutputError, match="cannot write"):
        check_writable(bad)
    with pytest.raises(OutputError, match=rf"'{tmp_path}' is a folder: give the name of the file to write"):
        check_writable(tmp_path)
    with pytest.raises(OutputError, match=rf"'{tmp_path / 'file'}' is a file: give a folder"):
        check_writable(tmp_path / "file", folder=True)
    check_writable(tmp_path / "new" / "out.json")
    check_writable(tmp_path / "dir", folder=True)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["dir", "file", "new"]  # no temp file left


@pytest.mark.parametrize(
    "tool, args",
    [
        ("test", [DET_CFG, "{tmp}/x.ckpt", "--out", "{bad}/m.json"]),
        ("test", [DET_CFG, "{tmp}/x.ckpt", "--show-dir", "{bad}"]),
        ("test", [DET_CFG, "{tmp}/x.ckpt", "--dump", "{bad}/d.pkl"]),
        ("plot_curves", ["{tmp}", "--out", "{bad}/c.png"]),
        ("get_flops", [SEG_CFG, "--out", "{bad}/f.json"]),
        ("browse_dataset", [SEG_CFG, "--out-dir", "{bad}"]),
        ("infer", [SEG_CFG, "x.ckpt", "{tmp}/x.jpg", "--out-dir", "{bad}"]),
        ("visualize_attention", [SEG_CFG, "x.ckpt", "{tmp}/x.jpg", "--out-dir", "{bad}"]),
    ],
)
def test_the_tools_name_an_unwritable_output_before_working_and_without_a_traceback(tool, args, tmp_path, monkeypatch):
    # the folder of the output cannot be made: os.makedirs raised from inside the writers, after the work was done
    (tmp_path / "file").write_text("x")
    (tmp_path / "x.ckpt").write_text("x")  # test.py checks the checkpoint path first; the outputs before reading it
    monkeypatch.chdir(tmp_path)  # test.py's default work dir (work_dirs/<config>) is made in the current folder
    Image.new("RGB", (32, 32)).save(tmp_path / "x.jpg")
    bad = tmp_path / "file" / "out"
    argv = [a.format(bad=bad, tmp=tmp_path) for a in args]
    monkeypatch.setattr("sys.argv", [f"{tool}.py", *argv])
    with pytest.raises(SystemExit, match=rf"^error: cannot write '{bad}.*': Not a directory"):
        load_tool(tool).main()
