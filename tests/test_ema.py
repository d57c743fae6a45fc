"""Model EMA from ``custom_hooks = [dict(type='EMAHook', ...)]`` (tasks/training/ema.py): the averaging against mmdet's
``ExpMomentumEMA`` and mmengine's ``ExponentialMovingAverage`` fed the same weights, a tiny real training (the saved
average, validation on it, the exports), resume exactness, and the refusals."""

import copy
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from mmdet.models.layers import ExpMomentumEMA
from mmengine.config import Config
from mmengine.model import ExponentialMovingAverage
from mmengine.runner import load_checkpoint

from tasks.deploy.checkpoints import read_training_checkpoint
from tasks.training.ema import ModelEMA, build_custom_hooks
from tests._runs import kill_and_resume_here, load_ckpt, run_here, seg_opts
from tests._tools import SEG_CFG, load_tool


# --- the averaging, step by step ---------------------------------------------------------------------------------
class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 1)
        self.bn = torch.nn.BatchNorm2d(3)


class _Task(L.LightningModule):
    """A model whose weights each optimizer step sets to the next random values (parameters and BatchNorm buffers),
    under a real Lightning loop; the callback averages ``self.model``, as it does MMTaskModule's mm model."""

    def __init__(self):
        super().__init__()
        self.model = _Net()
        self.gen = torch.Generator().manual_seed(0)

    def training_step(self, batch, batch_idx):
        return self.model.bn(self.model.conv(batch)).square().mean()

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        with torch.no_grad():
            for t in [*self.model.parameters(), self.model.bn.running_mean, self.model.bn.running_var]:
                t.copy_(torch.rand(t.shape, generator=self.gen))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _ValidatedTask(_Task):
    """Records the weights each validation ran on."""

    def __init__(self):
        super().__init__()
        self.validated = []

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and not self.trainer.sanity_checking:
            self.validated.append(copy.deepcopy(self.model.state_dict()))


class _Record(L.Callback):
    """After every optimizer step (after ModelEMA, which comes before it in the list): the raw weights and the
    average."""

    def __init__(self, ema: ModelEMA):
        self.ema, self.raw, self.averages, self.last = ema, [], [], 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.last:
            self.last = trainer.global_step
            self.raw.append(copy.deepcopy(module.model.state_dict()))
            self.averages.append(copy.deepcopy(self.ema.ema.state_dict()))


def _fit(hook_args: dict, steps: int, accumulate: int = 2, val_every: int | None = None):
    """``steps`` optimizer steps of ``accumulate`` batches each, with ModelEMA(**hook_args); returns the task, the
    callback and the record."""
    callback = ModelEMA(**hook_args)
    task, record = (_ValidatedTask() if val_every else _Task()), _Record(callback)
    trainer = L.Trainer(
        max_steps=steps,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        callbacks=[callback, record],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=val_every,
        limit_val_batches=1 if val_every else 0,
        check_val_every_n_epoch=None if val_every else 1,
    )
    data = torch.utils.data.DataLoader(torch.rand(64, 2, 4, 4), batch_size=4)
    trainer.fit(task, data, data if val_every else None)
    return task, callback, record


def _assert_same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def _assert_mm_averages(reference, record, begin_iter=0) -> None:
    """mm's averaged model fed the recorded raw weights by mm's EMAHook rule (``after_train_iter``) equals the
    recorded average after every step."""
    net = _Net()
    net.load_state_dict(record.raw[0])
    ref = reference(net)
    for i, (raw, averaged) in enumerate(zip(record.raw, record.averages)):
        net.load_state_dict(raw)
        if i + 1 >= begin_iter:
            ref.update_parameters(net)
        else:
            ref.module.load_state_dict(raw)
        _assert_same(averaged, ref.state_dict())


@pytest.mark.parametrize(
    "hook_args, reference",
    [
        (dict(momentum=0.1), lambda m: ExponentialMovingAverage(m, momentum=0.1)),
        (
            dict(momentum=0.3, interval=3, update_buffers=True),
            lambda m: ExponentialMovingAverage(m, momentum=0.3, interval=3, update_buffers=True),
        ),
        (
            dict(ema_type="ExpMomentumEMA", momentum=0.0001, gamma=4, update_buffers=True),
            lambda m: ExpMomentumEMA(m, momentum=0.0001, gamma=4, update_buffers=True),
        ),
        (
            dict(ema_type="ExpMomentumEMA", momentum=0.01, gamma=3, interval=2),
            lambda m: ExpMomentumEMA(m, momentum=0.01, gamma=3, interval=2),
        ),
    ],
)
def test_averaging_equals_mm_classes_after_every_step(hook_args, reference):
    """7 optimizer steps of 2 batches each: one update per optimizer step, compared after each."""
    task, callback, record = _fit(hook_args, 7)
    assert len(record.raw) == 7 and int(callback.ema.steps) == 7
    _assert_mm_averages(reference, record)
    _assert_same(task.model.state_dict(), record.raw[-1])  # training goes on with the raw weights
    # the average differs from the last weights: the comparison compared averages, not copies
    assert not torch.equal(callback.ema.module.conv.weight, task.model.conv.weight)


def test_begin_iter_follows_the_model_until_then():
    hook = dict(ema_type="ExpMomentumEMA", momentum=0.05, gamma=2, begin_iter=3)
    task, callback, record = _fit(hook, 6, accumulate=1)
    _assert_mm_averages(lambda m: ExpMomentumEMA(m, momentum=0.05, gamma=2), record, begin_iter=3)
    assert int(callback.ema.steps) == 4  # updated after steps 3..6; the first update copies


def test_validation_runs_on_the_average_and_training_on_the_raw_weights():
    task, callback, record = _fit(dict(momentum=0.2), 4, accumulate=1, val_every=2)
    assert len(task.validated) == 2
    for validated, averaged in zip(task.validated, record.averages[1::2]):
        _assert_same(validated, {k.removeprefix("module."): v for k, v in averaged.items() if k != "steps"})
    _assert_same(task.model.state_dict(), record.raw[-1])


# --- refusals -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "hooks, message",
    [
        ([dict(type="CheckInvalidLossHook")], "type='CheckInvalidLossHook' is not supported; supported: ['EMAHook']"),
        ([dict(type="EMAHook", momentum=0.1, decay=0.9)], "unknown argument(s) ['decay']"),
        ([dict(type="EMAHook", gamma=100)], "unknown argument(s) ['gamma'] for ema_type='ExponentialMovingAverage'"),
        ([dict(type="EMAHook", ema_type="SWA")], "ema_type='SWA' is not supported"),
        ([dict(type="EMAHook", momentum=0.9999 + 1)], "momentum must be in (0, 1)"),
        ([dict(type="EMAHook", begin_iter=2, begin_epoch=1)], "begin_iter or begin_epoch, not both"),
        ([dict(type="EMAHook", priority="SOON")], "priority='SOON'"),
        ([dict(type="EMAHook"), dict(type="EMAHook")], "one model EMA at most"),
    ],
)
def test_refused_hooks_name_the_problem(hooks, message):
    with pytest.raises(ValueError) as e:
        build_custom_hooks(Config(dict(custom_hooks=hooks)))
    assert message in str(e.value)


@pytest.mark.parametrize(
    "hook, alternative",
    [
        ("CheckInvalidLossHook", "nonfinite_loss='raise'"),
        ("PipelineSwitchHook", "load_from"),
        ("MeanTeacherHook", "semi-supervised"),
        ("SetEpochInfoHook", "set_epoch"),
        ("EMAHok", "supported: ['EMAHook']"),
    ],
)
def test_refused_mm_hooks_name_what_to_do_instead(hook, alternative):
    with pytest.raises(ValueError) as e:
        build_custom_hooks(Config(dict(custom_hooks=[dict(type=hook, interval=50)])))
    assert f"custom_hooks[0]: type={hook!r} is not supported" in str(e.value) and alternative in str(e.value)


def test_hooks_whose_work_is_done_anyway_are_accepted(caplog):
    # mmdet's checks of the heads' classes and of the norm statistics run here without a hook (the detection task,
    # SyncBuffers): such a config keeps its meaning, and only the EMA is a callback of its own
    hooks = [dict(type="NumClassCheckHook"), dict(type="mmdet.SyncNormHook"), dict(type="EMAHook")]
    with caplog.at_level(logging.INFO):
        callbacks = build_custom_hooks(Config(dict(custom_hooks=hooks)))
    assert [type(c) for c in callbacks] == [ModelEMA]
    assert "custom_hooks[0]: NumClassCheckHook: done without a hook here: " in caplog.text
    assert "custom_hooks[1]: mmdet.SyncNormHook: done without a hook here: " in caplog.text


def test_mmdet_yolox_hook_is_accepted():
    (callback,) = build_custom_hooks(
        Config(
            dict(
                custom_hooks=[
                    dict(type="EMAHook", ema_type="ExpMomentumEMA", momentum=0.0001, update_buffers=True, priority=49)
                ]
            )
        )
    )
    assert callback.priority == 49 and callback.ema_cls is ExpMomentumEMA


# --- a tiny real training ------------------------------------------------------------------------------------------
def _ema_config(folder, **hook) -> str:
    """The segmentation demo with ``custom_hooks = [dict(type='EMAHook', **hook)]``, as a config file inheriting it
    (``--cfg-options`` cannot give a list of dicts)."""
    path = folder / "upernet_ema.py"
    path.write_text(f"_base_ = [{SEG_CFG!r}]\ncustom_hooks = [dict(type='EMAHook', **{hook!r})]\n")
    return str(path)


class _RecordRaw(L.Callback):
    """The raw model after every optimizer step (runs before ModelEMA: the tools' callbacks come first), and the
    weights validation ran on."""

    def __init__(self):
        self.raw, self.validated = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.raw.append(copy.deepcopy(module.model.state_dict()))

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and batch_idx == 0:
            self.validated.append(copy.deepcopy(module.model.state_dict()))


@pytest.fixture(scope="session")
def ema_run(data_opts, run_once):
    """The run's work dir and its ``_RecordRaw`` (saved beside it): trained once per session, whichever worker
    asks first."""

    def make(folder):
        config = _ema_config(folder, ema_type="ExpMomentumEMA", momentum=0.01, gamma=3, update_buffers=True)
        opts = data_opts("tiny_ade20k", "trainer.max_steps=3", "trainer.val_check_interval=3")
        record = _RecordRaw()
        argv = [config, "--work-dir", str(folder / "work"), "--cfg-options", *opts]
        load_tool("train").main(argv, callbacks=[record])
        torch.save(dict(raw=record.raw, validated=record.validated), folder / "record.pt")
        return str(folder)

    folder = Path(run_once("ema_run", make))
    record = _RecordRaw()
    saved = torch.load(folder / "record.pt", weights_only=True)
    record.raw, record.validated = saved["raw"], saved["validated"]
    return folder / "work", record


def test_training_saves_the_average_of_the_raw_weights(ema_run):
    work, record = ema_run
    ckpt = load_ckpt(work / "last.ckpt")
    assert len(record.raw) == 3 and ckpt["global_step"] == 3
    # mmdet's ExpMomentumEMA fed the recorded raw weights gives the saved average
    net = copy.deepcopy(_model_from(work))
    net.load_state_dict(record.raw[0])
    ref = ExpMomentumEMA(net, momentum=0.01, gamma=3, update_buffers=True)
    for raw in record.raw:
        net.load_state_dict(raw)
        ref.update_parameters(net)
    averaged = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    for key, value in ref.module.state_dict().items():
        assert torch.equal(averaged[key], value), key
    # the raw weights are there too, in mmengine's EMAHook layout
    raw = ckpt["ema_state_dict"]
    assert int(raw["steps"]) == 3
    assert all(torch.equal(raw["module." + k], v) for k, v in record.raw[-1].items())
    assert any(not torch.equal(averaged[k], v) for k, v in record.raw[-1].items() if v.is_floating_point())
    # validation ran on the average
    (validated,) = record.validated
    assert all(torch.equal(validated[k], averaged[k]) for k in validated)


def _model_from(work):
    """The mm segmentor of the run's config, built without weights."""
    from tasks import build_task
    from tasks.config.load import load_config

    module, _ = build_task(load_config(str(work / "upernet_ema.py")), init_weights=False)
    return module.model


def test_exports_take_the_average_by_default_and_raw_on_request(ema_run, tmp_path, capsys):
    work, record = ema_run
    ckpt = read_training_checkpoint(work / "last.ckpt")
    assert ckpt.raw_state_dict is not None
    export = load_tool("export_model")
    ema_meta = export.main([str(work / "last.ckpt"), "--out", str(tmp_path / "ema.pth")])
    assert "EMA weights" in capsys.readouterr().out
    raw_meta = export.main([str(work / "last.ckpt"), "--out", str(tmp_path / "raw.pth"), "--raw-weights"])
    assert "raw weights" in capsys.readouterr().out
    assert (ema_meta["weights"], raw_meta["weights"]) == ("ema", "raw")
    ema_file, raw_file = (load_ckpt(tmp_path / f) for f in ("ema.pth", "raw.pth"))
    assert all(torch.equal(ema_file["state_dict"][k], v) for k, v in ckpt.state_dict.items())
    assert all(torch.equal(raw_file["state_dict"][k], v) for k, v in record.raw[-1].items())
    # mmengine's EMAHook layout: the raw weights under ema_state_dict as module.<key>, with the counter
    assert set(ema_file["ema_state_dict"]) == {"module." + k for k in ckpt.state_dict} | {"steps"}
    assert "ema_state_dict" not in raw_file
    # mmengine's loader takes the average from it, as from an EMAHook checkpoint
    model = _model_from(work)
    load_checkpoint(model, str(tmp_path / "ema.pth"), map_location="cpu")
    _assert_same(model.state_dict(), ckpt.state_dict)

    backbone = load_tool("export_backbone")
    b_ema = backbone.main([str(work / "last.ckpt"), "--out", str(tmp_path / "b_ema.pth")])
    assert "EMA weights" in capsys.readouterr().out
    b_raw = backbone.main([str(work / "last.ckpt"), "--out", str(tmp_path / "b_raw.pth"), "--raw-weights"])
    assert (b_ema["weights"], b_raw["weights"]) == ("ema", "raw")
    for name, source in (("b_ema.pth", ckpt.state_dict), ("b_raw.pth", record.raw[-1])):
        saved = load_ckpt(tmp_path / name)["state_dict"]
        assert all(torch.equal(v, source["backbone." + k]) for k, v in saved.items())


@pytest.mark.slow
def test_resume_after_kill_gives_the_uninterrupted_average_and_weights(data_opts, tmp_path):
    opts = seg_opts(
        data_opts,
        "trainer.max_steps=5",
        "checkpoint_every_n_steps=2",
        "trainer.deterministic=True",
    )
    config = _ema_config(tmp_path, ema_type="ExpMomentumEMA", momentum=0.01, gamma=2, update_buffers=True)

    def args(work):
        return [config, "--work-dir", str(work), "--resume", "auto", "--cfg-options", *opts]

    run_here("train", args(tmp_path / "ref"))
    saved, final = kill_and_resume_here(args(tmp_path / "run"), tmp_path / "run", tmp_path / "pause", pause_at=3)
    reference = load_ckpt(tmp_path / "ref" / "last.ckpt")
    assert saved["global_step"] == 2 and final["global_step"] == 5 and int(final["ema_state_dict"]["steps"]) == 5
    for key in ("state_dict", "ema_state_dict"):  # the average, and the raw weights
        assert reference[key].keys() == final[key].keys()
        for k in reference[key]:
            assert torch.equal(reference[key][k], final[key][k]), (key, k)


class _RecordTested(L.Callback):
    def on_test_epoch_start(self, trainer, module):
        self.tested = copy.deepcopy(module.model.state_dict())


def test_tools_test_evaluates_the_average(ema_run, tmp_path, capsys):
    work, record = ema_run
    probe = _RecordTested()
    metrics = load_tool("test").main(
        [str(work / "upernet_ema.py"), str(work / "last.ckpt"), "--work-dir", str(tmp_path)], callbacks=[probe]
    )
    assert "testing the EMA weights" in capsys.readouterr().out
    assert "mIoU" in metrics
    averaged = read_training_checkpoint(work / "last.ckpt").state_dict
    _assert_same(probe.tested, averaged)
    assert any(not torch.equal(probe.tested[k], v) for k, v in record.raw[-1].items() if v.is_floating_point())
