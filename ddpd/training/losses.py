"""Training objectives of thm:training_objective and of the baselines.

The theorem trains a planner (binary cross-entropy of p_theta(z_t^d | x_t)) and a
denoiser (cross-entropy of p_theta(x_1^d | x_t, z_t^d = N) at the noisy positions), each
weighted by alpha_dot_t / (1 - alpha_t). The default drops that prefactor, as the paper's
implementation does. Passing `rate` gives the weighted forms: the denoiser's is the ELBO's
denoising term in nats per sequence; the planner's is a surrogate of the ELBO's planner
term with the same minimiser, not its value. Losses are computed in float32.

docs/training.md ("Objectives") has the details."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ddpd.validation import value_range, values_checkable


def _check_tensor(name: str, value, dim: int, floating: Optional[bool] = None, dtype=None) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if value.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dimensions, got shape {tuple(value.shape)}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {value.dtype}")
    if dtype is not None and value.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {value.dtype}")


def _check_same_shape(name: str, value: torch.Tensor, shape: torch.Size) -> None:
    if value.shape != shape:
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(value.shape)}")


def _check_rate(rate: Optional[torch.Tensor], batch: int) -> None:
    if rate is None:
        return
    _check_tensor("rate", rate, 1, floating=True)
    _check_same_shape("rate", rate, torch.Size([batch]))
    if values_checkable(rate):
        low = value_range(rate)[0]  # NaN where any rate is
        if not low >= 0:  # inf passes: the linear schedule's rate at t = 1
            raise ValueError(f"rate: expected values >= 0 (alpha_dot / (1 - alpha)), got a minimum of {low}")


def _check_targets(name: str, x: torch.Tensor, shape: torch.Size, num_classes: int) -> None:
    _check_tensor(name, x, 2, dtype=torch.long)
    _check_same_shape(name, x, shape)
    if values_checkable(x):
        low, high = value_range(x)
        if low < 0 or high >= num_classes:
            raise ValueError(f"{name}: expected ids in [0, {num_classes}) (the logits' last dim), "
                             f"got range [{low}, {high}]")


def _token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[target] per position: [B, D, V], [B, D] -> [B, D]."""
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return ce.view(targets.shape)


REDUCTIONS = ("mean", "sum")


def _reduced(per_position: torch.Tensor, count, rate: Optional[torch.Tensor], reduction: str) -> torch.Tensor:
    """mean: the sum of per_position's terms over `count` of them, or with rate
    E_batch[ rate * sum_d per_position ] (the theorem's weighted form, per sequence); sum: the
    numerator alone, for a mean over several batches (a training step's micro-batches and
    processes), which a mean of their means is not where their counts differ. An int count
    of 0 (an empty batch) divides by 1: the mean is 0, not NaN, as for a tensor count >= 1."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if rate is not None:
        total, count = (rate.float() * per_position.sum(-1)).sum(), per_position.shape[0]
    else:
        total = per_position.sum()
    return total if reduction == "sum" else total / (max(count, 1) if isinstance(count, int) else count)


def planner_loss(logits: torch.Tensor, z_t: torch.Tensor, rate: Optional[torch.Tensor] = None,
                 reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy of planner logits [B, D] against z_t [B, D] (bool, True = noise).

    Default: mean over all B * D positions. With rate: E_b[rate_b * sum_d BCE_bd], the
    theorem's surrogate of the ELBO's planner term: the same minimiser, not ELBO nats.
    reduction="sum": the mean's numerator (docs/training.md, "Objectives").

    Args:
        logits: Float[B, D] planner logits.
        z_t: Bool[B, D], True where the position is noise.
        rate: Float[B] alpha_dot / (1 - alpha) at each sequence's t, or None.
        reduction: "mean" or "sum".

    Returns:
        A scalar float32 loss.

    Raises:
        TypeError, ValueError: inputs of the wrong type, dtype or shape (a negative or NaN rate,
            checked on CPU), or an unknown reduction.
    """
    _check_tensor("logits", logits, 2, floating=True)
    _check_tensor("z_t", z_t, 2, dtype=torch.bool)
    _check_same_shape("z_t", z_t, logits.shape)
    _check_rate(rate, logits.shape[0])
    bce = F.binary_cross_entropy_with_logits(logits.float(), z_t.float(), reduction="none")
    return _reduced(bce, bce.numel(), rate, reduction)


def denoiser_loss(logits: torch.Tensor, x1: torch.Tensor, z_t: torch.Tensor,
                  rate: Optional[torch.Tensor] = None, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of denoiser logits [B, D, V] against clean x1 [B, D] at the corrupted
    positions z_t [B, D] (bool, True = noise).

    Default: mean over the corrupted positions of the whole batch (0, with a zero
    gradient, when none is corrupted). With rate: E_b[rate_b * sum_{d: z=N} CE_bd], where a
    sequence without a corrupted position adds 0 whatever its rate (the linear schedule's
    is inf at t = 1). reduction="sum": the mean's numerator (docs/training.md, "Objectives").

    Args:
        logits: Float[B, D, V] denoiser logits.
        x1: Long[B, D] clean tokens in [0, V).
        z_t: Bool[B, D], True where the position is noise.
        rate: Float[B] alpha_dot / (1 - alpha) at each sequence's t, or None.
        reduction: "mean" or "sum".

    Returns:
        A scalar float32 loss.

    Raises:
        TypeError, ValueError: inputs of the wrong type, dtype, shape or range (a negative or
            NaN rate, checked on CPU), or an unknown reduction.
    """
    _check_tensor("logits", logits, 3, floating=True)
    _check_targets("x1", x1, logits.shape[:2], logits.shape[-1])
    _check_tensor("z_t", z_t, 2, dtype=torch.bool)
    _check_same_shape("z_t", z_t, logits.shape[:2])
    _check_rate(rate, logits.shape[0])
    # where, not multiply: a non-finite CE at a clean position stays out of the loss; its
    # gradient is NaN still (0 * NaN; masking the logits first would copy all of them), and
    # the trainer refuses to save non-finite weights
    ce = torch.where(z_t, _token_cross_entropy(logits, x1), 0.0)
    if rate is not None:  # where, not rate * 0: an inf rate of an all-clean sequence would make NaN
        rate = torch.where(z_t.any(-1), rate.float(), 0.0)
    # clamp: an all-clean batch gives 0 / 1 instead of 0 / 0, and no host sync
    return _reduced(ce, z_t.sum().clamp(min=1), rate, reduction)


def uniform_model_loss(logits: torch.Tensor, x1: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of p_theta(x_1 | x_t) logits [B, D, V] against x1 [B, D], mean over
    all positions (DFM-Uni: the model is not told which positions are noise); sum with
    reduction="sum".

    Args:
        logits: Float[B, D, V] logits of p_theta(x_1 | x_t).
        x1: Long[B, D] clean tokens in [0, V).
        reduction: "mean" or "sum".

    Returns:
        A scalar float32 loss.

    Raises:
        TypeError, ValueError: inputs of the wrong type, dtype, shape or range, or an unknown
            reduction.
    """
    _check_tensor("logits", logits, 3, floating=True)
    _check_targets("x1", x1, logits.shape[:2], logits.shape[-1])
    return _reduced(_token_cross_entropy(logits, x1), x1.numel(), None, reduction)


def ar_loss(logits: torch.Tensor, x: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy: logits [B, D, V] at position d against x[:, d + 1],
    mean over the B * (D - 1) predicted tokens (sum with reduction="sum"). x may start
    with a BOS id >= V, since position 0 is never a target.

    Args:
        logits: Float[B, D, V] next-token logits.
        x: Long[B, D] tokens (D >= 2).
        reduction: "mean" or "sum".

    Returns:
        A scalar float32 loss.

    Raises:
        TypeError, ValueError: inputs of the wrong type, dtype or shape, or fewer than 2 tokens.
    """
    _check_tensor("logits", logits, 3, floating=True)
    _check_tensor("x", x, 2, dtype=torch.long)
    _check_same_shape("x", x, logits.shape[:2])
    if x.shape[1] < 2:
        raise ValueError(f"x: expected at least 2 tokens per sequence, got {x.shape[1]}")
    _check_targets("x[:, 1:]", x[:, 1:], x[:, 1:].shape, logits.shape[-1])
    return _reduced(_token_cross_entropy(logits[:, :-1], x[:, 1:]), x[:, 1:].numel(), None, reduction)
