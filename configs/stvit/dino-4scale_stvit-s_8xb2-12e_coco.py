# DINO-4scale, 12 epochs, STViT-S backbone, COCO 2017.
#
# Recipe: mmdet's `dino/dino-4scale_r50_8xb2-12e_coco.py` with the backbone swapped; head, neck, encoder,
# decoder, data pipeline and schedule are mm's (tests/test_query_configs.py fails if they drift).
# - optimizer: mm's DINO: AdamW lr 1e-4, weight decay 1e-4, gradient clipping at L2 norm 0.1, the backbone at
#   lr x0.1 (`custom_keys` 'backbone'; InternImage's and TransNeXt's DINO recipes also keep AdamW lr 1e-4).
# - no weight decay on norms, STViT's positional convs and layer-scale gammas (backbone keys:
#   ../_base_/models/stvit-s-query.py): mm's Swin Mask2Former rule (`norm_decay_mult=0.0`, no decay on
#   position embeddings), as TransNeXt's DINO recipe does for its own backbone.
# - schedule: mm's DINO 1x: 12 epochs, lr x0.1 at epoch 11, no warm-up; total batch 16 (8 GPUs x 2 images).
#   No layer-wise lr decay: mm's and TransNeXt's DINO use a flat backbone multiplier (InternImage's one
#   layer-wise variant is tied to its own layer names). No 36-epoch config: neither InternImage nor TransNeXt
#   publishes DINO-4scale beyond 12 epochs.
# - 4 scales as mm's R-50 DINO and InternImage's / TransNeXt's DINO-4scale: stages 2-4 (strides 8-32,
#   out_indices=(1, 2, 3)) into the ChannelMapper, which adds the stride-64 level.
# - backbone: stoken_size=[8, 4, 2, 1], the COCO setting of the Mask R-CNN configs (see
#   mask-rcnn_stvit-s_fpn_1x_coco.py); drop_path_rate=0.2 as STViT-S Mask R-CNN 1x (Swin-T's detection value,
#   12 epochs too); sync_batchnorm=True for STViT's BatchNorms at 2 images per GPU.
# - precision='32-true': mm's DINO configs train in fp32.
_base_ = [
    "mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py",
    "../_base_/models/stvit-s-query.py",
    "../_base_/lightning/det_8x2.py",
]

dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size, out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512]),
)

optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.pop("stvit_backbone_keys"), norm_decay_mult=0.0))
auto_scale_lr = dict(enable=False, base_batch_size=16)

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

trainer = dict(precision="32-true", sync_batchnorm=True, max_epochs=max_epochs)
