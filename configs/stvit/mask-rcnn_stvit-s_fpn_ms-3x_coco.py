# Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training, STViT-S, COCO 2017.
#
# Recipe: Swin's 3x recipe, mmdet's `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py`
# (DETR-style augmentation: random resize of the short side to 480-800 px, or resize to
# 400-600 + random crop 384-600 + resize to 480-800; 36 epochs, lr x0.1 at 27 and 33,
# AdamW lr 1e-4 / wd 0.05, 1000-iteration warm-up, 8 GPUs x 2 images), backbone swapped.
# Backbone choices (stoken_size preset, norm_out=False, drop path 0.2, SyncBN, AMP) are
# the same as in `mask-rcnn_stvit-s_fpn_1x_coco.py`; see the comments there.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

custom_imports = dict(imports=['backbones'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='STViT',
        arch='small',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.2,
        with_cp=False,
        norm_out=False,
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/stvit_small.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

# The base already has LinearLR(1000 iters) + MultiStepLR([27, 33]) over 36 epochs.

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        bias_decay_mult=0.,
        custom_keys={
            'pos_embed': dict(decay_mult=0.),
            'gamma_1': dict(decay_mult=0.),
            'gamma_2': dict(decay_mult=0.),
        }))

trainer = dict(
    devices=8,
    num_nodes=1,
    accelerator='auto',
    strategy='ddp',
    precision='16-mixed',
    sync_batchnorm=True,
    max_epochs=max_epochs,
    check_val_every_n_epoch=1,
    log_every_n_steps=50)

checkpoint_callback = dict(
    monitor='bbox_mAP',
    mode='max',
    save_last=True,
    save_top_k=1,
    filename='epoch_{epoch:02d}-bbox_mAP_{bbox_mAP:.4f}',
    auto_insert_metric_name=False)
