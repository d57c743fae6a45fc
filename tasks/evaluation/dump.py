"""``tools/test.py --dump PATH``: the raw test predictions in the files mmdet's and mmseg's analysis tools read.

* mmdet: ``PATH`` (``.pkl`` / ``.pickle``) is the pickle that mmdet's ``DumpDetResults`` writes, made by that
  metric's own ``process``: one dict per image, in dataset order (as mmengine's ``collect_results`` gives), its
  metainfo (``img_id``, ``img_path``, ...) and ``pred_instances`` (``bboxes``, ``scores``, ``labels`` as CPU
  tensors; ``masks`` as RLE dicts), ground truth removed. mmdet's ``confusion_matrix.py`` and
  ``analyze_results.py`` read it.
* mmseg: ``PATH`` is a folder of label PNGs, one per image named after it, which is what mmseg's
  ``confusion_matrix.py`` reads (mmseg's ``tools/test.py --out`` writes that folder through ``IoUMetric``). The
  values are the model's class indices, the labels that script counts against its ground truth; unlike the
  submission PNGs of ``--out-dir``, ``reduce_zero_label`` is not undone (the script would be off by one).

Memory stays bounded: each rank pickles every image as it comes into its own spool file next to ``PATH``; at the
end rank 0 reads the spools (every rank's file: one host, or a shared file system) and writes the list as one
pickle by emitting the list's opcodes around the images' pickles. Nothing appears at ``PATH`` until it is
complete: the pickle is written to a temp file and renamed, the PNG folder is filled under a temporary name and
renamed.
"""

from __future__ import annotations

import os
import os.path as osp
import pickle
import shutil
import tempfile
from typing import BinaryIO

import lightning as L
import torch.distributed as dist

from backbones.checkpoints.atomic import atomic_write
from backbones.errors import UserError

PICKLE_SUFFIXES = (".pkl", ".pickle")
# mmengine's dump writes protocol 2. Below protocol 4 every memo entry is numbered explicitly (BINPUT n) and
# read back only within the pickle that stored it, so the images' pickles can be joined inside one list.
PROTOCOL = 2
_HEADER = bytes([pickle.PROTO[0], PROTOCOL])
_CHUNK = 1000  # items per MARK ... APPENDS group, as the pickler batches them


# the metrics' name prefix: mmengine warns about a metric without one (these compute no metric names)
PREFIX = "dump"


def _dump_det_results():
    """mmdet's ``DumpDetResults``, with the name prefix its constructor does not take."""
    from mmdet.evaluation.metrics import DumpDetResults

    return type("DumpDetResults", (DumpDetResults,), {"default_prefix": PREFIX})


class DumpPathError(UserError, ValueError):
    """A ``--dump`` path of the wrong kind for the task's analysis tools, or predictions that tools/analyze.py
    cannot find (the message says which kind, and which command writes them)."""


def check_dump_path(path: str, scope: str) -> None:
    """Raise a DumpPathError when ``path`` is not what ``scope``'s analysis tools read (see the module docstring).

    Args:
        path: the ``--dump`` argument.
        scope: ``'mmdet'`` or ``'mmseg'``.
    """
    if scope == "mmdet" and not path.endswith(PICKLE_SUFFIXES):
        raise DumpPathError(
            f"--dump {path}: mmdet's analysis tools read a pickle (DumpDetResults' format); give a file ending "
            "in .pkl or .pickle"
        )
    if scope == "mmseg" and (path.endswith(PICKLE_SUFFIXES) or osp.isfile(path)):
        raise DumpPathError(
            f"--dump {path}: mmseg's confusion_matrix.py reads a folder of label PNGs (as mmseg's "
            "tools/test.py --out writes), not a file; give a directory path"
        )
    if scope not in ("mmdet", "mmseg"):
        raise ValueError(f"scope must be 'mmdet' or 'mmseg', got {scope!r}")


def write_pickled_list(out: BinaryIO, items) -> int:
    """Write one pickle of a list whose elements are given already pickled, so that no more than one element is
    in memory; return the number of elements.

    Args:
        out: the binary file to write.
        items: iterable of ``pickle.dumps(element, protocol=2)`` bytes.
    """
    out.write(_HEADER + pickle.EMPTY_LIST)
    n = 0
    for data in items:
        if not (data.startswith(_HEADER) and data.endswith(pickle.STOP)):
            raise ValueError(f"element {n} is not a protocol-{PROTOCOL} pickle")
        if n % _CHUNK == 0:
            if n:
                out.write(pickle.APPENDS)
            out.write(pickle.MARK)
        out.write(memoryview(data)[len(_HEADER) : -1])  # the element's opcodes, without PROTO and STOP
        n += 1
    if n:
        out.write(pickle.APPENDS)
    out.write(pickle.STOP)
    return n


def _gather(obj) -> list | None:
    """Every rank's ``obj`` on rank 0 (None on the others); ``[obj]`` in one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


class PredictionDump(L.Callback):
    """Writes the predictions of ``trainer.test`` where mmdet's / mmseg's analysis tools read them.

    Args:
        path: a ``.pkl`` / ``.pickle`` file (mmdet) or a directory of label PNGs (mmseg); replaced if it exists.
        scope: ``'mmdet'`` or ``'mmseg'``.
    """

    def __init__(self, path: str, scope: str) -> None:
        check_dump_path(path, scope)
        self.path = osp.abspath(path)
        self.scope = scope
        self.metric = None
        self.spool = None  # mmdet: this rank's file of pickled images
        self.spool_path = None
        self.records: list[tuple[int, int, int]] = []  # mmdet: (dataset index, offset, length) per image
        self.index: dict[str, int] = {}  # mmdet: img_path -> dataset index
        self.tmp_dir = None  # mmseg: the folder being filled

    # ---- setup -----------------------------------------------------------------------------------
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dataset = trainer.datamodule.dataset("test")
        os.makedirs(osp.dirname(self.path), exist_ok=True)
        if self.scope == "mmdet":
            self.metric = _dump_det_results()(out_file_path=self.path)
            self.index = {dataset.get_data_info(i)["img_path"]: i for i in range(len(dataset))}
            fd, self.spool_path = tempfile.mkstemp(
                prefix=f".{osp.basename(self.path)}.rank{trainer.global_rank}.",
                suffix=".spool",
                dir=osp.dirname(self.path),
            )
            self.spool = os.fdopen(fd, "w+b")
            self.records = []
        else:
            from mmseg.evaluation import IoUMetric

            # one name on every rank: rank 0 empties it, the others wait before writing into it
            self.tmp_dir = osp.join(osp.dirname(self.path), f".{osp.basename(self.path)}.partial")
            if trainer.is_global_zero:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)
                os.makedirs(self.tmp_dir)
            trainer.strategy.barrier()
            self.metric = IoUMetric(format_only=True, output_dir=self.tmp_dir, prefix=PREFIX)
        self.metric.dataset_meta = dataset.metainfo

    # ---- per batch -------------------------------------------------------------------------------
    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        # the dicts mmengine's Evaluator hands its metrics
        samples = [sample.cpu().to_dict() for sample in outputs]
        if self.scope == "mmseg":
            for sample in samples:
                sample["reduce_zero_label"] = False  # the model's class indices (see the module docstring)
            self.metric.process({}, samples)  # writes TMP_DIR/<image stem>.png
            return
        self.metric.process({}, samples)  # DumpDetResults: gt removed, masks RLE-encoded, on CPU
        for item in self.metric.results:
            path = item.get("img_path")
            if path not in self.index:
                raise ValueError(
                    f"--dump: a prediction's img_path {path!r} is not an image of the test dataset; the dump is "
                    "ordered by dataset index and needs each sample's img_path metainfo"
                )
            data = pickle.dumps(item, protocol=PROTOCOL)
            self.records.append((self.index[path], self.spool.tell(), len(data)))
            self.spool.write(data)
        self.metric.results.clear()

    # ---- end -------------------------------------------------------------------------------------
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.scope == "mmdet":
            self.spool.close()
            parts = _gather((self.spool_path, self.records))
            if parts is not None:
                atomic_write(self.path, lambda out: write_pickled_list(out, self._in_dataset_order(parts)))
            trainer.strategy.barrier()  # rank 0 has read every spool
            os.remove(self.spool_path)
            self.spool = None
        else:
            trainer.strategy.barrier()  # every rank's PNGs are in the folder
            if trainer.is_global_zero:
                self._replace_dir()
            trainer.strategy.barrier()
        if trainer.is_global_zero:
            print(f"predictions dumped to {self.path}")

    @staticmethod
    def _in_dataset_order(parts: list):
        """The pickled images of every rank's spool, each dataset index once, in index order."""
        entries = sorted({idx: (spool, off, n) for spool, records in parts for idx, off, n in records}.items())
        files = {}
        try:
            for _, (spool, off, n) in entries:
                f = files.get(spool) or files.setdefault(spool, open(spool, "rb"))
                f.seek(off)
                yield f.read(n)
        finally:
            for f in files.values():
                f.close()

    def _replace_dir(self) -> None:
        old = None
        if osp.exists(self.path):  # a previous dump: set aside, so that PATH is never half of one and half the other
            old = tempfile.mkdtemp(prefix=f".{osp.basename(self.path)}.old-", dir=osp.dirname(self.path))
            os.replace(self.path, osp.join(old, "dump"))
        os.replace(self.tmp_dir, self.path)
        if old is not None:
            shutil.rmtree(old)

    def on_exception(self, trainer, pl_module, exception) -> None:
        # no partial output: the spool / the folder being filled go; PATH keeps what it had
        if self.spool is not None:
            self.spool.close()
            if osp.exists(self.spool_path):
                os.remove(self.spool_path)
        if self.tmp_dir is not None and trainer.is_global_zero:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
