# Lightning sections of the iteration-based COCO configs (Mask2Former; listed next to the mmdet base in
# `_base_`, which defines none of these keys). 8 GPUs x 2 images (train_dataloader.batch_size=2 from the mmdet
# base). Each config adds precision, sync_batchnorm, max_steps (= train_cfg.max_iters) and val_check_interval
# (= train_cfg.val_interval).
custom_imports = dict(imports=["backbones"], allow_failed_imports=False)

trainer = dict(
    devices=8, num_nodes=1, accelerator="auto", strategy="ddp", check_val_every_n_epoch=None, log_every_n_steps=50
)

checkpoint_callback = dict(
    monitor="segm_mAP",
    mode="max",
    save_last=True,
    save_top_k=1,
    filename="iter_{step:06d}-segm_mAP_{segm_mAP:.4f}",
    auto_insert_metric_name=False,
)
