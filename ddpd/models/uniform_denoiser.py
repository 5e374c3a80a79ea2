"""Noise-conditioned uniform denoiser p_theta(x_1^d | x_t, z_t^d = N) (UniD in the paper).

Given a uniform-noise sequence x_t over V symbols and t, predicts the clean value of
position d under the hypothesis that d is corrupted (eq:denoising_prob); j = x_t^d is
a legitimate answer, since uniform noise can land on the clean value. Trained by
cross-entropy over the corrupted positions only (thm:training_objective,
`ddpd.training.losses.denoiser_loss`). Paired with the Planner it gives the jump rate
of eq:jump_rate_parameterization.
"""
from __future__ import annotations

from ddpd.models.base import HeadModel, require_config
from ddpd.models.config import TransformerConfig


class UniformDenoiser(HeadModel):
    """denoiser(x: Long[B, D] in [0, V), t: Float[B]) -> Float[B, D, V] logits."""

    kind = "uniform-denoiser"

    def __init__(self, config: TransformerConfig):
        require_config(config, self.kind, vocab_size=lambda c: c.out_dim, causal=False)
        super().__init__(config)
