# Mask2Former, 160k iterations, 512x512 crops, STViT-Base backbone, ADE20K.
# Same recipe as mask2former_stvit-s_8xb2-160k_ade20k-512x512.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.3: mm's Swin-T/S/B Mask2Former value, as for STViT-S.
_base_ = "./mask2former_stvit-s_8xb2-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="base",
        drop_path_rate=0.3,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_base.pth"),
    ),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
)
