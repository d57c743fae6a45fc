"""Every key of a config is honoured or refused: the key table (tasks/config/key_table.py) covers every key of
mmdet's and mmseg's installed base configs and of ours, tools/train.py stops on a misspelt key naming the
closest valid one, ignored keys log one line only when set away from mm's defaults, docs/config_keys.md is the
table's rendering, and the config's ``compile`` trains like the eager model."""

import glob
import os.path as osp
import re

import lightning as L
import mmdet
import mmseg
import pytest
from mmengine.config import Config

import backbones
from tasks.config.keys import SECTIONS, _scheduler_args, check_keys, key_of, keys_of, markdown
from tasks.config.load import load_config
from tasks.training.compile import compile_options
from tasks.training.trainer import trainer_kwargs
from tests._runs import seg_opts
from tests._tools import DET_CFG, REPO, SEG_CFG, load_tool

MM_BASES = sorted(
    f
    for pkg in (mmdet, mmseg)
    for f in glob.glob(osp.join(osp.dirname(pkg.__file__), ".mim", "configs", "_base_", "**", "*.py"), recursive=True)
)
OURS = sorted(glob.glob(osp.join(REPO, "configs", "**", "*.py"), recursive=True))


def _uncovered(cfg) -> list[str]:
    missing = [k for k in cfg if key_of("", k) is None and not k.startswith("_")]
    for section in SECTIONS[:-1]:
        missing += [f"{section}.{k}" for k in cfg.get(section) or {} if k not in keys_of(section)]
    schedulers = cfg.get("param_scheduler") or []
    for entry in [schedulers] if isinstance(schedulers, dict) else schedulers:
        args = _scheduler_args(entry["type"], cfg.get("default_scope") or "mmseg") or set()
        missing += [f"param_scheduler.{k}" for k in entry if k not in keys_of("param_scheduler") and k not in args]
    return missing


def test_the_table_covers_every_key_of_mm_bases_and_of_our_configs():
    assert len(MM_BASES) > 100 and len(OURS) == 55 and SEG_CFG in OURS  # 45 configs and 10 bases of ours
    missing = {}
    for path in MM_BASES + OURS:
        uncovered = _uncovered(Config.fromfile(path, import_custom_modules=False))  # keys only: no mmpretrain
        if uncovered:
            missing[path] = uncovered
    assert not missing


def test_the_docs_page_is_the_tables_rendering():
    with open(osp.join(REPO, "docs", "config_keys.md")) as f:
        assert f.read() == markdown(), "regenerate it: python -m tasks.config.keys --markdown > docs/config_keys.md"


@pytest.mark.parametrize(
    "option, closest", [("optim_wraper.type=OptimWrapper", "optim_wrapper"), ("train_cgf.max_iters=2", "train_cfg")]
)
def test_a_misspelt_top_level_key_stops_training_naming_the_closest_key(tmp_path, option, closest):
    key = option.split(".")[0]
    with pytest.raises(ValueError) as e:
        load_tool("train").main([SEG_CFG, "--work-dir", str(tmp_path), "--cfg-options", option])
    message = str(e.value)
    assert f"unknown config key {key!r}" in message and f"Did you mean {closest!r}" in message
    assert SEG_CFG in message and f"'_{key}'" in message  # how to keep it as a variable of one's own
    assert not (tmp_path / "last.ckpt").exists()


def test_unknown_and_refused_keys_inside_sections_are_refused():
    with pytest.raises(ValueError, match=r"unknown config key train_cfg\.'max_iter'.*Did you mean 'max_iters'"):
        load_config(SEG_CFG, {"train_cfg.max_iter": 4})
    with pytest.raises(ValueError, match=r"env_cfg\.dist_cfg=.*trainer\.strategy=dict\(type='ddp'"):
        load_config(SEG_CFG, {"env_cfg.dist_cfg": dict(backend="gloo")})
    with pytest.raises(ValueError, match=r"resume=True is not supported.*--resume auto"):
        load_config(SEG_CFG, {"resume": True})
    with pytest.raises(ValueError, match=r"train_cfg\.type='ValLoop' is not supported"):
        load_config(SEG_CFG, {"train_cfg.type": "ValLoop"})
    cfg = Config.fromfile(SEG_CFG)
    cfg.param_scheduler[1]["powr"] = 1.0  # PolyLR's `power`, misspelt
    with pytest.raises(ValueError, match=r"param_scheduler\[1\] \(PolyLR\) 'powr'.*Did you mean 'power'"):
        check_keys(cfg, SEG_CFG)


def test_an_underscore_variable_passes_and_mm_keys_map_to_the_trainer():
    cfg = load_config(SEG_CFG, {"_my_scale": (64, 32), "optim_wrapper.type": "AmpOptimWrapper"})
    assert cfg._my_scale == (64, 32)
    kwargs = trainer_kwargs(cfg)
    # fp16 AMP does not run on the CPU (the demo's accelerator): bf16, without Lightning's warning that it swaps them
    assert kwargs["precision"] == "bf16-mixed" and kwargs["benchmark"] is True  # mmseg's env_cfg.cudnn_benchmark
    gpu = load_config(SEG_CFG, {"optim_wrapper.type": "AmpOptimWrapper", "trainer.accelerator": "gpu"})
    assert trainer_kwargs(gpu)["precision"] == "16-mixed"
    assert kwargs["log_every_n_steps"] == 10  # the demo's trainer section wins over default_hooks.logger.interval
    cfg = load_config(DET_CFG, {"trainer": None, "default_hooks.logger.interval": 7})
    assert trainer_kwargs(cfg)["log_every_n_steps"] == 7


def test_ignored_keys_log_one_line_only_when_set_away_from_mms_defaults(log_lines):
    for config in (SEG_CFG, DET_CFG):
        load_config(config)
    assert log_lines == []  # the demo configs (mm's bases with our sections) log nothing
    load_config(SEG_CFG, {"log_level": "DEBUG", "default_hooks.checkpoint.max_keep_ckpts": 2})
    assert len(log_lines) == 2
    assert log_lines[0].startswith(f"{SEG_CFG}: log_level is ignored: ") and "mm.log" in log_lines[0]
    assert "default_hooks.checkpoint is ignored" in log_lines[1] and "save_top_k" in log_lines[1]


def test_randomness_keys_are_honoured_or_refused(log_lines):
    # mm's `randomness.deterministic` is Lightning's `deterministic` (and wins over env_cfg.cudnn_benchmark, as in
    # mmengine's Runner); a misspelt key inside `randomness` or `auto_scale_lr` stops the run like any other
    kwargs = trainer_kwargs(load_config(SEG_CFG, {"randomness.deterministic": True}))
    assert kwargs["deterministic"] is True and "benchmark" not in kwargs
    assert (
        trainer_kwargs(load_config(SEG_CFG, {"randomness.deterministic": True, "trainer.deterministic": False}))[
            "deterministic"
        ]
        is False
    )  # the trainer section wins
    assert "deterministic" not in trainer_kwargs(load_config(SEG_CFG))
    with pytest.raises(
        ValueError, match=r"unknown config key randomness\.'deterministc'.*Did you mean 'deterministic'"
    ):
        load_config(SEG_CFG, {"randomness.deterministc": True})
    with pytest.raises(ValueError, match=r"unknown config key auto_scale_lr\.'base_batch_siz'.*'base_batch_size'"):
        load_config(SEG_CFG, {"auto_scale_lr.base_batch_siz": 16})
    assert log_lines == []
    load_config(SEG_CFG, {"randomness.diff_rank_seed": True})
    assert len(log_lines) == 1 and "randomness.diff_rank_seed is ignored: " in log_lines[0]


def test_bad_compile_values_are_refused():
    with pytest.raises(ValueError, match=r"unknown torch.compile argument\(s\) \['bakend'\]. Valid: fullgraph"):
        compile_options(dict(bakend="aot_eager"))
    with pytest.raises(ValueError, match=r"compile.backend='inductr' is not a torch.compile backend"):
        compile_options(dict(backend="inductr"))
    assert compile_options(True) == {} and compile_options(False) is None


class _Losses(L.Callback):
    def __init__(self):
        self.losses, self.compiled = [], None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.compiled = list(module.compiled)


@pytest.mark.slow
def test_compiled_training_matches_the_eager_run(data_opts, tmp_path):
    opts = seg_opts(data_opts, "trainer.max_steps=2")  # 64 px crops: the steps are cheap, the compile is the test
    runs = {}
    with backbones.fast_paths(True):  # compiling switches them off for the process: restored on the way out
        for name, extra in (("eager", []), ("compiled", ["compile.backend=aot_eager"])):
            probe = _Losses()
            argv = [SEG_CFG, "--work-dir", str(tmp_path / name), "--cfg-options", *opts, *extra]
            load_tool("train").main(argv, callbacks=[probe])
            runs[name] = probe
        assert not backbones.fast_paths_enabled()
    assert runs["eager"].compiled == [] and runs["compiled"].compiled == ["backbone"]  # UPerNet has no neck
    assert len(runs["compiled"].losses) == 2
    assert runs["compiled"].losses == pytest.approx(runs["eager"].losses, rel=1e-4)
    assert re.search(
        r"compile = \{'backend': 'aot_eager'\}", (tmp_path / "compiled" / osp.basename(SEG_CFG)).read_text()
    )


@pytest.mark.parametrize(
    "option", ["randomness=dict(seed=1,deterministic=True)", "randomness={'seed':1}", "custom_hooks=[dict(type='X')]"]
)
def test_a_dict_value_on_the_command_line_names_the_dotted_keys(option, capsys):
    # mmengine's DictAction parses numbers, strings, lists and tuples; a dict came out as a RecursionError deep
    # in mmengine, a string or a list of strings
    with pytest.raises(SystemExit) as e:
        load_tool("train").main([SEG_CFG, "--cfg-options", option])
    assert e.value.code == 2
    err = capsys.readouterr().err
    key = option.partition("=")[0]
    assert f"--cfg-options {option}: " in err and f"{key}.KEY=VALUE" in err


def test_values_with_braces_still_parse():
    from tasks.config.load import parse_cfg_options

    assert parse_cfg_options(["checkpoint_callback.filename=best_{epoch}", "x=[1,2]"]) == {
        "checkpoint_callback.filename": "best_{epoch}",
        "x": [1, 2],
    }


@pytest.mark.parametrize("by_epoch", [False, True])
def test_a_scheduler_without_end_runs_to_the_end_of_the_run(by_epoch):
    # mmengine's Runner: `end` defaults to the loop's max_epochs / max_iters; an iteration scheduler (by_epoch=False)
    # of an epoch-based run ends with the last iteration of the last epoch, not never (a PolyLR that never decays)
    import torch
    from mmengine.optim import PolyLR

    from tasks.training.optim import build_schedulers

    def lrs(scheduler, steps):
        out = []
        for _ in range(steps):
            out.append(scheduler.optimizer.param_groups[0]["lr"])
            scheduler.optimizer.step()  # (no gradients: changes nothing; torch wants it before the scheduler's)
            scheduler.step()
        return out

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = dict(type="PolyLR", power=1.0, eta_min=0.0, by_epoch=by_epoch)
    (ours,) = build_schedulers(optimizer, [cfg], max_epochs=2, max_steps=-1, epoch_length=lambda: 5)
    reference = PolyLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
        **{**{k: v for k, v in cfg.items() if k != "type"}, "end": 2 if by_epoch else 10},
    )
    steps = 2 if by_epoch else 10
    assert lrs(ours["scheduler"], steps) == pytest.approx(lrs(reference, steps))
    assert ours["scheduler"].end == (2 if by_epoch else 10)


def test_a_train_cfg_the_trainer_section_overrides_is_named(tmp_path, log_lines):
    # the demo configs set the run's length in their trainer section, which wins over train_cfg: a config of one's
    # own inheriting a demo and setting train_cfg must hear that its length is not the one trained
    path = tmp_path / "mine.py"
    path.write_text(
        f"_base_ = [{SEG_CFG!r}]\ntrain_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=2)\n"
    )
    kwargs = trainer_kwargs(load_config(path))
    assert kwargs["max_steps"] == 300 and kwargs["val_check_interval"] == 300
    assert log_lines == [
        f"{path}: train_cfg.max_iters=4 is not used: the trainer section sets the run's length "
        "(trainer.max_steps=300); set trainer.max_steps instead",
        f"{path}: train_cfg.val_interval=2 is not used: the trainer section sets the run's length (trainer."
        "val_check_interval=300); set trainer.val_check_interval instead",
    ]
    log_lines.clear()
    load_config(path, {"trainer.max_steps": 4, "trainer.val_check_interval": 2})
    assert log_lines == []
    load_config(path, training=False)  # read to evaluate, predict or draw: the run's length does not matter
    assert log_lines == []
    # a trainer value given on the command line is the user's own choice: nothing to say
    load_config(path, {"trainer.max_steps": 2})
    assert log_lines == [log_lines[0]] and "train_cfg.val_interval=2" in log_lines[0]
    log_lines.clear()
    # the same for the logging interval (mm's bases give it 50, which the demos' trainer sections replace quietly)
    load_config(path, {"trainer.max_steps": 4, "trainer.val_check_interval": 2, "default_hooks.logger.interval": 7})
    assert log_lines == [
        f"{path}: default_hooks.logger.interval=7 is not used: the trainer section sets "
        "trainer.log_every_n_steps=10; set trainer.log_every_n_steps instead"
    ]


def test_misspelt_paramwise_options_are_refused():
    # mmengine's default optimizer constructor reads its paramwise_cfg keys with .get(): a misspelt one (and a
    # misspelt custom_keys option) would train every parameter with the plain lr and decay
    with pytest.raises(
        ValueError, match=r"optim_wrapper\.paramwise_cfg\.'norm_decay_mul'.*Did you mean 'norm_decay_mult'"
    ):
        load_config(SEG_CFG, {"optim_wrapper.paramwise_cfg.norm_decay_mul": 0.0})
    with pytest.raises(
        ValueError,
        match=r"optim_wrapper\.paramwise_cfg\.custom_keys\['norm'\]\.'decay_multi'.*Did you mean 'decay_mult'",
    ):
        load_config(SEG_CFG, {"optim_wrapper.paramwise_cfg.custom_keys.norm.decay_multi": 0.0})
    # another constructor reads options of its own (mmdet's layer-wise decay): not checked against the default's
    load_config(
        SEG_CFG,
        {
            "optim_wrapper.constructor": "LearningRateDecayOptimizerConstructor",
            "optim_wrapper.paramwise_cfg.decay_rate": 0.9,
        },
    )


def test_auto_scale_lr_enabled_without_a_base_batch_size_names_the_key():
    with pytest.raises(ValueError, match=r"auto_scale_lr\.enable=True needs auto_scale_lr\.base_batch_size.*=16"):
        load_config(SEG_CFG, {"auto_scale_lr.enable": True})
    load_config(SEG_CFG, {"auto_scale_lr.enable": True, "auto_scale_lr.base_batch_size": 16})


def test_an_epoch_scheduler_in_a_run_limited_by_steps_is_named(log_lines):
    # mmengine's IterBasedTrainLoop never steps a by_epoch=True scheduler; here a run limited by max_steps still
    # passes over the train loader epoch by epoch and steps it then: said in one line, not silently
    import torch

    from tasks.training.optim import build_schedulers

    def lrs(scheduler, epochs):
        out = []
        for _ in range(epochs):
            out.append(scheduler.optimizer.param_groups[0]["lr"])
            scheduler.optimizer.step()
            scheduler.step()
        return out

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps = dict(max_epochs=-1, max_steps=10, epoch_length=lambda: 5)
    cfg = dict(type="MultiStepLR", by_epoch=True, milestones=[1])
    (linear, multistep) = build_schedulers(optimizer, [dict(type="LinearLR", by_epoch=False, end=2), cfg], **steps)
    assert (linear["interval"], multistep["interval"]) == ("step", "epoch")
    (alone,) = build_schedulers(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), [cfg], **steps)
    assert lrs(alone["scheduler"], 3) == pytest.approx([1.0, 0.1, 0.1])  # epoch 1 on: milestone 1 reached
    line, _ = [m for m in log_lines if m.startswith("param_scheduler[")]  # then [0], the entry built alone
    assert line.startswith("param_scheduler[1] (MultiStepLR): by_epoch=True in a run of max_steps=10: it steps after")
    log_lines.clear()
    (converted,) = build_schedulers(optimizer, [{**cfg, "convert_to_iter_based": True}], **steps)
    assert converted["interval"] == "step" and converted["scheduler"].milestones == {5: 1}
    assert not [m for m in log_lines if m.startswith("param_scheduler[")]
