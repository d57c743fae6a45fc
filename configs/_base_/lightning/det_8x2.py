# Lightning sections shared by the detection configs (listed next to the mmdet base in
# `_base_`; the mmdet configs define none of these keys). 8 GPUs x 2 images
# (train_dataloader.batch_size=2 from the mmdet base), validation every epoch. Each config
# adds precision, sync_batchnorm and max_epochs (= train_cfg.max_epochs).
custom_imports = dict(imports=["backbones"], allow_failed_imports=False)

trainer = dict(
    devices=8, num_nodes=1, accelerator="auto", strategy="ddp", check_val_every_n_epoch=1, log_every_n_steps=50
)

checkpoint_callback = dict(
    monitor="bbox_mAP",
    mode="max",
    save_last=True,
    save_top_k=1,
    filename="epoch_{epoch:02d}-bbox_mAP_{bbox_mAP:.4f}",
    auto_insert_metric_name=False,
)
