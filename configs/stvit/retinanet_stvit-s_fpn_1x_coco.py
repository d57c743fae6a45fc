# RetinaNet + FPN, 1x schedule (12 epochs), STViT-S backbone, COCO 2017.
#
# Recipe: mmdet's `retinanet/retinanet_r50_fpn_1x_coco.py` with STViT's detection
# optimizer (Swin's: AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05,
# 1000-iteration warm-up, lr x0.1 at epochs 8 and 11), 8 GPUs x 2 images, 1333x800.
# (mmdet's own Swin RetinaNet config keeps SGD-style lr 0.01; Swin's paper has no
# RetinaNet entry, so we use the same optimizer as for Mask R-CNN.)
#
# Feature levels: RetinaNet's FPN starts at stride 8 (P3-P7). As in mmdet's Swin
# RetinaNet, only stages 2-4 are returned (out_indices=(1, 2, 3)) and the FPN starts at
# its first input, so no backbone output goes unused (matters under DDP if
# norm_out=True adds a per-output norm). The extra P6/P7 are computed from C5
# ('on_input'), as in the base. Other backbone choices: see mask-rcnn_stvit-s_fpn_1x_coco.py.
_base_ = [
    "mmdet::retinanet/retinanet_r50_fpn_1x_coco.py",
    "../_base_/models/stvit-s.py",
    "../_base_/schedules/swin_det_1x.py",
    "../_base_/lightning/det_8x2.py",
]

# Super tokens in stage 3 at COCO scale (see the header of mask-rcnn_stvit-s_fpn_1x_coco.py).
dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size, out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512], start_level=0, add_extra_convs="on_input", num_outs=5),
)

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

param_scheduler = _base_.pop("swin_det_1x_param_scheduler")

optim_wrapper = _base_.pop("stvit_optim_wrapper")

trainer = dict(precision="16-mixed", sync_batchnorm=True, max_epochs=max_epochs)

# Test-time augmentation (tools/test.py --tta): mmdet's RetinaNet TTA (`retinanet/retinanet_tta.py`: three
# scales x horizontal flip, boxes of all views merged by class-wise NMS), plus LoadAnnotations (after the
# resize and flip, so at original scale, as in the test pipeline): our evaluator reads the ground truth from
# the samples, where mmdet's CocoMetric reads the annotation file.
tta_model = dict(type="DetTTAModel", tta_cfg=dict(nms=dict(type="nms", iou_threshold=0.5), max_per_img=100))
tta_img_scales = [(1333, 800), (666, 400), (2000, 1200)]
tta_pipeline = [
    dict(type="LoadImageFromFile", backend_args=None),
    dict(
        type="TestTimeAug",
        transforms=[
            [dict(type="Resize", scale=s, keep_ratio=True) for s in tta_img_scales],
            [dict(type="RandomFlip", prob=1.0), dict(type="RandomFlip", prob=0.0)],
            [dict(type="LoadAnnotations", with_bbox=True)],
            [
                dict(
                    type="PackDetInputs",
                    meta_keys=(
                        "img_id",
                        "img_path",
                        "ori_shape",
                        "img_shape",
                        "scale_factor",
                        "flip",
                        "flip_direction",
                    ),
                )
            ],
        ],
    ),
]
