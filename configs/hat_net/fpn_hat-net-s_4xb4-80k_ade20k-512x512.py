# Semantic FPN, 80k iterations, 512x512 crops, HAT-Net-S backbone, ADE20K.
#
# Recipe: PVT's Semantic FPN recipe, which HAT-Net follows: AdamW lr 1e-4, weight decay
# 1e-4, poly decay (power 0.9) to 0, no warm-up, 80k iterations, 4 GPUs x 4 images,
# 512x512 crops (inherited from the STViT-S Semantic FPN config, which uses the same
# recipe); only the backbone and trainer precision/BN settings are replaced.
# Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py. trainer.sync_batchnorm=True for
# the FPN head's BatchNorms (SyncBN in mmseg's norm_cfg); HAT-Net itself has no BatchNorm.
_base_ = ["../stvit/fpn_stvit-s_4xb4-80k_ade20k-512x512.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=_base_.pop("hatnet_s_backbone"))  # neck in_channels as STViT-S

optim_wrapper = _base_.pop("hatnet_optim_wrapper")

trainer = dict(precision="32-true", sync_batchnorm=True)
