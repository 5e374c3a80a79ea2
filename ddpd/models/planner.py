"""Planner p_theta(z_t^d = N | x_t): one logit per position that it is still noise.

Input: a uniform-noise sequence x_t over V symbols, NO time input (paper, appendix
'Implementation details': with t the planner could read the noise level off the
clock instead of the sequence). Trained by binary cross-entropy against z_t
(thm:training_objective, `ddpd.training.losses.planner_loss`); its sigmoid is the
"prob. of corruption" factor of the jump rate in eq:jump_rate_parameterization.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from ddpd.models.base import HeadModel, Labels, require_config
from ddpd.models.config import TransformerConfig


class Planner(HeadModel):
    """planner(x: Long[B, D]) -> Float[B, D] float32 logits of "position d is noise".

    With config.num_classes > 0 the planner is class-conditional: planner(x, labels=y)
    (the paper's ImageNet setting leaves the choice to the user; None = null label)."""

    kind = "planner"

    def __init__(self, config: TransformerConfig):
        require_config(config, self.kind, out_dim=1, time_conditioned=False, causal=False)
        super().__init__(config)

    def hidden(self, x: torch.Tensor, t: Optional[Union[torch.Tensor, float]] = None, *,
               labels: Labels = None) -> torch.Tensor:
        """Hidden states [B, D, d_model]; t is accepted for a uniform signature and ignored.

        Args:
            x: Long[B, D] token ids.
            t: ignored (the planner has no time input).
            labels: Long[B] class ids, an int, or None (the null label).

        Returns:
            The hidden states, [B, D, d_model].
        """
        return self.backbone.hidden(x, labels=labels)

    def forward(self, x: torch.Tensor, *, labels: Labels = None) -> torch.Tensor:
        """Logits of p(z^d = N | x): "position d is noise", per position.

        Args:
            x: Long[B, D] token ids in [0, V).
            labels: Long[B] class ids, an int, or None (the null label).

        Returns:
            Float[B, D] float32 logits.

        Raises:
            TypeError, ValueError: `x` or `labels` of the wrong type, shape or range.
        """
        return self.head(self.backbone.hidden(x, labels=labels)).squeeze(-1).float()
