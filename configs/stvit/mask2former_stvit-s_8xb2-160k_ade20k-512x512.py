# Mask2Former, ADE20K semantic segmentation, 512x512 crops, 160k iterations, STViT-S backbone.
#
# Recipe: mmseg's `mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py` with the backbone swapped, as
# mmseg's `mask2former_swin-t_8xb2-160k_ade20k-512x512.py` does; head, pixel decoder, transformer decoder,
# data pipeline and schedule are mm's (tests/test_query_configs.py fails if they drift).
# - optimizer: mm's Mask2Former: AdamW lr 1e-4, weight decay 0.05, gradient clipping at 0.01, the backbone at
#   lr x0.1; no decay on query / level embeddings and norms (`norm_decay_mult=0.0`). TransNeXt's Mask2Former
#   ADE20K recipe is the same.
# - no weight decay on the backbone's norms, positional convs and layer-scale gammas (backbone keys:
#   ../_base_/models/stvit-s-query.py), as mm's Swin Mask2Former config lists its norms and position tables.
# - schedule: mm's: poly decay (power 0.9) to 0 over 160k iterations, no warm-up, validation every 5000;
#   total batch 16 (8 GPUs x 2 images).
# - backbone: drop_path_rate=0.3, mm's Swin-T/S/B Mask2Former value (NAT's DiNAT Mask2Former too); the
#   classification super-token sizes [8, 4, 1, 1] as the UperNet configs (32x32 positions in stage 3);
#   sync_batchnorm=True for STViT's BatchNorms.
# - precision='32-true': mm's Mask2Former configs train in fp32.
_base_ = [
    "mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py",
    "../_base_/models/stvit-s-query.py",
    "../_base_/lightning/seg_8x2.py",
]
# mmseg's Mask2Former builds mmdet's pixel decoder, matcher and losses (`mmdet.` types), as its own
# custom_imports says.
custom_imports = dict(imports=["mmdet.models", "backbones"], allow_failed_imports=False)

model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), drop_path_rate=0.3),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
)

optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.pop("stvit_backbone_keys")))

max_iters = 160000
val_interval = 5000
# mm's CheckpointHook options (keep 3, best) are checkpoint_callback's here (save_top_k, monitor)
default_hooks = dict(checkpoint=dict(_delete_=True, type="CheckpointHook", by_epoch=False, interval=val_interval))
train_cfg = dict(max_iters=max_iters, val_interval=val_interval)

trainer = dict(precision="32-true", sync_batchnorm=True, max_steps=max_iters, val_check_interval=val_interval)
