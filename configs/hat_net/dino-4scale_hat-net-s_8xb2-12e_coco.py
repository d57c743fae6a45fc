# DINO-4scale, 12 epochs, HAT-Net-S backbone, COCO 2017.
#
# The recipe of ../stvit/dino-4scale_stvit-s_8xb2-12e_coco.py (which gives the source of each choice), backbone
# swapped: mm's DINO (AdamW lr 1e-4, weight decay 1e-4, clipping 0.1, backbone lr x0.1, 12 epochs with lr x0.1
# at 11, total batch 16), stages 2-4 into the ChannelMapper; head, neck, encoder and decoder are mm's.
# - no weight decay on HAT-Net's GroupNorms (by name: ../_base_/models/hat-net-s-query.py) and the heads' norms;
#   HAT-Net has no position embeddings.
# - drop_path_rate=0.1: PVT's value for every size, as the HAT-Net Mask R-CNN configs.
# - sync_batchnorm=False: no BatchNorm in HAT-Net or in DINO (GroupNorm).
_base_ = ["../stvit/dino-4scale_stvit-s_8xb2-12e_coco.py", "../_base_/models/hat-net-s-query.py"]

model = dict(backbone=dict(_base_.pop("hatnet_s_backbone"), out_indices=(1, 2, 3)))  # neck in_channels as STViT-S

# HAT-Net's norms join the inherited keys (STViT's names there match no HAT-Net parameter;
# tests/test_query_configs.py checks the group of every parameter)
optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.pop("hatnet_backbone_keys")))

trainer = dict(sync_batchnorm=False)
