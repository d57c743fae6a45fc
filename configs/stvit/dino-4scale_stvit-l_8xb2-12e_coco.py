# DINO-4scale, 12 epochs, STViT-Large backbone, COCO 2017.
# Same recipe as dino-4scale_stvit-s_8xb2-12e_coco.py;
# only the STViT-L settings (../_base_/models/stvit-l.py) and the channels change.
# with_cp=True: activation checkpointing per block, as mask-rcnn_stvit-l_fpn_1x_coco.py (38 blocks at COCO scale).
_base_ = ["./dino-4scale_stvit-s_8xb2-12e_coco.py", "../_base_/models/stvit-l.py"]

model = dict(backbone=dict(_base_.pop("stvit_l_backbone"), with_cp=True), neck=dict(in_channels=[192, 448, 640]))
