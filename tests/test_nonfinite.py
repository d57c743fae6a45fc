"""The nonfinite_loss policy as a unit (tasks/training/nonfinite.py); the Lightning runs are in test_reliability.py."""

import pytest
import torch
from torch import nn

from tasks.training.nonfinite import NonFiniteLossPolicy


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


def test_raise_names_the_step_and_the_terms():
    policy, model = NonFiniteLossPolicy("raise"), _model()
    with pytest.raises(FloatingPointError, match=r"non-finite loss at step 7: loss=nan .*nonfinite_loss='skip'"):
        _nan_step(policy, model)
    assert policy.skipped == 0 and not policy.take_skip()


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
