"""STViT and HAT-Net feature extractors for dense prediction (pure PyTorch).

``import backbones`` also registers ``type='STViT'`` / ``type='HATNet'`` in the mm model registries when
mmengine is installed, so mmdet and mmseg configs can build them, and the official classification models
(``stvit_small``, ``hatnet_tiny``, ...) in timm's registry once timm is imported (``backbones.timm_models``).
``backbones.FAMILIES`` is the family registry (``backbones.families``): each family's file registers its record on
import.

The rooms: ``models/`` (one file per family, their shared base class, heads, attention recording), ``ops/`` (the
operations the model files call, plain or fast behind one switch) and ``checkpoints/`` (reading, downloading,
exporting and atomic writes).
"""

import importlib.util

from . import timm_models
from .checkpoints.pretrained import LoadReport, load_pretrained
from .checkpoints.weights import KeyReport, load_model_weights
from .families import FAMILIES, Family, OfficialCode, create, family_of, register

# The families: importing a family's file registers it. A new family is its file in models/ and its line here.
from .models.hatnet import HATNet
from .models.stvit import STViT
from .ops.switch import fast_paths, fast_paths_enabled, set_fast_paths

__all__ = [
    "STViT",
    "HATNet",
    "load_pretrained",
    "LoadReport",
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
