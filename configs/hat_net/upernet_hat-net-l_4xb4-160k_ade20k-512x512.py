# UperNet, 160k iterations, 512x512, HAT-Net-Large backbone (80M params, depths [3, 8, 27, 3]), ADE20K.
# Same recipe as upernet_hat-net-s_4xb4-160k_ade20k-512x512.py; only arch, channels and
# pretrained weights change. drop_path_rate stays 0.1 (PVT's value for all sizes).
_base_ = "./upernet_hat-net-s_4xb4-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="large", drop_path_rate=0.1, init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_large.pth")
    ),
    decode_head=dict(in_channels=[64, 128, 320, 640]),
    auxiliary_head=dict(in_channels=320),
)
