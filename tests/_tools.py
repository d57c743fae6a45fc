"""Paths and tool loading shared by the tests that run the command-line tools."""
import importlib.util
import os.path as osp

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET_CFG = osp.join(REPO, 'configs/demo/mask-rcnn_stvit-t_fpn_tiny-coco.py')
SEG_CFG = osp.join(REPO, 'configs/demo/upernet_hat-net-t_tiny-ade20k.py')


def load_tool(name):
    # tools/ is not a package (and tools/test.py would shadow the stdlib ``test``): load by path
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', osp.join(REPO, 'tools', f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flat_metrics(metrics: dict) -> dict:
    """An evaluator's metrics with ``per_class`` spread into ``per_class/METRIC/CLASS`` keys (None -> NaN), for
    ``pytest.approx(..., nan_ok=True)``, which refuses nested dicts."""
    flat = {k: v for k, v in metrics.items() if k != 'per_class'}
    for metric, values in (metrics.get('per_class') or {}).items():
        flat.update({f'per_class/{metric}/{c}': float('nan') if v is None else v for c, v in values.items()})
    return flat
