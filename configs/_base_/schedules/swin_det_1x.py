# Swin's detection 1x schedule (12 epochs): 1000-iteration linear warm-up from 0.001 x lr,
# lr x0.1 at epochs 8 and 11. The mmdet bases already define `param_scheduler`, so the list is
# carried under its own name and taken out with
#     param_scheduler = _base_.pop('swin_det_1x_param_scheduler')
# (see ../models/stvit-s.py for why pop).
swin_det_1x_param_scheduler = [
    dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type="MultiStepLR", begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
