"""Config loading shared by tools/train.py and tools/test.py."""

from __future__ import annotations

import os
import os.path as osp

from mmengine.config import Config
from mmengine.registry import init_default_scope

SCOPES = ('mmdet', 'mmseg')


def load_config(path: str | os.PathLike, cfg_options: dict | None = None) -> Config:
    """Read an mmengine config (``_base_`` / ``mmdet::`` inheritance, ``custom_imports``) and apply
    ``--cfg-options`` overrides (already parsed to literals by mmengine's ``DictAction``)."""
    cfg = Config.fromfile(os.fspath(path))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = cfg.get('default_scope')
    if scope not in SCOPES:
        raise ValueError(f'{path}: default_scope must be one of {SCOPES} (inherit an mmdet:: or mmseg:: base '
                         f'config), got {scope!r}')
    return cfg


def register_scope(scope: str) -> None:
    """Import every mmdet / mmseg module into its registries and make ``scope`` the default scope, so
    that ``type='Resize'`` etc. resolve in that library (mmengine's Runner does the same)."""
    if scope == 'mmdet':
        from mmdet.utils import register_all_modules
    elif scope == 'mmseg':
        from mmseg.utils import register_all_modules
    else:
        raise ValueError(f'unknown scope {scope!r}, expected one of {SCOPES}')
    register_all_modules(init_default_scope=False)
    init_default_scope(scope)


def default_work_dir(cfg: Config, config_path: str | os.PathLike) -> str:
    return cfg.get('work_dir') or osp.join('work_dirs', osp.splitext(osp.basename(config_path))[0])
