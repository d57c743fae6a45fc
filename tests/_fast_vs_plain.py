"""Run a backbone on its fast paths and, on a copy with the same weights, on its plain formulation
(``backbones.fast_paths(False)``), for tests that compare the two."""

from __future__ import annotations

import copy

import torch

from backbones import fast_paths


def outputs_and_grads(model: torch.nn.Module, x: torch.Tensor):
    """Run ``model`` (fast paths as they are set) and a deep copy of it with fast paths off on x, and
    backpropagate the same random weighting of their outputs (with a plain sum some gradients are
    analytically zero, e.g. through HAT-Net's last GroupNorm, and comparing rounding noise relative to its own
    scale is meaningless). Returns the two output tuples and (name, grad, plain grad) for every parameter."""
    plain = copy.deepcopy(model)
    outs = model(x)
    weights = [torch.randn_like(o) for o in outs]
    sum((o * w).sum() for o, w in zip(outs, weights)).backward()
    with fast_paths(False):
        plain_outs = plain(x)
        sum((o * w).sum() for o, w in zip(plain_outs, weights)).backward()
    grads = [(n, p.grad, q.grad) for (n, p), q in zip(model.named_parameters(), plain.parameters())]
    return outs, plain_outs, grads
