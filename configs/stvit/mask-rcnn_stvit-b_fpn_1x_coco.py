# Mask R-CNN + FPN, 1x schedule, STViT-Base backbone, COCO 2017.
# Same recipe as mask-rcnn_stvit-s_fpn_1x_coco.py; only arch, channels, drop path and
# pretrained weights change. 1x (not 3x) for the larger variants: it is the cheapest
# schedule that ranks backbones, and the only one shared with the HAT-Net/PVT protocol
# (1x for all sizes); a 3x variant is the same four overrides on
# mask-rcnn_stvit-s_fpn_ms-3x_coco.py.
# drop_path_rate=0.3: Swin-S/B use 0.3 for detection; STViT-B (30 blocks, 52M params) sits
# between Swin-S and Swin-B in size.
_base_ = "./mask-rcnn_stvit-s_fpn_1x_coco.py"

model = dict(
    backbone=dict(
        arch="base", drop_path_rate=0.3, init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_base.pth")
    ),
    neck=dict(in_channels=[96, 192, 384, 512]),
)
