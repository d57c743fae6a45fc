# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training, HAT-Net-S, COCO.
#
# PVT/HAT-Net report no Mask R-CNN 3x; for comparability this uses the same Swin 3x
# recipe as the STViT-S config it inherits (DETR-style multi-scale + crop augmentation,
# 36 epochs, lr x0.1 at 27 and 33, 1000-iteration warm-up, 8 GPUs x 2 images), with
# HAT-Net's (PVT's) optimizer: AdamW lr 1e-4, weight decay 1e-4.
# Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py.
_base_ = '../stvit/mask-rcnn_stvit-s_fpn_ms-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='HATNet',
        arch='small',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        with_cp=False,
        norm_out=False,
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/hatnet_small.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0.))

trainer = dict(precision='32-true', sync_batchnorm=False)
