"""mmdet / mmseg registry adapters: ``type='STViT'`` and ``type='HATNet'`` in model configs.

The classes are registered in mmengine's root MODELS registry, which mmdet's and mmseg's registries
search as their parent, so both libraries build them without this module importing either. The
adapters add only mm's ``init_cfg`` convention; ``Pretrained`` goes through ``load_pretrained`` (safe
loading, official key filter, strict key and shape checks) instead of mmengine's ``load_checkpoint``.
"""
from __future__ import annotations

import copy

from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.registry import MODELS

from .hatnet import HATNet
from .pretrained import load_pretrained
from .stvit import STViT


class _MMInit:
    def _set_init_cfg(self, init_cfg):
        self.init_cfg = copy.deepcopy(init_cfg)

    def init_weights(self):
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get("type") == "Pretrained":
            report = load_pretrained(self, cfg["checkpoint"], prefix=cfg.get("prefix"))
            print_log(str(report), logger="current")
            self._is_init = True
        else:
            BaseModule.init_weights(self)


@MODELS.register_module(name="STViT", force=True)
class MMSTViT(_MMInit, STViT, BaseModule):
    """STViT for mm configs: same arguments as ``backbones.STViT`` plus ``init_cfg``."""

    def __init__(self, *args, init_cfg=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._set_init_cfg(init_cfg)


@MODELS.register_module(name="HATNet", force=True)
class MMHATNet(_MMInit, HATNet, BaseModule):
    """HAT-Net for mm configs: same arguments as ``backbones.HATNet`` plus ``init_cfg``."""

    def __init__(self, *args, init_cfg=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._set_init_cfg(init_cfg)
