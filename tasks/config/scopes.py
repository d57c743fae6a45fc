"""The two mm libraries a config can belong to, and making one of them the default scope of mm's registries."""

from __future__ import annotations

from mmengine.registry import init_default_scope

SCOPES = ("mmdet", "mmseg")


def register_scope(scope: str) -> None:
    """Import every mmdet / mmseg module into its registries and make ``scope`` the default scope, so
    that ``type='Resize'`` etc. resolve in that library (mmengine's Runner does the same). The backbones'
    adapters live in mmengine's root registry, which finds ``type='STViT'`` from either library; a scoped
    ``type='mmdet.STViT'`` searches mmdet's registry alone, so they are registered there too."""
    if scope == "mmdet":
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    elif scope == "mmseg":
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        raise ValueError(f"unknown scope {scope!r}, expected one of {SCOPES}")
    from backbones.mm import ADAPTERS

    register_all_modules(init_default_scope=False)
    for adapter in ADAPTERS.values():
        MODELS.register_module(name=adapter.type_name, module=adapter, force=True)
    init_default_scope(scope)
