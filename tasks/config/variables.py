"""The names that config files use as variables, not as keys: mm's base configs write their sections with them,
and this project's configs do the same. The key table lists each as a config variable (``VARIABLE``), read by
the config itself, so that a config inheriting a base is not refused for them. A backbone family's own variables
(``stvit_s_backbone``, ``hatnet_backbone_keys``: a name starting with the family's name and ``_``) are one rule
over the registered families instead (``FAMILY_VARIABLES``), so that a new family's configs need no entry here."""

BASE_VARIABLES = (
    # mmdet's / mmseg's bases: names their own sections are written with
    "albu_train_transforms backbone_norm_cfg batch_augments batch_size branch_field checkpoint checkpoint_file "
    "color_space crop_size data_preprocessor data_root dynamic_intervals embed_multi image_size interval "
    "num_stuff_classes num_things_classes "
    "dataset_aug dataset_train dataset_type dataset_version geometric img_ratios img_scale input_size "
    "labeled_dataset metainfo norm_cfg num_classes num_workers optimizer scale stable_diffusion_cfg strong_pipeline "
    "sup_pipeline test_img_scale test_pipeline train_ann train_img_scale train_pipeline tta_pipeline unlabeled_dataset "
    "unsup_pipeline val_ann val_img_scale val_pipeline vis_backends weak_pipeline backend_args"
).split()
OUR_VARIABLES = (
    # configs/: the same for ours (the schedule lengths feed train_cfg / trainer, the backbones model.backbone)
    "channels dense_stoken_size img_scales max_epochs max_iters pretrained swin_det_1x_param_scheduler "
    "tta_img_scales val_interval"
).split()
# the name under which the key table lists the families' variables (``tasks.config.keys.key_of`` applies the rule)
FAMILY_VARIABLES = "<family>_*"
