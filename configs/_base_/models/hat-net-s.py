# HAT-Net-S backbone and the HAT-Net optimizer wrapper, shared by the configs in
# configs/hat_net/. Carried under their own names and taken out with `_base_.pop(...)`, as
# explained in stvit-s.py (the inherited configs already define `model` / `optim_wrapper`).
#
# Backbone choices (see mask-rcnn_hat-net-s_fpn_1x_coco.py): drop_path_rate=0.1 (PVT's value
# for every size and task); norm_out=False (the exact official stage features).
hatnet_s_backbone = dict(
    _delete_=True,
    type="HATNet",
    arch="small",
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.1,
    with_cp=False,
    norm_out=False,
    init_cfg=dict(type="Pretrained", checkpoint="pretrained/hatnet_small.pth"),
)

# AdamW in a plain OptimWrapper. The optimizer is PVT's (lr 1e-4, betas (0.9, 0.999), weight
# decay 1e-4), which HAT-Net follows; the UperNet configs replace `optimizer` with Swin's
# UperNet one. No weight decay on norms
# (HAT-Net's GroupNorms) and biases; HAT-Net has no positional convs or layer scale.
hatnet_optim_wrapper = dict(
    _delete_=True,
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0),
)
