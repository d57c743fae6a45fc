"""Fixtures shared by the test modules: the golden vectors, the tiny datasets with the options that point the
demo configs at them, and the short training runs of the demo configs that several modules read."""

import gc
import json
import logging
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from filelock import FileLock

from tests._tools import (
    DET_CFG,
    IMAGE_INFO,
    SEG_CFG,
    TINY_ADE20K,
    TINY_COCO,
    load_tool,
    warnings_as_errors,
    write_image_info,
)

ROOT = Path(__file__).resolve().parents[1]
# The golden vectors and the released variants' key manifest, committed with the tests (tests/data/README.md).
GOLDEN_DATA = ROOT / "tests" / "data"

# Threads per test process: the cores shared among pytest-xdist's workers (the README runs 2), at most 2 each;
# more threads than cores make every OpenMP barrier wait for a descheduled thread. A value the user set is kept;
# ours is recomputed in each worker (the workers inherit the controller's, computed for one process), and set in
# torch too, which this module has imported already (OpenMP reads the variable when it loads).
if "OMP_NUM_THREADS" not in os.environ or os.environ.get("_TESTS_SET_OMP_NUM_THREADS"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ["OMP_NUM_THREADS"] = str(max(1, min(2, (os.cpu_count() or 1) // _workers)))
    os.environ["_TESTS_SET_OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(items):
    """The tests marked ``slow`` (whole training processes, benchmarks) run first, each module's in its order.
    setup.cfg has pytest-xdist hand out one test at a time (``--dist load --maxschedchunk 1``), so the long tests
    spread over the workers, which end on short ones and finish together (the default chunks gave one worker most
    of the long tests)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # a stable sort


def pytest_collection_finish(session):
    """The objects of the imported libraries and test modules move to the garbage collector's permanent
    generation: a full collection (mmengine's datasets call ``gc.collect()`` each time they are built, and
    Python runs them as objects pile up) then walks only what the tests created, not the millions of objects of
    torch, mm and Lightning that a worker holds all session."""
    gc.freeze()


@pytest.fixture(scope="session")
def reference_dir():
    if not (GOLDEN_DATA / "official_keys.json").is_file():
        pytest.fail(
            f"golden vectors not found in {GOLDEN_DATA}: they are part of the repository; restore them "
            "with `git checkout -- tests/data`"
        )
    return GOLDEN_DATA


@pytest.fixture
def log_lines():
    """The messages logged through Lightning's logger (where rank_zero_info writes) during the test."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test leaves os.environ as it found it. Lightning's DDP launcher sets LOCAL_RANK, WORLD_SIZE, NODE_RANK
    and MASTER_* in the process that launches; left in a pytest-xdist worker, they made a later test's child
    ``tools/test.py ... trainer.devices=2`` believe it had been launched externally, start no rank 1, and wait
    for it forever."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_process_group_left():
    """A test leaves no torch.distributed process group behind: in a pytest-xdist worker it made every later test
    there run "distributed" with one rank (SyncBatchNorm then refused CPU inputs in tests/test_configs.py). The
    group is destroyed and the test that left it fails."""
    import torch.distributed as dist

    existed = dist.is_available() and dist.is_initialized()
    yield
    if not existed and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialized (see releasing_process_group)")


def once(tmp_path_factory, name: str, make):
    """``make(folder)`` once per test session, its JSON-able result returned to every caller: with pytest-xdist,
    the first worker to ask runs it under a file lock in the directory the workers share, the others wait for it
    and read its result (xdist's own recipe for session fixtures; a run is not trained once per worker)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # pytest-N/, holding each worker's basetemp
    folder, done = root / name, root / f"{name}.json"
    with FileLock(f"{folder}.lock"):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # what an earlier, failed attempt left
            folder.mkdir()
            result = make(folder)
            done.write_text(json.dumps(result))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def run_once(tmp_path_factory):
    """``run_once(name, make)``: ``once`` for a test module's own session-wide runs."""
    return lambda name, make: once(tmp_path_factory, name, make)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """The directory holding ``tiny_coco/`` (TINY_COCO images, plus the image-info file IMAGE_INFO) and
    ``tiny_ade20k/`` (TINY_ADE20K images), written once per session. Read-only for tests: copy before
    changing anything."""

    def make(out):
        from tasks.data.tiny import make_ade20k, make_coco

        make_coco(out, num_train=TINY_COCO[0], num_val=TINY_COCO[1], seed=0)
        make_ade20k(out, num_train=TINY_ADE20K[0], num_val=TINY_ADE20K[1], seed=0)
        assert write_image_info(out / "tiny_coco", name=Path(IMAGE_INFO).name) == IMAGE_INFO
        return str(out)

    return Path(once(tmp_path_factory, "tiny_data", make))


@pytest.fixture(scope="session")
def data_opts(tiny_data):
    """``data_opts(dataset, *extra)``: ``--cfg-options`` that point every split of a demo config at the tiny
    ``dataset`` ('tiny_coco' or 'tiny_ade20k'), batch 2 on CPU without workers, progress bar or model summary,
    logging every step; then ``extra``."""

    def opts(dataset: str, *extra: str) -> list[str]:
        assert dataset in ("tiny_coco", "tiny_ade20k"), dataset
        out = []
        for split in ("train", "val", "test"):
            out += [f"{split}_dataloader.dataset.data_root={tiny_data}/{dataset}/", f"{split}_dataloader.num_workers=0"]
        return out + [
            "train_dataloader.batch_size=2",
            "trainer.accelerator=cpu",
            "trainer.enable_progress_bar=False",
            "trainer.enable_model_summary=False",
            "trainer.log_every_n_steps=1",
            *extra,
        ]

    return opts


class Run(NamedTuple):
    """A finished tools/train.py run: its work dir, ``last.ckpt``, the resolved config it wrote, the final
    validation metrics and the ``--cfg-options`` it ran with."""

    work_dir: Path
    ckpt: str
    config: str
    metrics: dict
    opts: list


def _train(tmp_path_factory, name, config, opts) -> Run:
    """tools/train.py on ``config`` with ``opts``, once per session (``once``)."""

    def make(work_dir):
        with warnings_as_errors():  # a normal run prints no warning: a new one fails every test that trains
            metrics = load_tool("train").main([config, "--work-dir", str(work_dir), "--cfg-options", *opts])
        # tools/train.py writes the resolved config (with the overrides) into the work dir
        return [str(work_dir), str(work_dir / "last.ckpt"), str(work_dir / Path(config).name), metrics, opts]

    work_dir, *rest = once(tmp_path_factory, name, make)
    return Run(Path(work_dir), *rest)


# The detection demo at 96 px: small enough for a CPU step in about a second, large enough for every FPN level.
DET_96PX = (
    "train_dataloader.dataset.pipeline.2.scale=(96,96)",
    "val_dataloader.dataset.pipeline.1.scale=(96,96)",
    "test_dataloader.dataset.pipeline.1.scale=(96,96)",
)


@pytest.fixture(scope="session")
def det_run(data_opts, tmp_path_factory) -> Run:
    """The detection demo (Mask R-CNN + shrunk STViT) at 96 px: one epoch of 2 steps, validated at its end, with
    CSV and TensorBoard logs. Shared by every module that needs a trained detector: read it, or copy the work
    dir (``copy_run``) before resuming or changing it."""
    opts = data_opts(
        "tiny_coco",
        *DET_96PX,
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=2",
        "trainer.check_val_every_n_epoch=1",
    )
    return _train(tmp_path_factory, "det_run", DET_CFG, opts)


@pytest.fixture(scope="session")
def seg_run(data_opts, tmp_path_factory) -> Run:
    """The segmentation demo (UPerNet + shrunk HAT-Net): 2 iterations, validated at the end. Shared like
    ``det_run``."""
    opts = data_opts("tiny_ade20k", "trainer.max_steps=2", "trainer.val_check_interval=2")
    return _train(tmp_path_factory, "seg_run", SEG_CFG, opts)


@pytest.fixture
def copy_run(tmp_path):
    """``copy_run(run)``: a copy of a shared run's work dir under this test's tmp_path, as a Run, for tests that
    resume or otherwise write into it."""

    def copy(run: Run) -> Run:
        work_dir = Path(shutil.copytree(run.work_dir, tmp_path / Path(run.work_dir).name))
        return run._replace(
            work_dir=work_dir,
            ckpt=str(work_dir / Path(run.ckpt).name),
            config=str(work_dir / Path(run.config).name),
        )

    return copy
