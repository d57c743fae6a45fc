# UperNet, 160k iterations, 512x512 crops, HAT-Net-S backbone, ADE20K.
#
# PVT has no UperNet recipe, so this keeps Swin's UperNet recipe of the STViT-S config it
# inherits (AdamW lr 6e-5, betas (0.9, 0.999), weight decay 0.01, 1500-iteration warm-up,
# poly power 1.0, 4 GPUs x 4 images): it is the recipe behind the UperNet-160k numbers
# these backbones are compared with. PVT's AdamW lr 1e-4 / wd 1e-4 was set for the light
# Semantic FPN head (see fpn_hat-net-s_4xb4-80k_ade20k-512x512.py).
# Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py. trainer.sync_batchnorm=True for
# the mmseg heads' BatchNorms (norm_cfg SyncBN in mmseg; the task module reverts mm SyncBN to
# BN and leaves synchronisation to Lightning). HAT-Net itself has no BatchNorm.
_base_ = ["../stvit/upernet_stvit-s_4xb4-160k_ade20k-512x512.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=_base_.pop("hatnet_s_backbone"))  # head in_channels as STViT-S

optim_wrapper = dict(
    _base_.pop("hatnet_optim_wrapper"), optimizer=dict(type="AdamW", lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01)
)

trainer = dict(precision="32-true", sync_batchnorm=True)
