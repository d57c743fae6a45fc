"""STViT and HAT-Net feature extractors for dense prediction (pure PyTorch).

``import backbones`` also registers ``type='STViT'`` / ``type='HATNet'`` in the mm model registries when
mmengine is installed, so mmdet and mmseg configs can build them, and the official classification models
(``stvit_small``, ``hatnet_tiny``, ...) in timm's registry once timm is imported (``backbones.timm_models``).
``backbones.FAMILIES`` is the family registry (``backbones.families``): each family's file registers its record on
import.
"""

import importlib.util

from . import timm_models
from ._fast_paths import enabled as fast_paths_enabled
from ._fast_paths import fast_paths, set_fast_paths
from .families import FAMILIES, Family, OfficialCode, create, family_of, register
from .hatnet import HATNet
from .pretrained import LoadReport, load_pretrained
from .stvit import STViT
from .weights import CheckpointError, KeyReport, load_model_weights

__all__ = [
    "STViT",
    "HATNet",
    "load_pretrained",
    "LoadReport",
    "CheckpointError",
    "KeyReport",
    "load_model_weights",
    "set_fast_paths",
    "fast_paths",
    "fast_paths_enabled",
    "FAMILIES",
    "Family",
    "OfficialCode",
    "create",
    "family_of",
    "register",
]

timm_models.install()  # the families' timm models, in timm's registry once timm is imported

if importlib.util.find_spec("mmengine") is not None:  # registry adapters: optional, the pure backbones need no mm
    from . import mm  # noqa: F401
