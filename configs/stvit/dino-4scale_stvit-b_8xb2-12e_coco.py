# DINO-4scale, 12 epochs, STViT-Base backbone, COCO 2017.
# Same recipe as dino-4scale_stvit-s_8xb2-12e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.3: as mask-rcnn_stvit-b_fpn_1x_coco.py (Swin-S/B's detection value; STViT-B sits between them).
_base_ = "./dino-4scale_stvit-s_8xb2-12e_coco.py"

model = dict(
    backbone=dict(
        arch="base",
        drop_path_rate=0.3,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_base.pth"),
    ),
    neck=dict(in_channels=[192, 384, 512]),
)
