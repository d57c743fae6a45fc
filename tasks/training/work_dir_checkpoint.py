"""``WorkDirCheckpoint``: Lightning's ``ModelCheckpoint`` whose ranking of checkpoints follows a moved work dir, and
whose ``last.ckpt`` is the final step's when training ends.

A resumed ``ModelCheckpoint`` takes back its bookkeeping (best score, the top-k files and their scores, the last
file) only when the checkpoint was written in the same ``dirpath``; otherwise Lightning warns and keeps only
``best_model_path``. A work dir moved or copied as a whole (to scratch space, to another cluster: the checkpoint
still names the old path) holds the same files under the new path. There the recorded paths move with it and the
ranking goes on: the next better checkpoint replaces the worst of the top k, as in the uninterrupted run. A
checkpoint from elsewhere (``--resume PATH`` with a new ``--work-dir``, the files not there) keeps Lightning's
rule, said in one line instead of a warning.
"""

from __future__ import annotations

import os
import os.path as osp
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info

_PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def moved_state(state: dict[str, Any], old: str, new: str) -> dict[str, Any] | None:
    """``state`` (a ``ModelCheckpoint.state_dict()``) with every recorded file under ``old`` renamed under
    ``new``, or None when one of them is not there (not the same work dir moved). Empty paths stay empty."""

    def rename(path: str) -> str | None:
        if not path:
            return path
        relative = osp.relpath(path, old)
        if relative.startswith(os.pardir):  # written outside the old dirpath: not part of the move
            return None
        renamed = osp.join(new, relative)
        return renamed if osp.isfile(renamed) else None

    out = dict(state, dirpath=new)
    for key in _PATH_KEYS:
        if key in state:
            out[key] = rename(state[key])
            if out[key] is None:
                return None
    best_k = {}
    for path, score in (state.get("best_k_models") or {}).items():
        renamed = rename(path)
        if renamed is None:
            return None
        best_k[renamed] = score
    out["best_k_models"] = best_k
    return out


class WorkDirCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (the same arguments) that resumes its ranking in a moved work dir and leaves the final
    step's ``last.ckpt`` at the end of training (module docstring)."""

    def _generate_state_key(self, **kwargs: Any) -> str:
        # ModelCheckpoint's key (Lightning prefixes the class name): checkpoints written with either class resume
        # into the other, and tasks/deploy/checkpoints.py finds the best score under it
        return f"{ModelCheckpoint.__qualname__}{kwargs!r}"

    def on_train_end(self, trainer, pl_module) -> None:
        # Lightning writes last.ckpt here only when the run wrote none before: a run whose last steps came after its
        # last checkpoint (max_steps not a multiple of val_check_interval) ended with the last.ckpt of that earlier
        # step, so --resume repeated the steps after it and the exports lacked them. Written unless this step's is.
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old = state_dict.get("dirpath", self.dirpath)
        if old is None or self.dirpath is None or old == self.dirpath:
            return super().load_state_dict(state_dict)
        moved = moved_state(state_dict, old, self.dirpath)
        if moved is not None:
            return super().load_state_dict(moved)
        # Lightning's rule for another directory, without its warning
        rank_zero_info(
            f"resuming from a checkpoint written in {old}: its best and last checkpoints are not in {self.dirpath}, "
            "so the ranking of the best checkpoints starts anew here"
        )
        self.best_model_path = state_dict["best_model_path"]
