"""A backbone plus a linear output head.

Every ddpd network is `head(hidden(x, t))`. Exposing `hidden` and `head` separately
lets a sampler that denoises one position per step (Algorithm 1) apply the [H, V]
head at the chosen positions only (`ddpd.ops.sample_from_hidden` takes the hidden
states of those positions and `head.weight`, `head.bias`) instead of at all D.

Dtypes: `hidden` returns the dtype of the weights, under autocast too (the residual
stream starts at the embedding, which autocast leaves in the weights' dtype, and its
adds promote the blocks' autocast outputs to it); `forward` always returns float32 logits,
so a sampler's own arithmetic stays float32 whatever precision the network runs in.

Class labels: every network takes `labels=` as a keyword (Long[B] in [0, C], C =
`null_label`; None = the null label), accepted only when `config.num_classes` = C > 0.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.nn as nn

from ddpd.models.backbone import Backbone, init_linear
from ddpd.models.config import TransformerConfig

Labels = Optional[Union[torch.Tensor, int]]


def require_config(config: Any, kind: str, **expected: Any) -> None:
    """Raise if `config` is not a TransformerConfig whose fields equal `expected`.

    Args:
        config: the configuration to check.
        kind: the network's kind, for the message.
        **expected: field name -> the value the kind needs, or a function of the config that
            gives it (called after the type check: another type has no fields to read).

    Raises:
        TypeError: `config` is not a TransformerConfig.
        ValueError: a field differs from its expected value.
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config: expected TransformerConfig, got {type(config).__name__}")
    for field, value in expected.items():
        value = value(config) if callable(value) else value
        actual = getattr(config, field)
        if actual != value:
            raise ValueError(f"config.{field}: a {kind} model expects {value!r}, got {actual!r}")


class HeadModel(nn.Module):
    """Backbone + nn.Linear(d_model, out_dim) head; forward(x, t) -> [B, D, out_dim] float32."""

    kind = "head"

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.head = nn.Linear(config.d_model, config.out_dim)
        init_linear(self.head)

    @property
    def null_label(self) -> Optional[int]:
        """The label id meaning "no class" (classifier-free guidance), None without classes."""
        return self.config.num_classes if self.config.num_classes else None

    def hidden(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None, *,
               labels: Labels = None) -> torch.Tensor:
        """Hidden states after the final norm, [B, D, d_model]; t ignored if not time-conditioned.

        Args:
            x: Long[B, D] token ids in [0, config.vocab_size).
            t: Float[B] times in [0, 1] (or a number for every row); required when the model is
                time-conditioned.
            labels: Long[B] class ids in [0, num_classes] (or an int for every row); None: the
                null label.

        Returns:
            The hidden states, [B, D, d_model], in the dtype of the weights.

        Raises:
            TypeError, ValueError: `x`, `t` or `labels` of the wrong type, shape or range.
        """
        return self.backbone.hidden(x, t, labels=labels)

    def forward(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None, *,
                labels: Labels = None) -> torch.Tensor:
        """The network's float32 logits: the output head applied to `hidden`.

        Args:
            x: Long[B, D] token ids in [0, config.vocab_size).
            t: Float[B] times in [0, 1] (or a number for every row); required when the model is
                time-conditioned.
            labels: Long[B] class ids in [0, num_classes] (or an int for every row); None: the
                null label.

        Returns:
            Float[B, D, out_dim] float32 logits (for a denoiser, over the V clean values).

        Raises:
            TypeError, ValueError: `x`, `t` or `labels` of the wrong type, shape or range.
        """
        return self.head(self.hidden(x, t, labels=labels)).float()
