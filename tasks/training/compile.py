"""The config's ``compile`` key (mmengine's switch): ``True`` or ``dict(...)`` of ``torch.compile`` arguments.

mmengine wraps the whole ``model.train_step`` in ``torch.compile``. Here the backbone and the neck are compiled,
each in place (``nn.Module.compile``: the parameter names, so checkpoints, stay the same): they are the regular
tensor code where the time goes, while the rest of an mm detector (RPN proposal sampling, RoI assignment,
data samples, NMS in mmcv's ops) is Python over lists and per-image shapes, where dynamo breaks the graph and
meets a new number of boxes at every step. The backbone's figures against eager
(``perf/training/compile_step.py``, whose ``--targets model`` compiles the whole model for comparison) are in
docs/measuring.md#torchcompile.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

import backbones

# torch.compile's keyword arguments (the first parameter is the model)
COMPILE_ARGS = tuple(list(inspect.signature(torch.compile).parameters)[1:])


def compile_options(spec) -> dict | None:
    """The ``torch.compile`` keyword arguments of the config's ``compile`` value, or None when it is off.

    Args:
        spec: ``None`` / ``False`` (off), ``True`` (torch's defaults: inductor) or a dict of ``torch.compile``
            arguments (``backend``, ``mode``, ``dynamic``, ``fullgraph``, ``options``...).

    Raises:
        ValueError: an unknown argument or backend, or inductor without a C++ compiler.
    """
    if spec is None or spec is False:
        return None
    if spec is True:
        options = {}
    elif isinstance(spec, dict):
        options = dict(spec)
    else:
        raise ValueError(f"compile must be True, False or a dict of torch.compile arguments, got {spec!r}")
    unknown = sorted(set(options) - set(COMPILE_ARGS))
    if unknown:
        raise ValueError(f"compile: unknown torch.compile argument(s) {unknown}. Valid: {', '.join(COMPILE_ARGS)}")
    backend = options.get("backend") or "inductor"
    if isinstance(backend, str):
        import torch._dynamo

        backends = torch._dynamo.list_backends(exclude_tags=())
        if backend not in backends:
            raise ValueError(f"compile.backend={backend!r} is not a torch.compile backend; these are: {backends}")
    if backend == "inductor":
        _check_cpp_compiler()
    return options


def _check_cpp_compiler() -> None:
    """Inductor compiles its CPU kernels (and its wrappers on GPU) with a C++ compiler: say so before training."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # noqa: BLE001 - torch raises its own InvalidCxxCompiler (or a RuntimeError)
        raise ValueError(
            "compile: torch.compile's default backend (inductor) needs a C++ compiler (g++ or clang++ on the PATH, "
            "or the CXX environment variable), and none was found. Install one, or set "
            "compile=dict(backend='aot_eager') (graph capture without generated kernels), or compile=False."
        ) from e


def compile_model(model: nn.Module, spec) -> list[str]:
    """Compile the backbone and the neck of an mm model in place, as the config's ``compile`` asks; the
    backbones' fast paths are switched off (``backbones.set_fast_paths(False)``) for the process.

    Args:
        model: the mm detector / segmentor.
        spec: the config's ``compile`` value (see ``compile_options``).

    Returns:
        The names of the compiled submodules (empty when ``compile`` is off).
    """
    options = compile_options(spec)
    if options is None:
        return []
    # The backbones' fast paths (channels_last layout and views over it, tuned for eager CPU) are switched off for
    # the process: AOT autograd replays their views on tensors of other strides and fails ("view size is not
    # compatible"); the compiler does its own fusion and layout choice on the plain formulation.
    backbones.set_fast_paths(False)
    names = [name for name in ("backbone", "neck") if isinstance(getattr(model, name, None), nn.Module)]
    for name in names:
        getattr(model, name).compile(**options)
    return names
