# DINO-4scale, 12 epochs, HAT-Net-Tiny backbone, COCO 2017.
# Same recipe as dino-4scale_hat-net-s_8xb2-12e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.1: PVT's value for every size, as HAT-Net-S.
_base_ = "./dino-4scale_hat-net-s_8xb2-12e_coco.py"

model = dict(
    backbone=dict(
        arch="tiny",
        drop_path_rate=0.1,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_tiny.pth"),
    ),
    neck=dict(in_channels=[96, 240, 384]),
)
