# Mask2Former, 160k iterations, 512x512 crops, STViT-Large backbone, ADE20K.
# Same recipe as mask2former_stvit-s_8xb2-160k_ade20k-512x512.py;
# only arch, channels, drop path and pretrained weights change.
# drop_path_rate=0.4: one step above mm's Swin-B Mask2Former value (0.3): STViT-L (38 blocks, 93M) is deeper and
# larger than Swin-B (24 blocks, 88M), as in mask-rcnn_stvit-l_fpn_1x_coco.py.
_base_ = "./mask2former_stvit-s_8xb2-160k_ade20k-512x512.py"

model = dict(
    backbone=dict(
        arch="large",
        drop_path_rate=0.4,
        init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_large.pth"),
    ),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
)
