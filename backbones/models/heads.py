"""Classification heads on a backbone's last stage map (the official models' heads, for the families' timm models,
``backbones.timm_models``). Pure PyTorch, with the interface of timm's ``ClassifierHead``: ``fc``, ``pool_type``,
``hidden_size`` (the width that ``fc`` reads), ``reset(num_classes, pool_type)`` and ``forward(x, pre_logits)``."""

from __future__ import annotations

import torch
import torch.nn as nn

POOL_TYPES = ("avg", "max", "")


def global_pool(x: torch.Tensor, pool_type: str) -> torch.Tensor:
    """(B, C, H, W) -> (B, C) by the mean ('avg') or the maximum ('max') over positions; '' keeps the map."""
    if pool_type == "avg":
        return x.mean((2, 3))
    if pool_type == "max":
        return x.amax((2, 3))
    return x


def check_pool(num_classes: int, pool_type: str) -> None:
    if pool_type not in POOL_TYPES:
        raise ValueError(f"global_pool must be one of {list(POOL_TYPES)} ('' keeps the map); got {pool_type!r}")
    if not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"num_classes must be an int >= 0 (0: no classifier); got {num_classes!r}")
    if pool_type == "" and num_classes:
        raise ValueError(
            f"global_pool='' (no pooling) needs num_classes=0: a linear classifier reads pooled features; got "
            f"num_classes={num_classes}"
        )


class LinearHead(nn.Module):
    """Global pool, dropout, linear classifier (``fc``; an identity with ``num_classes=0``)."""

    def __init__(self, channels: int, num_classes: int = 1000, pool_type: str = "avg", drop_rate: float = 0.0):
        super().__init__()
        check_pool(num_classes, pool_type)
        self.hidden_size, self.pool_type = channels, pool_type
        self.drop = nn.Dropout(drop_rate)
        self.fc = self._classifier(num_classes)

    def _classifier(self, num_classes: int) -> nn.Module:
        if not num_classes:
            return nn.Identity()
        fc = nn.Linear(self.hidden_size, num_classes)
        nn.init.trunc_normal_(fc.weight, std=0.02)  # both official models' initialisation
        nn.init.zeros_(fc.bias)
        return fc

    def reset(self, num_classes: int, pool_type: str | None = None) -> None:
        """A new classifier for ``num_classes`` (0: none), and ``pool_type`` if given."""
        pool_type = self.pool_type if pool_type is None else pool_type
        check_pool(num_classes, pool_type)
        self.pool_type = pool_type
        self.fc = self._classifier(num_classes)

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """What ``fc`` reads, before the dropout: the pooled map."""
        return global_pool(x, self.pool_type)

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.pre_logits(x)
        return x if pre_logits else self.fc(self.drop(x))
