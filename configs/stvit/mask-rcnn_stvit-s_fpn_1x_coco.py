# Mask R-CNN + FPN, 1x schedule (12 epochs), STViT-S backbone, COCO 2017.
#
# Recipe: STViT follows Swin's detection recipe, i.e. mmdet's
# `swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py` with the backbone swapped:
# AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05, 1000-iteration linear
# warm-up, lr x0.1 at epochs 8 and 11, 8 GPUs x 2 images (total batch 16),
# single-scale 1333x800 training. Only what differs from mmdet's R-50 config is
# written here.
#
# Choices the paper leaves open (named here so they can be changed in one place):
# - stoken_size=[8, 4, 2, 1] (the dense-prediction setting): super token attention with 2x2 super
#   tokens in stage 3 instead of the classification preset [8, 4, 1, 1], whose stage 3 is global
#   attention over all 50x84 positions of a 800x1344 image (half of its 194 GMACs). By FLOPs,
#   [8,4,2,1] (88.7 GMACs for the backbone at 800x1344) is the finest stage-3 setting below Swin-T's
#   99.1, so it stays closest to the global attention the ImageNet weights were trained with; the
#   parameters are the same, so those weights load unchanged. Its measured speed against Swin-T
#   depends on the CPU or GPU: `tools/benchmark.py --stoken-size 8,4,2,1 --compare`, figures with their
#   hardware in docs/benchmarks/. The official repo itself profiles dense inputs with
#   super tokens in stage 3 ([16, 8, 2, 1] at 512x512). ADE20K configs (512x512, 32x32 positions in
#   stage 3) keep the preset.
# - norm_out=False: outputs are the exact official stage features (no extra norm per
#   output as Swin adds); every stage already ends in BN-normalised blocks.
# - drop_path_rate=0.2: Swin-T (same size class, 25-28M params) uses 0.2 for
#   detection; STViT-S was pre-trained with 0.3 (official run.sh), and the usual
#   practice is to lower it slightly for 12-epoch fine-tuning.
# - BatchNorm: STViT uses BN in the stem, the down-sampling layers and before every
#   MLP; with 2 images per GPU we synchronise it across the 8 GPUs
#   (trainer.sync_batchnorm=True, 16 images per BN batch) instead of freezing the
#   statistics (norm_eval=False, the backbone default).
# - precision='16-mixed': Swin's official detection code trained with mixed precision
#   (apex, `use_fp16=True`); it also cuts the memory of the global attention in stage 3.
# - no weight decay on norms, biases, the positional depth-wise convs (`pos_embed`)
#   and layer-scale gammas (Swin's "no decay on norm / position bias" rule carried
#   over to STViT's parameter names).
_base_ = [
    "mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py",
    "../_base_/models/stvit-s.py",
    "../_base_/schedules/swin_det_1x.py",
    "../_base_/lightning/det_8x2.py",
]

# Super tokens in stage 3 at COCO scale (see the header of mask-rcnn_stvit-s_fpn_1x_coco.py).
dense_stoken_size = [8, 4, 2, 1]
model = dict(
    backbone=dict(_base_.pop("stvit_s_backbone"), stoken_size=dense_stoken_size),
    neck=dict(in_channels=[64, 128, 320, 512]),
)

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=1)

param_scheduler = _base_.pop("swin_det_1x_param_scheduler")

optim_wrapper = _base_.pop("stvit_optim_wrapper")

trainer = dict(precision="16-mixed", sync_batchnorm=True, max_epochs=max_epochs)
