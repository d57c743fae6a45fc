# UperNet, 160k iterations, 512x512, STViT-Large backbone, ADE20K.
# Same recipe as upernet_stvit-s_4xb4-160k_ade20k-512x512.py; only arch, channels, drop
# path and pretrained weights change.
# drop_path_rate=0.4: STViT-L (38 blocks, 95M params) is deeper and larger than Swin-B
# (24 blocks, 88M, 0.3 for UperNet), so one step higher.
_base_ = "./upernet_stvit-s_4xb4-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="large", drop_path_rate=0.4, init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_large.pth")
    ),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
    auxiliary_head=dict(in_channels=448),
)
