# UperNet, 160k iterations, 512x512, STViT-Base backbone, ADE20K.
# Same recipe as upernet_stvit-s_4xb4-160k_ade20k-512x512.py; only arch, channels, drop
# path and pretrained weights change.
# drop_path_rate=0.3: Swin-T/S/B all use 0.3 for UperNet; STViT-B (30 blocks, 52M params) is
# between Swin-S and Swin-B.
_base_ = "./upernet_stvit-s_4xb4-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="base", drop_path_rate=0.3, init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_base.pth")
    ),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384),
)
