"""tools/print_config.py: the resolved config, with the overrides, as mmengine's pretty_text; and how every tool names a
bad config path, option or trainer argument (no traceback from inside a library)."""

import re
import subprocess
import sys

import pytest
from mmengine.config import Config
from PIL import Image

from backbones.families import unregister
from tasks.config.keys import ConfigError
from tasks.config.load import load_config
from tests._tools import DET_CFG, REPO, SEG_CFG, load_tool
from tests.test_family_registry import load_toy


def test_print_config_resolves_bases_and_overrides(capsys):
    text = load_tool("print_config").main(
        [DET_CFG, "--cfg-options", "trainer.max_epochs=3", "model.roi_head.bbox_head.num_classes=7"]
    )
    assert capsys.readouterr().out.strip() == text.strip()
    cfg = Config.fromstring(text, ".py")
    # the mmdet:: base is resolved (keys the demo config does not write itself) and the overrides applied
    assert cfg.model.type == "MaskRCNN" and cfg.model.rpn_head.type == "RPNHead"
    assert cfg.trainer.max_epochs == 3 and cfg.model.roi_head.bbox_head.num_classes == 7
    assert cfg.model.backbone.type == "STViT"


def test_print_config_starts_without_lightning_and_prints_its_notes():
    # reading a config needs no trainer: tools/print_config.py does not import Lightning (about 8 s of start-up
    # on 2 cores), and the notes on ignored keys still reach the console (tasks/runtime/rank_zero.py)
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['print_config.py', {DET_CFG!r}, '--cfg-options', 'default_hooks.logger.interval=10']\n"
        "runpy.run_path('tools/print_config.py', run_name='__main__')\n"
        "print('lightning' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "model = dict(" in out.stdout and out.stdout.splitlines()[-1] == "False"
    assert "default_hooks.logger.interval=10 is not used: the trainer section sets trainer.log_every_n_steps" in (
        out.stderr
    )


def test_print_config_segmentation():
    cfg = Config.fromstring(load_tool("print_config").main([SEG_CFG]), ".py")
    assert cfg.default_scope == "mmseg" and cfg.model.decode_head.type == "UPerHead"


def test_a_new_familys_own_config_variables_pass_the_key_check(tmp_path):
    """A config of a family registered later (tests/data/toy.py) written as ours are, with the
    family's own variables: they pass while the family is registered, and are unknown keys otherwise."""
    path = tmp_path / "toy.py"
    path.write_text(
        f"_base_ = [{DET_CFG!r}]\n"
        "toy_s_backbone = dict(type='ToyNet', arch='one')\n"
        "toy_backbone_keys = {'stem': dict(decay_mult=0.0)}\n"
        "model = dict(backbone=dict(_delete_=True, **toy_s_backbone))\n"
    )
    tool = load_tool("print_config")
    with pytest.raises(ConfigError, match="unknown config key 'toy_s_backbone'"):
        tool.main([str(path)])
    load_toy()  # registers the toy family
    try:
        text = tool.main([str(path)])
    finally:
        unregister("toy")
    cfg = Config.fromstring(text, ".py")
    assert cfg.model.backbone.type == "ToyNet" and cfg.toy_backbone_keys == {"stem": {"decay_mult": 0.0}}


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing.py", r"config file not found: '.*missing\.py' \(relative paths are resolved from"),
        ("folder", r"config '.*folder' is a folder: give the config file"),
        ("last.ckpt", r"'.*last\.ckpt' is not an mmengine config \(a \.py / \.json / \.yaml / \.yml file\)"),
    ],
)
@pytest.mark.parametrize("tool", ["print_config", "browse_dataset", "test", "infer", "visualize_attention"])
def test_a_bad_config_path_is_named_without_a_traceback(tool, case, message, tmp_path, monkeypatch):
    # mmengine's parser raised from deep inside itself (for a folder: "file ... does not exist")
    (tmp_path / "folder").mkdir()
    (tmp_path / "last.ckpt").write_bytes(b"not a config")
    Image.new("RGB", (32, 32)).save(tmp_path / "x.jpg")
    config = str(tmp_path / case)
    argv = {
        "print_config": [config],
        "browse_dataset": [config, "--out-dir", str(tmp_path / "out")],
        "test": [config, str(tmp_path / "last.ckpt")],
        "infer": [config, str(tmp_path / "last.ckpt"), str(tmp_path / "x.jpg"), "--out-dir", str(tmp_path / "out")],
        "visualize_attention": [config, str(tmp_path / "last.ckpt"), "x.jpg", "--out-dir", str(tmp_path / "out")],
    }[tool]
    with pytest.raises(ConfigError, match=message):
        load_config(config)
    monkeypatch.setattr("sys.argv", [f"{tool}.py", *argv])  # the command line: the message, no traceback
    with pytest.raises(SystemExit, match="^error: " + message):
        load_tool(tool).main()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tool", ["infer", "visualize_attention"])
@pytest.mark.parametrize(
    "device, message",
    [("cdua", r"'cdua' is not a torch device; give cpu, cuda or cuda:N"), ("cuda:99", r"'cuda:99': ")],
)
def test_a_misspelt_device_is_a_usage_error(tool, device, message, capsys):
    # torch raised "Expected one of cpu, cuda, ipu, ..." from inside the model's .to() after the model was built
    argv = [SEG_CFG, "x.ckpt", "x.jpg", "--out-dir", "out", "--device", device]
    with pytest.raises(SystemExit) as exit_info:
        load_tool(tool).main(argv)
    assert exit_info.value.code == 2
    assert re.search(rf"error: argument --device: {message}", capsys.readouterr().err)


@pytest.mark.parametrize(
    "options, message",
    [
        (["missing.py"], r"ConfigError: config file not found: '.*missing\.py'"),
        ([SEG_CFG, "--cfg-options", "optim_wraper.clip_grad=None"], r"ConfigError: .*'optim_wraper'.*'optim_wrapper'"),
        ([SEG_CFG, "--resume"], r"CheckpointError: --resume: checkpoint .*run/last\.ckpt does not exist"),
    ],
)
def test_train_names_a_bad_config_without_a_traceback(options, message, tmp_path, capsys, monkeypatch):
    # a failing rank prints one line naming itself and the error; a traceback only for errors that are not the input's
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        load_tool("train").cli([*options[:1], "--work-dir", str(tmp_path / "run"), *options[1:]])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err
    assert re.search(r"^rank 0 failed: " + message, err, re.M), err


def test_a_trainer_argument_lightning_refuses_is_named_as_a_config_error(tmp_path):
    # Lightning's own check of trainer.devices raised a TypeError from inside its accelerator connector
    from tasks.training.trainer import build_trainer

    cfg = load_config(SEG_CFG, {"trainer.devices": "x"})
    with pytest.raises(
        ConfigError, match=r"^the trainer section: .*devices.*\(the Lightning Trainer got .*devices='x'"
    ):
        build_trainer(cfg, str(tmp_path), for_test=True)
