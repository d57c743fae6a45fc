"""tasks/config/packages.py: ``mmdet::`` / ``mmseg::`` config paths resolve as with mmengine's own lookup, with
each package's model index read once per process."""

import os.path as osp

import mmdet
from mmengine.config import Config
from mmengine.config import config as config_module
from mmengine.config import utils as config_utils

from tasks.config import packages as package_configs
from tests._tools import DET_CFG, REPO, SEG_CFG

# one config per kind of path: mmdet's and mmseg's own configs, and mmseg's _base_ files (four of them)
CONFIGS = [DET_CFG, SEG_CFG, osp.join(REPO, "configs", "stvit", "fpn_stvit-s_4xb4-80k_ade20k-512x512.py")]


def _load(path):
    return Config.fromfile(path, import_custom_modules=False).to_dict()


def test_configs_resolve_as_with_mmengines_own_lookup(monkeypatch):
    assert config_utils._get_cfg_metainfo is package_configs._cfg_metainfo  # installed by `import tasks`
    assert config_module.is_installed is package_configs.is_installed
    kept = [_load(p) for p in CONFIGS]
    monkeypatch.setattr(config_utils, "_get_cfg_metainfo", package_configs.MMENGINE_CFG_METAINFO)
    monkeypatch.setattr(config_module, "is_installed", package_configs.MMENGINE_IS_INSTALLED)
    assert [_load(p) for p in CONFIGS] == kept


def test_each_package_index_is_read_once():
    package_configs.model_index.cache_clear()
    package_configs.is_installed.cache_clear()
    for _ in range(2):
        _load(DET_CFG)
    assert package_configs.model_index.cache_info().misses == 1  # mmdet's, then kept
    assert package_configs.is_installed.cache_info().misses == 1  # asked once for mmdet
    index = package_configs.model_index(osp.dirname(mmdet.__file__))
    entry = index["mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py"]  # what mmengine's metafile loop keys it by
    assert entry["Config"] == "configs/mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py"
