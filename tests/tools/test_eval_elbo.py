"""ELBO estimators (ddpd.eval.elbo) against exact likelihoods on an enumerable toy.

The toy has S = 3 symbols and D = 3 positions (27 sequences). For a generative model
(the CTMC up to t_max followed by the final emission described in ddpd.eval.elbo)
the exact log-likelihood of every sequence is computed by solving the Kolmogorov
forward equation over all states (RK4 in s = -log(1 - alpha), or a matrix
exponential when the rates do not depend on time) and applying the emission.

Monte-Carlo comparisons use Z = 4 standard errors (two-sided, per comparison).
"""
import math

import numpy as np
import pytest
import torch

from ddpd.assets import BOOKS
from ddpd.eval.corruption import NUM_STREAMS, EvalNoise
from ddpd.eval.elbo import TERMS, ElboTerms, elbo_mask_diffusion, elbo_planned, elbo_uniform_model
from ddpd.process import get_schedule
from tests.oracles.toy import ToyProblem, dirichlet_p_data, tempered

S, D = 3, 3
T_MAX = 0.999
S_MAX = -math.log1p(-T_MAX)
Z = 4.0
REPLICAS = 160
SAMPLES = 4


@pytest.fixture(scope="module")
def toy():
    return ToyProblem(dirichlet_p_data(S, D, 0.5, seed=1), S, D)


@pytest.fixture(scope="module")
def models(toy):
    return toy.models()


# ---------------------------------------------------------------- exact likelihoods


def _generators(states: torch.Tensor, symbols: int, rates: torch.Tensor) -> torch.Tensor:
    """Rate matrices [G, N, N] (in the s clock) from jump rates [G, N, D, symbols] to
    value j at position d (entries with j = x^d are ignored)."""
    n, length = states.shape
    powers = symbols ** torch.arange(length - 1, -1, -1)
    index = (states * powers).sum(-1)
    j = torch.arange(symbols)
    target = index[:, None, None] + (j - states[:, :, None]) * powers[None, :, None]
    r = torch.where(states[:, :, None] != j, rates.double(), torch.zeros((), dtype=torch.float64))
    gens = torch.zeros(rates.shape[0], n, n, dtype=torch.float64)
    source = index[:, None, None].expand_as(target)
    for g in range(rates.shape[0]):
        gens[g].index_put_((source.reshape(-1), target.reshape(-1)), r[g].reshape(-1), accumulate=True)
    return gens - torch.diag_embed(gens.sum(-1))


def _evolve(p0, states, symbols, rates_at, time_dependent, steps=60):
    """p at s_max from p0 under the rates rates_at(x [M, D], t [M]) -> [M, D, symbols]."""
    n = states.shape[0]
    if not time_dependent:
        gen = _generators(states, symbols, rates_at(states, torch.zeros(n))[None])[0]
        return p0 @ torch.linalg.matrix_exp(S_MAX * gen)
    h = S_MAX / steps
    s = torch.arange(2 * steps + 1, dtype=torch.float64) * (h / 2)
    t = (-torch.expm1(-s)).float().repeat_interleave(n)
    rates = rates_at(states.repeat(s.numel(), 1), t).view(s.numel(), n, states.shape[1], symbols)
    gens = _generators(states, symbols, rates)
    p = p0.clone()
    for i in range(steps):
        g0, g1, g2 = gens[2 * i], gens[2 * i + 1], gens[2 * i + 2]
        k1 = p @ g0
        k2 = (p + h / 2 * k1) @ g1
        k3 = (p + h / 2 * k2) @ g1
        k4 = (p + h * k3) @ g2
        p = p + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return p


def _emission_product(per_position: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """E[x, y] = prod_d per_position[x, d, y^d]."""
    return per_position[:, torch.arange(clean.shape[1])[None, :], clean].prod(-1)


def _full(n, value):
    return torch.full((n,), value)


def exact_uniform_model(toy, model):
    states = toy.states
    n = states.shape[0]
    p0 = torch.full((n,), 1.0 / n, dtype=torch.float64)
    p = _evolve(p0, states, S, lambda x, t: model(x, t).double().softmax(-1), True)
    emission = _emission_product(model(states, _full(n, T_MAX)).double().softmax(-1), states)
    return torch.log(p @ emission)


def _planned_rates(planner_p, q):
    return planner_p[..., None] * q


def _planned_emission(planner_p, q, states):
    same = torch.nn.functional.one_hot(states, S).double()
    return _emission_product((1.0 - planner_p[..., None]) * same + planner_p[..., None] * q, states)


def exact_planned_uniform(toy, planner, denoiser, time_conditioned=False):
    states = toy.states
    n = states.shape[0]

    def planner_p(x, t):
        return torch.sigmoid(planner(x, t) if time_conditioned else planner(x)).double()

    def rates(x, t):
        return _planned_rates(planner_p(x, t), denoiser(x, t).double().softmax(-1))

    p0 = torch.full((n,), 1.0 / n, dtype=torch.float64)
    p = _evolve(p0, states, S, rates, True)
    t = _full(n, T_MAX)
    emission = _planned_emission(planner_p(states, t), denoiser(states, t).double().softmax(-1), states)
    return torch.log(p @ emission)


def _planned_mask_denoiser(planner, mask_denoiser, x):
    """E_{z~}[p_mask(j | x masked at z~ and d)] [N, D, S], z~^e ~ Bernoulli(p_z^e), by enumeration."""
    n = x.shape[0]
    p = torch.sigmoid(planner(x)).double()
    patterns = torch.tensor([[(k >> (D - 1 - d)) & 1 for d in range(D)] for k in range(2**D)], dtype=torch.bool)
    masked = torch.where(patterns[None], torch.full((n, 2**D, D), S), x[:, None, :])
    t = 1.0 - patterns.float().mean(-1).repeat(n)
    q = mask_denoiser(masked.view(-1, D), t).double().softmax(-1).view(n, 2**D, D, S)
    bern = torch.where(patterns[None], p[:, None, :], 1.0 - p[:, None, :])  # [N, P, D]
    out = torch.zeros(n, D, S, dtype=torch.float64)
    for d in range(D):
        others = torch.cat([bern[:, :, :d], bern[:, :, d + 1:]], dim=-1).prod(-1)  # [N, P]
        weight = torch.where(patterns[None, :, d], others, torch.zeros_like(others))
        out[:, d] = (weight[..., None] * q[:, :, d]).sum(1)
    return out


def exact_planned_mask(toy, planner, mask_denoiser):
    states = toy.states
    n = states.shape[0]
    q = _planned_mask_denoiser(planner, mask_denoiser, states)
    planner_p = torch.sigmoid(planner(states)).double()
    p0 = torch.full((n,), 1.0 / n, dtype=torch.float64)
    p = _evolve(p0, states, S, lambda x, t: _planned_rates(planner_p, q), False)
    return torch.log(p @ _planned_emission(planner_p, q, states))


def exact_mask_diffusion(toy, mask_denoiser):
    states = toy.mask_states  # (S + 1)^D, mask id S
    n = states.shape[0]
    masked = states == S

    def rates(x, t):
        q = mask_denoiser(x, t).double().softmax(-1)
        q = torch.cat([q, torch.zeros(*q.shape[:2], 1, dtype=torch.float64)], dim=-1)
        return torch.where((x == S)[..., None], q, torch.zeros_like(q))

    p0 = torch.zeros(n, dtype=torch.float64)
    p0[-1] = 1.0  # the all-mask state has the largest index
    p = _evolve(p0, states, S + 1, rates, False)
    q = mask_denoiser(states, _full(n, T_MAX)).double().softmax(-1)
    keep = torch.nn.functional.one_hot(states.clamp(max=S - 1), S).double()
    per_position = torch.where(masked[..., None], q, keep)
    return torch.log(p @ _emission_product(per_position, toy.states))


# ---------------------------------------------------------------- the ELBO as an exact expectation
#
# ELBO(x_1) = int_0^a dalpha sum_{z != 0} (1 - alpha)^(k - 1) alpha^(D - k) E_values[h + sum_{d: z^d = N} f_d]
#           - int_0^{s_max} ds alpha^D sum_d pi_d(x_1, t)        (the all-clean states, s = -log(1 - alpha))
#           + E_{x ~ p_{t_max|1}}[log p_final(x_1 | x)]
# with every expectation over (z, noise values) enumerated and the integrals done by
# Gauss-Legendre quadrature (exact in alpha for time-free models: a polynomial of degree D - 1).

NODES = 48


def _gauss(low, high, n=NODES):
    x, w = torch.from_numpy(__import__("numpy").polynomial.legendre.leggauss(n)[0]), \
        torch.from_numpy(__import__("numpy").polynomial.legendre.leggauss(n)[1])
    return low + (high - low) * (x + 1) / 2, w * (high - low) / 2


PATTERNS = torch.tensor([[(k >> (D - 1 - d)) & 1 for d in range(D)] for k in range(2**D)], dtype=torch.bool)


def _corruptions(x1: torch.Tensor, noise: str):
    """Every (z, values) for each row of x1: x [R, C, D], z [R, C, D], probability of the
    values given z [C] (uniform: S^-D per value assignment of all positions)."""
    if noise == "mask":
        z = PATTERNS[None].expand(x1.shape[0], -1, -1)
        return torch.where(z, torch.full_like(z, S, dtype=torch.long), x1[:, None, :]), z, torch.ones(2**D)
    values = torch.cartesian_prod(*[torch.arange(S)] * D).view(-1, D)
    z = PATTERNS.repeat_interleave(values.shape[0], 0)
    v = values.repeat(2**D, 1)
    x = torch.where(z[None], v[None], x1[:, None, :])
    return x, z[None].expand_as(x), torch.full((z.shape[0],), float(S) ** -D)


def reference_elbo(x1, variant, t_max):
    """(rate matching, transitioning incl. final emission) per row of x1, exact expectations."""
    a = t_max  # linear schedule
    x, z, p_values = _corruptions(x1, variant.noise)
    rows, combos = x.shape[:2]
    k = z[0].sum(-1)
    alphas, weights = _gauss(0.0, a)
    poly = torch.stack([torch.where(k > 0, (1 - al) ** (k - 1).clamp(min=0) * al ** (D - k), torch.zeros(()))
                        for al in alphas.tolist()]).double()  # [nodes, C]
    x1_rep = x1[:, None, :].expand_as(x).reshape(-1, D)
    rate, trans = torch.zeros(rows, dtype=torch.float64), torch.zeros(rows, dtype=torch.float64)
    for i, al in enumerate(alphas.tolist() if variant.time_dependent else [0.0]):
        t = torch.full((rows * combos,), al)
        h, f = variant.integrand(x1_rep, x.reshape(-1, D), z.reshape(-1, D), t)
        scale = weights[i] * poly[i] if variant.time_dependent else (weights[:, None] * poly).sum(0)
        rate += (h.view(rows, combos) * scale * p_values).sum(-1)
        trans += (f.view(rows, combos) * scale * p_values).sum(-1)
    if variant.clean_pi is not None:
        s, w_s = _gauss(0.0, -math.log1p(-a))
        for si, wi in zip(s.tolist(), w_s.tolist()):
            al = -math.expm1(-si)
            rate -= wi * al**D * variant.clean_pi(x1, torch.full((rows,), al)).double()
    prob_z = torch.where(z[0], 1.0 - a, a).prod(-1).double()  # [C]
    final = variant.final(x1_rep, x.reshape(-1, D), z.reshape(-1, D), torch.full((rows * combos,), t_max))
    trans += (final.view(rows, combos) * prob_z * p_values).sum(-1)
    return rate, trans


def _at(log_p, index):
    return log_p.gather(-1, index[..., None]).squeeze(-1)


class UniformVariant:
    noise, time_dependent = "uniform", True

    def __init__(self, model):
        self.model = model

    def integrand(self, x1, x, z, t):
        log_p = self.model(x, t).double().log_softmax(-1)
        jump = x != x1
        h = (jump.double() - (1 - _at(log_p, x).exp())).sum(-1)
        return h, torch.where(jump, _at(log_p, x1), 0.0).sum(-1)

    def clean_pi(self, x1, t):
        return (1 - _at(self.model(x1, t).double().log_softmax(-1), x1).exp()).sum(-1)

    def final(self, x1, x, z, t):
        return _at(self.model(x, t).double().log_softmax(-1), x1).sum(-1)


class PlannedUniformVariant:
    noise, time_dependent = "uniform", True

    def __init__(self, planner, denoiser, time_conditioned):
        self.planner, self.denoiser, self.timed = planner, denoiser, time_conditioned

    def p(self, x, t):
        return torch.sigmoid(self.planner(x, t) if self.timed else self.planner(x)).double()

    def integrand(self, x1, x, z, t):
        p, log_q = self.p(x, t), _at(self.denoiser(x, t).double().log_softmax(-1), x1)
        return (z.double() - p).sum(-1), torch.where(z, p.log() + log_q, 0.0).sum(-1)

    def clean_pi(self, x1, t):
        return self.p(x1, t).sum(-1)

    def final(self, x1, x, z, t):
        p, q = self.p(x, t), _at(self.denoiser(x, t).double().log_softmax(-1), x1).exp()
        return torch.log((1 - p) * (x == x1) + p * q).sum(-1)


class PlannedMaskVariant:
    """The planner's mask: expectations over z~ enumerated; mask='true': the noise positions."""

    noise, time_dependent = "uniform", False

    def __init__(self, planner, mask_denoiser, mask):
        self.planner, self.denoiser, self.mask = planner, mask_denoiser, mask

    def _draws(self, x, x1):
        """(weights [R, P, D], log q [R, P, D]) over masks z~ with z~^d = N."""
        p = torch.sigmoid(self.planner(x)).double()
        masked = torch.where(PATTERNS[None], torch.full((x.shape[0], 2**D, D), S), x[:, None, :])
        t = 1.0 - PATTERNS.float().mean(-1).repeat(x.shape[0])
        log_p = self.denoiser(masked.view(-1, D), t).double().log_softmax(-1).view(x.shape[0], 2**D, D, S)
        log_q = _at(log_p, x1[:, None, :].expand(-1, 2**D, -1))
        bern = torch.where(PATTERNS[None], p[:, None, :], 1 - p[:, None, :])
        weights = torch.stack([torch.where(PATTERNS[None, :, d], torch.cat([bern[:, :, :d], bern[:, :, d + 1:]], -1)
                                           .prod(-1), torch.zeros(())) for d in range(D)], dim=-1)
        return p, weights, log_q

    def _true(self, x, x1, z):
        masked = torch.where(z, torch.full_like(x, S), x)
        return _at(self.denoiser(masked, torch.zeros(x.shape[0])).double().log_softmax(-1), x1)

    def integrand(self, x1, x, z, t):
        if self.mask == "true":
            p = torch.sigmoid(self.planner(x)).double()
            log_q = self._true(x, x1, z)
        else:
            p, weights, log_q = self._draws(x, x1)
            log_q = (weights * log_q).sum(1)
        return (z.double() - p).sum(-1), torch.where(z, p.log() + log_q, 0.0).sum(-1)

    clean_pi = None  # set in __init__ below (time-free planner: pi does not depend on t)

    def final(self, x1, x, z, t):
        same = x == x1
        if self.mask == "true":
            p = torch.sigmoid(self.planner(x)).double()
            q = self._true(x, x1, z).exp()
            return torch.where(z, torch.log((1 - p) * same + p * q), torch.log(1 - p)).sum(-1)
        p, weights, log_q = self._draws(x, x1)
        mixed = (weights * torch.log((1 - p[:, None, :]) + p[:, None, :] * log_q.exp())).sum(1)
        kept = p * mixed + (1 - p) * torch.log(1 - p)
        return torch.where(same, kept, p.log() + (weights * log_q).sum(1)).sum(-1)


def _planned_mask_variant(planner, mask_denoiser, mask):
    variant = PlannedMaskVariant(planner, mask_denoiser, mask)
    variant.clean_pi = lambda x1, t: torch.sigmoid(planner(x1)).double().sum(-1)
    return variant


class MaskVariant:
    noise, time_dependent, clean_pi = "mask", False, None

    def __init__(self, mask_denoiser):
        self.denoiser = mask_denoiser

    def integrand(self, x1, x, z, t):
        f = self.final(x1, x, z, t)
        return torch.zeros_like(f), f

    def final(self, x1, x, z, t):
        return torch.where(z, _at(self.denoiser(x, t).double().log_softmax(-1), x1), 0.0).sum(-1)


# ---------------------------------------------------------------- Monte-Carlo summaries


def _replicated(toy):
    x1 = toy.states.repeat(REPLICAS, 1)
    return x1, torch.arange(x1.shape[0])


def _per_state(values: torch.Tensor):
    v = values.double().view(REPLICAS, -1)
    return v.mean(0), v.std(0) / math.sqrt(REPLICAS)


def _assert_unbiased(name, estimate: torch.Tensor, reference: torch.Tensor):
    mean, se = _per_state(estimate)
    excess = ((mean - reference).abs() / se.clamp(min=1e-12)).max()
    assert float(excess) < Z, f"{name}: estimate differs from the exact expectation by {float(excess):.1f} SE"


def _check_estimator(toy, variant, estimate_fn, t_max=T_MAX, seed=0):
    """MC estimate (both terms) against the exact expectation; returns the exact ELBO."""
    x1, rows = _replicated(toy)
    est = estimate_fn(x1, rows, t_max, seed)
    rate, trans = reference_elbo(toy.states, variant, t_max)
    _assert_unbiased("rate matching", est.rate_matching, rate)
    _assert_unbiased("transitioning", est.transitioning, trans)
    return rate + trans, rate


# ---------------------------------------------------------------- tests


def flat_planner(x):
    """A planner with p(noise) = 1/2 at every position."""
    return torch.zeros(x.shape)


def flat_denoiser(x, t):
    """A denoiser (or uniform model) with uniform logits over the V tokens."""
    return torch.zeros(*x.shape, V)


def test_mask_diffusion_elbo_is_tight_for_the_exact_denoiser(toy, models):
    """With the exact p(x_1^d | unmasked positions) every unmasking order gives p_data(x_1),
    so the ELBO equals the log-likelihood up to the factorised final emission, whose
    error is O((D (1 - t_max))^2) in probability: below 1e-5 nats on average over p_data
    (on the rarest sequences, p ~ 1e-6, it is larger relative to their probability)."""
    elbo, _ = _check_estimator(toy, MaskVariant(models.mask_denoiser),
                               lambda x1, rows, t_max, seed: elbo_mask_diffusion(
                                   models.mask_denoiser, x1, S, mc_samples=SAMPLES, t_max=t_max, seed=seed,
                                   row_ids=rows))
    gap = exact_mask_diffusion(toy, models.mask_denoiser) - elbo
    assert bool((gap >= -1e-7).all())
    assert float((toy.p_data * gap).sum()) < 1e-5


def test_mask_diffusion_elbo_bounds_and_ranks_a_wrong_denoiser(toy, models):
    wrong = tempered(models.mask_denoiser, 0.5)
    elbo, _ = _check_estimator(toy, MaskVariant(wrong), lambda x1, rows, t_max, seed: elbo_mask_diffusion(
        wrong, x1, S, mc_samples=SAMPLES, t_max=t_max, seed=seed, row_ids=rows))
    assert bool((elbo <= exact_mask_diffusion(toy, wrong) + 1e-9).all())
    right, _ = reference_elbo(toy.states, MaskVariant(models.mask_denoiser), T_MAX)
    assert float((toy.p_data * elbo).sum()) < float((toy.p_data * right).sum()) - 0.05


@pytest.mark.parametrize("power, t_max", [(1.0, T_MAX), (0.5, T_MAX), (1.0, 0.6)])
def test_uniform_model_elbo(toy, models, power, t_max):
    model = tempered(models.uniform_model, power)
    elbo, rate = _check_estimator(toy, UniformVariant(model), lambda x1, rows, t_max, seed: elbo_uniform_model(
        model, x1, S, mc_samples=SAMPLES, t_max=t_max, seed=seed, row_ids=rows), t_max=t_max)
    if t_max == T_MAX:
        assert bool((elbo <= exact_uniform_model(toy, model) + 1e-6).all())
    # The exact model's jump rate is E[R_t(x_t | x_1) | x_t]: rate matching averages to 0
    # over p_data at every t; a wrong model's does not.
    average = abs(float((toy.p_data * rate).sum()))
    assert average < 1e-6 if power == 1.0 else average > 1e-2


@pytest.mark.parametrize("time_conditioned", [False, True])
def test_planner_uniform_denoiser_elbo(toy, models, time_conditioned):
    planner = models.planner_t if time_conditioned else models.planner
    variant = PlannedUniformVariant(planner, models.uniform_denoiser, time_conditioned)
    elbo, rate = _check_estimator(toy, variant, lambda x1, rows, t_max, seed: elbo_planned(
        planner, models.uniform_denoiser, x1, S, time_conditioned_planner=time_conditioned, mc_samples=SAMPLES,
        t_max=t_max, seed=seed, row_ids=rows))
    assert bool((elbo <= exact_planned_uniform(toy, planner, models.uniform_denoiser, time_conditioned) + 1e-6)
                .all())
    average = abs(float((toy.p_data * rate).sum()))
    assert average < 1e-6 if time_conditioned else average > 1e-2


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_planner_mask_denoiser_elbo_with_the_planner_mask(toy, models, power):
    denoiser = tempered(models.mask_denoiser, power)
    elbo, _ = _check_estimator(toy, _planned_mask_variant(models.planner, denoiser, "planner"),
                               lambda x1, rows, t_max, seed: elbo_planned(
                                   models.planner, denoiser, x1, S, denoiser_type="mask", mask="planner",
                                   mc_samples=SAMPLES, t_max=t_max, seed=seed, row_ids=rows))
    assert bool((elbo <= exact_planned_mask(toy, models.planner, denoiser) + 1e-9).all())


def test_planner_mask_denoiser_elbo_with_the_true_mask(toy, models):
    _check_estimator(toy, _planned_mask_variant(models.planner, models.mask_denoiser, "true"),
                     lambda x1, rows, t_max, seed: elbo_planned(
                         models.planner, models.mask_denoiser, x1, S, denoiser_type="mask", mask="true",
                         mc_samples=SAMPLES, t_max=t_max, seed=seed, row_ids=rows))


def test_true_mask_denoising_term_is_the_mask_diffusion_one(toy, models):
    """With the true noise positions masked the denoiser sees x_1 masked at z_t, at the time t
    of the draw: the same draws give the mask-diffusion denoising term exactly (the denoiser
    reads t here, as the exact one does not)."""
    def timed(x, t):
        return models.mask_denoiser(x, t) * (1.0 + t)[:, None, None]

    x1 = toy.states
    kwargs = dict(mc_samples=2, t_max=T_MAX, seed=10)
    planned = elbo_planned(models.planner, timed, x1, S, denoiser_type="mask", mask="true", **kwargs)
    masked = elbo_mask_diffusion(timed, x1, S, **kwargs)
    torch.testing.assert_close(planned.denoising, masked.denoising)


def test_mask_diffusion_elbo_reads_the_denoiser_at_masked_positions_only(toy, models):
    """An unmasked position of mask diffusion is carried over: the denoiser's output there (here
    no mass on the carried token, a -inf log-probability) must change no term, the final
    emission's included."""
    def carried_over_ignored(x, t):
        carried = torch.where(torch.arange(S) == x.clamp(max=S - 1)[..., None], -math.inf, 0.0)
        return torch.where((x == S)[..., None], models.mask_denoiser(x, t), carried)

    kwargs = dict(mc_samples=2, t_max=T_MAX, seed=3)
    exact = elbo_mask_diffusion(models.mask_denoiser, toy.states, S, **kwargs)
    blurred = elbo_mask_diffusion(carried_over_ignored, toy.states, S, **kwargs)
    for name in ("denoising", "final"):
        torch.testing.assert_close(getattr(blurred, name), getattr(exact, name))


def test_planned_mask_denoiser_runs_at_the_time_of_its_masked_share(toy, models):
    """With the planner's mask the denoiser sees t = alpha^{-1}(1 - #masked / D): on the linear
    schedule the unmasked share, as in the sampler."""
    times = []

    def denoiser(x, t):
        times.append((t, 1.0 - (x == S).float().mean(-1)))
        return models.mask_denoiser(x, t)

    elbo_planned(models.planner, denoiser, toy.states, S, denoiser_type="mask", mask="planner", seed=1)
    assert times and len(torch.cat([got for got, _ in times]).unique()) > 1
    for got, share in times:
        torch.testing.assert_close(got, share)


COSINE = get_schedule("cosine")


def _on_the_linear_clock(network):
    """network(x, t) driven by the linear schedule's time t = alpha: it reads the cosine time of that alpha."""
    return lambda x, t: network(x, COSINE.inverse(t).float())


@pytest.mark.parametrize("name", ["uniform", "planner+uniform", "planner_t+uniform", "planner+mask", "true-mask",
                                  "mask"])
def test_the_schedule_sets_only_the_time_the_networks_read(toy, models, name):
    """The bound is an integral over alpha: under the cosine schedule up to t_max it is, draw for
    draw, the linear schedule's up to alpha(t_max) with networks that read the cosine time of
    each alpha. The exact tests run the linear schedule, where t = alpha, so a t_max where
    alpha(t_max) belongs (s_max, the draws of alpha, their weights, the final state) or an alpha
    given to a network as its time went unseen."""
    def timed(x, t):  # the exact mask denoiser ignores t
        return models.mask_denoiser(x, t) * (1.0 + t)[:, None, None]

    def estimate(wrap, schedule, t_max):
        kwargs = dict(mc_samples=2, t_max=t_max, schedule=schedule, seed=5)
        planned = dict(denoiser_type="mask", **kwargs)
        return {
            "uniform": lambda: elbo_uniform_model(wrap(models.uniform_model), toy.states, S, **kwargs),
            "planner+uniform": lambda: elbo_planned(models.planner, wrap(models.uniform_denoiser), toy.states, S,
                                                    **kwargs),
            "planner_t+uniform": lambda: elbo_planned(wrap(models.planner_t), wrap(models.uniform_denoiser),
                                                      toy.states, S, time_conditioned_planner=True, **kwargs),
            "planner+mask": lambda: elbo_planned(models.planner, wrap(timed), toy.states, S, **planned),
            "true-mask": lambda: elbo_planned(models.planner, wrap(timed), toy.states, S, mask="true", **planned),
            "mask": lambda: elbo_mask_diffusion(wrap(timed), toy.states, S, **kwargs),
        }[name]()

    t_max = 0.9
    alpha_max = float(COSINE.alpha(torch.tensor(t_max, dtype=torch.float64)))
    cosine = estimate(lambda network: network, "cosine", t_max)
    linear = estimate(_on_the_linear_clock, "linear", alpha_max)
    for term in TERMS:
        torch.testing.assert_close(getattr(cosine, term), getattr(linear, term), rtol=1e-5, atol=1e-5, msg=term)
    assert not torch.allclose(cosine.elbo, estimate(lambda network: network, "linear", t_max).elbo)


# ---------------------------------------------------------------- tiny transformers, reproducibility, inputs

V, L = 27, 24
WIKI = str(BOOKS)  # the text8-format corpus shipped with the package


@pytest.fixture(scope="module")
def tiny():
    from ddpd.models import build_model, config_for

    torch.manual_seed(0)
    kinds = ("planner", "mask-denoiser", "uniform-denoiser", "uniform")
    return {k: build_model(k, config_for(k, V, L, d_model=16, n_layers=1, n_heads=2)).eval() for k in kinds}


@pytest.fixture(scope="module")
def text():
    from ddpd.training.data import Text8Tokenizer

    with open(WIKI, encoding="ascii") as f:
        chars = f.read(L * 12)
    return torch.tensor(Text8Tokenizer().encode(chars)).view(12, L)


def _estimators(tiny):
    p, m, u, uni = tiny["planner"], tiny["mask-denoiser"], tiny["uniform-denoiser"], tiny["uniform"]
    return {
        "uniform": lambda x, **k: elbo_uniform_model(uni, x, V, **k),
        "planner+uniform": lambda x, **k: elbo_planned(p, u, x, V, **k),
        "planner+mask": lambda x, **k: elbo_planned(p, m, x, V, denoiser_type="mask", **k),
        "mask": lambda x, **k: elbo_mask_diffusion(m, x, V, **k),
    }


@torch.no_grad()
def test_tiny_models_give_finite_seeded_batch_invariant_terms(tiny, text):
    for name, estimate in _estimators(tiny).items():
        whole = estimate(text, mc_samples=2, seed=11)
        parts = [estimate(text[i:i + 5], mc_samples=2, seed=11, row_ids=torch.arange(i, min(i + 5, 12)))
                 for i in range(0, 12, 5)]
        for term in ("rate_matching", "planning", "denoising", "final"):
            value = getattr(whole, term)
            assert value.shape == (12,) and bool(torch.isfinite(value).all()), (name, term)
            torch.testing.assert_close(value, torch.cat([getattr(p, term) for p in parts]), msg=(name, term))
        bits = whole.bits()
        torch.testing.assert_close(bits["elbo"], -whole.elbo / (L * math.log(2.0)))
        assert bool((bits["denoising"] >= 0).all()), name  # log-probabilities are <= 0
        again = estimate(text, mc_samples=2, seed=11)
        assert torch.equal(again.elbo, whole.elbo), name
        assert not torch.equal(estimate(text, mc_samples=2, seed=12).elbo, whole.elbo), name


@torch.no_grad()
def test_evaluate_elbo_rows_are_each_estimators_means_over_every_sequence(tiny, text):
    """A row is its estimator's per-sequence bits averaged over every sequence (batches of 5
    with their row ids), run with the settings given (the mask id of the models included), and
    says whether it bounds the likelihood: only the true-mask row does not."""
    from ddpd.eval import ModelSet, evaluate_elbo
    from ddpd.eval.report import mean_and_se

    def timed(network):  # the untrained networks ignore t (adaLN-Zero): make the schedule count
        return lambda x, t: network(x, t) * (1.0 + t)[:, None, None]

    p, u, uni = tiny["planner"], timed(tiny["uniform-denoiser"]), timed(tiny["uniform"])
    m = timed(tiny["mask-denoiser"])

    def mask_at_v_plus_1(x, t):  # reads V + 1 as the mask and V as a token, as the mask id V + 1 asks
        return m(torch.where(x == V + 1, V, torch.where(x == V, 0, x)), t)

    settings = dict(mc_samples=2, t_max=0.9, schedule="cosine", seed=7)
    models = ModelSet(V, planner=p, uniform_denoiser=u, mask_denoiser=mask_at_v_plus_1, uniform_model=uni,
                      mask_id=V + 1)
    expected = {
        "uniform": (True, elbo_uniform_model(uni, text, V, **settings)),
        "planner+uniform-denoiser": (True, elbo_planned(p, u, text, V, **settings)),
        "planner+mask-denoiser": (True, elbo_planned(p, m, text, V, denoiser_type="mask", **settings)),
        "planner+mask-denoiser(true-mask)": (False, elbo_planned(p, m, text, V, denoiser_type="mask", mask="true",
                                                                 **settings)),
        "mask-diffusion": (True, elbo_mask_diffusion(m, text, V, **settings)),
    }
    rows = evaluate_elbo(models, text, batch_size=5, **settings)
    assert [row["method"] for row in rows] == list(expected)
    for row in rows:
        bound, terms = expected[row["method"]]
        assert row["bound"] == ("yes" if bound else "no (diagnostic)"), row["method"]
        assert (row["num_sequences"], row["length"], row["mc_samples"], row["t_max"]) == (12, L, 2, 0.9)
        for term, bits in terms.bits().items():
            mean, se = mean_and_se(bits)
            assert row[term] == pytest.approx(mean, rel=1e-5, abs=1e-6), (row["method"], term)
            assert row[f"{term}_se"] == pytest.approx(se, rel=1e-4, abs=1e-6), (row["method"], term)
    with pytest.raises(ValueError, match="methods: these models support"):
        evaluate_elbo(models, text, methods=[])
    with pytest.raises(ValueError, match=r"methods: these models support .*, got \['uniform', 'ddpd'\]$"):
        evaluate_elbo(models, text, methods=["uniform", "ddpd"])


@torch.no_grad()
def test_evaluate_denoising_rows_are_the_stats_of_every_sequence_in_bits(text):
    """A row is denoising_stats over every sequence (batches of 5 with their row ids, the default
    alpha): bits per noisy token averaged over the sequences that have one, accuracy over every
    noisy position; no planner, no planned row."""
    from ddpd.eval import ModelSet, evaluate_denoising
    from ddpd.eval.denoising import DEFAULT_ALPHA, denoising_stats
    from ddpd.eval.report import mean_and_se

    def guess(x, t):  # a space (id 0) at every position: right at some noisy positions, not all
        return torch.zeros(*x.shape, V).index_fill(-1, torch.tensor([0]), 3.0) * (1.0 + t)[:, None, None]

    models = ModelSet(V, uniform_model=guess, mask_denoiser=guess)
    for x1, alpha in ((text, {}), (text[:, :2], dict(alpha=0.9))):  # at 0.9, some pairs have no noise
        rows = evaluate_denoising(models, x1, batch_size=5, schedule="cosine", seed=3, **alpha)
        assert [row["denoiser"] for row in rows] == ["uniform", "mask-denoiser"]
        for row in rows:
            stats = denoising_stats(row["denoiser"], guess, x1, V, schedule="cosine", seed=3, **alpha)
            noisy = stats.noisy > 0
            assert 0 < int(noisy.sum()) and (alpha == {} or int(noisy.sum()) < x1.shape[0])
            bits, se = mean_and_se(stats.nats[noisy] / stats.noisy[noisy] / math.log(2.0))
            total = int(stats.noisy.sum())
            assert (row["bits"], row["bits_se"]) == (pytest.approx(bits, rel=1e-5), pytest.approx(se, rel=1e-4))
            assert row["accuracy"] == pytest.approx(float(stats.correct.sum()) / total)
            assert 0 < row["accuracy"] < 1 or alpha
            assert (row["noisy_positions"], row["num_sequences"]) == (total, x1.shape[0])
            assert row["alpha"] == alpha.get("alpha", DEFAULT_ALPHA)


@torch.no_grad()
def test_evaluate_denoising_scores_nothing_where_no_position_is_noisy():
    """At alpha near 1 a few short sequences may keep every token clean: the row has no bits,
    standard error or accuracy to give (None, not NaN or a division by zero), and 0 positions."""
    from ddpd.eval import ModelSet, evaluate_denoising
    from ddpd.eval.denoising import denoising_stats

    x1 = torch.tensor([[1, 2], [3, 4]])
    assert int(denoising_stats("uniform", flat_denoiser, x1, V, alpha=0.999).noisy.sum()) == 0
    row, = evaluate_denoising(ModelSet(V, uniform_model=flat_denoiser), x1, alpha=0.999)
    assert (row["bits"], row["bits_se"], row["accuracy"]) == (None, None, None)
    assert (row["noisy_positions"], row["num_sequences"], row["alpha"]) == (0, 2, 0.999)


@torch.no_grad()
def test_evaluate_denoising_scores_a_lone_noisy_position():
    """One noisy position among the sequences (alpha 0.9, seed 1) is scored: its bits, an
    undefined (NaN) standard error, and an accuracy of 0 or 1, not the None of no noise."""
    from ddpd.eval import ModelSet, evaluate_denoising
    from ddpd.eval.denoising import denoising_stats

    x1 = torch.tensor([[1, 2], [3, 4]])
    stats = denoising_stats("uniform", flat_denoiser, x1, V, alpha=0.9, seed=1)
    assert stats.noisy.tolist() == [1.0, 0.0]
    row, = evaluate_denoising(ModelSet(V, uniform_model=flat_denoiser), x1, alpha=0.9, seed=1)
    assert row["bits"] == pytest.approx(float(stats.nats[0]) / math.log(2.0), rel=1e-6)
    assert math.isnan(row["bits_se"])
    assert (row["accuracy"], row["noisy_positions"]) == (float(stats.correct[0]), 1)


@torch.no_grad()
def test_evaluations_do_not_depend_on_the_batch_size(tiny, text):
    """Eleven sequences in batches of 1, 5 (a last batch of one) or all at once give the same
    rows: every sequence is scored once, with its own stream."""
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo

    models = ModelSet(V, mask_denoiser=tiny["mask-denoiser"])
    x1 = text[:11, :8]
    for evaluate in (evaluate_elbo, evaluate_denoising):
        rows = [evaluate(models, x1, batch_size=size, seed=4) for size in (32, 5, 1)]
        for other in rows[1:]:
            for mine, theirs in zip(rows[0], other):
                assert mine.keys() == theirs.keys()
                for key, value in mine.items():
                    assert theirs[key] == (pytest.approx(value, rel=1e-5, nan_ok=True)
                                           if isinstance(value, float) else value), (evaluate.__name__, key)


@torch.no_grad()
def test_evaluate_denoising_masks_with_the_model_sets_mask_id(text):
    """The mask denoiser's row corrupts with the mask id of the ModelSet (V + 1 here), as
    denoising_stats does given it; with the default id V the denoiser reads other inputs."""
    from ddpd.eval import ModelSet, evaluate_denoising
    from ddpd.eval.denoising import denoising_stats
    from ddpd.eval.report import mean_and_se

    def guess(x, t):  # sure of a space where it reads V + 1, uniform elsewhere
        return (x == V + 1)[..., None] * torch.zeros(*x.shape, V).index_fill(-1, torch.tensor([0]), 5.0)

    row, = evaluate_denoising(ModelSet(V, mask_denoiser=guess, mask_id=V + 1), text, batch_size=5, seed=3)
    for mask_id, same in ((V + 1, True), (None, False)):
        stats = denoising_stats("mask-denoiser", guess, text, V, mask_id=mask_id, seed=3)
        noisy = stats.noisy > 0
        bits, _ = mean_and_se(stats.nats[noisy] / stats.noisy[noisy] / math.log(2.0))
        assert (row["bits"] == pytest.approx(bits, rel=1e-5)) is same, mask_id


@torch.no_grad()
def test_evaluate_elbo_runs_the_methods_asked_in_their_order(tiny, text):
    """methods picks the rows and their order among those the models support."""
    from ddpd.eval import ModelSet, evaluate_elbo

    models = ModelSet(V, planner=tiny["planner"], mask_denoiser=tiny["mask-denoiser"], uniform_model=tiny["uniform"])
    x1 = text[:3, :8]
    rows = evaluate_elbo(models, x1, methods=["mask-diffusion", "uniform"], seed=2)
    assert [row["method"] for row in rows] == ["mask-diffusion", "uniform"]
    expected = elbo_uniform_model(tiny["uniform"], x1, V, seed=2).bits()["elbo"].double().mean()
    assert rows[1]["elbo"] == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("given, methods, kinds", [
    (("uniform_model",), ["uniform"], ["uniform"]),
    (("planner",), [], []),
    (("uniform_denoiser",), [], ["uniform-denoiser"]),
    (("planner", "uniform_denoiser"), ["planner+uniform-denoiser"], ["uniform-denoiser"]),
    (("mask_denoiser",), ["mask-diffusion"], ["mask-denoiser"]),
    (("planner", "mask_denoiser"), ["planner+mask-denoiser", "planner+mask-denoiser(true-mask)", "mask-diffusion"],
     ["mask-denoiser", "mask-denoiser-planner"]),
    (("planner", "uniform_denoiser", "mask_denoiser", "uniform_model"),
     ["uniform", "planner+uniform-denoiser", "planner+mask-denoiser", "planner+mask-denoiser(true-mask)",
      "mask-diffusion"], ["uniform", "uniform-denoiser", "mask-denoiser", "mask-denoiser-planner"]),
])
def test_each_method_and_denoising_kind_needs_its_networks(given, methods, kinds):
    """A planned row needs the planner and its denoiser, the planner alone gives none; the
    planner's mask row is a bound, the true-mask one is not."""
    from ddpd.eval import ModelSet, elbo_methods
    from ddpd.eval.likelihood import denoising_kinds

    networks = {name: (lambda x, t=None: torch.zeros(*x.shape, V)) for name in given}
    models = ModelSet(V, **networks)
    available = elbo_methods(models)
    assert list(available) == methods
    assert [name for name, (bound, _) in available.items() if not bound] == \
        [name for name in methods if name.endswith("(true-mask)")]
    found = denoising_kinds(models)
    assert list(found) == kinds
    for kind, (denoiser, planner) in found.items():
        assert denoiser is networks[{"uniform": "uniform_model"}.get(kind, kind.replace("-planner", "")
                                                                       .replace("-", "_"))], kind
        assert planner is (networks["planner"] if kind.endswith("-planner") else None), kind


@torch.no_grad()
def test_evaluations_draw_a_progress_bar_only_when_asked(monkeypatch):
    """progress=False never draws a bar, even on a terminal; progress=True lets tqdm draw one
    where stderr is a terminal (disable=None), with a step per batch and row."""
    import ddpd.eval.likelihood as likelihood
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo

    bars = []

    class Bar:
        def __init__(self, total, disable, **kwargs):
            self.total, self.disable, self.steps, self.closed = total, disable, 0, False
            bars.append(self)

        def update(self):
            self.steps += 1

        def close(self):
            self.closed = True

    monkeypatch.setattr(likelihood, "tqdm", Bar)
    x1 = torch.arange(20).remainder(V).view(5, 4)
    models = ModelSet(V, uniform_model=flat_denoiser, mask_denoiser=flat_denoiser)
    for evaluate in (evaluate_elbo, evaluate_denoising):
        for progress, disable in ((False, True), (True, None)):
            evaluate(models, x1, batch_size=2, progress=progress)
            bar = bars.pop()
            assert (bar.disable, bar.total, bar.steps, bar.closed) == (disable, 3 * 2, 3 * 2, True), \
                (evaluate.__name__, progress)
        evaluate(models, x1, batch_size=2)
        assert bars.pop().disable is True, evaluate.__name__


def test_evaluation_tables_name_their_columns_and_round_to_four_places():
    """The Markdown tables of the rows: every number in bits or accuracy to four decimals,
    alpha as given, an undefined score left blank."""
    from ddpd.eval.likelihood import denoising_markdown, elbo_markdown

    rows = [{"denoiser": "uniform", "bits": 1.234567, "bits_se": 0.0123456, "accuracy": 0.56789, "alpha": 0.85},
            {"denoiser": "mask-denoiser", "bits": None, "bits_se": None, "accuracy": None, "alpha": 0.999}]
    assert denoising_markdown(rows).splitlines() == [
        "| Denoiser | Denoising (bits/token) | ± s.e. | Accuracy | alpha |", "|---|---:|---:|---:|---:|",
        "| uniform | 1.2346 | 0.0123 | 0.5679 | 0.85 |", "| mask-denoiser |  |  |  | 0.999 |"]
    row = {"method": "uniform", "rate_matching": 1.234567, "transitioning": 0.5, "elbo": 1.7345678,
           "elbo_se": 0.01234, "bound": "yes"}
    assert elbo_markdown([row]).splitlines() == [
        "| Method | Rate matching (bits/token) | Transitioning (bits/token) | Combined (bits/token) | ± s.e. | Bound |",
        "|---|---:|---:|---:|---:|---:|", "| uniform | 1.2346 | 0.5000 | 1.7346 | 0.0123 | yes |"]


@torch.no_grad()
def test_uniform_model_elbo_is_finite_near_t_max_with_a_large_vocabulary():
    """S = 50257, a model sure every token is clean, stream 706 drawn at alpha > 0.9985: there
    p(z = N | x_t) was 1 - 1 * kept with kept rounded to 1 in float32, log 0, so planning -inf,
    denoising +inf and the ELBO NaN."""
    S = 50257

    def model(x, t):
        return torch.full((*x.shape, S), -1e4).scatter(-1, x[..., None], 0.0)

    x1 = torch.zeros(2, 4, dtype=torch.long)
    terms = elbo_uniform_model(model, x1, S, t_max=0.9999, seed=0, row_ids=torch.tensor([705, 706]))
    for term in ("rate_matching", "planning", "denoising", "final", "elbo"):
        assert bool(torch.isfinite(getattr(terms, term)).all()), term


def test_elbo_takes_a_numpy_integer_seed():
    def model(x, t):
        return torch.arange(V, dtype=torch.float32).expand(*x.shape, V) * t[:, None, None]

    x1 = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    expected = elbo_uniform_model(model, x1, V, seed=2**64 - 1).elbo
    assert torch.equal(elbo_uniform_model(model, x1, V, seed=np.uint64(2**64 - 1)).elbo, expected)
    assert not torch.equal(elbo_uniform_model(model, x1, V, seed=np.int64(5)).elbo, expected)


@pytest.mark.parametrize("change, error", [
    (dict(x1=torch.zeros(2, 4)), "x1 must have dtype torch.int64"),
    (dict(x1=torch.full((2, 4), V)), "x1 must hold ids in \\[0, 27\\)"),
    (dict(mc_samples=0), "mc_samples must be >= 1"),
    (dict(t_max=1.0), "t_max must be in \\(0.0, 1.0\\)"),
    (dict(t_max=0.0), "t_max must be in \\(0.0, 1.0\\)"),
    (dict(seed=-1), "seed must be an int"),
    (dict(row_ids=torch.arange(3)), "row_ids must be a Long tensor of shape \\(2,\\)"),
    (dict(row_ids=torch.arange(2.0)), "row_ids must have dtype in \\(torch.int64\\)"),
    (dict(denoiser_type="masked"), "denoiser_type must be one of \\('uniform', 'mask'\\), got 'masked'"),
    (dict(mask="oracle"), "mask must be one of \\('planner', 'true'\\), got 'oracle'"),
    (dict(planner="planner"), "planner must be callable"),
])
def test_elbo_validates_inputs(tiny, change, error):
    args = dict(planner=tiny["planner"], denoiser=tiny["uniform-denoiser"], x1=torch.zeros(2, 4, dtype=torch.long),
                vocab_size=V)
    args.update(change)
    planner, denoiser, x1, vocab = (args.pop(k) for k in ("planner", "denoiser", "x1", "vocab_size"))
    with pytest.raises((ValueError, TypeError), match=error):
        elbo_planned(planner, denoiser, x1, vocab, **args)


def test_elbo_takes_a_numpy_float_time_and_refuses_no_sequences():
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo

    def model(x, t):
        return torch.arange(V, dtype=torch.float32).expand(*x.shape, V) * t[:, None, None]

    x1 = torch.tensor([[0, 1, 2, 3]])
    assert torch.equal(elbo_uniform_model(model, x1, V, t_max=np.float32(0.5)).elbo,
                       elbo_uniform_model(model, x1, V, t_max=float(np.float32(0.5))).elbo)
    models = ModelSet(vocab_size=V, uniform_model=model)
    for evaluate in (evaluate_elbo, evaluate_denoising):
        with pytest.raises(ValueError, match="sequences must hold at least one row, got 0"):
            evaluate(models, torch.zeros(0, 4, dtype=torch.long))


def test_elbo_rejects_a_model_with_the_wrong_output_shape():
    with pytest.raises(ValueError, match="model must return floating logits of shape \\[2, 4, 27\\]"):
        elbo_uniform_model(lambda x, t: torch.zeros(2, 4, 26), torch.zeros(2, 4, dtype=torch.long), V)
    with pytest.raises(TypeError, match="model must return a tensor, got list"):
        elbo_uniform_model(lambda x, t: [0.0], torch.zeros(2, 4, dtype=torch.long), V)


@pytest.mark.parametrize("models", [{"uniform_model": lambda x, t: torch.zeros(*x.shape, V)}, None, "uniform"],
                         ids=["dict", "None", "str"])
def test_evaluations_name_models_that_are_no_model_set(models):
    """A dict of networks (or None) met "'dict' object has no attribute 'vocab_size'", an AttributeError
    from inside elbo_methods."""
    from ddpd.eval import elbo_methods, evaluate_denoising, evaluate_elbo
    from ddpd.eval.likelihood import denoising_kinds

    x1 = torch.zeros(1, 4, dtype=torch.long)
    for call in (lambda: evaluate_elbo(models, x1), lambda: evaluate_denoising(models, x1),
                 lambda: elbo_methods(models), lambda: denoising_kinds(models)):
        with pytest.raises(TypeError, match=f"models must be a ModelSet .*, got {type(models).__name__}$"):
            call()


def test_evaluations_refuse_sequences_not_2d_and_denoising_without_a_denoiser():
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo

    for evaluate in (evaluate_elbo, evaluate_denoising):
        for bad, got in ((torch.zeros(4, dtype=torch.long), r"torch.Size\(\[4\]\)"), ([[0, 1]], "list"),
                         (torch.zeros(2, 4, 1, dtype=torch.long), r"torch.Size\(\[2, 4, 1\]\)")):
            with pytest.raises(ValueError, match=f"sequences must be Long\\[N, D\\], got {got}"):
                evaluate(ModelSet(vocab_size=V, uniform_model=flat_denoiser), bad)
    with pytest.raises(ValueError, match="denoising: no denoiser or uniform model given"):
        evaluate_denoising(ModelSet(vocab_size=V, planner=lambda x: torch.zeros(x.shape)),
                           torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("fields, error, message", [
    (dict(vocab_size="27"), TypeError, "vocab_size must be an int"),
    (dict(vocab_size=0), ValueError, "vocab_size must be >= 2"),
    (dict(vocab_size=1), ValueError, "vocab_size must be >= 2, got 1"),  # refused by every estimator
    (dict(vocab_size=V, planner="runs/planner"), TypeError, "planner must be callable, got str"),
    (dict(vocab_size=V, uniform_model=7), TypeError, "uniform_model must be callable"),
    (dict(vocab_size=V, uniform_denoiser="runs/u"), TypeError, "uniform_denoiser must be callable, got str"),
    (dict(vocab_size=V, mask_denoiser=7), TypeError, "mask_denoiser must be callable, got int"),
    (dict(vocab_size=V, mask_id=V - 1), ValueError, f"mask_id must be >= {V}"),
])
def test_a_model_set_refuses_fields_the_estimators_cannot_use(fields, error, message):
    """A path given for a network, or a string vocabulary size, failed inside the first
    estimator that read it (a str is not callable), after the others had run."""
    from ddpd.eval import ModelSet

    with pytest.raises(error, match=message):
        ModelSet(**fields)


def test_a_model_set_holds_numpy_sizes_as_python_ints():
    """vocab_size and mask_id given as numpy integers (read from an array or a config) are
    kept as the Python ints they name."""
    from ddpd.eval import ModelSet

    models = ModelSet(np.int64(V), mask_id=np.int32(V + 1))
    assert (type(models.vocab_size), type(models.mask_id)) == (int, int)
    assert (models.vocab_size, models.mask_id) == (V, V + 1)


def test_elbo_refuses_a_mask_id_among_the_tokens(tiny):
    """The mask id is V or above (a token id read as the mask would mask that token), for
    both estimators that mask; V itself is the default."""
    m, p = tiny["mask-denoiser"], tiny["planner"]
    x1 = torch.zeros(2, 4, dtype=torch.long)
    estimators = {"mask-diffusion": lambda **k: elbo_mask_diffusion(m, x1, V, **k),
                  "planned": lambda **k: elbo_planned(p, m, x1, V, denoiser_type="mask", **k)}
    for name, estimate in estimators.items():
        with pytest.raises(ValueError, match=f"mask_id must be >= {V}, got {V - 1}"):
            estimate(mask_id=V - 1)
        assert torch.equal(estimate(mask_id=V).elbo, estimate().elbo), name


def test_elbo_refuses_a_vocabulary_of_one_token():
    """A single token leaves nothing to corrupt a position into: V = 1 is refused, V = 2 taken."""
    def model(x, t):
        return torch.zeros(*x.shape, 1)

    x1 = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="vocab_size must be >= 2, got 1"):
        elbo_uniform_model(model, x1, 1)
    terms = elbo_uniform_model(lambda x, t: torch.zeros(*x.shape, 2), x1, 2)
    assert bool(torch.isfinite(terms.elbo).all())


def test_elbo_refuses_a_t_max_whose_alpha_is_zero_under_the_schedule():
    """t_max = 1e-9 is in (0, 1) but the cosine alpha of it rounds to 0: no time to integrate
    over, refused naming t_max (under the linear schedule it is taken)."""
    def model(x, t):
        return torch.arange(V, dtype=torch.float32).expand(*x.shape, V) * t[:, None, None]

    x1 = torch.tensor([[0, 1, 2, 3]])
    with pytest.raises(ValueError, match=r"t_max: alpha\(t_max\) must be in \(0, 1\), got 0.0 for t_max=1e-09"):
        elbo_uniform_model(model, x1, V, t_max=1e-9, schedule="cosine")
    assert bool(torch.isfinite(elbo_uniform_model(model, x1, V, t_max=1e-9, schedule="linear").elbo).all())


def flat_estimators(x1):
    """Every estimator on the flat planner and denoiser, by name, taking its settings."""
    return {
        "uniform": lambda **k: elbo_uniform_model(flat_denoiser, x1, V, **k),
        "planner+uniform": lambda **k: elbo_planned(flat_planner, flat_denoiser, x1, V, **k),
        "planner+mask": lambda **k: elbo_planned(flat_planner, flat_denoiser, x1, V, denoiser_type="mask", **k),
        "mask": lambda **k: elbo_mask_diffusion(flat_denoiser, x1, V, **k),
    }


def test_elbo_takes_a_t_max_a_hair_below_1():
    """t_max = 1 - 1e-9 (alpha(t_max) rounds to 1 in float32, not in float64) is taken by every
    estimator with finite terms; mask diffusion with a flat denoiser unmasks each position once
    at log(1 / V), so its bound is D log(1 / V) however close to 1 it stops."""
    x1 = torch.arange(32).remainder(V).view(4, 8)
    estimators = flat_estimators(x1)
    for name, estimate in estimators.items():
        terms = estimate(mc_samples=2, t_max=1.0 - 1e-9)
        for term in TERMS:
            assert bool(torch.isfinite(getattr(terms, term)).all()), (name, term)
    torch.testing.assert_close(terms.elbo, torch.full((4,), -8 * math.log(V)))


def test_elbo_terms_add_up_and_convert_to_bits_per_token():
    """elbo = rate_matching + planning + denoising + final; bits are -nats / (D ln 2), for
    every term the reports show (a term left out of TERMS drops its column)."""
    terms = ElboTerms(*(torch.tensor([value]) for value in (-1.0, -2.0, -4.0, -8.0)), length=3)
    assert terms.transitioning.tolist() == [-14.0] and terms.elbo.tolist() == [-15.0]
    bits = terms.bits()
    assert list(bits) == ["rate_matching", "planning", "denoising", "final", "transitioning", "elbo"]
    for name, nats in zip(bits, (-1.0, -2.0, -4.0, -8.0, -14.0, -15.0)):
        torch.testing.assert_close(bits[name], torch.tensor([-nats / (3 * math.log(2.0))]), msg=name)


def test_stratified_draws_cover_each_stratum_once():
    """Sample m of M lands in its stratum [m / M, (m + 1) / M] for every row (u in (0, 1], rounded
    to float32): the variance reduction the estimators rely on."""
    noise, rows, samples = EvalNoise(3), torch.arange(50), 4
    for sample in range(samples):
        u = noise.stratified(sample, samples, 0, rows)
        assert bool(((u >= sample / samples) & (u <= (sample + 1) / samples)).all()), sample


def test_every_sample_and_stream_draws_its_own_uniforms():
    """No two (sample, stream) pairs share their uniforms: sample 1's stream 0 is not sample 0's
    stream 1, or a noise decision would repeat as another sample's level."""
    noise, rows = EvalNoise(3), torch.arange(4)
    draws = [noise.uniform(sample, stream, rows, 8) for sample in range(2) for stream in range(NUM_STREAMS)]
    assert len({tuple(u.flatten().tolist()) for u in draws}) == len(draws)


def test_eval_noise_repr_rebuilds_its_stream():
    noise, rows = EvalNoise(2**64 - 1), torch.arange(3)
    assert repr(noise) == f"EvalNoise(seed={2**64 - 1})"
    again = eval(repr(noise), {"EvalNoise": EvalNoise})
    assert torch.equal(again.uniform(1, 2, rows, 5), noise.uniform(1, 2, rows, 5))


@pytest.mark.parametrize("denoiser_type, mask", [("uniform", "planner"), ("mask", "planner"), ("mask", "true")])
def test_planner_elbo_stopped_early_matches_the_exact_expectation(toy, models, denoiser_type, mask):
    """At t_max = 0.6 a position of the final state is noise with probability 0.4 and holds its
    clean value by chance a third of the time: the final emission keeps it (x == x_1), as the
    CTMC does, whether or not it was drawn as noise. The true-mask diagnostic alone reads the
    draw: such a position is masked for the denoiser and may be kept or denoised. At 0.999 such
    positions are too rare to tell."""
    if denoiser_type == "uniform":
        variant, denoiser = PlannedUniformVariant(models.planner, models.uniform_denoiser, False), \
            models.uniform_denoiser
    else:
        variant, denoiser = _planned_mask_variant(models.planner, models.mask_denoiser, mask), models.mask_denoiser
    _check_estimator(toy, variant, lambda x1, rows, t_max, seed: elbo_planned(
        models.planner, denoiser, x1, S, denoiser_type=denoiser_type, mask=mask, mc_samples=SAMPLES, t_max=t_max,
        seed=seed, row_ids=rows), t_max=0.6)


@pytest.mark.parametrize("estimator, kind, mask, timed", [
    ("uniform", None, None, False), ("mask", None, None, False), ("planned", "uniform", "planner", False),
    ("planned", "uniform", "planner", True), ("planned", "mask", "planner", False), ("planned", "mask", "true", False)])
def test_each_draw_of_an_estimate_has_its_own_stream(toy, models, estimator, kind, mask, timed, monkeypatch):
    """Two draws of one Monte-Carlo sample never share uniforms (the transitioning term's planned
    mask is not the final emission's, say): each (sample, stream) is asked for once."""
    asked = []
    uniform = EvalNoise.uniform

    def recorded(self, sample, stream, rows, cols):
        asked.append((sample, stream))
        return uniform(self, sample, stream, rows, cols)

    monkeypatch.setattr(EvalNoise, "uniform", recorded)
    x1, kwargs = toy.states, dict(mc_samples=2, t_max=T_MAX, seed=1)
    if estimator == "uniform":
        elbo_uniform_model(models.uniform_model, x1, S, **kwargs)
    elif estimator == "mask":
        elbo_mask_diffusion(models.mask_denoiser, x1, S, **kwargs)
    else:
        denoiser = models.uniform_denoiser if kind == "uniform" else models.mask_denoiser
        elbo_planned(models.planner_t if timed else models.planner, denoiser, x1, S, denoiser_type=kind, mask=mask,
                     time_conditioned_planner=timed, **kwargs)
    assert len(asked) == len(set(asked)), sorted(asked)


def test_evaluate_elbo_defaults_and_batch_size_check():
    """Without settings a row is one sample a sequence, linear schedule, DEFAULT_T_MAX, seed 0;
    batch_size below 1 is named by both evaluations."""
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo
    from ddpd.eval.elbo import DEFAULT_T_MAX
    from ddpd.eval.report import mean_and_se

    def model(x, t):
        return torch.arange(V, dtype=torch.float32).expand(*x.shape, V) * t[:, None, None]

    x1 = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    row, = evaluate_elbo(ModelSet(V, uniform_model=model), x1)
    terms = elbo_uniform_model(model, x1, V, mc_samples=1, t_max=DEFAULT_T_MAX, schedule="linear", seed=0)
    assert (row["mc_samples"], row["t_max"]) == (1, DEFAULT_T_MAX)
    assert row["elbo"] == pytest.approx(mean_and_se(terms.bits()["elbo"])[0], rel=1e-6)
    for evaluate in (evaluate_elbo, evaluate_denoising):
        with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0$"):
            evaluate(ModelSet(V, uniform_model=model), x1, batch_size=0)


def test_every_estimator_defaults_to_one_linear_sample_to_0_999_with_seed_0():
    """Without settings every estimator draws one sample a sequence, seed 0, on the linear
    schedule up to t_max = 0.999, the defaults ddpd-eval elbo states and passes: a library
    default of its own would report another bound (or other draws) for the same models."""
    from ddpd.eval.elbo import DEFAULT_T_MAX

    x1 = torch.arange(32).remainder(V).view(4, 8)
    estimators = flat_estimators(x1)
    stated = dict(mc_samples=1, seed=0, t_max=0.999, schedule="linear")
    assert DEFAULT_T_MAX == 0.999
    for name, estimate in estimators.items():
        default = estimate()
        for term in TERMS:
            torch.testing.assert_close(getattr(default, term), getattr(estimate(**stated), term), rtol=0, atol=0,
                                       msg=(name, term))
        for other in (dict(mc_samples=2), dict(seed=1), dict(t_max=0.9999)):
            assert not torch.equal(default.elbo, estimate(**{**stated, **other}).elbo), (name, other)


def test_every_estimator_names_a_network_given_as_a_path():
    """A checkpoint path given for a network is refused naming the argument, not met as "'str'
    object is not callable" from inside the first forward pass."""
    def network(x, t=None):
        return torch.zeros(*x.shape, V) if t is not None else torch.zeros(x.shape)

    x1, path = torch.zeros(2, 4, dtype=torch.long), "runs/network"
    calls = [
        ("model", lambda: elbo_uniform_model(path, x1, V)),
        ("planner", lambda: elbo_planned(path, network, x1, V)),
        ("denoiser", lambda: elbo_planned(network, path, x1, V)),
        ("denoiser", lambda: elbo_planned(network, path, x1, V, denoiser_type="mask")),
        ("denoiser", lambda: elbo_mask_diffusion(path, x1, V)),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=f"^{name} must be callable, got str$"):
            call()


def test_sample_m_of_an_estimate_reads_its_stratum_of_each_integral():
    """Sample m of M draws alpha = a u (the corrupted state) and s = s_max u (the all-clean
    part) with u in its stratum [m / M, (m + 1) / M] for every row, as EvalNoise.stratified
    gives: plain uniforms leave the estimate unbiased but lose the variance reduction. The
    linear schedule's t is alpha; the model is called at the corrupted time, the clean time and
    t_max in turn, each a float32 time as the networks are trained on."""
    times = []

    def model(x, t):
        assert t.dtype == torch.float32, t.dtype
        times.append(t.double())
        return torch.zeros(*x.shape, V)

    samples, t_max = 4, 0.9
    elbo_uniform_model(model, torch.zeros(8, 4, dtype=torch.long), V, mc_samples=samples, t_max=t_max, seed=2)
    assert len(times) == 3 * samples
    for m in range(samples):
        corrupted, clean, final = times[3 * m:3 * m + 3]
        for u in (corrupted / t_max, -torch.log1p(-clean) / -math.log1p(-t_max)):
            assert bool(((u >= m / samples - 1e-5) & (u <= (m + 1) / samples + 1e-5)).all()), (m, u)
        torch.testing.assert_close(final, torch.full((8,), t_max, dtype=torch.float64))


@pytest.mark.parametrize("logit, denoiser_type, mask", [(-200.0, "uniform", "planner"), (200.0, "mask", "true")])
def test_planned_elbo_is_finite_for_a_planner_sure_of_every_position(logit, denoiser_type, mask):
    """A planner sure every position is clean (or noise) has log p(z = N) = logit and
    log p(z = D) = -logit there, not log(0) from its rounded sigmoid: the planning term and
    the final emission's noise and keep branches stay finite (with the true mask a clean
    position of the final state is kept at log p(z = D) = -200)."""
    def planner(x):
        return torch.full(x.shape, logit)

    x1 = torch.arange(32).remainder(V).view(4, 8)
    terms = elbo_planned(planner, flat_denoiser, x1, V, denoiser_type=denoiser_type, mask=mask, mc_samples=2, t_max=0.9)
    for term in TERMS:
        assert bool(torch.isfinite(getattr(terms, term)).all()), term
    assert bool((terms.planning < 0).all() if logit < 0 else (terms.final < -100).all())


@pytest.mark.parametrize("estimator", ["mask", "planner+uniform", "true-mask"])
def test_the_final_emission_reads_the_denoiser_at_t_max(estimator):
    """Each sample calls the denoiser at the corrupted state's time, then at t_max for the final
    emission (not at t = 1, nor at alpha(t_max)), under the cosine schedule."""
    times = []

    def denoiser(x, t):
        times.append(t)
        return torch.zeros(*x.shape, V)

    x1, samples, t_max = torch.arange(32).remainder(V).view(4, 8), 2, 0.9
    kwargs = dict(mc_samples=samples, t_max=t_max, schedule="cosine", seed=4)
    if estimator == "mask":
        elbo_mask_diffusion(denoiser, x1, V, **kwargs)
    else:
        mask = dict(denoiser_type="mask", mask="true") if estimator == "true-mask" else {}
        elbo_planned(flat_planner, denoiser, x1, V, **mask, **kwargs)
    assert len(times) == 2 * samples
    for corrupted, final in zip(times[0::2], times[1::2]):
        assert bool((corrupted < t_max).all())
        torch.testing.assert_close(final, torch.full((4,), t_max))


@pytest.mark.parametrize("denoiser_type", ["uniform", "mask"])
def test_the_planned_final_emission_reads_the_state_not_its_noise_draw(denoiser_type, monkeypatch):
    """The model sees the final state x, not which of its positions were drawn as noise: a
    position holding its clean value is kept or planned as the CTMC would, whether or not its
    value was drawn. Marking every position of x as drawn changes no term (the true-mask
    diagnostic alone reads the draw)."""
    from ddpd.eval import corruption

    def every_position_drawn(*args, **kwargs):
        x, z = marginal(*args, **kwargs)
        return x, torch.ones_like(z)

    x1 = torch.arange(32).remainder(V).view(4, 8)
    kwargs = dict(denoiser_type=denoiser_type, mc_samples=2, t_max=0.6, seed=6)
    drawn = elbo_planned(flat_planner, flat_denoiser, x1, V, **kwargs)
    marginal = corruption.marginal_corruption
    monkeypatch.setattr(corruption, "marginal_corruption", every_position_drawn)
    every = elbo_planned(flat_planner, flat_denoiser, x1, V, **kwargs)
    torch.testing.assert_close(every.final, drawn.final)


def test_every_estimator_names_a_denoiser_with_the_wrong_vocabulary():
    """A denoiser of 26 logits for V = 27 is refused naming the denoiser (not "model") whether
    it runs after a planner (uniform denoiser, true or planned mask) or alone."""

    def short(x, t):
        return torch.zeros(*x.shape, V - 1)

    x1 = torch.zeros(2, 4, dtype=torch.long)
    calls = [lambda: elbo_planned(flat_planner, short, x1, V),
             lambda: elbo_planned(flat_planner, short, x1, V, denoiser_type="mask", mask="true"),
             lambda: elbo_planned(flat_planner, short, x1, V, denoiser_type="mask"),
             lambda: elbo_mask_diffusion(short, x1, V)]
    for call in calls:
        with pytest.raises(ValueError, match=r"^denoiser must return floating logits of shape \[2, 4, 27\]"):
            call()


def test_a_planner_sure_of_noise_masks_a_position_whose_uniform_is_1():
    """Row 277064 of seed 0 draws exactly 1.0 at column 7 of sample 0's planned mask (one
    uniform in 2**24): a planner sure of noise (p = 1 in float32) masks it there too, as
    ddpd.ops.bernoulli reads u = 1; a plain u < p showed the denoiser that position."""
    from ddpd.eval.corruption import PLANNED_MASK

    rows, S = torch.tensor([277064]), 3
    assert float(EvalNoise(0).uniform(0, PLANNED_MASK, rows, 8)[0, 7]) == 1.0
    seen = []

    def records_x(x, t):
        seen.append(x.clone())
        return torch.zeros(*x.shape, S)

    elbo_planned(lambda x: torch.full(x.shape, 30.0), records_x, torch.zeros(1, 8, dtype=torch.long), S,
                 denoiser_type="mask", mask="planner", seed=0, row_ids=rows)
    assert seen and all(torch.equal(x, torch.full((1, 8), S)) for x in seen)
