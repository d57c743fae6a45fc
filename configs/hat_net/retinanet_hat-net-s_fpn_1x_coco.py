# RetinaNet + FPN, 1x schedule (12 epochs), HAT-Net-S backbone, COCO 2017.
#
# Recipe: PVT's RetinaNet 1x (mmdet's `pvt/retinanet_pvt-s_fpn_1x_coco.py`): AdamW lr 1e-4,
# weight decay 1e-4, 500-iteration warm-up, lr x0.1 at epochs 8 and 11, 8 GPUs x 2
# images, 1333x800. Inherits the STViT-S RetinaNet config (mmdet's RetinaNet R-50 1x
# base, stages 2-4 into an FPN with P6/P7 from C5, see there); backbone, optimizer,
# warm-up and trainer settings are replaced. Backbone choices: see
# mask-rcnn_hat-net-s_fpn_1x_coco.py.
_base_ = ["../stvit/retinanet_stvit-s_fpn_1x_coco.py", "../_base_/models/hat-net-s.py"]

model = dict(backbone=dict(_base_.pop("hatnet_s_backbone"), out_indices=(1, 2, 3)))  # neck as STViT-S

param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type="MultiStepLR", begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]

optim_wrapper = _base_.pop("hatnet_optim_wrapper")

trainer = dict(precision="32-true", sync_batchnorm=False)
