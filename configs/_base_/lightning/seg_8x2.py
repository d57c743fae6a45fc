# Lightning sections of the ADE20K configs trained on 8 GPUs x 2 images (Mask2Former; listed next to the mmseg
# base in `_base_`, which defines none of these keys; train_dataloader.batch_size=2 from the base). Iteration-based:
# each config adds precision, sync_batchnorm, max_steps (= train_cfg.max_iters) and val_check_interval
# (= train_cfg.val_interval), and `custom_imports` (mmseg's base defines it: mmengine refuses a key that two
# bases define).

trainer = dict(
    devices=8, num_nodes=1, accelerator="auto", strategy="ddp", check_val_every_n_epoch=None, log_every_n_steps=50
)

checkpoint_callback = dict(
    monitor="mIoU",
    mode="max",
    save_last=True,
    save_top_k=1,
    filename="iter_{step:06d}-mIoU_{mIoU:.4f}",
    auto_insert_metric_name=False,
)
