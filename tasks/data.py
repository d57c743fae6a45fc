"""LightningDataModule over the config's mm dataloader sections (mmdet CocoDataset, mmseg ADE20KDataset...).

Datasets and their pipelines are built by the library (``DATASETS.build``) and batches are mm's
``pseudo_collate`` dicts. Only ``batch_size``, ``num_workers``, ``persistent_workers``, ``pin_memory``,
``drop_last`` and ``sampler.shuffle`` are read from each section. mm ``batch_sampler`` entries are ignored.

Training data order and augmentation are pure functions of (``randomness.seed``, epoch): the train sampler
(``ResumableSampler``, a ``DistributedSampler`` also in one process) shuffles with ``seed + epoch`` and hands
each sample its own seed, with which numpy's and ``random``'s global generators (used by mm transforms such
as RandomFlip / RandomResize / RandomCrop) are reseeded before its pipeline runs. The train loader is
stateful (``state_dict`` / ``load_state_dict``, saved by Lightning in every checkpoint): resuming a
checkpoint written mid-epoch skips the batches already trained on, so an interrupted and resumed run sees
exactly the batches of an uninterrupted one (independently of ``num_workers``).

Bad data fails with the file named (``CheckedDataset``): a missing or unreadable image, a truncated JPEG
(no end-of-image marker), a segmentation map with labels >= num_classes other than the ignore index
(an error, not a silent remap: such pixels would corrupt the loss and mIoU), and COCO annotations whose
``category_id`` is not in the file's ``categories`` (mmdet would drop them silently). Grayscale, RGBA and
16-bit images are read as 8-bit 3-channel BGR by mmcv's ``LoadImageFromFile`` (``color_type='color'``).
Training images without objects are dropped by mmdet's ``filter_cfg=dict(filter_empty_gt=True)`` (the
mmdet base configs' default); the data module logs how many.
"""

from __future__ import annotations

import json
import logging
import os
import os.path as osp
import random

import lightning as L
import numpy as np
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .config import register_scope

log = logging.getLogger(__name__)

SPLITS = ('train', 'val', 'test')


def _data_paths(ds_cfg: dict):
    """Yield (description, path) for what must exist before ``ds_cfg`` can be built."""
    if 'datasets' in ds_cfg:  # ConcatDataset
        for sub in ds_cfg['datasets']:
            yield from _data_paths(sub)
        return
    if 'dataset' in ds_cfg:  # RepeatDataset, ClassBalancedDataset, MultiImageMixDataset
        yield from _data_paths(ds_cfg['dataset'])
        return
    root = ds_cfg.get('data_root') or ''
    if root:
        yield 'data_root', root
    if ds_cfg.get('ann_file'):
        yield 'ann_file', osp.join(root, ds_cfg['ann_file'])
    for key, prefix in (ds_cfg.get('data_prefix') or {}).items():
        if prefix:
            yield f'data_prefix.{key}', osp.join(root, prefix)


def check_dataset_paths(ds_cfg: dict, section: str) -> None:
    for what, path in _data_paths(ds_cfg):
        if '://' not in path and not osp.exists(path):
            raise FileNotFoundError(
                f"{section}.dataset.{what} '{path}' does not exist. For the demo data run "
                f"`python tools/make_tiny_data.py --out data`; for your own copy pass "
                f"`--cfg-options {section}.dataset.data_root=DIR` (and the other *_dataloader sections).")


class DataError(RuntimeError):
    """A sample that cannot be used; the message names the file."""


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1)[0])


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` (also for one process, so Lightning leaves it alone) that yields
    ``(index, sample_seed)`` and can start an epoch after its first ``skip`` samples (mid-epoch resume)."""

    def __init__(self, dataset, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.skip = 0  # samples of epoch ``skip_epoch`` already trained on
        self.skip_epoch = -1

    def __iter__(self):
        indices = list(super().__iter__())
        start = self.skip if self.skip_epoch == self.epoch else 0
        self.skip, self.skip_epoch = 0, -1
        for idx in indices[start:]:
            yield idx, sample_seed(self.seed, self.epoch, idx)


class ResumableDataLoader(DataLoader):
    """A DataLoader that Lightning checkpoints (``state_dict``): the epoch and how many batches of it the
    training loop has finished; ``load_state_dict`` makes the next iteration skip them."""

    progress = None  # callable -> batches of the current epoch finished by the training loop

    def state_dict(self) -> dict:
        done = int(self.progress()) if self.progress is not None else 0
        return {'epoch': int(self.sampler.epoch), 'batches': done, 'batch_size': int(self.batch_size)}

    def load_state_dict(self, state: dict) -> None:
        if state.get('batch_size', self.batch_size) != self.batch_size:
            raise ValueError(f"resuming mid-epoch needs the checkpoint's train batch size "
                             f"({state['batch_size']}), got {self.batch_size}")
        # Lightning creates the epoch's iterator before calling set_epoch when resuming: set it here.
        if state['batches'] >= len(self):  # saved at the end of an epoch: the next one starts afresh
            self.sampler.set_epoch(state['epoch'] + 1)
            return
        self.sampler.set_epoch(state['epoch'])
        self.sampler.skip, self.sampler.skip_epoch = state['batches'] * self.batch_size, state['epoch']


def _jpeg_truncated(path: str) -> bool:
    """No JPEG end-of-image marker (FFD9) in the last KiB: cut off, e.g. by an interrupted copy. OpenCV
    decodes such files without an error, filling the missing rows with grey."""
    with open(path, 'rb') as f:
        if f.read(2) != b'\xff\xd8':  # not a JPEG stream (e.g. a PNG named .jpg): mmcv decodes by content
            return False
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 1024))
        return b'\xff\xd9' not in f.read()


class CheckedDataset(Dataset):
    """Wraps an mm dataset: per-sample seeding of the augmentation RNGs, and errors that name the file."""

    def __init__(self, dataset, split: str):
        self.dataset, self.split = dataset, split
        classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
        self.num_classes = len(classes) if classes is not None and hasattr(dataset, 'ignore_index') else None
        self.ignore_index = getattr(dataset, 'ignore_index', 255)

    def __len__(self):
        return len(self.dataset)

    def _files(self, idx: int) -> list[str]:
        try:
            info = self.dataset.get_data_info(idx)
        except Exception:  # noqa: BLE001 - wrappers without get_data_info: no file names to check
            return []
        return [info[k] for k in ('img_path', 'seg_map_path') if isinstance(info.get(k), str)]

    def __getitem__(self, key):
        idx, seed = key if isinstance(key, tuple) else (key, None)
        if seed is not None:
            np.random.seed(seed)
            random.seed(seed)
        files = self._files(idx)
        for path in files:
            if '://' in path:
                continue
            if not osp.isfile(path):
                raise DataError(f'{self.split} sample {idx}: file {path} does not exist')
            if path.lower().endswith(('.jpg', '.jpeg')) and _jpeg_truncated(path):
                raise DataError(f'{self.split} sample {idx}: {path} is a truncated JPEG (no end-of-image '
                                'marker); re-copy or remove it')
        try:
            data = self.dataset[idx]
        except DataError:
            raise
        except Exception as e:
            raise DataError(f'{self.split} sample {idx} ({", ".join(files) or "no file name"}) could not be '
                            f'loaded: {type(e).__name__}: {e}') from e
        if self.num_classes is not None:
            self._check_labels(data, files)
        return data

    def _check_labels(self, data: dict, files: list[str]) -> None:
        sample = data.get('data_samples')
        seg = getattr(getattr(sample, 'gt_sem_seg', None), 'data', None)
        if seg is None:
            return
        bad = (seg >= self.num_classes) & (seg != self.ignore_index)
        if bad.any():
            values = sorted({int(v) for v in seg[bad].unique()[:10]})
            raise DataError(f'{self.split}: segmentation map {files[-1] if files else "?"} has labels {values} '
                            f'(after reduce_zero_label / label_map) outside 0..{self.num_classes - 1} and not the '
                            f'ignore index {self.ignore_index}: fix the map or the dataset classes')


def check_coco_categories(dataset, section: str) -> None:
    """mmdet's CocoDataset silently drops annotations whose category_id is not in the file's ``categories``
    (a wrong id mapping would lose objects unnoticed): refuse them, naming the file. Also log how many
    training images without objects ``filter_cfg.filter_empty_gt`` dropped."""
    ann_file = getattr(dataset, 'ann_file', None)
    if not ann_file or '://' in ann_file or not osp.isfile(ann_file) or not hasattr(dataset, 'cat_ids'):
        return
    with open(ann_file) as f:
        coco = json.load(f)
    known = {c['id'] for c in coco.get('categories', [])}
    unknown: dict = {}
    for ann in coco.get('annotations', []):
        if ann.get('category_id') not in known:
            unknown.setdefault(ann.get('category_id'), []).append(ann.get('id'))
    if unknown:
        desc = ', '.join(f'{cid} (annotation ids {ids[:5]}{"..." if len(ids) > 5 else ""})'
                         for cid, ids in sorted(unknown.items(), key=str))
        raise DataError(f"{section}: {ann_file} has annotations with category_id not listed in its 'categories' "
                        f'{sorted(known)}: {desc}')
    n_images = len(coco.get('images', []))
    if not getattr(dataset, 'test_mode', True) and len(dataset) < n_images:
        log.warning('%s: %d of %d images of %s skipped by filter_cfg=%s (no objects of the dataset classes, '
                    'or smaller than min_size)', section, n_images - len(dataset), n_images, ann_file,
                    dict(getattr(dataset, 'filter_cfg', None) or {}))


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

    def section(self, split: str) -> dict:
        name = f'{split}_dataloader'
        if self.cfg.get(name) is None:
            raise KeyError(f'the config has no {name} section')
        return self.cfg[name]

    def dataset(self, split: str):
        """The built dataset of a split (cached; also used for metainfo by the evaluator/visualizer)."""
        if split not in self._datasets:
            ds_cfg = self.section(split)['dataset']
            check_dataset_paths(ds_cfg, f'{split}_dataloader')
            register_scope(self.scope)
            from mmengine.registry import DATASETS  # the default scope routes to mmdet/mmseg's registry
            dataset = DATASETS.build(ds_cfg)
            check_coco_categories(dataset, f'{split}_dataloader')
            self._datasets[split] = dataset
        return self._datasets[split]

    def _loader(self, split: str, shuffle: bool, sampler=None, cls=DataLoader) -> DataLoader:
        sec = self.section(split)
        workers = sec.get('num_workers', 0)
        return cls(
            CheckedDataset(self.dataset(split), split), batch_size=sec.get('batch_size', 1), sampler=sampler,
            shuffle=shuffle if sampler is None else None, num_workers=workers,
            persistent_workers=bool(sec.get('persistent_workers')) and workers > 0,
            pin_memory=sec.get('pin_memory', False), drop_last=sec.get('drop_last', False),
            collate_fn=pseudo_collate)

    def train_dataloader(self) -> DataLoader:
        shuffle = (self.section('train').get('sampler') or {}).get('shuffle', True)
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        seed = int((self.cfg.get('randomness') or {}).get('seed') or 0)
        sampler = ResumableSampler(self.dataset('train'), num_replicas=world, rank=rank, shuffle=shuffle,
                                   seed=seed)
        loader = self._loader('train', shuffle, sampler=sampler, cls=ResumableDataLoader)
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
            raise ValueError(f'{split} set has {len(dataset)} images for {trainer.world_size} processes; '
                             'each needs at least one (the metric sync at epoch end would wait forever)')
        sampler = UnrepeatedDistributedSampler(dataset, num_replicas=trainer.world_size,
                                               rank=trainer.global_rank, shuffle=False)
        return self._loader(split, shuffle=False, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader('val')

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader('test')
