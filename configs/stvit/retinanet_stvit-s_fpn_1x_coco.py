# RetinaNet + FPN, 1x schedule (12 epochs), STViT-S backbone, COCO 2017.
#
# Recipe: mmdet's `retinanet/retinanet_r50_fpn_1x_coco.py` with STViT's detection
# optimizer (Swin's: AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05,
# 1000-iteration warm-up, lr x0.1 at epochs 8 and 11), 8 GPUs x 2 images, 1333x800.
# (mmdet's own Swin RetinaNet config keeps SGD-style lr 0.01; Swin's paper has no
# RetinaNet entry, so we use the same optimizer as for Mask R-CNN.)
#
# Feature levels: RetinaNet's FPN starts at stride 8 (P3-P7). As in mmdet's Swin
# RetinaNet, only stages 2-4 are returned (out_indices=(1, 2, 3)) and the FPN starts at
# its first input, so no backbone output goes unused (matters under DDP if
# norm_out=True adds a per-output norm). The extra P6/P7 are computed from C5
# ('on_input'), as in the base. Other backbone choices: see mask-rcnn_stvit-s_fpn_1x_coco.py.
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['backbones'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='STViT',
        arch='small',
        out_indices=(1, 2, 3),
        drop_path_rate=0.2,
        with_cp=False,
        norm_out=False,
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/stvit_small.pth')),
    neck=dict(in_channels=[128, 320, 512], start_level=0, add_extra_convs='on_input', num_outs=5))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

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
