# The STViT-L settings over an STViT-S config, shared by the configs/stvit/*_stvit-l_* configs: each inherits the
# STViT-S config of its recipe plus this file, and writes `model = dict(backbone=_base_.pop('stvit_l_backbone'), ...)`
# with its head's channels (STViT-L's stages: 96, 192, 448, 640).
#
# Not a whole backbone (no _delete_): only what differs from the STViT-S one the recipe sets.
# drop_path_rate=0.4: Swin-S/B use 0.3 for detection and segmentation; STViT-L (38 blocks, 95M params) is deeper
# and larger than Swin-B (24 blocks, 88M), so one step higher.
stvit_l_backbone = dict(
    arch="large",
    drop_path_rate=0.4,
    init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_large.pth"),
)
