# Mask2Former, COCO instance segmentation, LSJ, 50 epochs, STViT-Large backbone.
# Same recipe as mask2former_stvit-s_8xb2-lsj-50e_coco.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.4: one step above mm's Swin-B Mask2Former value (0.3): STViT-L (38 blocks, 93M) is deeper and
# larger than Swin-B (24 blocks, 88M), as in mask-rcnn_stvit-l_fpn_1x_coco.py.
# with_cp=True: activation checkpointing per block, as mask-rcnn_stvit-l_fpn_1x_coco.py (38 blocks at COCO scale).
_base_ = "./mask2former_stvit-s_8xb2-lsj-50e_coco.py"

model = dict(
    backbone=dict(
        arch="large",
        drop_path_rate=0.4,
        with_cp=True,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_large.pth"),
    ),
    panoptic_head=dict(in_channels=[96, 192, 448, 640]),
)
