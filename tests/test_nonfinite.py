"""The nonfinite_loss policy (tasks/training/nonfinite.py): as a unit, and in real in-process trainings of the
segmentation demo (the multi-process runs are in test_reliability.py)."""

import lightning as L
import pytest
import torch
from torch import nn

from tasks.training.nonfinite import NonFiniteLossPolicy
from tests._runs import seg_opts
from tests._tools import SEG_CFG, load_tool

train_tool = load_tool("train")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))


def _nan_step(policy, model):
    with policy.guard(model) as step:
        out = model(torch.full((5, 3), float("nan")))
    loss = out.mean()
    assert step.nonfinite(loss)
    return step.skip({"loss": loss, "loss_cls": torch.tensor(0.5)}, "step 7", model.parameters())


def test_invalid_mode_is_refused():
    with pytest.raises(ValueError, match=r"nonfinite_loss must be one of \('raise', 'skip'\), got 'ignore'"):
        NonFiniteLossPolicy("ignore")
    assert NonFiniteLossPolicy(None).mode == "raise"


def test_skip_restores_buffers_and_returns_a_zero_loss_reaching_every_parameter():
    policy, model = NonFiniteLossPolicy("skip"), _model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loss = _nan_step(policy, model)
    # the NaN forward moved the BatchNorm statistics; the skip put them back
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    assert policy.skipped == 1
    assert policy.take_skip() and not policy.take_skip()  # once per skipped step


def test_finite_loss_is_not_flagged_and_the_count_is_checkpointed():
    policy, model = NonFiniteLossPolicy("skip"), _model()
    with policy.guard(model) as step:
        loss = model(torch.randn(5, 3)).mean()
    assert not step.nonfinite(loss)
    _nan_step(policy, model)
    _nan_step(policy, model)
    restored = NonFiniteLossPolicy("skip")
    restored.load_state_dict(policy.state_dict())
    assert restored.skipped == 2


def _raise_step(policy, model, x, where):
    """One 'raise' step as MMTaskModule runs it, up to the optimizer: forward, record, backward, gradient mask."""
    with policy.guard(model) as step:
        loss = model(x).mean()
    loss, skipped = step.finish(loss, {"loss": loss, "loss_cls": torch.tensor(0.5)}, where, model.parameters)
    assert not skipped
    model.zero_grad()
    loss.backward()
    policy.zero_nonfinite_grads(model.parameters(), where)


def test_raise_keeps_flags_on_the_device_until_the_check_names_the_first_bad_step():
    policy, model = NonFiniteLossPolicy("raise"), _model().train()
    _raise_step(policy, model, torch.randn(5, 3), "step 6")
    grads = [p.grad.clone() for p in model.parameters()]
    policy.check()  # a finite step: nothing raised, finite gradients untouched
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert policy.host_reads == 1
    _raise_step(policy, model, torch.full((5, 3), float("nan")), "step 7")
    _raise_step(policy, model, torch.full((5, 3), float("inf")), "step 8")
    assert policy.host_reads == 1  # nothing read on the host while stepping
    # the NaN gradients were zeroed on the device: an optimizer step cannot make a weight non-finite
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 7: loss=nan \(all terms: loss=nan, "):
        policy.check()
    assert policy.host_reads == 2
    policy.check()  # the flags were consumed: a later check does not raise the same step again


def test_raise_names_a_nonfinite_gradient_of_a_finite_loss():
    policy, w = NonFiniteLossPolicy("raise"), nn.Parameter(torch.zeros(3))
    loss = torch.sqrt(w).sum()  # finite (0) but d/dw sqrt(w) = inf at 0
    policy.record_loss(loss, {"loss": loss}, "step 2")
    loss.backward()
    policy.zero_nonfinite_grads([w], "step 2")
    assert torch.equal(w.grad, torch.zeros(3))
    with pytest.raises(FloatingPointError, match=r"non-finite gradient at step 2: the loss was finite"):
        policy.check()


class NaNAtBatch(L.Callback):
    """The main segmentation head's logits NaN on the n-th training batch (0-based); records whether every
    parameter is finite after each optimizer step, and keeps the module."""

    def __init__(self, n):
        self.n, self.batches, self.handle, self.finite_after, self.module = n, -1, None, [], None

    def on_train_start(self, trainer, module):
        self.module = module

        def hook(mod, args, out):
            return out * float("nan") if mod.training and self.batches == self.n else None

        self.handle = module.model.decode_head.conv_seg.register_forward_hook(hook)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches += 1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.finite_after.append(all(bool(torch.isfinite(p).all()) for p in module.parameters()))

    def teardown(self, trainer, module, stage):
        self.handle.remove()


def _train(data_opts, work_dir, nan_at, *opts):
    callback = NaNAtBatch(nan_at)
    argv = [SEG_CFG, "--work-dir", str(work_dir), "--cfg-options", *seg_opts(data_opts, *opts)]
    return callback, lambda: train_tool.main(argv, callbacks=[callback])


def test_raise_reads_the_flags_once_per_logging_interval_and_stops_before_a_checkpoint(data_opts, tmp_path):
    # NaN at step 1; flags read every 3 steps; the epoch (4 batches) would end with a checkpoint at step 4
    callback, run = _train(data_opts, tmp_path, 1, "trainer.max_steps=6", "trainer.log_every_n_steps=3")
    expected = r"non-finite loss at step 1 \(epoch 0, batch 1, rank 0\): loss=nan, decode\.loss_ce=nan \("
    with pytest.raises(FloatingPointError, match=expected):
        run()
    assert callback.module.nonfinite.host_reads == 1  # three steps, one read: at the logging step
    assert callback.finite_after == [True, True, True]  # the NaN step's update was zeroed
    assert not (tmp_path / "last.ckpt").exists()


def test_a_checkpoint_write_checks_the_flags_between_logging_steps(data_opts, tmp_path):
    callback, run = _train(
        data_opts, tmp_path, 1, "trainer.max_steps=8", "trainer.log_every_n_steps=4", "checkpoint_every_n_steps=1"
    )
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 1 \(epoch 0, batch 1, rank 0\)"):
        run()
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 1  # from before the NaN step
    assert callback.module.nonfinite.host_reads == 2  # the step-1 checkpoint, then the step-2 one that stopped
