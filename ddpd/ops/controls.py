"""DrawControls: the controls of a token draw (temperature, truncation, excluded and allowed
tokens) as one object, taken by sample_categorical and sample_from_hidden and their
references. The law each control sets is in docs/ops/sample_categorical.md."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional, Union

import torch

Number = Union[int, float, torch.Tensor]


@dataclasses.dataclass(frozen=True, eq=False)
class DrawControls:
    """What a token draw may draw and how sharply; checked by the op that takes it.

    Each numeric control is a number for every row, or a tensor of the draw's leading shape
    (one value per row; a 0-d tensor applies to every row).

    Attributes:
        temperature: in [0, 1e36]; 0 draws the argmax (greedy).
        top_k: keep the k largest logits (ties at the boundary kept); None or 0: off.
        top_p: keep the smallest upper set of mass >= top_p, in (0, 1]; None or 1: off.
        min_p: keep the tokens with p >= min_p * p_max, in [0, 1]; None or 0: off.
        exclude_ids: tokens no row may draw (ints or an integer tensor).
        exclude_per_row: Long[...] one more excluded token per row.
        allowed: Bool[..., V] the tokens each row may draw.

    Example:
        >>> sample_categorical(logits, controls=DrawControls(temperature=0.7, top_p=0.9), seed=0)
    """
    temperature: Number = 1.0
    top_k: Optional[Number] = None
    top_p: Optional[Number] = None
    min_p: Optional[Number] = None
    exclude_ids: Optional[Union[Sequence[int], torch.Tensor]] = None
    exclude_per_row: Optional[torch.Tensor] = None
    allowed: Optional[torch.Tensor] = None
