# Mask2Former, 160k iterations, 512x512 crops, HAT-Net-Large backbone, ADE20K.
# Same recipe as mask2former_hat-net-s_8xb2-160k_ade20k-512x512.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.3: mm's Swin-T/S/B Mask2Former value, as HAT-Net-S.
_base_ = "./mask2former_hat-net-s_8xb2-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="large",
        drop_path_rate=0.3,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_large.pth"),
    ),
    decode_head=dict(in_channels=[64, 128, 320, 640]),
)
