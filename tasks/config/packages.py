"""``mmdet::...`` / ``mmseg::...`` config paths resolved as mmengine resolves them, with each package's model index
read once per process instead of once per path.

mmengine 0.10's ``Config`` looks every such path up in the package's model index before anything else: it parses
``.mim/model-index.yml`` and every metafile listed there (about 70 YAML files for mmdet 3.3) and, when the name is
not among their ``Config`` entries, falls back to ``.mim/configs/<path>``. Nothing is kept between lookups, so
every ``_base_`` entry of every config load parsed them all again, and the tools and tests load configs many
times (docs/measuring.md has the figures). Before that, ``Config`` asks whether the package is installed, and
mmengine's ``is_installed`` reloads ``pkg_resources`` (a scan of every installed distribution) for each
path. ``install()`` replaces the index reading with one that keeps each package's index, and the installed check
with one that keeps each package's answer (the installed files do not change under a running process); the
lookup, its answer and mmengine's fallback stay mmengine's.
"""

from __future__ import annotations

import functools
import os.path as osp
import warnings

from mmengine.config import config as _config_module
from mmengine.config import utils as _config_utils
from mmengine.fileio import load

MMENGINE_CFG_METAINFO = _config_utils._get_cfg_metainfo  # mmengine's own, reading the index at every lookup
MMENGINE_IS_INSTALLED = _config_module.is_installed  # mmengine's own, reloading pkg_resources at every call


@functools.lru_cache(maxsize=None)
def is_installed(package: str) -> bool:
    """``mmengine.utils.is_installed`` for ``Config``'s check of an ``mmdet::`` / ``mmseg::`` path, asked once per
    package and process."""
    return MMENGINE_IS_INSTALLED(package)


@functools.lru_cache(maxsize=None)
def model_index(package_path: str) -> dict[str, dict]:
    """{config name as mmengine matches it: the first metafile entry naming that config} of the package at
    ``package_path``: mmengine's own reading of ``.mim/model-index.yml`` and its metafiles, done once."""
    index = {}
    for meta_path in load(osp.join(package_path, ".mim", "model-index.yml"))["Import"]:
        for model in load(osp.join(package_path, ".mim", meta_path))["Models"]:
            if "Config" not in model:
                warnings.warn(f"There is not `Config` define in {model}")  # mmengine's words
                continue
            index.setdefault(model["Config"].partition("/")[-1], model)  # the first entry wins, as in mmengine
    return index


def _cfg_metainfo(package_path: str, cfg_path: str) -> dict:
    """``mmengine.config.utils._get_cfg_metainfo`` over the kept index; the same ValueError for a name that is
    not there (mmengine's ``Config`` then reads ``.mim/configs/<path>``)."""
    index = model_index(package_path)
    if cfg_path not in index:
        raise ValueError(f"{cfg_path} is not among the {len(index)} configs of {package_path}'s model index")
    return index[cfg_path]


def install() -> None:
    """Make mmengine's config lookup read each package's index and check its installation once (idempotent)."""
    _config_utils._get_cfg_metainfo = _cfg_metainfo
    _config_module.is_installed = is_installed
