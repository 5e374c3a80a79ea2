"""A backbone plus a linear output head, with the head applicable at chosen positions.

Every ddpd network is `head(hidden(x, t))`. Exposing `hidden` and `head` separately
lets a sampler that denoises one position per step (Algorithm 1) apply the
[H, V] head at that position only, via `logits_at`, instead of at all D positions.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ddpd.models.backbone import Backbone, init_linear
from ddpd.models.config import TransformerConfig


def require_config(config: Any, kind: str, **expected: Any) -> None:
    """Raise if `config` is not a TransformerConfig whose fields equal `expected`."""
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config: expected TransformerConfig, got {type(config).__name__}")
    for field, value in expected.items():
        actual = getattr(config, field)
        if actual != value:
            raise ValueError(f"config.{field}: a {kind} model expects {value!r}, got {actual!r}")


class HeadModel(nn.Module):
    """Backbone + nn.Linear(d_model, out_dim) head; forward(x, t) -> [B, D, out_dim]."""

    kind = "head"

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.head = nn.Linear(config.d_model, config.out_dim)
        init_linear(self.head)

    def hidden(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None) -> torch.Tensor:
        """Hidden states after the final norm, [B, D, d_model]; t ignored if not time-conditioned."""
        return self.backbone.hidden(x, t)

    def logits_at(self, hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Head applied at positions index: Long[B, k] of hidden [B, D, H] -> [B, k, out_dim].

        Equals forward(x, t).gather(1, index) without computing the other D - k positions."""
        self._check_gather(hidden, index)
        picked = hidden.gather(1, index[:, :, None].expand(-1, -1, hidden.shape[-1]))
        return self.head(picked)

    def forward(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None) -> torch.Tensor:
        return self.head(self.hidden(x, t))

    def _check_gather(self, hidden: torch.Tensor, index: torch.Tensor) -> None:
        width = self.config.d_model
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[-1] != width:
            shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"hidden: expected shape [B, D, {width}], got {shape}")
        if not isinstance(index, torch.Tensor) or index.dtype != torch.long:
            got = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
            raise TypeError(f"index: expected a torch.int64 tensor, got {got}")
        if index.dim() != 2 or index.shape[0] != hidden.shape[0]:
            raise ValueError(f"index: expected shape [{hidden.shape[0]}, k], got {tuple(index.shape)}")
        if index.device.type == "cpu" and index.numel() > 0:
            low, high = int(index.min()), int(index.max())
            if low < 0 or high >= hidden.shape[1]:
                raise ValueError(f"index: expected positions in [0, {hidden.shape[1]}), got range [{low}, {high}]")
