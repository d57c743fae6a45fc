"""The train loader's batching (tasks/data/sampling.py): the config's mm ``batch_sampler`` (mmdet's
AspectRatioBatchSampler in every COCO config) around the resumable, per-rank sampler.

Real mmdet datasets, samplers and pipelines on tiny synthetic COCO data with both orientations.
"""

import json

import pytest

from tasks.data.tiny import make_coco
from tests._tools import REPO

PAPER_CFG = f"{REPO}/configs/stvit/mask-rcnn_stvit-s_fpn_1x_coco.py"
TINY_CLASSES = ("square", "disc", "triangle")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = make_coco(tmp_path_factory.mktemp("data"), num_train=40, num_val=2, seed=0)
    images = json.loads((root / "annotations" / "instances_train2017.json").read_text())["images"]
    portrait = sum(i["width"] < i["height"] for i in images)
    assert 5 < portrait < len(images) - 5, "the test needs both orientations"
    return root


def datamodule(root, cfg_path=PAPER_CFG, **extra):
    from tasks.config.load import load_config
    from tasks.data.module import MMDataModule

    opts = {}
    for s in ("train", "val", "test"):
        opts.update(
            {
                f"{s}_dataloader.dataset.data_root": f"{root}/",
                f"{s}_dataloader.dataset.metainfo.classes": TINY_CLASSES,
                f"{s}_dataloader.num_workers": 0,
            }
        )
    return MMDataModule(load_config(cfg_path, {**opts, **extra}), "mmdet")


def portrait(dataset, idx):
    info = dataset.get_data_info(idx)
    return info["width"] < info["height"]


def mixed_batches(dataset, batches):
    """Positions of the batches that hold both orientations."""
    return [k for k, b in enumerate(batches) if len({portrait(dataset, i) for i in b}) > 1]


def epoch_batches(batch_sampler, epoch):
    batch_sampler.sampler.set_epoch(epoch)
    return [[idx for idx, _ in batch] for batch in batch_sampler]


def check_grouped(dataset, batches, batch_size):
    """mmdet's grouping: full batches of one orientation, then the images left over in the two groups at the end
    of the shard (fewer than batch_size of each) batched together, as mmdet does (so those may mix)."""
    n_portrait = sum(portrait(dataset, i) for b in batches for i in b)
    n_images = sum(len(b) for b in batches)
    left = [n_portrait % batch_size, (n_images - n_portrait) % batch_size]
    n_tail = -(-sum(left) // batch_size)
    body, tail = batches[: len(batches) - n_tail], batches[len(batches) - n_tail :]
    assert mixed_batches(dataset, body) == [] and all(len(b) == batch_size for b in body)
    tail_portrait = sum(portrait(dataset, i) for b in tail for i in b)
    assert [tail_portrait, sum(map(len, tail)) - tail_portrait] == left
    return mixed_batches(dataset, tail)


def test_paper_config_train_loader_yields_no_mixed_batch(coco):
    dm = datamodule(coco)
    assert dm.cfg.train_dataloader.batch_sampler.type == "AspectRatioBatchSampler"  # from mmdet's COCO base
    loader = dm.train_dataloader()
    dataset = dm.dataset("train")
    n_batches = 0
    for batch in loader:  # the real loader: orientation of the images the pipeline loaded
        shapes = [s.ori_shape for s in batch["data_samples"]]
        assert len({h > w for h, w in shapes}) == 1, shapes
        n_batches += 1
    assert n_batches == len(loader) == -(-len(dataset) // 2)
    assert len(dataset) % 2 == 1  # one group has an even count, the other one image left over: no batch mixes
    for epoch in range(1, 6):
        batches = epoch_batches(loader.batch_sampler, epoch)
        assert check_grouped(dataset, batches, 2) == []
        assert sorted(i for b in batches for i in b) == list(range(len(dataset)))

    # the same data batched without the batch sampler (what the loader did before): batches mix orientations
    plain = datamodule(coco, **{"train_dataloader.batch_sampler": None}).train_dataloader()
    assert type(plain.batch_sampler.make_batches(plain.batch_sampler.sampler)).__name__ == "BatchSampler"
    as_before = epoch_batches(plain.batch_sampler, 0)  # consecutive pairs of the shuffled order, as before
    order = list(plain.batch_sampler.sampler)
    assert as_before == [order[k : k + 2] for k in range(0, len(order), 2)]
    assert len(mixed_batches(dataset, as_before)) > len(loader) // 4


def test_same_batches_as_mmengine_default_sampler_with_mmdet_batch_sampler(coco):
    from mmdet.datasets.samplers import AspectRatioBatchSampler
    from mmengine.dataset import DefaultSampler

    dm = datamodule(coco, **{"randomness.seed": 7})
    ours = dm.train_dataloader().batch_sampler
    dataset = dm.dataset("train")
    reference = DefaultSampler(dataset, shuffle=True, seed=7)  # mmengine's runner: one process
    for epoch in (0, 3):
        reference.set_epoch(epoch)
        assert epoch_batches(ours, epoch) == list(AspectRatioBatchSampler(reference, batch_size=2))


@pytest.mark.parametrize("batch_size", [2, 3])
def test_two_ranks_group_their_own_shard_and_cover_the_epoch(coco, batch_size):
    from tasks.data.sampling import ResumableBatchSampler, ResumableSampler, build_batch_sampler

    dataset = datamodule(coco).dataset("train")
    make = build_batch_sampler(dict(type="AspectRatioBatchSampler"), batch_size, drop_last=False)

    def rank_batches(rank, epoch, seed=0):
        sampler = ResumableSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=seed)
        batches = ResumableBatchSampler(sampler, make)
        assert len(batches) == -(-len(sampler) // batch_size)  # equal on both ranks: DDP steps in lockstep
        return epoch_batches(batches, epoch)

    for epoch in (0, 1):
        ranks = [rank_batches(r, epoch) for r in (0, 1)]
        for rank, batches in enumerate(ranks):
            check_grouped(dataset, batches, batch_size)
            shard = ResumableSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=0)
            shard.set_epoch(epoch)
            assert sorted(i for b in batches for i in b) == sorted(shard)  # each rank groups its own shard
        assert {i for batches in ranks for b in batches for i in b} == set(range(len(dataset)))
        assert ranks == [rank_batches(r, epoch) for r in (0, 1)]  # a pure function of (seed, epoch)
    assert rank_batches(0, 0) != rank_batches(0, 1) and rank_batches(0, 0) != rank_batches(0, 0, seed=1)


def test_sample_seeds_and_mid_epoch_skip(coco):
    from tasks.data.sampling import sample_seed

    loader = datamodule(coco, **{"randomness.seed": 3}).train_dataloader()
    batches = loader.batch_sampler
    batches.sampler.set_epoch(2)
    full = list(batches)
    assert all(seed == sample_seed(3, 2, idx) for batch in full for idx, seed in batch)

    loader.progress = lambda: 4  # a checkpoint written after 4 batches of epoch 2
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches": 4, "batch_size": 2, "batch_sampler": "AspectRatioBatchSampler"}
    resumed = datamodule(coco, **{"randomness.seed": 3}).train_dataloader()
    resumed.load_state_dict(state)
    assert list(resumed.batch_sampler) == full[4:]
    assert list(resumed.batch_sampler) == full  # the skip applies to the resumed epoch only

    # an epoch cut short (e.g. limit_train_batches) leaves nothing behind for the next one
    partial = iter(batches)
    next(partial)
    assert list(batches) == full

    plain = datamodule(coco, **{"randomness.seed": 3, "train_dataloader.batch_sampler": None}).train_dataloader()
    with pytest.raises(
        ValueError,
        match=r"batching of the checkpoint \(AspectRatioBatchSampler\).*BatchSampler.*"
        r"train_dataloader\.batch_sampler\.type=AspectRatioBatchSampler",
    ):
        plain.load_state_dict(state)


def test_lightning_sets_the_epoch_and_keeps_the_batch_sampler(coco):
    """Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``; under DDP it would swap a loader's
    sampler for its own DistributedSampler (breaking the batch sampler) unless ``use_distributed_sampler``
    is off, which the trainer kwargs ensure (every loader shards itself)."""
    from lightning.fabric.utilities.data import _set_sampler_epoch

    from tasks.training.trainer import trainer_kwargs

    dm = datamodule(coco)
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, 5)
    assert loader.batch_sampler.sampler.epoch == 5
    assert trainer_kwargs(dm.cfg)["use_distributed_sampler"] is False
    dm.cfg.trainer.use_distributed_sampler = True
    with pytest.raises(ValueError, match="shards every split itself"):
        trainer_kwargs(dm.cfg)
