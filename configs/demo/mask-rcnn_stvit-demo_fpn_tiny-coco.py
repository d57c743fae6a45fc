# Mask R-CNN + FPN with the shrunk STViT (arch="shrunk") on the synthetic tiny COCO
# (python tools/make_tiny_data.py --out data). Sized to train in a few minutes on 2 CPU cores:
#   python tools/train.py configs/demo/mask-rcnn_stvit-demo_fpn_tiny-coco.py
_base_ = "mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py"
custom_imports = dict(imports=["backbones"], allow_failed_imports=False)

data_root = "data/tiny_coco/"
# names of the category ids 1, 3, 7 in the tiny json; CocoDataset maps them to labels 0, 1, 2
metainfo = dict(classes=("square", "disc", "triangle"), palette=[(215, 40, 40), (40, 185, 60), (45, 75, 220)])
img_scale = (192, 192)
channels = 64  # FPN / RoI head width (256 in the base): the demo must run on a CPU

model = dict(
    backbone=dict(
        _delete_=True,
        type="STViT",
        arch="shrunk",  # backbones/models/stvit.py's SHRUNK: stage channels 32, 64, 128, 256, depths 1, 1, 2, 1
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,
        init_cfg=None,
    ),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=channels),
        bbox_head=dict(in_channels=channels, fc_out_channels=256, num_classes=3),
        mask_roi_extractor=dict(out_channels=channels),
        mask_head=dict(in_channels=channels, conv_out_channels=channels, num_classes=3),
    ),
    train_cfg=dict(rpn_proposal=dict(nms_pre=500, max_per_img=300), rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100)),
)

train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
    dict(type="Resize", scale=img_scale, keep_ratio=True),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PackDetInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="Resize", scale=img_scale, keep_ratio=True),
    dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
    dict(type="PackDetInputs", meta_keys=("img_id", "img_path", "ori_shape", "img_shape", "scale_factor")),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline),
)
test_dataloader = val_dataloader
# COCO box and mask mAP, as mmdet's base config asks (docs/evaluation.md): computed by tasks/evaluation/coco.py,
# equal to mmdet's CocoMetric, logged as bbox_mAP, segm_mAP... Without ann_file, the ground truth is the split's
# own annotation file. Options ours does not compute (classwise=True, proposal_nums...) run mmdet's CocoMetric,
# logged under the same names (no coco/ prefix), so the monitor below stays valid.
val_evaluator = dict(_delete_=True, type="CocoMetric", metric=["bbox", "segm"], format_only=False)
test_evaluator = val_evaluator

optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    # no weight decay on norms, biases, STViT's positional convs and layer-scale gammas
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={"pos_embed": dict(decay_mult=0.0), "gamma": dict(decay_mult=0.0), "norm": dict(decay_mult=0.0)},
    ),
    clip_grad=dict(max_norm=10.0, norm_type=2),
)
max_epochs = 12
param_scheduler = [
    dict(type="LinearLR", start_factor=0.01, by_epoch=False, begin=0, end=24),
    dict(type="MultiStepLR", by_epoch=True, begin=0, end=max_epochs, milestones=[10], gamma=0.1),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)  # what the trainer section says, as mm reads it

trainer = dict(
    accelerator="cpu",
    devices=1,
    max_epochs=max_epochs,
    check_val_every_n_epoch=max_epochs,
    num_sanity_val_steps=0,
    log_every_n_steps=4,
)
checkpoint_callback = dict(monitor="bbox_mAP", mode="max")
randomness = dict(seed=0)  # data order and augmentation are a function of (seed, epoch): tasks/data/module.py
# Reliability (tasks/training/trainer.py, tasks/training/module.py): write last.ckpt every N optimizer steps
# for an exact mid-epoch --resume, and 'raise' (stop, naming the step and loss terms) or 'skip' steps whose
# loss is NaN / inf.
checkpoint_every_n_steps = None
nonfinite_loss = "raise"
