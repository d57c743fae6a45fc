"""Process memory probes (Linux ``/proc``; ``resource`` elsewhere), and a model's peak memory measured alone."""

import resource
import sys


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_gib() -> float:
    """This process's peak resident memory (GiB). Linux: VmHWM of /proc/self/status. Not ru_maxrss there:
    that survives exec, so a child started from a large parent reports the parent's RSS at fork time."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib / 2**20
    # ru_maxrss: KiB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


def rss_gib() -> float:
    """This process's current resident memory (GiB); its peak where the current value cannot be read."""
    kib = _status_kib("VmRSS")
    return kib / 2**20 if kib is not None else peak_rss_gib()


def anon_rss_gib() -> float:
    """This process's resident anonymous memory (GiB: what it allocated, without the pages of its libraries'
    files); its whole RSS where that cannot be read. A growth measured in it is the growth of the process's data:
    the file pages mapped in as new code runs for the first time vary with the page cache (tens of MiB more
    in a new virtual environment, whose files were just written) and say nothing of what a loop keeps."""
    kib = _status_kib("RssAnon")
    return kib / 2**20 if kib is not None else rss_gib()


def peak_memory_gib(name: str, setting) -> float:
    """Peak memory (GiB) of iterations of one model of ``perf.models.build`` (weights, gradients and
    activations): on CUDA ``max_memory_allocated`` of one iteration in this process; on CPU the peak RSS of
    two iterations in a child process that builds only that model (compiled with ``setting.compile``), so
    that models do not share a peak.

    Args:
        name: the model's name for ``perf.models.build``.
        setting: its ``perf.models.Setting``.
    """
    import dataclasses
    import json

    import torch

    from .child import last_json, run_module
    from .models import model_and_input
    from .timing import make_step

    if not str(setting.device).startswith("cuda"):
        return last_json(run_module("perf.memory", name, json.dumps(dataclasses.asdict(setting))))["max_rss_gib"]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, x = model_and_input(name, setting)
    make_step(model, x, setting.mode, setting.precision)()
    del model, x
    return torch.cuda.max_memory_allocated() / 2**30


def _child(name: str, setting_json: str) -> None:
    """``python -m perf.memory NAME SETTING``: two iterations, then the peak RSS as the last line (JSON)."""
    import json

    import torch

    from .models import Setting, model_and_input
    from .timing import make_step

    setting = Setting(**json.loads(setting_json))
    setting.size = tuple(setting.size)
    if setting.threads:
        torch.set_num_threads(setting.threads)
    model, x = model_and_input(name, setting)
    if setting.compile and name == "ours":
        model = torch.compile(model)
    step = make_step(model, x, setting.mode, setting.precision)
    step()
    step()
    print(json.dumps({"max_rss_gib": peak_rss_gib()}))


if __name__ == "__main__":
    _child(*sys.argv[1:3])
