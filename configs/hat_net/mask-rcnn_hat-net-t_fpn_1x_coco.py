# Mask R-CNN + FPN, 1x schedule, HAT-Net-Tiny backbone (13M params, depths [2, 2, 6, 3]), COCO 2017.
# Same recipe as mask-rcnn_hat-net-s_fpn_1x_coco.py (PVT's 1x protocol, which PVT/HAT-Net
# report for every size, hence 1x rather than 3x for the other variants); only arch,
# channels and pretrained weights change. drop_path_rate stays 0.1 (PVT's value for all
# sizes; PVT-L has the same depths as HAT-Net-L).
_base_ = "./mask-rcnn_hat-net-s_fpn_1x_coco.py"

model = dict(
    backbone=dict(
        arch="tiny", drop_path_rate=0.1, init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_tiny.pth")
    ),
    neck=dict(in_channels=[48, 96, 240, 384]),
)
