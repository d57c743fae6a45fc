"""Gradient accumulation with the paper's semantics (tasks/training/trainer.py, tasks/training/optim.py): one
optimizer step per N batches on the mean of their gradients, schedules and step counts in optimizer steps, and
``--auto-scale-lr`` counting accumulation in the total batch."""

import copy
import logging

import lightning as L
import pytest
import torch

from tasks.config.load import load_config
from tasks.training.optim import build_schedulers
from tasks.training.trainer import trainer_kwargs
from tests._runs import seg_opts
from tests._tools import SEG_CFG, load_tool

train_tool = load_tool("train")

ACCUMULATION, STEPS = 2, 3
# GroupNorm instead of the heads' BatchNorm (HAT-Net has GroupNorms only) and no dropout: a model without batch
# statistics or randomness in its forward, whose gradient on one batch is a function of the weights and the batch.
NO_BATCH_STATISTICS = [
    f"model.{head}.{key}"
    for head in ("decode_head", "auxiliary_head")
    for key in ("norm_cfg.type=GN", "norm_cfg.num_groups=8", "dropout_ratio=0.0")
]


class Probe(L.Callback):
    """The initial weights, every training batch, the first optimizer step's gradients, and the lr of each step."""

    def __init__(self):
        self.initial, self.batches, self.grads, self.lrs, self.module = None, [], None, [], None

    def on_train_start(self, trainer, module):
        self.initial = copy.deepcopy(module.state_dict())
        self.module = module

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches.append(copy.deepcopy(batch))

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def run(data_opts, tmp_path_factory):
    """3 optimizer steps of 2 accumulated batches, a warm-up over the 3 steps, --auto-scale-lr; returns (probe,
    work dir, the --cfg-options, the lines logged by Lightning's logger)."""
    work = tmp_path_factory.mktemp("accumulation")
    probe = Probe()
    opts = seg_opts(
        data_opts,
        f"trainer.max_steps={STEPS}",
        f"optim_wrapper.accumulative_counts={ACCUMULATION}",
        f"param_scheduler.0.end={STEPS}",  # the warm-up spans the run (the decay starts later)
        "auto_scale_lr.base_batch_size=8",
        *NO_BATCH_STATISTICS,
    )
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch")  # where Lightning's rank_zero_info (and so scale_lr) logs
    logger.addHandler(handler)
    try:
        train_tool.main(
            [SEG_CFG, "--auto-scale-lr", "--work-dir", str(work), "--cfg-options", *opts], callbacks=[probe]
        )
    finally:
        logger.removeHandler(handler)
    return probe, work, opts, lines


def _loss(module, batch):
    data = module._preprocess(batch, training=True)
    return module.model.parse_losses(module.model(**data, mode="loss"))[0]


def test_accumulated_gradient_is_the_mean_of_the_micro_batches(run):
    probe = run[0]
    module = probe.module
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())
    module.load_state_dict(probe.initial)
    module.train()
    per_batch = []
    for batch in probe.batches[:ACCUMULATION]:  # the first optimizer step's batches, on the initial weights
        module.zero_grad()
        _loss(module, batch).backward()
        per_batch.append({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
    assert per_batch[0].keys() == per_batch[1].keys() == probe.grads.keys()
    assert any(not torch.allclose(per_batch[0][n], per_batch[1][n]) for n in probe.grads)  # two different batches
    worst = 0.0
    for name, grad in probe.grads.items():
        mean = (per_batch[0][name] + per_batch[1][name]) / 2
        worst = max(worst, float((grad - mean).abs().max() / mean.abs().max().clamp_min(1e-12)))
    assert worst < 1e-5, worst
    print(f"accumulated gradient vs mean of the micro-batches' gradients: max relative difference {worst:.2e}")


def test_steps_and_lr_curve_count_optimizer_steps(run, tmp_path):
    probe, work, opts, _ = run
    ckpt = torch.load(work / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == STEPS and len(probe.batches) == STEPS * ACCUMULATION
    # the schedule stepped once per optimizer step: the curve of the same schedulers stepped STEPS times
    cfg = load_config(SEG_CFG, train_tool.parse_args([SEG_CFG, "--cfg-options", *opts]).cfg_options)
    scaled = cfg.optim_wrapper.optimizer.lr * ACCUMULATION * 2 / 8  # --auto-scale-lr: (1 x 1 x 2 x 2) / 8
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=scaled)
    schedulers = [
        c["scheduler"]
        for c in build_schedulers(optimizer, cfg.param_scheduler, max_epochs=-1, max_steps=STEPS, epoch_length=None)
    ]
    expected = []
    for _ in range(STEPS):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: only the step count the schedulers check
        for scheduler in schedulers:
            scheduler.step()
    assert probe.lrs == pytest.approx(expected, rel=1e-9)
    assert len(set(probe.lrs)) == STEPS  # a real curve (stepped per batch, the last two steps would share an lr)


def test_auto_scale_lr_counts_accumulation_in_the_total_batch(run):
    _, work, _, lines = run
    assert (
        "auto_scale_lr: total batch 4 = devices 1 x nodes 1 x batch_size 2 x accumulation 2; "
        "lr 0.001 -> 0.0005 = 0.001 x 4 / base_batch_size 8"
    ) in lines
    groups = torch.load(work / "last.ckpt", map_location="cpu", weights_only=True)["optimizer_states"][0]
    assert groups["param_groups"][0]["initial_lr"] == pytest.approx(0.0005)


def test_accumulation_keys_and_validation_interval_in_optimizer_steps():
    cfg = load_config(SEG_CFG, {})

    def kwargs(**opts):
        changed = copy.deepcopy(cfg)
        changed.merge_from_dict(opts)
        return trainer_kwargs(changed)

    assert kwargs(**{"optim_wrapper.accumulative_counts": 2})["accumulate_grad_batches"] == 2
    assert kwargs(**{"trainer.accumulate_grad_batches": 3})["accumulate_grad_batches"] == 3
    both = kwargs(**{"trainer.accumulate_grad_batches": 2, "optim_wrapper.accumulative_counts": 2})
    assert both["accumulate_grad_batches"] == 2
    # the demo validates every max_iters optimizer steps: that many steps of 2 batches each
    assert both["val_check_interval"] == 2 * kwargs()["val_check_interval"] == 2 * both["max_steps"]
    with pytest.raises(ValueError, match=r"accumulation given twice.*accumulative_counts=N"):
        kwargs(**{"trainer.accumulate_grad_batches": 2, "optim_wrapper.accumulative_counts": 4})
    with pytest.raises(ValueError, match=r"optim_wrapper\.accumulative_counts must be a positive integer"):
        kwargs(**{"optim_wrapper.accumulative_counts": 0})
