# Mask R-CNN + FPN, 1x schedule, STViT-Large backbone, COCO 2017.
# Same recipe as mask-rcnn_stvit-s_fpn_1x_coco.py; only the STViT-L settings
# (../_base_/models/stvit-l.py) and the channels change. 1x (not 3x) for the larger variants: it is the cheapest
# schedule that ranks backbones, and the only one shared with the HAT-Net/PVT protocol
# (1x for all sizes); a 3x variant is the same overrides on
# mask-rcnn_stvit-s_fpn_ms-3x_coco.py.
# with_cp=True: activation checkpointing per block. The official STViT-L already
# checkpoints most blocks at 224x224; at 1333x800 its 19 global-attention blocks in
# stage 3 (~4.2k tokens, 7 heads) would otherwise keep tens of GB of attention maps per GPU
# for the backward pass, even with AMP.
_base_ = ["./mask-rcnn_stvit-s_fpn_1x_coco.py", "../_base_/models/stvit-l.py"]

model = dict(backbone=dict(_base_.pop("stvit_l_backbone"), with_cp=True), neck=dict(in_channels=[96, 192, 448, 640]))
