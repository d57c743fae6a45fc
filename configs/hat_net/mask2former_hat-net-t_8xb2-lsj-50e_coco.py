# Mask2Former, COCO instance segmentation, LSJ, 50 epochs, HAT-Net-Tiny backbone.
# Same recipe as mask2former_hat-net-s_8xb2-lsj-50e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.3: mm's Swin-T/S/B Mask2Former value, as HAT-Net-S.
_base_ = "./mask2former_hat-net-s_8xb2-lsj-50e_coco.py"

model = dict(
    backbone=dict(
        arch="tiny",
        drop_path_rate=0.3,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_tiny.pth"),
    ),
    panoptic_head=dict(in_channels=[48, 96, 240, 384]),
)
