# Cascade Mask R-CNN + FPN, 3x schedule with multi-scale training, HAT-Net-S, COCO 2017.
#
# PVT/HAT-Net report no Cascade Mask R-CNN; this uses the same Swin cascade 3x recipe
# as the STViT-S config it inherits (GIoU 4conv1fc SyncBN box heads, DETR-style
# augmentation, 36 epochs), with HAT-Net's (PVT's) optimizer: AdamW lr 1e-4, weight
# decay 1e-4. Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py.
# trainer.sync_batchnorm=True for the box heads' BatchNorms (their norm_cfg is SyncBN; the
# task module reverts mm SyncBN to BN and leaves synchronisation to Lightning). HAT-Net itself
# has no BatchNorm.
_base_ = ["../stvit/cascade-mask-rcnn_stvit-s_fpn_ms-3x_coco.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=_base_.pop("hatnet_s_backbone"))  # neck in_channels as STViT-S

optim_wrapper = _base_.pop("hatnet_optim_wrapper")

trainer = dict(precision="32-true", sync_batchnorm=True)
