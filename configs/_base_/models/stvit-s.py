# STViT-S backbone and the STViT optimizer wrapper, shared by the configs in configs/stvit/.
#
# The mmdet / mmseg bases already define `model` and `optim_wrapper`, and mmengine refuses a
# key defined by two bases of one config, so these are carried under their own names and
# taken out with `_base_.pop(...)` where they are used, e.g.
#     model = dict(backbone=_base_.pop('stvit_s_backbone'), ...)
#     optim_wrapper = _base_.pop('stvit_optim_wrapper')
# (pop, not a plain reference, so that the carrier names do not stay in the resolved config).
#
# Backbone choices (see mask-rcnn_stvit-s_fpn_1x_coco.py): stoken_size not set here (the
# classification preset [8, 4, 1, 1]; the COCO leaves set the dense setting [8, 4, 2, 1]);
# norm_out=False (the exact official stage features);
# drop_path_rate=0.2 (the detection / Semantic FPN value; the UperNet configs override it);
# no activation checkpointing (STViT-L detection overrides it).
stvit_s_backbone = dict(
    _delete_=True,
    type="STViT",
    arch="small",
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.2,
    with_cp=False,
    norm_out=False,
    init_cfg=dict(type="Pretrained", checkpoint="pretrained/stvit_small.pth"),
)

# AdamW in a plain OptimWrapper (Lightning handles AMP). The optimizer is Swin's detection
# one (lr 1e-4, betas (0.9, 0.999), weight decay 0.05), used by every detection config; the
# segmentation configs replace `optimizer` with their recipe's. No weight decay on norms, biases, the positional
# depth-wise convs (`pos_embed`) and layer-scale gammas (Swin's "no decay on norm / position
# bias" rule carried over to STViT's parameter names).
stvit_optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={
            "pos_embed": dict(decay_mult=0.0),
            "gamma_1": dict(decay_mult=0.0),
            "gamma_2": dict(decay_mult=0.0),
        },
    ),
)
