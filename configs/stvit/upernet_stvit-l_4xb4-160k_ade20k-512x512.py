# UperNet, 160k iterations, 512x512, STViT-Large backbone, ADE20K.
# Same recipe as upernet_stvit-s_4xb4-160k_ade20k-512x512.py; only the STViT-L settings
# (../_base_/models/stvit-l.py) and the channels change.
_base_ = ["./upernet_stvit-s_4xb4-160k_ade20k-512x512.py", "../_base_/models/stvit-l.py"]

model = dict(
    backbone=_base_.pop("stvit_l_backbone"),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
    auxiliary_head=dict(in_channels=448),
)
