"""LightningDataModule over the config's mm dataloader sections (mmdet CocoDataset, mmseg ADE20KDataset...).

Datasets and their pipelines are built by the library (``DATASETS.build``) and batches are mm's
``pseudo_collate`` dicts. Only ``batch_size``, ``num_workers``, ``persistent_workers``, ``pin_memory``,
``drop_last``, ``sampler.shuffle`` and, for training, ``batch_sampler`` are read from each section.

Training data order and augmentation are pure functions of (``randomness.seed``, epoch), see tasks/data/sampling.py:
the train sampler (``ResumableSampler``, a ``DistributedSampler`` also in one process) shuffles with
``seed + epoch``, each rank takes its own shard, the section's ``batch_sampler`` (e.g. mmdet's
``AspectRatioBatchSampler``: images with width < height batched apart from the others) groups that shard, and
each sample gets its own seed, with which numpy's and ``random``'s global generators (used by mm transforms
such as RandomFlip / RandomResize / RandomCrop) are reseeded before its pipeline runs. The train loader is
stateful (``state_dict`` / ``load_state_dict``, saved by Lightning in every checkpoint): resuming a
checkpoint written mid-epoch skips the batches already trained on, so an interrupted and resumed run sees
exactly the batches of an uninterrupted one (independently of ``num_workers``). Every loader makes its own
distributed sampler, so the trainer is built with ``use_distributed_sampler=False`` (tasks/training/trainer.py).

Every dataset is built and checked by tasks/data/checks.py (paths before building, COCO annotation files
while mmdet reads them, every sample's files and labels as it is loaded: errors name the file). With the config's
``data_errors='skip'`` a training sample that fails to load gives its place to the next one (tasks/data/skipping.py).
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader, Dataset

from ..config.scopes import register_scope
from .checks import CheckedDataset, build_dataset, check_dataset_paths
from .sampling import ResumableBatchSampler, ResumableDataLoader, ResumableSampler, SeededDataset, build_batch_sampler
from .skipping import SkippingDataset, data_error_policy

SPLITS = ("train", "val", "test")


class MMDataModule(L.LightningDataModule):
    """The train / val / test loaders of an mm config's ``*_dataloader`` sections (see the module docstring).

    Args:
        cfg: the mmengine config; reads ``train_dataloader``, ``val_dataloader``, ``test_dataloader`` and
            ``randomness.seed`` (the train order and augmentation seed, default 0).
        scope: ``'mmdet'`` or ``'mmseg'``: the library whose registries build the datasets.
    """

    def __init__(self, cfg: Config, scope: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.scope = scope
        self._datasets: dict = {}

    def transfer_batch_to_device(self, batch: dict, device: torch.device, dataloader_idx: int) -> dict:
        # The batch stays mm's pseudo-collated dict (lists of uint8 images and data samples); the task module's
        # data_preprocessor moves it, exactly as under mmengine's Runner. (Here rather than on the module:
        # Lightning takes the data module's hook when one is passed, and notes an override on the module.)
        return batch

    def section(self, split: str) -> dict:
        """The config's ``{split}_dataloader`` section (``split``: 'train', 'val' or 'test')."""
        name = f"{split}_dataloader"
        if self.cfg.get(name) is None:
            raise KeyError(f"the config has no {name} section")
        return self.cfg[name]

    def dataset(self, split: str) -> Dataset:
        """The built dataset of a split (cached; also used for metainfo by the evaluator/visualizer)."""
        if split not in self._datasets:
            ds_cfg = self.section(split)["dataset"]
            check_dataset_paths(ds_cfg, f"{split}_dataloader")
            register_scope(self.scope)
            sections = tuple(f"{s}_dataloader" for s in SPLITS if self.cfg.get(f"{s}_dataloader") is not None)
            self._datasets[split] = build_dataset(ds_cfg, f"{split}_dataloader", sections)
        return self._datasets[split]

    def _loader(self, split: str, cls=DataLoader, **batching) -> DataLoader:
        """A loader of ``split`` with the section's worker settings; ``batching`` is either ``shuffle``
        (+ ``sampler``) or ``batch_sampler``."""
        sec = self.section(split)
        workers = sec.get("num_workers", 0)
        if "batch_sampler" not in batching:
            batching.update(batch_size=sec.get("batch_size", 1), drop_last=sec.get("drop_last", False))
        checked = CheckedDataset(self.dataset(split), split)
        dataset = SeededDataset(checked)
        if split == "train" and data_error_policy(self.cfg)[0] == "skip":  # validation and tests never skip
            dataset = SkippingDataset(dataset, checked.files)
        return cls(
            dataset,
            num_workers=workers,
            persistent_workers=bool(sec.get("persistent_workers")) and workers > 0,
            pin_memory=sec.get("pin_memory", False),
            collate_fn=pseudo_collate,
            **batching,
        )

    def train_dataloader(self) -> DataLoader:
        sec = self.section("train")
        shuffle = (sec.get("sampler") or {}).get("shuffle", True)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        seed = int((self.cfg.get("randomness") or {}).get("seed") or 0)
        sampler = ResumableSampler(self.dataset("train"), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        make_batches = build_batch_sampler(
            sec.get("batch_sampler"), sec.get("batch_size", 1), sec.get("drop_last", False)
        )
        # The loader's own generator: each epoch's iterator draws its workers' base seed from it rather than from
        # torch's global RNG, which the model's random layers (drop path) use. With the global RNG, a run resumed
        # from a checkpoint written at an epoch's last batch made one draw more than the uninterrupted run (the
        # restored, already finished epoch's iterator), and its drop-path masks differed from there on.
        loader = self._loader(
            "train",
            cls=ResumableDataLoader,
            batch_sampler=ResumableBatchSampler(sampler, make_batches),
            generator=torch.Generator().manual_seed(seed + rank),
        )
        if trainer is not None:
            loader.progress = lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return loader

    def _eval_loader(self, split: str) -> DataLoader:
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return self._loader(split, shuffle=False)
        # Lightning's DistributedSampler pads with repeated images so every rank gets the same count,
        # which would count those images twice in the metrics. This sampler gives each image to exactly
        # one rank; being a DistributedSampler, Lightning leaves it alone.
        dataset = self.dataset(split)
        if len(dataset) < trainer.world_size:
            raise ValueError(
                f"{split} set has {len(dataset)} images for {trainer.world_size} processes; "
                "each needs at least one (the metric sync at epoch end would wait forever)"
            )
        sampler = UnrepeatedDistributedSampler(
            dataset, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )
        return self._loader(split, shuffle=False, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


def without_annotation_loading(pipeline: list) -> list:
    """The pipeline without its ``LoadAnnotations`` steps, also inside ``TestTimeAug``: ``tools/test.py
    --format-only`` and ``tools/infer.py`` need no ground truth, and test-server images have none."""

    def keep(step) -> bool:
        return not str(step.get("type", "")).endswith("LoadAnnotations")

    out = []
    for step in filter(keep, pipeline):
        if step.get("type") == "TestTimeAug":  # a list of alternatives per stage; a stage left empty goes
            stages = [[t for t in stage if keep(t)] for stage in step["transforms"]]
            step = dict(step, transforms=[stage for stage in stages if stage])
        out.append(step)
    return out
