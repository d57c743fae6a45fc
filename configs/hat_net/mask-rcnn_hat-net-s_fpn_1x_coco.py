# Mask R-CNN + FPN, 1x schedule (12 epochs), HAT-Net-S backbone, COCO 2017.
#
# Recipe: HAT-Net follows PVT's detection protocol exactly (official README: "exactly
# follows the code and the training settings of PVT"): mmdet's Mask R-CNN R-50 1x with
# AdamW lr 1e-4, weight decay 1e-4, mmdet's default 500-iteration linear warm-up
# (ratio 0.001), lr x0.1 at epochs 8 and 11, 8 GPUs x 2 images, 1333x800. The data,
# model heads and schedule are inherited from the STViT-S config (same mmdet base);
# only the backbone, optimizer, warm-up and trainer precision/BN settings differ.
#
# Choices the paper leaves open:
# - drop_path_rate=0.1: PVT used 0.1 for every size in detection and segmentation
#   (PVT-L has the same depths [3, 8, 27, 3] as HAT-Net-L); kept for all HAT-Net sizes.
# - norm_out=False: exact official stage features (blocks end in GroupNorm'd branches).
# - no weight decay on norms (HAT-Net's GroupNorms are caught by norm_decay_mult) and
#   biases; HAT-Net has no positional convs or layer scale. (PVT itself decayed everything.)
# - precision='32-true' (PVT trained in fp32); sync_batchnorm=False (no BatchNorm in the
#   backbone or in Mask R-CNN's heads).
_base_ = ["../stvit/mask-rcnn_stvit-s_fpn_1x_coco.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=_base_.pop("hatnet_s_backbone"))  # neck in_channels as STViT-S

param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type="MultiStepLR", begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

optim_wrapper = _base_.pop("hatnet_optim_wrapper")

trainer = dict(precision="32-true", sync_batchnorm=False)
