r"""Per-sequence evidence lower bounds (ELBO) of DDPD and its baselines, Monte-Carlo.

Appendix 'Evaluating the ELBO' (eq. elbo_jensen_inequality_ours, eq. randon-niko-ours):
log p_theta(x_1) >= prior + rate matching + transitioning, estimated with one position
forced to be noise (ddpd.eval.corruption) so the integrand stays bounded, truncated at
t_max with a final factorised emission, and for a mask denoiser with a planner one draw
of the planned mask inside the logarithm (still a bound, by Jensen).

All terms are in nats per sequence; `ElboTerms.bits` gives bits per token. The
derivation of each term and estimator is in docs/evaluation.md ("The ELBO")."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ddpd.eval import corruption as C
from ddpd.eval.checks import (
    at,
    check_callable,
    check_choice,
    check_int,
    check_row_ids,
    check_tokens,
    log_probs,
    planner_logits,
)
from ddpd.eval.planned_mask import planned_mask_log_probs
from ddpd.ops.rng import happens
from ddpd.process import Schedule, get_schedule, planner_log_prob_from_uniform
from ddpd.validation import check_float

DEFAULT_T_MAX = 1.0 - 1e-3
DENOISER_TYPES = ("uniform", "mask")
MASKS = ("planner", "true")
TERMS = ("rate_matching", "planning", "denoising", "final", "transitioning", "elbo")


@dataclass
class ElboTerms:
    """ELBO terms per sequence in nats, Float[B] each; log-likelihood sign (higher is better).

    transitioning = planning + denoising + final; elbo = rate_matching + transitioning.
    """

    rate_matching: Tensor
    planning: Tensor
    denoising: Tensor
    final: Tensor
    length: int

    @property
    def transitioning(self) -> Tensor:
        """The transitioning term with the final emission, nats per sequence.

        Returns:
            Float[B].
        """
        return self.planning + self.denoising + self.final

    @property
    def elbo(self) -> Tensor:
        """The bound: rate matching + transitioning, nats per sequence.

        Returns:
            Float[B].
        """
        return self.rate_matching + self.transitioning

    def bits(self) -> dict[str, Tensor]:
        """Every term as a cost in bits per token, -term / (D ln 2), Float[B] each.

        Returns:
            term name -> Float[B] bits per token.
        """
        scale = -1.0 / (self.length * math.log(2.0))
        return {name: getattr(self, name) * scale for name in TERMS}


@dataclass
class _Corrupted:
    x_t: Tensor
    z: Tensor
    alpha: Tensor
    t: Tensor
    weight: Tensor  # a * D / k: turns a sum over positions into the integral's estimate


class _Estimator:
    """Checked settings and the seeded draws shared by every ELBO estimator."""

    def __init__(self, x1: Tensor, vocab_size: int, mc_samples: int, t_max: float,
                 schedule: Union[str, Schedule], seed: int, row_ids: Optional[Tensor]):
        self.vocab_size = check_int("vocab_size", vocab_size, 2)
        self.x1 = check_tokens("x1", x1, vocab_size)
        self.samples = check_int("mc_samples", mc_samples, 1)
        self.t_max = check_float("t_max", t_max, 0.0, 1.0, open_min=True, open_max=True)
        self.schedule = get_schedule(schedule)
        self.noise = C.EvalNoise(seed)
        self.rows = check_row_ids(row_ids, x1.shape[0], x1.device)
        self.length = x1.shape[1]
        self.alpha_max = float(self.schedule.alpha(torch.tensor(self.t_max, dtype=torch.float64)))
        if not 0.0 < self.alpha_max < 1.0:
            raise ValueError(f"t_max: alpha(t_max) must be in (0, 1), got {self.alpha_max} for t_max={t_max}")
        self.s_max = -math.log1p(-self.alpha_max)

    def _u(self, m: int, stream: int, cols: int) -> Tensor:
        return self.noise.uniform(m, stream, self.rows, cols)

    def time(self, alpha: Tensor) -> Tensor:
        return self.schedule.inverse(alpha).float()

    def full(self, value: float) -> Tensor:
        return torch.full((self.x1.shape[0],), value, dtype=torch.float32, device=self.x1.device)

    def corrupted(self, m: int, noise: str, mask_id: Optional[int] = None) -> _Corrupted:
        """Sample m: alpha ~ U(0, a) (stratified), x_t with a forced noisy position."""
        alpha = self.alpha_max * self.noise.stratified(m, self.samples, C.ALPHA, self.rows)
        x_t, z, k = C.forced_corruption(self.x1, alpha, self._u(m, C.POSITION, 1)[:, 0],
                                        self._u(m, C.NOISE, self.length), self._u(m, C.VALUE, self.length),
                                        noise, self.vocab_size, mask_id)
        return _Corrupted(x_t, z, alpha, self.time(alpha), self.alpha_max * self.length / k)

    def final_state(self, m: int, noise: str, mask_id: Optional[int] = None):
        """(x, z) ~ p_{t_max|1}, the state the final emission starts from."""
        return C.marginal_corruption(self.x1, self.full(self.alpha_max), self._u(m, C.FINAL_NOISE, self.length),
                                     self._u(m, C.FINAL_VALUE, self.length), noise, self.vocab_size, mask_id)

    def clean_time(self, m: int):
        """(t, weight) for the all-clean part: s ~ U(0, s_max) stratified, weight s_max alpha^D."""
        s = self.s_max * self.noise.stratified(m, self.samples, C.CLEAN_TIME, self.rows).double()
        alpha = -torch.expm1(-s)
        weight = self.s_max * torch.exp(self.length * torch.log(alpha))
        return self.time(alpha.float()), weight.float()

    def clean_constant(self) -> float:
        """int_0^a alpha^D / (1 - alpha) dalpha = -log(1 - a) - sum_{j=1}^{D} a^j / j."""
        j = torch.arange(1, self.length + 1, dtype=torch.float64)
        return self.s_max - float((torch.exp(j * math.log(self.alpha_max)) / j).sum())

    def terms(self, totals: Tensor) -> ElboTerms:
        return ElboTerms(*(totals / self.samples), length=self.length)


def _masked_sum(values: Tensor, where: Tensor) -> Tensor:
    # where, not multiply: -inf log-probabilities at positions that do not count stay out
    return torch.where(where, values, torch.zeros_like(values)).sum(-1)


def elbo_uniform_model(
    model: Callable,
    x1: Tensor,
    vocab_size: int,
    *,
    mc_samples: int = 1,
    t_max: float = DEFAULT_T_MAX,
    schedule: Union[str, Schedule] = "linear",
    seed: int = 0,
    row_ids: Optional[Tensor] = None,
) -> ElboTerms:
    """ELBO of a single uniform-diffusion model(x, t) -> Float[B, D, V] logits of p(x_1^d | x_t).

    The terms planning / denoising split its transitioning term by
    prop:generative_rate_decomposition. Each Monte-Carlo sample takes three forward
    passes. docs/evaluation.md ("The ELBO") gives the estimator.

    Args:
        model: the uniform model, model(x, t) -> Float[B, D, V] logits.
        x1: Long[B, D] clean tokens in [0, vocab_size).
        vocab_size: V.
        mc_samples: Monte-Carlo samples a sequence.
        t_max: where the CTMC stops and the final emission starts.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        row_ids: Long[B] random-stream ids; None: 0..B-1.

    Returns:
        The ElboTerms, each Float[B] in nats.

    Raises:
        ValueError, TypeError: invalid tokens, sizes, t_max or row ids.
    """
    check_callable("model", model)
    est = _Estimator(x1, vocab_size, mc_samples, t_max, schedule, seed, row_ids)
    S = est.vocab_size
    totals = torch.zeros(4, x1.shape[0], device=x1.device)
    for m in range(est.samples):
        c = est.corrupted(m, "uniform")
        log_p = log_probs(model, c.x_t, c.t, S, "model")
        log_same = at(log_p, c.x_t)
        jumps = c.x_t != x1
        rate_matching = c.weight * (jumps.float() + torch.expm1(log_same)).sum(-1)
        log_noise = planner_log_prob_from_uniform(log_p, c.x_t, c.alpha)
        log_x1 = at(log_p, x1)
        planning = c.weight * _masked_sum(log_noise, jumps)
        denoising = c.weight * _masked_sum(log_x1 - log_noise, jumps)
        t_clean, w_clean = est.clean_time(m)
        log_same_clean = at(log_probs(model, x1, t_clean, S, "model"), x1)
        rate_matching = rate_matching + w_clean * torch.expm1(log_same_clean).sum(-1)
        x_f, _ = est.final_state(m, "uniform")
        final = at(log_probs(model, x_f, est.full(est.t_max), S, "model"), x1).sum(-1)
        totals += torch.stack((rate_matching, planning, denoising, final))
    return est.terms(totals)


def elbo_planned(
    planner: Callable,
    denoiser: Callable,
    x1: Tensor,
    vocab_size: int,
    *,
    denoiser_type: str = "uniform",
    mask: str = "planner",
    time_conditioned_planner: bool = False,
    mask_id: Optional[int] = None,
    mc_samples: int = 1,
    t_max: float = DEFAULT_T_MAX,
    schedule: Union[str, Schedule] = "linear",
    seed: int = 0,
    row_ids: Optional[Tensor] = None,
) -> ElboTerms:
    """ELBO of a planner + denoiser (eq. jump_rate_parameterization).

    planner(x) -> Float[B, D] logits of z^d = N (planner(x, t) if
    time_conditioned_planner); denoiser(x, t) -> Float[B, D, V] logits:
    denoiser_type='uniform': p(x_1^d | x_t, z^d = N) on the uniform-noise sequence;
    'mask': a mask denoiser (input mask id mask_id, default V) used through
    prop:draw_with_maskD with the planner's mask (mask='planner', a bound) or the
    true noise positions (mask='true', a diagnostic). Other arguments as in
    `elbo_uniform_model`.

    Args:
        planner: planner(x) (or planner(x, t)) -> Float[B, D] logits of z^d = N.
        denoiser: denoiser(x, t) -> Float[B, D, V] logits.
        x1: Long[B, D] clean tokens in [0, vocab_size).
        vocab_size: V.
        denoiser_type: "uniform" or "mask".
        mask: "planner" (a bound) or "true" (a diagnostic), for a mask denoiser.
        time_conditioned_planner: whether the planner takes t.
        mask_id: the mask denoiser's mask id; None: V.
        mc_samples: Monte-Carlo samples a sequence.
        t_max: where the CTMC stops and the final emission starts.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        row_ids: Long[B] random-stream ids; None: 0..B-1.

    Returns:
        The ElboTerms, each Float[B] in nats.

    Raises:
        ValueError, TypeError: invalid tokens, choices, sizes, t_max or row ids.
    """
    check_callable("planner", planner)
    check_callable("denoiser", denoiser)
    check_choice("denoiser_type", denoiser_type, DENOISER_TYPES)
    check_choice("mask", mask, MASKS)
    est = _Estimator(x1, vocab_size, mc_samples, t_max, schedule, seed, row_ids)
    mask_id = est.vocab_size if mask_id is None else check_int("mask_id", mask_id, est.vocab_size)
    q = _PlannedDenoiser(denoiser, x1, est, denoiser_type, mask, mask_id)
    clock = (lambda t: t) if time_conditioned_planner else (lambda t: None)
    totals = torch.zeros(4, x1.shape[0], device=x1.device)
    for m in range(est.samples):
        c = est.corrupted(m, "uniform")
        logits = planner_logits(planner, c.x_t, clock(c.t))
        rate_matching = c.weight * (c.z.float() - torch.sigmoid(logits)).sum(-1)
        planning = c.weight * _masked_sum(F.logsigmoid(logits), c.z)
        log_q, _ = q.log_prob(m, C.PLANNED_MASK, c.x_t, c.z, c.z, c.t, logits)
        denoising = c.weight * _masked_sum(log_q, c.z)
        if time_conditioned_planner:
            t_clean, w_clean = est.clean_time(m)
            rate_matching = rate_matching - w_clean * torch.sigmoid(planner_logits(planner, x1, t_clean)).sum(-1)
        final = _planned_final(planner, q, est, m, clock)
        totals += torch.stack((rate_matching, planning, denoising, final))
    terms = est.terms(totals)
    if not time_conditioned_planner:
        clean = est.clean_constant() * torch.sigmoid(planner_logits(planner, x1, None)).sum(-1)
        terms.rate_matching = terms.rate_matching - clean
    return terms


def _planned_final(planner: Callable, q: _PlannedDenoiser, est: _Estimator, m: int, clock) -> Tensor:
    """log p_final(x_1 | x) summed over positions, x ~ p_{t_max|1} (a lower bound for
    the planner's mask: docs/evaluation.md, "The ELBO")."""
    x, z = est.final_state(m, "uniform")
    t = est.full(est.t_max)
    logits = planner_logits(planner, x, clock(t))
    same = x == est.x1
    log_q, covered = q.log_prob(m, C.FINAL_MASK, x, z, ~same, t, logits)
    keep = torch.where(same, F.logsigmoid(-logits), torch.full_like(logits, float("-inf")))
    mixed = torch.logaddexp(keep, F.logsigmoid(logits) + torch.where(covered, log_q, torch.zeros_like(log_q)))
    return torch.where(covered, mixed, keep).sum(-1)


class _PlannedDenoiser:
    """log p(x_1^d | x, z^d = N) of the denoiser of a planner + denoiser model."""

    def __init__(self, denoiser: Callable, x1: Tensor, est: _Estimator, denoiser_type: str, mask: str,
                 mask_id: int):
        self.denoiser, self.x1, self.est = denoiser, x1, est
        self.kind = "uniform" if denoiser_type == "uniform" else f"mask-{mask}"
        self.mask_id = mask_id

    def log_prob(self, m: int, stream: int, x: Tensor, z: Tensor, need: Tensor, t: Tensor,
                 planner_logits: Tensor):
        """(log q Float[B, D], covered Bool[B, D]): log q at least where `need`.

        z: the true noise positions of x; t: its time; need: positions whose
        log-probability the caller uses (z for the transitioning term, x != x_1 in the
        final emission); covered: where log q is valid (every position for the uniform
        denoiser)."""
        S = self.est.vocab_size
        if self.kind == "uniform":
            return at(log_probs(self.denoiser, x, t, S, "denoiser"), self.x1), torch.ones_like(z)
        if self.kind == "mask-true":
            masked = torch.where(z, torch.full_like(x, self.mask_id), x)
            return at(log_probs(self.denoiser, masked, t, S, "denoiser"), self.x1), z
        u = self.est.noise.uniform(m, stream, self.est.rows, x.shape[1])
        z_planned = happens(u, torch.sigmoid(planner_logits))  # p = 1 masks at u = 1 too
        log_q = planned_mask_log_probs(self.denoiser, x, z_planned, need, self.mask_id, self.est.schedule, S)
        return at(log_q, self.x1), z_planned | need


def elbo_mask_diffusion(
    denoiser: Callable,
    x1: Tensor,
    vocab_size: int,
    *,
    mask_id: Optional[int] = None,
    mc_samples: int = 1,
    t_max: float = DEFAULT_T_MAX,
    schedule: Union[str, Schedule] = "linear",
    seed: int = 0,
    row_ids: Optional[Tensor] = None,
) -> ElboTerms:
    """Mask-diffusion ELBO of a mask denoiser(x, t) -> Float[B, D, V] logits alone (the
    reference point): rate matching is 0, transitioning is the denoising term. Other
    arguments as in `elbo_uniform_model`; mask_id defaults to V.

    Args:
        denoiser: the mask denoiser, denoiser(x, t) -> Float[B, D, V] logits.
        x1: Long[B, D] clean tokens in [0, vocab_size).
        vocab_size: V.
        mask_id: the mask id; None: V.
        mc_samples: Monte-Carlo samples a sequence.
        t_max: where the CTMC stops and the final emission starts.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        row_ids: Long[B] random-stream ids; None: 0..B-1.

    Returns:
        The ElboTerms, each Float[B] in nats.

    Raises:
        ValueError, TypeError: invalid tokens, sizes, t_max or row ids.
    """
    check_callable("denoiser", denoiser)
    est = _Estimator(x1, vocab_size, mc_samples, t_max, schedule, seed, row_ids)
    mask_id = est.vocab_size if mask_id is None else check_int("mask_id", mask_id, est.vocab_size)
    S = est.vocab_size
    zeros = torch.zeros(x1.shape[0], device=x1.device)
    totals = torch.zeros(4, x1.shape[0], device=x1.device)
    for m in range(est.samples):
        c = est.corrupted(m, "mask", mask_id)
        denoising = c.weight * _masked_sum(at(log_probs(denoiser, c.x_t, c.t, S, "denoiser"), x1), c.z)
        x_f, z_f = est.final_state(m, "mask", mask_id)
        final = _masked_sum(at(log_probs(denoiser, x_f, est.full(est.t_max), S, "denoiser"), x1), z_f)
        totals += torch.stack((zeros, zeros, denoising, final))
    return est.terms(totals)
