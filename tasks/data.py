"""LightningDataModule over the config's mm dataloader sections (mmdet CocoDataset, mmseg ADE20KDataset...).

Datasets and their pipelines are built by the library (``DATASETS.build``) and batches are mm's
``pseudo_collate`` dicts. Only ``batch_size``, ``num_workers``, ``persistent_workers``, ``pin_memory``,
``drop_last`` and ``sampler.shuffle`` are read from each section; sampling is Lightning's (it injects a
seeded DistributedSampler for training under DDP). mm ``batch_sampler`` entries are ignored.
"""

from __future__ import annotations

import os.path as osp

import lightning as L
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader

from .config import register_scope

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


class MMDataModule(L.LightningDataModule):
    def __init__(self, cfg: Config, scope: str):
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
            self._datasets[split] = DATASETS.build(ds_cfg)
        return self._datasets[split]

    def _loader(self, split: str, shuffle: bool, sampler=None) -> DataLoader:
        sec = self.section(split)
        workers = sec.get('num_workers', 0)
        return DataLoader(
            self.dataset(split), batch_size=sec.get('batch_size', 1), sampler=sampler,
            shuffle=shuffle if sampler is None else None, num_workers=workers,
            persistent_workers=bool(sec.get('persistent_workers')) and workers > 0,
            pin_memory=sec.get('pin_memory', False), drop_last=sec.get('drop_last', False),
            collate_fn=pseudo_collate)

    def train_dataloader(self) -> DataLoader:
        shuffle = (self.section('train').get('sampler') or {}).get('shuffle', True)
        return self._loader('train', shuffle)

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
