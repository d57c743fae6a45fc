# DINO-4scale, 12 epochs, STViT-Large backbone, COCO 2017.
# Same recipe as dino-4scale_stvit-s_8xb2-12e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.4: as mask-rcnn_stvit-l_fpn_1x_coco.py (one step above Swin-B's 0.3: STViT-L is deeper and larger).
# with_cp=True: activation checkpointing per block, as mask-rcnn_stvit-l_fpn_1x_coco.py (38 blocks at COCO scale).
_base_ = "./dino-4scale_stvit-s_8xb2-12e_coco.py"

model = dict(
    backbone=dict(
        arch="large",
        drop_path_rate=0.4,
        with_cp=True,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_large.pth"),
    ),
    neck=dict(in_channels=[192, 448, 640]),
)
