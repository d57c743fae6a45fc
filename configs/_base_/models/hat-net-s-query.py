# HAT-Net-S for the query-based heads (DINO, Mask2Former): the backbone of hat-net-s.py and the parameter groups
# these heads' mm configs give their Swin backbones, in HAT-Net's parameter names (see stvit-s-query.py for why
# each norm needs a key of its own; tests/test_query_configs.py checks every parameter's lr and decay).
# hat-net-s.py's optimizer (PVT's) is dropped here.
_base_ = "./hat-net-s.py"
_base_.pop("hatnet_optim_wrapper")

# lr x0.1 like the rest of the backbone, no weight decay: mm's Swin Mask2Former `backbone_norm_multi`
__no_decay = dict(lr_mult=0.1, decay_mult=0.0)
hatnet_backbone_keys = {
    "patch_embed.1.": __no_decay,  # the stem's GroupNorm
    **{f"ds{i}.norm.": __no_decay for i in (2, 3, 4)},  # the down-sampling layers'
    # each block's GroupNorms: attention (input, grid, down-sampled keys, output) and the inverted residual's two
    **{f"attn.{n}.": __no_decay for n in ("norm", "grid_norm", "ds_norm", "proj_norm")},
    "conv.conv1.0.": __no_decay,
    "conv.conv3.1.": __no_decay,
}
