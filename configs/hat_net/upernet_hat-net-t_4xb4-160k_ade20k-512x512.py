# UperNet, 160k iterations, 512x512, HAT-Net-Tiny backbone (13M params, depths [2, 2, 6, 3]), ADE20K.
# Same recipe as upernet_hat-net-s_4xb4-160k_ade20k-512x512.py; only arch, channels and
# pretrained weights change. drop_path_rate stays 0.1 (PVT's value for all sizes).
_base_ = "./upernet_hat-net-s_4xb4-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="tiny", drop_path_rate=0.1, init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_tiny.pth")
    ),
    decode_head=dict(in_channels=[48, 96, 240, 384]),
    auxiliary_head=dict(in_channels=240),
)
