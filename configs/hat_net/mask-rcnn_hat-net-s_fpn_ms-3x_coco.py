# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training, HAT-Net-S, COCO.
#
# PVT/HAT-Net report no Mask R-CNN 3x; for comparability this uses the same Swin 3x
# recipe as the STViT-S config it inherits (DETR-style multi-scale + crop augmentation,
# 36 epochs, lr x0.1 at 27 and 33, 1000-iteration warm-up, 8 GPUs x 2 images), with
# HAT-Net's (PVT's) optimizer: AdamW lr 1e-4, weight decay 1e-4.
# Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py.
_base_ = ["../stvit/mask-rcnn_stvit-s_fpn_ms-3x_coco.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=_base_.pop("hatnet_s_backbone"))  # neck in_channels as STViT-S

optim_wrapper = _base_.pop("hatnet_optim_wrapper")

trainer = dict(precision="32-true", sync_batchnorm=False)
