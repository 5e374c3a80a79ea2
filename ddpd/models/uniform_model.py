"""Single uniform-diffusion model p_theta(x_1^d | x_t) (DFM-Uni in the paper).

Same shapes as the UniformDenoiser but trained on every position (eq:reverse_rate):
it does not know which positions are noise. prop:generative_rate_decomposition
splits it into a planner p(z^d = N | x_t) (eq:corruption_prob) and a denoiser
(eq:denoising_prob); `ddpd.process.planner_prob_from_uniform` and
`denoiser_prob_from_uniform` do the split.
"""
from __future__ import annotations

from ddpd.models.base import HeadModel, require_config
from ddpd.models.config import TransformerConfig


class UniformModel(HeadModel):
    """model(x: Long[B, D] in [0, V), t: Float[B]) -> Float[B, D, V] logits of p(x_1^d | x_t)."""

    kind = "uniform"

    def __init__(self, config: TransformerConfig):
        require_config(config, self.kind, vocab_size=lambda c: c.out_dim, causal=False)
        super().__init__(config)
