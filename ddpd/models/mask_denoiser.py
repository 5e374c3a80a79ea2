"""Mask-diffusion denoiser p_theta(x_1^d | x_t) for x_t^d = mask (MaskD in the paper).

Input vocabulary V + 1: ids 0..V-1 are clean tokens, id V is the mask token, which
therefore has its own embedding row. Output: V logits per position, never one for
the mask. The rate of eq:trans_prob_decomp_mask uses it at masked positions only;
with a planner it also serves as the uniform denoiser through prop:draw_with_maskD
(mask the positions the planner believes are noise, then denoise).
"""
from __future__ import annotations

from ddpd.models.base import HeadModel, require_config
from ddpd.models.config import TransformerConfig


class MaskDenoiser(HeadModel):
    """denoiser(x: Long[B, D] in [0, V], t: Float[B]) -> Float[B, D, V] logits; mask id = V."""

    kind = "mask-denoiser"

    def __init__(self, config: TransformerConfig):
        require_config(config, self.kind, vocab_size=lambda c: c.out_dim + 1, causal=False)
        super().__init__(config)

    @property
    def mask_id(self) -> int:
        return self.config.out_dim
