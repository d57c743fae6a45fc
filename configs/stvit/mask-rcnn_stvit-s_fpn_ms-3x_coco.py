# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training, STViT-S, COCO 2017.
#
# Recipe: Swin's 3x recipe, mmdet's `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py`
# (DETR-style augmentation: random resize of the short side to 480-800 px, or resize to
# 400-600 + random crop 384-600 + resize to 480-800; 36 epochs, lr x0.1 at 27 and 33,
# AdamW lr 1e-4 / wd 0.05, 1000-iteration warm-up, 8 GPUs x 2 images), backbone swapped.
# Backbone choices (stoken_size preset, norm_out=False, drop path 0.2, SyncBN, AMP) are
# the same as in `mask-rcnn_stvit-s_fpn_1x_coco.py`; see the comments there.
_base_ = [
    "mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py",
    "../_base_/models/stvit-s.py",
    "../_base_/lightning/det_8x2.py",
]

# Super tokens in stage 3 at COCO scale (see the header of mask-rcnn_stvit-s_fpn_1x_coco.py).
dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size),
    neck=dict(in_channels=[64, 128, 320, 512]),
)

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

# The base already has LinearLR(1000 iters) + MultiStepLR([27, 33]) over 36 epochs.

optim_wrapper = _base_.pop("stvit_optim_wrapper")

trainer = dict(precision="16-mixed", sync_batchnorm=True, max_epochs=max_epochs)
