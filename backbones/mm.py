"""mmdet / mmseg registry adapters: ``type='STViT'`` and ``type='HATNet'`` in model configs.

Every registered family (``backbones.families``) gets one adapter class, made here from its record and
registered under its ``type_name`` in mmengine's root MODELS registry, which mmdet's and mmseg's registries
search as their parent, so both libraries build them without this module importing either; a family registered
later gets its adapter then (``families.on_register``). The adapters add only mm's ``init_cfg`` convention;
``Pretrained`` goes through ``load_pretrained`` (safe loading, official key filter, strict key and shape
checks) instead of mmengine's ``load_checkpoint``. Its ``checkpoint`` may be an http(s) URL, downloaded once
and verified against ``sha256=`` (a key of the init_cfg), the URL's ``#sha256=`` fragment or torch.hub's
``name-<hash prefix>.pth`` file name.

A ``pretrained=`` that reaches an adapter usually comes from the config's ``model.pretrained``: mmseg's
``EncoderDecoder`` forwards it to the backbone, and mmseg's stock configs set it for their ResNet
(``'open-mmlab://resnet50_v1c'``). A value that cannot be a checkpoint of this backbone is refused with an error that
names ``model.pretrained`` and the fix (``model.pretrained=None`` and ``backbone.init_cfg``): a URL or a
missing file before anything is built, a file that does not fit as soon as it is read.
"""

from __future__ import annotations

import contextlib
import copy
import os

from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.registry import MODELS

from .checkpoints.pretrained import load_pretrained
from .checkpoints.weights import check_checkpoint_path
from .errors import CheckpointError
from .families import Family, on_register


@contextlib.contextmanager
def _checked_pretrained(type_name: str, pretrained):
    """Around the backbone's construction: a ``pretrained=`` that cannot be a checkpoint of this backbone
    is refused in words that name model.pretrained and the fix (see the module docstring)."""

    def refuse(problem: str, cause: Exception):
        raise CheckpointError(
            f"{type_name} backbone got pretrained={pretrained!r}, which is not a checkpoint of it: "
            f"{problem.rstrip('.')}. In "
            "an mm config this value comes from model.pretrained (mmseg's EncoderDecoder forwards it to the "
            "backbone; mmseg's stock configs set it for their ResNet, e.g. 'open-mmlab://resnet50_v1c'). Set "
            "model.pretrained=None (--cfg-options model.pretrained=None) and load the backbone's weights with "
            f"model.backbone.init_cfg=dict(type='Pretrained', checkpoint='PATH/TO/{type_name.lower()}.pth')."
        ) from cause

    if isinstance(pretrained, (str, os.PathLike)):
        try:
            check_checkpoint_path(pretrained)
        except CheckpointError as e:
            refuse(str(e), e)
    try:
        yield
    except CheckpointError as e:
        if pretrained is None:
            raise
        refuse(str(e), e)


class _MMInit:
    type_name = ""  # the registered name, for error messages

    def _set_init_cfg(self, init_cfg):
        """Keep ``init_cfg`` (None, a dict or a list of dicts: mm's forms); anything else is refused here, by
        name, rather than by a bare assertion in mmengine's ``init_weights``."""
        if not (
            init_cfg is None
            or isinstance(init_cfg, dict)
            or (isinstance(init_cfg, list) and all(isinstance(c, dict) for c in init_cfg))
        ):
            raise TypeError(
                f"{self.type_name}: init_cfg must be None, a dict or a list of dicts, e.g. "
                f"init_cfg=dict(type='Pretrained', checkpoint='pretrained/{self.type_name.lower()}.pth'); "
                f"got {init_cfg!r}"
            )
        self.init_cfg = copy.deepcopy(init_cfg)

    def init_weights(self):
        """mm's ``init_cfg`` (a dict or a list of them): the other initialisers first, then a ``Pretrained``
        entry through ``load_pretrained`` (safe, strict) instead of mmengine's non-strict ``load_checkpoint``,
        whose mismatches are log lines only, in the list form as in the dict form (mm's order too)."""
        cfgs = self.init_cfg if isinstance(self.init_cfg, list) else [self.init_cfg]
        pretrained = [c for c in cfgs if isinstance(c, dict) and c.get("type") == "Pretrained"]
        if not pretrained:
            BaseModule.init_weights(self)
            return
        for cfg in pretrained:
            if not cfg.get("checkpoint"):
                raise ValueError(
                    f"{self.type_name}: init_cfg=dict(type='Pretrained') needs checkpoint=PATH_OR_URL (got {cfg}); "
                    f"e.g. init_cfg=dict(type='Pretrained', checkpoint='pretrained/{self.type_name.lower()}.pth')"
                )
        others = [c for c in cfgs if c not in pretrained]
        if others:
            given, self.init_cfg = self.init_cfg, others
            try:
                BaseModule.init_weights(self)
            finally:
                self.init_cfg = given
        for cfg in pretrained:
            report = load_pretrained(self, cfg["checkpoint"], prefix=cfg.get("prefix"), sha256=cfg.get("sha256"))
            print_log(str(report), logger="current")
        self._is_init = True


def _adapter(family: Family) -> type:
    """The mm adapter of ``family``: its backbone class plus mm's ``init_cfg``, registered as ``type_name``."""

    class Adapter(_MMInit, family.cls, BaseModule):
        type_name = family.type_name

        def __init__(self, *args, init_cfg=None, **kwargs):
            with _checked_pretrained(self.type_name, kwargs.get("pretrained")):
                super().__init__(*args, **kwargs)
            self._set_init_cfg(init_cfg)

    Adapter.__name__ = Adapter.__qualname__ = f"MM{family.cls.__name__}"
    Adapter.__doc__ = f"{family.title} for mm configs: the arguments of ``{family.cls.__name__}`` plus ``init_cfg``."
    MODELS.register_module(name=family.type_name, module=Adapter, force=True)
    ADAPTERS[family.name] = Adapter
    return Adapter


ADAPTERS: dict[str, type] = {}  # family name -> its registered adapter class
on_register(_adapter)
