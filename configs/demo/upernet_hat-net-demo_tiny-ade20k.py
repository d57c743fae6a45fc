# UPerNet with the shrunk HAT-Net (arch="shrunk") on the synthetic tiny ADE20K
# (python tools/make_tiny_data.py --out data). Sized to train in a few minutes on 2 CPU cores:
#   python tools/train.py configs/demo/upernet_hat-net-demo_tiny-ade20k.py
_base_ = "mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py"
custom_imports = dict(imports=["backbones"], allow_failed_imports=False)

data_root = "data/tiny_ade20k/"
# The tiny set's five ADE20K classes: mmseg maps their labels (0, 3, 8, 17, 119 after reduce_zero_label) to 0-4 and
# keeps their ADE20K colours. Heads of 5 classes instead of 150 halve the training step on a CPU.
metainfo = dict(classes=("wall", "floor", "windowpane", "plant", "ball"))
num_classes = len(metainfo["classes"])
crop_size = (128, 128)
norm_cfg = dict(type="BN", requires_grad=True)  # SyncBN in the base: set trainer.sync_batchnorm under DDP

model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type="HATNet",
        arch="shrunk",  # backbones/models/hatnet.py's SHRUNK: stage channels 32, 64, 128, 256, depths 1, 1, 2, 1
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,
        init_cfg=None,
    ),
    decode_head=dict(in_channels=[32, 64, 128, 256], channels=64, num_classes=num_classes, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=128, channels=32, num_classes=num_classes, norm_cfg=norm_cfg),
)

train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="RandomResize", scale=(256, 128), ratio_range=(0.75, 1.5), keep_ratio=True),
    dict(type="RandomCrop", crop_size=crop_size, cat_max_ratio=0.75),
    dict(type="RandomFlip", prob=0.5),
    dict(type="PackSegInputs"),
]
test_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="Resize", scale=(256, 128), keep_ratio=True),
    dict(type="LoadAnnotations", reduce_zero_label=True),
    dict(type="PackSegInputs"),
]
# Test-time augmentation (tools/test.py --tta): mmseg's ADE20K multi-scale + flip (`_base_/datasets/ade20k.py`:
# ratios 0.5-1.75 of the original image, each also flipped; SegTTAModel averages the softmax of the 12 views).
tta_model = dict(type="SegTTAModel")
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(
        type="TestTimeAug",
        transforms=[
            [dict(type="Resize", scale_factor=r, keep_ratio=True) for r in img_ratios],
            [
                dict(type="RandomFlip", prob=0.0, direction="horizontal"),
                dict(type="RandomFlip", prob=1.0, direction="horizontal"),
            ],
            [dict(type="LoadAnnotations", reduce_zero_label=True)],
            [dict(type="PackSegInputs")],
        ],
    ),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=True),
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline),
)
test_dataloader = val_dataloader
# mIoU (with aAcc, mAcc), as mmseg's base config asks (docs/evaluation.md): computed by
# tasks/evaluation/segmentation.py, equal to mmseg's IoUMetric; iou_metrics=['mIoU', 'mDice', ...] runs mmseg's.
val_evaluator = dict(type="IoUMetric", iou_metrics=["mIoU"])
test_evaluator = val_evaluator

optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
    # no weight decay on norms and biases (HAT-Net has no positional convs or gammas)
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={"pos_embed": dict(decay_mult=0.0), "norm": dict(decay_mult=0.0)},
    ),
)
max_iters = 300
param_scheduler = [
    dict(type="LinearLR", start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type="PolyLR", eta_min=1e-5, power=0.9, by_epoch=False, begin=20, end=max_iters),
]
train_cfg = dict(type="IterBasedTrainLoop", max_iters=max_iters, val_interval=max_iters)

trainer = dict(
    accelerator="cpu",
    devices=1,
    max_steps=max_iters,
    max_epochs=-1,
    val_check_interval=max_iters,
    check_val_every_n_epoch=None,
    num_sanity_val_steps=0,
    log_every_n_steps=10,
)
checkpoint_callback = dict(monitor="mIoU", mode="max")
randomness = dict(seed=0)  # data order and augmentation are a function of (seed, epoch): tasks/data/module.py
# Reliability (tasks/training/trainer.py, tasks/training/module.py): write last.ckpt every N optimizer steps
# for an exact mid-epoch --resume, and 'raise' (stop, naming the step and loss terms) or 'skip' steps whose
# loss is NaN / inf.
checkpoint_every_n_steps = None
nonfinite_loss = "raise"
