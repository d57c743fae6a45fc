# Mask2Former, 160k iterations, 512x512 crops, STViT-Large backbone, ADE20K.
# Same recipe as mask2former_stvit-s_8xb2-160k_ade20k-512x512.py;
# only the STViT-L settings (../_base_/models/stvit-l.py) and the channels change.
_base_ = ["./mask2former_stvit-s_8xb2-160k_ade20k-512x512.py", "../_base_/models/stvit-l.py"]

model = dict(backbone=_base_.pop("stvit_l_backbone"), decode_head=dict(in_channels=[96, 192, 448, 640]))
