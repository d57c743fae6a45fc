"""Process memory probes (Linux ``/proc``; ``resource`` elsewhere)."""

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
