# Cascade Mask R-CNN + FPN, 3x schedule with multi-scale training, HAT-Net-S, COCO 2017.
#
# PVT/HAT-Net report no Cascade Mask R-CNN; this uses the same Swin cascade 3x recipe
# as the STViT-S config it inherits (GIoU 4conv1fc SyncBN box heads, DETR-style
# augmentation, 36 epochs), with HAT-Net's (PVT's) optimizer: AdamW lr 1e-4, weight
# decay 1e-4. Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py.
# trainer.sync_batchnorm=True for the box heads' BatchNorms (their norm_cfg is SyncBN; the
# task module reverts mm SyncBN to BN and leaves synchronisation to Lightning). HAT-Net itself
# has no BatchNorm.
_base_ = '../stvit/cascade-mask-rcnn_stvit-s_fpn_ms-3x_coco.py'

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

trainer = dict(precision='32-true', sync_batchnorm=True)
