# STViT-S for the query-based heads (DINO, Mask2Former): the backbone of stvit-s.py and the parameter groups
# these heads' mm configs give their Swin backbones, in STViT's parameter names.
#
# mm's DINO and Mask2Former configs already set AdamW, their lr, weight decay and gradient clipping, and
# `custom_keys={'backbone': dict(lr_mult=0.1, ...)}` (the backbone at a tenth of the lr, as in mm's Swin
# variants and in TransNeXt's DINO / Mask2Former recipes). mmengine applies only the first matching custom key
# (the longest first) to a parameter and then skips `norm_decay_mult`, so the backbone's norms and positional
# parameters need keys of their own longer than 'backbone', as mm's Swin Mask2Former configs list
# `backbone.stages.N.blocks.N.norm`. The keys below are parts of STViT's parameter names that no mm head uses
# (tests/test_query_configs.py checks every parameter's lr and decay). stvit-s.py's optimizer (the 2021
# detection recipe) is dropped here.
_base_ = "./stvit-s.py"
_base_.pop("stvit_optim_wrapper")

# lr x0.1 like the rest of the backbone, no weight decay: mm's Swin Mask2Former `backbone_norm_multi`
__no_decay = dict(lr_mult=0.1, decay_mult=0.0)
stvit_backbone_keys = {
    # the stem's and the down-sampling layers' BatchNorms (Sequential indices of PatchEmbed / PatchMerging)
    **{f"patch_embed.proj.{i}.": __no_decay for i in (2, 5, 8, 11)},
    "downsample.proj.1.": __no_decay,
    # each block's LayerNorm2d before the attention and BatchNorm before the MLP
    "norm1.norm.": __no_decay,
    "norm2.weight": __no_decay,
    "norm2.bias": __no_decay,
    # positional depth-wise convs (Swin: `absolute_pos_embed`, `relative_position_bias_table`)
    "pos_embed": __no_decay,
    # layer-scale gammas (base, large). '.gamma_1' ties with 'backbone' in length and sorts first.
    ".gamma_1": __no_decay,
    ".gamma_2": __no_decay,
}
