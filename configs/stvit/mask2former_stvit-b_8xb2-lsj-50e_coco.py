# Mask2Former, COCO instance segmentation, LSJ, 50 epochs, STViT-Base backbone.
# Same recipe as mask2former_stvit-s_8xb2-lsj-50e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.3: mm's Swin-T/S/B Mask2Former value, as for STViT-S.
_base_ = "./mask2former_stvit-s_8xb2-lsj-50e_coco.py"

model = dict(
    backbone=dict(
        arch="base",
        drop_path_rate=0.3,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_base.pth"),
    ),
    panoptic_head=dict(in_channels=[96, 192, 384, 512]),
)
