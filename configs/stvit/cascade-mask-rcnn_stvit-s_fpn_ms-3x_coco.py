# Cascade Mask R-CNN + FPN, 3x schedule (36 epochs) with multi-scale training, STViT-S, COCO.
#
# Recipe: Swin's Cascade Mask R-CNN 3x recipe (the one behind the Swin-T/S/B cascade
# numbers that STViT is compared with; Swin's repo:
# `cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py`),
# ported onto mmdet 3.x's `cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py`:
# - box heads: 4conv1fc with SyncBN, class-specific regression, decoded-box GIoU loss
#   (weight 10) instead of mmdet's default shared-2fc / smooth-L1 heads;
# - data: the DETR-style multi-scale + crop augmentation of Swin's Mask R-CNN 3x
#   (copied from mmdet's `swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py`), no
#   RepeatDataset: 36 real epochs, lr x0.1 at epochs 27 and 33;
# - AdamW lr 1e-4 / wd 0.05, 1000-iteration warm-up, 8 GPUs x 2 images.
# (mmdet's own `cascade-mask-rcnn_r50_fpn_ms-3x_coco.py` is a different recipe:
# 640-800 resize only, shared-2fc heads, and its evaluator reports bbox only.)
# Backbone choices (stoken_size preset, norm_out=False, drop path 0.2 = Swin-T cascade
# value, SyncBN, AMP): see mask-rcnn_stvit-s_fpn_1x_coco.py.
_base_ = [
    "mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py",
    "../_base_/models/stvit-s.py",
    "../_base_/lightning/det_8x2.py",
]


def _giou_4conv1fc_head(target_stds):
    return dict(
        type="ConvFCBBoxHead",
        num_shared_convs=4,
        num_shared_fcs=1,
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0, 0.0, 0.0, 0.0], target_stds=target_stds),
        reg_class_agnostic=False,
        reg_decoded_bbox=True,
        norm_cfg=dict(type="SyncBN", requires_grad=True),
        loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type="GIoULoss", loss_weight=10.0),
    )


# Super tokens in stage 3 at COCO scale (see the header of mask-rcnn_stvit-s_fpn_1x_coco.py).
dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size),
    neck=dict(in_channels=[64, 128, 320, 512]),
    roi_head=dict(
        bbox_head=[
            _giou_4conv1fc_head([0.1, 0.1, 0.2, 0.2]),
            _giou_4conv1fc_head([0.05, 0.05, 0.1, 0.1]),
            _giou_4conv1fc_head([0.033, 0.033, 0.067, 0.067]),
        ]
    ),
)

# Swin / DETR-style augmentation (backend_args=None as in the base datasets).
train_pipeline = [
    dict(type="LoadImageFromFile", backend_args=None),
    dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
    dict(type="RandomFlip", prob=0.5),
    dict(
        type="RandomChoice",
        transforms=[
            [
                dict(
                    type="RandomChoiceResize",
                    scales=[
                        (480, 1333),
                        (512, 1333),
                        (544, 1333),
                        (576, 1333),
                        (608, 1333),
                        (640, 1333),
                        (672, 1333),
                        (704, 1333),
                        (736, 1333),
                        (768, 1333),
                        (800, 1333),
                    ],
                    keep_ratio=True,
                )
            ],
            [
                dict(type="RandomChoiceResize", scales=[(400, 1333), (500, 1333), (600, 1333)], keep_ratio=True),
                dict(type="RandomCrop", crop_type="absolute_range", crop_size=(384, 600), allow_negative_crop=True),
                dict(
                    type="RandomChoiceResize",
                    scales=[
                        (480, 1333),
                        (512, 1333),
                        (544, 1333),
                        (576, 1333),
                        (608, 1333),
                        (640, 1333),
                        (672, 1333),
                        (704, 1333),
                        (736, 1333),
                        (768, 1333),
                        (800, 1333),
                    ],
                    keep_ratio=True,
                ),
            ],
        ],
    ),
    dict(type="PackDetInputs"),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type="MultiStepLR", begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33], gamma=0.1),
]

optim_wrapper = _base_.pop("stvit_optim_wrapper")

trainer = dict(precision="16-mixed", sync_batchnorm=True, max_epochs=max_epochs)
