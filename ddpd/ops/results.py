"""The ops' results: one NamedTuple per kind of op, of fixed arity whatever the flags of a
call (a field not asked for is None). Unpack by name (`draw.tokens`) or by position.
Which op returns which: docs/ops/README.md."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class Draw(NamedTuple):
    """A draw of one token (or k indices) per row.

    Returned by sample_categorical, sample_from_hidden, multinomial,
    multinomial_from_logits and categorical_from_weights, and by their references.

    Attributes:
        tokens: Long[...] the drawn tokens (multinomial: Long[B, k] indices), 0 in invalid rows.
        valid: Bool[...] False where a row had nothing to draw.
        logprob: Float[...] the drawn token's log-probability under the tempered, truncated
            law; None unless return_logprob=True.
        confidence: Float[...] the confidence asked for ("prob", "margin", "entropy"); None
            unless confidence= was given.
    """
    tokens: torch.Tensor
    valid: torch.Tensor
    logprob: Optional[torch.Tensor] = None
    confidence: Optional[torch.Tensor] = None


class Selection(NamedTuple):
    """The positions a planner chooses to denoise (planner_select).

    Attributes:
        positions: Long[B, k] chosen positions, in draw order.
        sum_p: Float[B] the sum over positions of the planner's probability of noise.
        stop: Bool[B] True where every position's probability is below eps.
    """
    positions: torch.Tensor
    sum_p: torch.Tensor
    stop: torch.Tensor


class Mask(NamedTuple):
    """The mask of prop:draw_with_maskD (planner_mask).

    Attributes:
        masked: Long[B, D] x with mask_id where z is set.
        z: Bool[B, D] the drawn noise indicators.
        count: Long[B] z.sum(1).
    """
    masked: torch.Tensor
    z: torch.Tensor
    count: torch.Tensor


class Plan(NamedTuple):
    """A Selection and the Mask drawn with it, from one pass (planner_select_mask).

    Attributes:
        positions: Long[B, k] chosen positions, in draw order.
        sum_p: Float[B] the sum over positions of the planner's probability of noise.
        stop: Bool[B] True where every position's probability is below eps.
        masked: Long[B, D] x with mask_id where z is set.
        z: Bool[B, D] the drawn noise indicators, set at the chosen positions except one
            chosen with weight 0 (logit -inf or NaN, picked when fewer than k have weight),
            which is not denoised.
        count: Long[B] z.sum(1).
    """
    positions: torch.Tensor
    sum_p: torch.Tensor
    stop: torch.Tensor
    masked: torch.Tensor
    z: torch.Tensor
    count: torch.Tensor


class Compacted(NamedTuple):
    """Rows packed into a fixed capacity (compact_fixed).

    Attributes:
        tensors: tuple of the given tensors' active rows, each with `capacity` rows (zeros past count).
        index: Long[capacity] the source row of each packed row, -1 past count.
        count: Long[] the number of active rows (may exceed capacity).
    """
    tensors: tuple
    index: torch.Tensor
    count: torch.Tensor
