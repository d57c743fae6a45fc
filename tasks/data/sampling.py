"""Training data order that is a pure function of (seed, epoch) and resumes mid-epoch exactly.

The index order comes from ``ResumableSampler`` (a ``DistributedSampler``, also in one process: shuffled with
``seed + epoch``, each rank taking its own shard, as mmengine's ``DefaultSampler`` does). The batches are cut from
it by the config's mm ``batch_sampler`` (e.g. mmdet's ``AspectRatioBatchSampler``, which puts images with
width < height in one group and the rest in another), or by torch's ``BatchSampler`` when the config has none.
``ResumableBatchSampler`` builds that batch sampler afresh every epoch (mmdet's keeps leftover images of an
epoch that was cut short, e.g. by ``limit_train_batches``, which would leak into the next one), hands every
sample its own seed, and can start an epoch after the batches a checkpoint says were already trained on.

``ResumableDataLoader`` saves that position in Lightning checkpoints (``state_dict`` / ``load_state_dict``).
"""

from __future__ import annotations

import itertools
import random
from typing import Callable, Iterable

import numpy as np
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from ..config.keys import ConfigError


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed with which the augmentation RNGs are reseeded before sample ``index`` of ``epoch`` is loaded."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class SeededDataset(Dataset):
    """Reads ``(index, sample_seed)`` keys (``ResumableBatchSampler``): numpy's and ``random``'s global generators,
    which mm transforms such as RandomFlip / RandomResize / RandomCrop draw from, are reseeded before the sample's
    pipeline runs, so its augmentation depends on (seed, epoch, index) only, not on the worker or what ran
    before. A plain index (the evaluation loaders) loads the sample as it is."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key, seed = key
            np.random.seed(seed)
            random.seed(seed)
        return self.dataset[key]


class ResumableSampler(DistributedSampler):
    """The epoch's dataset indices of this rank: a ``DistributedSampler`` (also for one process), whose order
    depends only on (``seed``, epoch), the number of ranks and the rank."""


def build_batch_sampler(spec: dict | None, batch_size: int, drop_last: bool) -> Callable[[Sampler], Sampler]:
    """A factory ``sampler -> batch sampler`` for a dataloader section's ``batch_sampler`` entry.

    Args:
        spec: the section's ``batch_sampler`` (an mm ``DATA_SAMPLERS`` type such as
            ``dict(type='AspectRatioBatchSampler')``), or None for torch's ``BatchSampler``.
        batch_size: images per batch (the section's ``batch_size``), unless ``spec`` sets its own.
        drop_last: whether to drop the epoch's last, incomplete batch, unless ``spec`` sets its own.
    """
    if spec is None:
        return lambda sampler: BatchSampler(sampler, batch_size, drop_last)
    from mmengine.registry import DATA_SAMPLERS  # the default scope routes to mmdet's registry

    from ..config.load import build_from_registry

    def build(sampler):
        cfg = dict(spec)
        for key, value in (("sampler", sampler), ("batch_size", batch_size), ("drop_last", drop_last)):
            cfg.setdefault(key, value)
        return build_from_registry(DATA_SAMPLERS, cfg, what="train_dataloader.batch_sampler")

    return build


class ResumableBatchSampler(Sampler):
    """Batches of ``(index, sample_seed)`` keys (read by ``SeededDataset``) for one epoch.

    Args:
        sampler: the rank's index order (``ResumableSampler``); Lightning calls its ``set_epoch``.
        make_batches: ``sampler -> batch sampler`` (``build_batch_sampler``), called once per epoch.
    """

    def __init__(self, sampler: ResumableSampler, make_batches: Callable[[Sampler], Iterable[list[int]]]):
        self.sampler = sampler
        self.make_batches = make_batches
        probe = make_batches(sampler)
        self.kind = type(probe).__name__  # recorded in checkpoints: a mid-epoch resume needs the same batching
        self.batch_size = int(probe.batch_size)
        self.skip = 0  # batches of epoch ``skip_epoch`` already trained on
        self.skip_epoch = -1

    def __len__(self) -> int:
        return len(self.make_batches(self.sampler))

    def __iter__(self):
        epoch, seed = self.sampler.epoch, self.sampler.seed
        start = self.skip if self.skip_epoch == epoch else 0
        self.skip, self.skip_epoch = 0, -1
        for batch in itertools.islice(iter(self.make_batches(self.sampler)), start, None):
            yield [(idx, sample_seed(seed, epoch, idx)) for idx in batch]


class ResumableDataLoader(DataLoader):
    """A DataLoader over a ``ResumableBatchSampler`` that Lightning checkpoints (``state_dict``): the epoch and
    how many batches of it the training loop has finished; ``load_state_dict`` makes the next iteration skip
    them."""

    progress = None  # callable -> batches of the current epoch finished by the training loop

    def state_dict(self) -> dict:
        done = int(self.progress()) if self.progress is not None else 0
        batches = self.batch_sampler
        return {
            "epoch": int(batches.sampler.epoch),
            "batches": done,
            "batch_size": batches.batch_size,
            "batch_sampler": batches.kind,
        }

    def load_state_dict(self, state: dict) -> None:
        batches = self.batch_sampler
        # Lightning creates the epoch's iterator before calling set_epoch when resuming: set it here.
        if state["batches"] >= len(self):  # saved at the end of an epoch: the next one starts afresh
            batches.sampler.set_epoch(state["epoch"] + 1)
            return
        # Mid-epoch, the batches to skip are counted in the checkpoint's batch size: another one would skip the
        # wrong samples. ConfigError: the user's input, reported without a traceback.
        if state.get("batch_size", batches.batch_size) != batches.batch_size:
            raise ConfigError(
                f"--resume: the checkpoint stopped mid-epoch (epoch {state['epoch']}, after {state['batches']} "
                f"batches) with train_dataloader.batch_size={state['batch_size']}; this config has "
                f"{batches.batch_size}. Resume with --cfg-options train_dataloader.batch_size={state['batch_size']} "
                "(change it at the end of an epoch), or start a new run with load_from=CKPT"
            )
        saved = state.get("batch_sampler", "BatchSampler")  # checkpoints written before batch samplers counted
        if saved != batches.kind:
            hint = (
                "train_dataloader.batch_sampler=None"
                if saved == "BatchSampler"
                else f"train_dataloader.batch_sampler.type={saved}"
            )
            raise ConfigError(
                f"resuming mid-epoch needs the batching of the checkpoint ({saved}); this config "
                f"batches with {batches.kind}: pass --cfg-options {hint}"
            )
        batches.sampler.set_epoch(state["epoch"])
        batches.skip, batches.skip_epoch = state["batches"], state["epoch"]
