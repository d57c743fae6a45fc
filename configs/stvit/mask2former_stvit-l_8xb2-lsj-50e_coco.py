# Mask2Former, COCO instance segmentation, LSJ, 50 epochs, STViT-Large backbone.
# Same recipe as mask2former_stvit-s_8xb2-lsj-50e_coco.py;
# only the STViT-L settings (../_base_/models/stvit-l.py) and the channels change.
# with_cp=True: activation checkpointing per block, as mask-rcnn_stvit-l_fpn_1x_coco.py (38 blocks at COCO scale).
_base_ = ["./mask2former_stvit-s_8xb2-lsj-50e_coco.py", "../_base_/models/stvit-l.py"]

model = dict(
    backbone=dict(_base_.pop("stvit_l_backbone"), with_cp=True), panoptic_head=dict(in_channels=[96, 192, 448, 640])
)
