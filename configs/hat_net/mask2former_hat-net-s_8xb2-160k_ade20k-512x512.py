# Mask2Former, ADE20K semantic segmentation, 512x512 crops, 160k iterations, HAT-Net-S backbone.
#
# The recipe of ../stvit/mask2former_stvit-s_8xb2-160k_ade20k-512x512.py (which gives the source of each choice),
# backbone swapped: mm's Mask2Former (AdamW lr 1e-4, weight decay 0.05, clipping 0.01, backbone lr x0.1, no decay
# on norms and query / level embeddings, poly 0.9 over 160k iterations, total batch 16); head, pixel decoder and
# transformer decoder are mm's.
# - no weight decay on HAT-Net's GroupNorms (by name: ../_base_/models/hat-net-s-query.py).
# - drop_path_rate=0.3: mm's Swin-T/S/B Mask2Former value (NAT's DiNAT Mask2Former too).
# - sync_batchnorm=False: no BatchNorm in HAT-Net or in Mask2Former (GroupNorm).
_base_ = ["../stvit/mask2former_stvit-s_8xb2-160k_ade20k-512x512.py", "../_base_/models/hat-net-s-query.py"]

model = dict(backbone=dict(_base_.pop("hatnet_s_backbone"), drop_path_rate=0.3))  # head in_channels as STViT-S

# HAT-Net's norms join the inherited keys (STViT's names there match no HAT-Net parameter;
# tests/test_query_configs.py checks the group of every parameter)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.pop("hatnet_backbone_keys")))

trainer = dict(sync_batchnorm=False)
