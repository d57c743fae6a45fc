"""The GPU report (tools/gpu_report.py): its plans, models and budget (``plan``), its ``sections`` and its
``markdown``. Needs only torch, ``backbones`` and this package."""
