# Lightning sections shared by the ADE20K configs (listed next to the mmseg base(s) in
# `_base_`; the mmseg configs define none of these keys). 4 GPUs x 4 images
# (train_dataloader.batch_size=4 from the mmseg base), iteration-based. Each config adds
# precision, sync_batchnorm, max_steps (= train_cfg.max_iters) and val_check_interval
# (= train_cfg.val_interval).
custom_imports = dict(imports=["backbones"], allow_failed_imports=False)

trainer = dict(
    devices=4, num_nodes=1, accelerator="auto", strategy="ddp", check_val_every_n_epoch=None, log_every_n_steps=50
)

checkpoint_callback = dict(
    monitor="mIoU",
    mode="max",
    save_last=True,
    save_top_k=1,
    filename="iter_{step:06d}-mIoU_{mIoU:.4f}",
    auto_insert_metric_name=False,
)

# The total batch size the configs' lr was set for (4 GPUs x 4 images); tools/train.py --auto-scale-lr
# scales the lr to the real one (as mmdet's COCO bases do with 16). Off unless the flag is given.
auto_scale_lr = dict(enable=False, base_batch_size=16)
