# Mask2Former, COCO instance segmentation, large-scale jitter (LSJ) 1024x1024, 50 epochs, STViT-S backbone.
#
# Recipe: mmdet's `mask2former/mask2former_r50_8xb2-lsj-50e_coco.py` with the backbone swapped, as mmdet's
# `mask2former_swin-t-p4-w7-224_8xb2-lsj-50e_coco.py` does; head, pixel decoder, transformer decoder, data
# pipeline and schedule are mm's (tests/test_query_configs.py fails if they drift).
# - optimizer: mm's Mask2Former: AdamW lr 1e-4, weight decay 0.05, gradient clipping at 0.01, the backbone at
#   lr x0.1; no decay on query / level embeddings and norms (`norm_decay_mult=0.0`).
# - no weight decay on the backbone's norms, positional convs and layer-scale gammas (backbone keys:
#   ../_base_/models/stvit-s-query.py), as mm's Swin Mask2Former config lists its norms and position tables.
# - schedule: mm's: 368750 iterations (50 epochs at 16 images), lr x0.1 at 327778 and 355092, validation
#   every 5000 iterations (mm's `dynamic_intervals` only moves the last validation to the end: the trainer
#   validates at the end anyway); total batch 16 (8 GPUs x 2 images). No layer-wise lr decay (mm's Swin and
#   TransNeXt's Mask2Former use a flat backbone multiplier).
# - backbone: drop_path_rate=0.3, mm's Swin-T/S/B Mask2Former value (NAT's DiNAT Mask2Former too);
#   stoken_size=[8, 4, 2, 1]: 1024x1024 crops give stage 3 a 64x64 map, as at COCO's Mask R-CNN scale (see
#   mask-rcnn_stvit-s_fpn_1x_coco.py); sync_batchnorm=True for STViT's BatchNorms.
# - precision='32-true': mm's Mask2Former configs train in fp32 (NAT's too).
# Panoptic segmentation (mm's `..._coco-panoptic.py`) needs panopticapi, which is not on the package index.
_base_ = [
    "mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py",
    "../_base_/models/stvit-s-query.py",
    "../_base_/lightning/det_8x2_iter.py",
]

dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size, drop_path_rate=0.3),
    panoptic_head=dict(in_channels=[64, 128, 320, 512]),
)

# mm's instance config keeps its panoptic base's `data_prefix.seg` (panoptic PNGs), which instance training never
# reads; dropped, so that a COCO copy without the panoptic annotations passes the data checks.
train_dataloader = dict(dataset=dict(data_prefix=dict(_delete_=True, img="train2017/")))
val_dataloader = dict(dataset=dict(data_prefix=dict(_delete_=True, img="val2017/")))
test_dataloader = val_dataloader

optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.pop("stvit_backbone_keys")))

max_iters = 368750
val_interval = 5000
# mm's CheckpointHook options (keep 3, best) are checkpoint_callback's here (save_top_k, monitor)
default_hooks = dict(checkpoint=dict(_delete_=True, type="CheckpointHook", by_epoch=False, interval=val_interval))
train_cfg = dict(max_iters=max_iters, val_interval=val_interval, dynamic_intervals=None)

trainer = dict(precision="32-true", sync_batchnorm=True, max_steps=max_iters, val_check_interval=val_interval)
