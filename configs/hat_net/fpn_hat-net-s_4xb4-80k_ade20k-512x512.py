# Semantic FPN, 80k iterations, 512x512 crops, HAT-Net-S backbone, ADE20K.
#
# Recipe: PVT's Semantic FPN recipe, which HAT-Net follows: AdamW lr 1e-4, weight decay
# 1e-4, poly decay (power 0.9) to 0, no warm-up, 80k iterations, 4 GPUs x 4 images,
# 512x512 crops (inherited from the STViT-S Semantic FPN config, which uses the same
# recipe); only the backbone and trainer precision/BN settings are replaced.
# Backbone choices: see mask-rcnn_hat-net-s_fpn_1x_coco.py. trainer.sync_batchnorm=True for
# the FPN head's BatchNorms (SyncBN in mmseg's norm_cfg); HAT-Net itself has no BatchNorm.
_base_ = '../stvit/fpn_stvit-s_4xb4-80k_ade20k-512x512.py'

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
