"""Helpers of the tests that train in child processes (tests/test_reliability.py, test_cluster.py,
test_distributed.py, test_accumulation.py): their environment, the tiny segmentation run's options, and the
comparison of two training checkpoints."""

import os
import socket

import torch

TIMEOUT = 240  # seconds for one training process of these tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a launcher (Lightning's, torchrun, SLURM) tells the processes it starts: a child that inherits these from
# the test process believes it was launched as one rank of a job.
LAUNCHER_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def env(**extra) -> dict:
    """A child's environment: one thread per process (the test machines have few cores and the ranks of a job
    share them), a free rendezvous port of its own, and no launcher or SLURM variables of the test process."""
    own = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARIABLES and not k.startswith(("TORCHELASTIC_", "SLURM_"))
    }
    return {**own, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **extra}


def seg_opts(data_opts, *extra) -> list:
    """The segmentation demo on 64 px crops of 128 px images, batch 2, without validation: a step takes a fraction
    of a second on one core."""
    return data_opts(
        "tiny_ade20k",
        "crop_size=(64,64)",
        "model.data_preprocessor.size=(64,64)",
        "train_dataloader.dataset.pipeline.2.scale=(128,64)",
        "train_dataloader.dataset.pipeline.3.crop_size=(64,64)",
        "trainer.limit_val_batches=0",
        "checkpoint_callback.monitor=None",
        *extra,
    )


def ddp_opts(devices: int) -> list:
    """Options for a ``devices``-process run on CPU: gloo DDP when 2, with a process-group timeout so that a
    rank waiting for a dead peer gives up instead of hanging."""
    if devices == 1:
        return []
    return [
        f"trainer.devices={devices}",
        "trainer.accelerator=cpu",
        "trainer.strategy.type=ddp",
        "trainer.strategy.timeout=60",
    ]


def load_ckpt(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold bit-identical weights, buffers, optimizer states and lr schedules."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    for sa, sb in zip(a["optimizer_states"][0]["state"].values(), b["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(sa[n], sb[n]) for n in sa)
    assert a["lr_schedulers"] == b["lr_schedulers"]
