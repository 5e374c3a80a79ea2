"""The process formulas against brute-force enumeration on tiny state spaces."""
import itertools
import math

import pytest
import torch

from ddpd.process import (
    CosineSchedule,
    CustomSchedule,
    LinearSchedule,
    Schedule,
    corrupt,
    denoiser_log_prob_from_uniform,
    denoiser_prob_from_uniform,
    get_schedule,
    planner_log_prob_from_uniform,
    planner_prob_from_uniform,
    uniform_token,
)

F64 = torch.float64

SCHEDULES = [
    LinearSchedule(),
    CosineSchedule(),
    CustomSchedule(lambda t: t**2, lambda t: 2 * t, lambda a: a.sqrt()),
]


def test_schedule_reprs_rebuild_or_name_their_fields():
    """A named schedule's repr rebuilds it; a CustomSchedule's was "CustomSchedule()", which names
    none of the three callables it holds and does not rebuild (it takes three)."""
    for schedule in (LinearSchedule(), CosineSchedule()):
        again = eval(repr(schedule), {type(schedule).__name__: type(schedule)})
        assert type(again) is type(schedule) and repr(again) == f"{type(schedule).__name__}()"
    custom = SCHEDULES[2]
    assert repr(custom) == (f"CustomSchedule(alpha={custom._alpha!r}, alpha_dot={custom._alpha_dot!r}, "
                            f"inverse={custom._inverse!r})")


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
def test_schedule_endpoints_derivative_inverse(schedule):
    t = torch.linspace(0.01, 0.99, 50, dtype=torch.float64)
    ends = torch.tensor([0.0, 1.0], dtype=F64)
    assert torch.allclose(schedule.alpha(ends), ends, atol=1e-12)
    h = 1e-6
    numeric = (schedule.alpha(t + h) - schedule.alpha(t - h)) / (2 * h)
    assert torch.allclose(schedule.alpha_dot(t), numeric, rtol=1e-6)
    assert torch.allclose(schedule.inverse(schedule.alpha(t)), t, rtol=1e-9)
    assert torch.allclose(schedule.rate(t), schedule.alpha_dot(t) / (1 - schedule.alpha(t)))


@pytest.mark.parametrize("schedule", SCHEDULES[:2], ids=lambda s: type(s).__name__)
def test_schedules_give_float_values_for_an_integer_time(schedule):
    """The named schedules at t = 0 or 1 as a Python int or a Long tensor: alpha and alpha_dot come
    back floating, as for a float time (torch.ones_like of a Long t is Long)."""
    for t in (1, torch.tensor([0, 1])):
        for values in (schedule.alpha(t), schedule.alpha_dot(t)):
            assert values.is_floating_point(), (t, values)


def test_the_cosine_inverse_reads_an_alpha_rounded_just_outside_0_1_as_its_end():
    """acos(1 - a) is NaN for a off [0, 1]: an alpha float32 arithmetic puts 1e-7 past an end
    (1 - sum_p / D) must map to that end's time, not to a NaN time."""
    a = torch.tensor([-1e-7, 1.0 + 1e-7], dtype=F64)
    assert CosineSchedule().inverse(a).tolist() == [0.0, 1.0]


def test_get_schedule_rejects_unknown():
    assert isinstance(get_schedule("cosine"), CosineSchedule)
    with pytest.raises(ValueError, match="schedule"):
        get_schedule("sqrt")
    with pytest.raises(TypeError, match="alpha"):
        CustomSchedule(1.0, lambda t: t, lambda a: a)


@pytest.mark.parametrize("alpha, inverse, match", [
    (lambda t: 0.5 * t, lambda a: 2 * a, r"alpha must map t = 0 to 0 and t = 1 to 1, got 0.0 and 0.5"),
    (lambda t: 0.1 + 0.9 * t, lambda a: (a - 0.1) / 0.9, r"alpha must map .* got 0.1 and 1.0"),
    (lambda t: t, lambda a: 0.5 * a, r"inverse must map alpha = 0 to 0 and alpha = 1 to 1, got 0.0 and 0.5"),
    (lambda t: t * (1 - 1e-5), lambda a: a / (1 - 1e-5), r"alpha must map .* got 0.0 and 0.99999"),  # past 1e-6
])
def test_custom_schedule_refuses_a_schedule_off_its_endpoints(alpha, inverse, match):
    """alpha_0 = 0 and alpha_1 = 1 (the schedule's definition): with alpha_1 = 0.5, corrupt at t = 1
    left half the tokens noise and the samplers stopped at t = 1 on a state still half noise."""
    with pytest.raises(ValueError, match=match):
        CustomSchedule(alpha, lambda t: torch.ones_like(t), inverse)


@pytest.mark.parametrize("alpha, alpha_dot, match", [
    (lambda t: t + 0.5 * torch.sin(2 * math.pi * t), lambda t: torch.ones_like(t),  # falls from t = 0.3 to 0.7
     r"alpha must not fall on \[0, 1\] \(alpha_t rises .*\), got alpha\(0.301758\) = 0.775551 > alpha\(0.302734\)"),
    (lambda t: t, lambda t: 1 - 2 * t, r"alpha_dot must be >= 0 on \[0, 1\] .* got -0.00195312 at t = 0.500977"),
    (lambda t: t, lambda t: 1 / (t - 0.5), r"alpha_dot must be finite on \[0, 1\], got inf at t = 0.5"),
    # a fall or a slope below zero smaller than 1e-3 is refused too: there is no tolerance
    (lambda t: t + 0.0015 * ((t - 0.5).abs() < 0.01).double(), lambda t: torch.ones_like(t),
     r"alpha must not fall .* got alpha\(0.509766\) = 0.511266 > alpha\(0.510742\) = 0.510742"),
    (lambda t: t, lambda t: t - 1e-4, r"alpha_dot must be >= 0 on \[0, 1\] .* got -0.0001 at t = 0"),
])
def test_custom_schedule_refuses_an_alpha_that_falls(alpha, alpha_dot, match):
    """alpha_t rises from 0 to 1; one that falls between its right endpoints gave negative jump
    rates and probabilities, drawn from without a word."""
    with pytest.raises(ValueError, match=match):
        CustomSchedule(alpha, alpha_dot, lambda a: a)


def test_custom_schedule_takes_endpoints_within_1e_6():
    """The documented tolerance: a schedule whose float arithmetic misses alpha_1 = 1 by 1e-7 is taken."""
    schedule = CustomSchedule(lambda t: t * (1 - 1e-7), lambda t: torch.ones_like(t), lambda a: a / (1 - 1e-7))
    assert float(schedule.alpha(1.0)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("schedule, got", [
    (None, "NoneType"), (LinearSchedule, "the class LinearSchedule"), (1, "int"),
])
def test_get_schedule_names_a_schedule_of_the_wrong_type(schedule, got):
    """The class rather than an instance, or no schedule: a TypeError, as for every wrong type."""
    with pytest.raises(TypeError, match=f"schedule must be a schedule's name or a Schedule, got {got}"):
        get_schedule(schedule)


def test_rate_decomposition_at_alpha_0_and_1_in_closed_form():
    """The endpoints the samplers start and end at (eqs. corruption_prob and denoising_prob, S = 3):
    at alpha = 0 every position is noise and the jump law is p(x_1 | x_t); at alpha = 1 no
    corrupted position is left to land on x_t^d (self-loop 0), and a row sure of x_t^d has
    p(z = N) = 0: no jump, -inf throughout (not the NaN of -inf - -inf)."""
    p_x1 = torch.tensor([[[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]]], dtype=F64)
    x_t, inf = torch.tensor([[0, 0]]), math.inf
    cases = {0.0: ([1.0, 1.0], [[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]]), 1.0: ([0.5, 0.0], [[0.0, 0.6, 0.4], [0.0] * 3])}
    for alpha, (noise, jump) in cases.items():
        noise, jump = torch.tensor([noise], dtype=F64), torch.tensor([jump], dtype=F64)
        torch.testing.assert_close(planner_prob_from_uniform(p_x1, x_t, alpha), noise)
        torch.testing.assert_close(planner_log_prob_from_uniform(p_x1.log(), x_t, alpha), noise.log())
        torch.testing.assert_close(denoiser_prob_from_uniform(p_x1, x_t, alpha), jump)
        torch.testing.assert_close(denoiser_log_prob_from_uniform(p_x1.log(), x_t, alpha), jump.log())
    assert denoiser_log_prob_from_uniform(p_x1.log(), x_t, 1.0)[0, 1].tolist() == [-inf] * 3


def _enumerate_posteriors(p_data, S, D, alpha):
    """Exact p(x1^d=j|x_t), p(z^d=N|x_t), p(x1^d=j|x_t,z^d=N) by summing the joint."""
    states = list(itertools.product(range(S), repeat=D))
    post_x1 = torch.zeros(len(states), D, S, dtype=F64)
    post_z = torch.zeros(len(states), D, dtype=F64)
    post_x1_zn = torch.zeros(len(states), D, S, dtype=F64)
    for i, xt in enumerate(states):
        total = 0.0
        for x1_idx, x1 in enumerate(states):
            for z in itertools.product((0, 1), repeat=D):  # 1 = noise
                w = p_data[x1_idx].item()
                for d in range(D):
                    w *= (1 - alpha) / S if z[d] else alpha * (xt[d] == x1[d])
                total += w
                for d in range(D):
                    post_x1[i, d, x1[d]] += w
                    if z[d]:
                        post_z[i, d] += w
                        post_x1_zn[i, d, x1[d]] += w
        post_x1[i] /= total
        post_x1_zn[i] /= post_z[i][:, None]
        post_z[i] /= total
    return torch.tensor(states), post_x1, post_z, post_x1_zn


@pytest.mark.parametrize("S,D,alpha", [(3, 2, 0.3), (2, 3, 0.7), (4, 1, 0.5)])
def test_rate_decomposition_matches_enumeration(S, D, alpha):
    torch.manual_seed(S * 10 + D)
    p_data = torch.distributions.Dirichlet(torch.full((S**D,), 0.5, dtype=F64)).sample()
    x_t, post_x1, post_z, post_x1_zn = _enumerate_posteriors(p_data, S, D, alpha)
    planner = planner_prob_from_uniform(post_x1, x_t, alpha)
    assert torch.allclose(planner, post_z, atol=1e-12)
    assert torch.allclose(planner_log_prob_from_uniform(post_x1.log(), x_t, alpha).exp(), post_z, atol=1e-12)
    denoiser = denoiser_prob_from_uniform(post_x1, x_t, torch.full((x_t.shape[0],), alpha, dtype=F64))
    assert torch.allclose(denoiser, post_x1_zn, atol=1e-12)
    assert torch.allclose(denoiser.sum(-1), torch.ones_like(planner))


@pytest.mark.parametrize("alpha", [0.99, 0.999, 0.9999])
def test_rate_decomposition_keeps_the_self_loop_near_alpha_one_in_float32(alpha):
    """S = 50257, a model sure of x_t^d (logits 0 there, -40 elsewhere): alpha / (alpha + (1 - alpha) / S)
    rounds to 1 in float32 above alpha = 0.9985, which dropped the self-loop (probability 0, not
    0.99999, at 0.999). Float32 against eq. corruption_prob in float64, 1e-4 relative."""
    S, x_t = 50257, torch.tensor([[7]])
    log_p = torch.full((1, 1, S), -40.0, dtype=F64).scatter(-1, x_t[..., None], 0.0).log_softmax(-1)
    p_same = log_p[0, 0, 7].exp()
    want_noise = 1 - p_same * alpha / (alpha + (1 - alpha) / S)
    want_self_loop = (p_same - (1 - want_noise)) / want_noise
    lp, a = log_p.float(), torch.tensor([alpha])
    noise = planner_prob_from_uniform(lp.exp(), x_t, a)
    log_noise = planner_log_prob_from_uniform(lp, x_t, a)
    self_loop = denoiser_log_prob_from_uniform(lp, x_t, a)[0, 0, 7].exp()
    for got, want in ((noise, want_noise), (log_noise.exp(), want_noise), (self_loop, want_self_loop)):
        assert float(got) == pytest.approx(float(want), rel=1e-4)


def test_rate_decomposition_in_float32_at_alpha_one_for_a_model_sure_of_x_t():
    """alpha = 1 (self-loop weight 0), a model 30 nats sure of x_t^d in float32: 1 - p(x_1^d = x_t^d)
    rounds to 0, yet p(z = N | x_t) = 2 e^-30 / (1 + 2 e^-30) and the jump law is half and half on the
    two other tokens (the other tokens' probability summed, not 1 - p(x_1^d = x_t^d))."""
    log_p = torch.tensor([[[0.0, -30.0, -30.0]]]).log_softmax(-1)
    x_t = torch.tensor([[0]])
    want = math.log(2 * math.exp(-30) / (1 + 2 * math.exp(-30)))
    assert float(planner_log_prob_from_uniform(log_p, x_t, 1.0)) == pytest.approx(want, rel=1e-5)
    jump = denoiser_log_prob_from_uniform(log_p, x_t, 1.0)[0, 0]
    assert jump[0] == float("-inf")
    torch.testing.assert_close(jump[1:].exp(), torch.tensor([0.5, 0.5]))


def _log_noise_as_written(log_p, x_t, alpha):
    """log p(z^d = N | x_t) (eq. corruption_prob) op for op as ddpd.process first computed it:
    the values that a version with finite gradients must keep, bit for bit."""
    here, a = x_t[..., None], alpha[:, None]
    log_self_loop = log_p.gather(-1, here).squeeze(-1) + torch.log((1.0 - a) / (1.0 + (log_p.shape[-1] - 1) * a))
    return torch.logaddexp(torch.logsumexp(log_p.scatter(-1, here, -math.inf), -1), log_self_loop)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_log_rates_have_finite_gradients_where_a_row_is_sure_of_x_t(dtype):
    """A row sure of x_t^d (the other tokens -inf) gave NaN gradients to every logit of the row:
    logsumexp of -inf alone, and at alpha = 1 (p(z = N) = 0) logaddexp of two -inf. They are the
    gradients of the probability-space formula now, and the values are as before, bit for bit,
    with autograd and without (edge rows too: x_t^d impossible, alpha 0 and 1)."""
    generator = torch.Generator().manual_seed(0)
    B, D, S = 6, 4, 5
    logits = torch.randn(B, D, S, dtype=dtype, generator=generator)
    x_t = torch.randint(0, S, (B, D), generator=generator)
    here = torch.nn.functional.one_hot(x_t, S).bool()
    logits[:, 0] = torch.where(here[:, 0], 0.0, -math.inf)  # sure of x_t^d
    logits[:, 1] = torch.where(here[:, 1], -math.inf, logits[:, 1])  # x_t^d impossible
    logits[:, 2, :2] = -math.inf  # some other tokens impossible
    alpha = torch.tensor([0.0, 0.3, 0.7, 0.999, 1.0, 1.0], dtype=dtype)
    logits.requires_grad_(True)
    log_p = logits.log_softmax(-1)
    log_noise = planner_log_prob_from_uniform(log_p, x_t, alpha)
    log_jump = denoiser_log_prob_from_uniform(log_p, x_t, alpha)
    assert torch.equal(log_noise.detach(), _log_noise_as_written(log_p.detach(), x_t, alpha))
    assert log_noise[4:, 0].tolist() == [-math.inf, -math.inf]  # p(z = N) = 0
    with torch.no_grad():
        assert torch.equal(planner_log_prob_from_uniform(log_p, x_t, alpha), log_noise)
        assert torch.equal(denoiser_log_prob_from_uniform(log_p, x_t, alpha), log_jump)
    grad, = torch.autograd.grad(log_noise.exp().sum(), logits, retain_graph=True)
    want, = torch.autograd.grad(planner_prob_from_uniform(logits.softmax(-1), x_t, alpha).sum(), logits)
    torch.testing.assert_close(grad, want)
    grad, = torch.autograd.grad(log_jump.exp().sum(), logits)
    assert torch.isfinite(grad).all()


def test_self_loop_ctmc_preserves_inter_state_rates():
    """prop:self-loop-jumps: the rates rate * p(z^d = N | x_t) * p(x_1^d = j | x_t, z^d = N), self-loop
    j = x_t^d included, have the uniform generative rate off the diagonal and total rate
    rate * sum_d p(z^d = N | x_t): the CTMC the DDPD samplers simulate."""
    S, D, alpha = 3, 2, 0.4
    p_data = torch.distributions.Dirichlet(torch.full((S**D,), 0.3, dtype=F64)).sample()
    x_t, post_x1, _, _ = _enumerate_posteriors(p_data, S, D, alpha)
    rate = LinearSchedule().rate(torch.full((x_t.shape[0],), alpha, dtype=F64))
    planner = planner_prob_from_uniform(post_x1, x_t, alpha)
    denoiser = denoiser_prob_from_uniform(post_x1, x_t, alpha)
    rates = (rate[:, None] * planner)[..., None] * denoiser
    total = (rate[:, None] * planner).sum(-1)
    # Off-diagonal rates equal the uniform generative rate alpha'/(1-alpha) p(x1^d=j|x_t).
    off = torch.ones_like(rates, dtype=torch.bool).scatter(-1, x_t[..., None], False)
    expected = rate[:, None, None] * post_x1
    assert torch.allclose(rates[off], expected[off], atol=1e-12)
    assert torch.allclose(total, rate * planner.sum(-1))
    assert torch.allclose(total, rates.sum((-1, -2)))


RATE_FUNCTIONS = [planner_prob_from_uniform, denoiser_prob_from_uniform, planner_log_prob_from_uniform,
                  denoiser_log_prob_from_uniform]


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
def test_rate_decomposition_takes_alpha_as_a_number_a_0d_tensor_or_one_per_row(fn):
    p_x1 = torch.softmax(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)), -1)
    x_t = torch.tensor([[0, 1, 2], [3, 2, 1]])
    expected = fn(p_x1, x_t, torch.tensor([0.25, 0.25]))
    for alpha in (0.25, torch.tensor(0.25), torch.tensor([0.25, 0.25], dtype=F64)):
        torch.testing.assert_close(fn(p_x1, x_t, alpha), expected)


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("alpha, batch, error, match", [
    (torch.tensor([0.1, 0.2]), 1, ValueError, r"alpha must be a number, a 0-d tensor or of shape \[1\].* \(2,\)"),
    (torch.tensor([0.1, 0.2, 0.3]), 2, ValueError, r"alpha must be .* of shape \[2\].*got shape \(3,\)"),
    (torch.full((2, 1), 0.1), 2, ValueError, r"alpha must be .* of shape \[2\].*got shape \(2, 1\)"),
    ("0.5", 2, TypeError, "alpha must be a number or a tensor, got str"),
    (True, 2, TypeError, "alpha must be a number or a tensor, got bool"),
])
def test_rate_decomposition_names_a_mismatched_alpha(fn, alpha, batch, error, match):
    p_x1 = torch.full((batch, 3, 4), 0.25)
    with pytest.raises(error, match=match):
        fn(p_x1, torch.zeros(batch, 3, dtype=torch.long), alpha)


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("x_t, error, match", [
    (torch.tensor([[0, 1, 4]]), ValueError, r"x_t must hold ids in \[0, 4\), got range \[0, 4\]"),  # a mask id
    (torch.tensor([[0, -1, 2]]), ValueError, r"x_t must hold ids in \[0, 4\), got range \[-1, 2\]"),
    (torch.tensor([[0, 1, 2]], dtype=torch.int32), TypeError, r"x_t must have dtype in \(torch.int64\)"),
])
def test_rate_decomposition_names_an_x_t_that_is_no_token(fn, x_t, error, match):
    """A masked x_t (mask id S) met gather's 'index 4 is out of bounds for dimension 2 with size 4',
    naming no argument."""
    with pytest.raises(error, match=match):
        fn(torch.full((1, 3, 4), 0.25), x_t, 0.5)


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("p_x1, x_t, error, match", [
    (torch.full((2, 3, 4), 0.25), torch.zeros(3, 2, dtype=torch.long), ValueError,
     r"x_t must have shape \(2, 3\) \(\[B, D\] of (log_)?p_x1 \[B, D, S\]\), got \(3, 2\)"),
    (torch.full((2, 3, 4), 0.25), torch.zeros(3, dtype=torch.long), ValueError, r"x_t must have shape \(2, 3\)"),
    (torch.full((2, 3, 4), 0.25), torch.zeros(1, 2, 3, dtype=torch.long), ValueError, r"x_t must have shape \(2, 3\)"),
    (torch.full((3, 4), 0.25), torch.zeros(3, dtype=torch.long), ValueError, r"p_x1 must be 3-D, got shape \(3, 4\)"),
    (torch.ones(2, 3, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), TypeError,
     r"p_x1 must have dtype in \(torch.float32"),
    ([[[0.5, 0.5]]], torch.zeros(1, 1, dtype=torch.long), TypeError, "p_x1 must be a torch.Tensor, got list"),
    (None, torch.zeros(1, 1, dtype=torch.long), TypeError, "p_x1 must be a torch.Tensor, got NoneType"),
])
def test_rate_decomposition_names_a_p_x1_and_x_t_that_do_not_match(fn, p_x1, x_t, error, match):
    """An x_t of another shape than p_x1's [B, D] met gather's 'Index tensor must have the same number of
    dimensions as input tensor' (a RuntimeError naming no argument), a p_x1 that is no tensor an
    AttributeError; a transposed x_t ([D, B]) met 'Size does not match at dimension 0'."""
    with pytest.raises(error, match=match):
        fn(p_x1, x_t, 0.5)


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("alpha, match", [
    (1.5, r"\[1.5, 1.5\]"), (-0.5, r"\[-0.5, -0.5\]"), (torch.tensor([0.5, float("nan")]), r"\[nan, nan\]"),
    (torch.tensor([0.2, 1.25], dtype=F64), r"\[0.2, 1.25\]"),
])
def test_rate_decomposition_refuses_an_alpha_outside_0_1(fn, alpha, match):
    """alpha = 1.5 made the self-loop weight negative: p(z = N | x_t) = -0.0909 for a model sure of
    x_t^d (S = 4), which the samplers drew from as a probability."""
    p_x1 = torch.full((2, 3, 4), 0.25)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got range " + match):
        fn(p_x1, torch.zeros(2, 3, dtype=torch.long), alpha)


@pytest.mark.parametrize("noise", ["uniform", "mask"])
def test_corrupt_marginals(noise):
    g = torch.Generator().manual_seed(0)
    S, n = 5, 200_000
    x1 = torch.randint(0, S, (n, 1), generator=g)
    t = torch.full((n,), 0.3)
    x_t, z_t = corrupt(x1, t, "linear", noise, S, generator=g)
    frac_noise = z_t.double().mean().item()
    assert abs(frac_noise - 0.7) < 4 * math.sqrt(0.21 / n)
    assert torch.equal(x_t[~z_t], x1[~z_t])
    if noise == "mask":
        assert (x_t[z_t] == S).all()
    else:
        # Corrupted positions are uniform over the vocabulary, including x1's value.
        hits = (x_t[z_t] == x1[z_t]).double().mean().item()
        assert abs(hits - 1 / S) < 0.01
        assert x_t.max() < S


def test_corrupt_noise_values():
    """Uniform noise redraws over all S tokens (the last included), each 1/S of the time; mask
    noise writes the given mask_id. (Draws over the first S - 1 tokens alone still hit x1's value
    1/S of the time, which is all test_corrupt_marginals checks.)"""
    g = torch.Generator().manual_seed(0)
    S, n = 5, 100_000
    x1 = torch.zeros(n, 1, dtype=torch.long)
    x_t, _ = corrupt(x1, 0.0, "linear", "uniform", S, generator=g)
    share = torch.bincount(x_t.flatten(), minlength=S).double() / n
    assert float((share - 1 / S).abs().max()) < 4 * math.sqrt(0.16 / n)
    x_t, z_t = corrupt(x1, 0.5, "linear", "mask", S, mask_id=7, generator=g)
    assert z_t.any() and (x_t[z_t] == 7).all() and (x_t[~z_t] == 0).all()


def test_corrupt_noises_a_position_whose_uniform_reaches_alpha(monkeypatch):
    """z = N where u >= alpha_t: on torch's uniform grid (k 2**-24, from 0) that is probability
    1 - alpha_t exactly, and t = 0 noises every position, a uniform of 0 included; t = 1 none."""
    u = torch.tensor([[0.0, 0.5, 1 - 2.0**-24]])
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: u.clone())
    x1 = torch.zeros(1, 3, dtype=torch.long)
    for t, noise in ((0.0, [True, True, True]), (0.5, [False, True, True]), (1.0, [False, False, False])):
        x_t, z_t = corrupt(x1, t, "linear", "mask", 5)
        assert z_t.tolist() == [noise] and torch.equal(x_t, torch.where(z_t, 5, x1)), t


@pytest.mark.parametrize("noise", ["uniform", "mask"])
def test_corrupt_reads_each_row_at_its_own_time(noise):
    """t of shape [B] holds one time per row of x1: t = 0 noises its whole row, t = 1 none of its."""
    x1 = torch.randint(0, 5, (3, 64), generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.0, 1.0, 1.0])
    x_t, z_t = corrupt(x1, t, "linear", noise, 5, generator=torch.Generator().manual_seed(1))
    assert z_t[0].all() and not z_t[1:].any() and torch.equal(x_t[1:], x1[1:])


@pytest.mark.parametrize("noise", ["uniform", "mask"])
def test_corrupt_draws_from_its_generator_alone(noise):
    """Both draws (which positions, and uniform noise's tokens) come from `generator`: the same seed
    gives the same (x_t, z_t) whatever torch's global generator holds, and leaves that one as it was."""
    x1 = torch.randint(0, 7, (4, 64), generator=torch.Generator().manual_seed(1))
    runs, state = [], torch.get_rng_state()
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        runs.append(corrupt(x1, 0.5, "linear", noise, 7, generator=torch.Generator().manual_seed(2)))
        assert torch.equal(torch.get_rng_state(), before)
    torch.set_rng_state(state)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_corrupt_validates():
    x1 = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="noise"):
        corrupt(x1, torch.zeros(2), "linear", "gaussian", 4)
    with pytest.raises(TypeError, match="x1"):
        corrupt(x1.float(), torch.zeros(2), "linear", "mask", 4)


@pytest.mark.parametrize("change, error, match", [
    (dict(mask_id=2), ValueError, r"mask_id must be >= 5"),  # a mask would read as token 2
    (dict(mask_id=-1), ValueError, r"mask_id must be >= 5"),
    (dict(mask_id=5.0), TypeError, "mask_id must be an int"),
    (dict(vocab_size=5.0), TypeError, "vocab_size must be an int"),
    (dict(vocab_size=0), ValueError, "vocab_size must be >= 1"),
    (dict(x1=torch.tensor([[0, 1, 5]])), ValueError, r"x1 must hold ids in \[0, 5\), got range \[0, 5\]"),
    (dict(x1=torch.tensor([[-1, 1, 2]])), ValueError, r"x1 must hold ids in \[0, 5\)"),
    (dict(t=torch.tensor([1.5])), ValueError, r"t must be in \[0, 1\], got range \[1.5, 1.5\]"),
    (dict(t=torch.tensor([float("nan")])), ValueError, r"t must be in \[0, 1\]"),
    (dict(t=-0.5), ValueError, r"t must be in \[0, 1\]"),
    (dict(t=torch.zeros(1, 1)), ValueError, r"t must be a number, a 0-d tensor or of shape \[1\]"),
    (dict(t=torch.zeros(2)), ValueError, r"t must be a number, a 0-d tensor or of shape \[1\]"),
])
def test_corrupt_names_the_bad_argument(change, error, match):
    args = dict(x1=torch.tensor([[0, 1, 2]]), t=torch.zeros(1), vocab_size=5, mask_id=None)
    args.update(change)
    with pytest.raises(error, match=match):
        corrupt(args["x1"], args["t"], "linear", "mask", args["vocab_size"], mask_id=args["mask_id"])


def test_corrupt_takes_a_time_as_a_number_a_0d_tensor_or_one_per_row():
    x1 = torch.tensor([[0, 1, 2], [2, 1, 0]])
    for t in (1.0, 1, torch.tensor(1.0), torch.ones(2), torch.ones(2, dtype=torch.float64)):
        x_t, z_t = corrupt(x1, t, "linear", "mask", 5, mask_id=5)
        assert torch.equal(x_t, x1) and not z_t.any()


def test_uniform_token_is_exact_on_the_uniforms_of_both_noise_sources():
    """floor(u V) with no rounding of its own, for every uniform PhiloxNoise ((m + 0.5) 2**-24 in
    float32) and TorchNoise (k 2**-24) can give: every token drawn, each within 2**-23 of 1/V.
    The product in float32 rounded again: at V = 50257 some tokens 0.35% more likely."""
    m = torch.arange(2**24, dtype=torch.int64)
    for u in ((m.float() + 0.5) * 2.0**-24, m.float() * 2.0**-24):
        dyadic = (u.double() * 2**25).long()  # u = dyadic / 2**25 exactly
        for vocab in (2**23, 10**6, 50257, 27):
            tokens = uniform_token(u, vocab)
            assert torch.equal(tokens, ((dyadic * vocab) >> 25).clamp(max=vocab - 1))  # Philox's top u is 1.0
            p = torch.bincount(tokens, minlength=vocab).double() / 2**24
            assert p.numel() == vocab and float((p - 1 / vocab).abs().max()) <= 2.0**-23
    with pytest.raises(ValueError, match="vocab_size must be <= 8388608"):  # some tokens could never come
        uniform_token(m[:4].float() * 2.0**-24, 2**23 + 1)


@pytest.mark.parametrize("u, vocab_size, error, match", [
    (torch.rand(2, 3), 0, ValueError, "vocab_size must be >= 1, got 0"),  # was a tensor of -1s
    (torch.rand(2, 3), -2, ValueError, "vocab_size must be >= 1, got -2"),  # was -2s
    (torch.rand(2, 3), 5.0, TypeError, "vocab_size must be an int, got float"),
    ([0.1, 0.5], 5, TypeError, "u must be a torch.Tensor, got list"),
    (0.5, 5, TypeError, "u must be a torch.Tensor, got float"),
    (torch.ones(2, dtype=torch.long), 5, TypeError, r"u must have dtype in \(torch.float32"),
])
def test_uniform_token_names_a_bad_argument(u, vocab_size, error, match):
    """vocab_size 0 or below gave tokens -1 (floor(u V) clamped to V - 1) without a word; a u that is
    no tensor met an AttributeError on .double()."""
    with pytest.raises(error, match=match):
        uniform_token(u, vocab_size)


def test_checks_of_values_leave_traced_tensors_unread():
    """make_fx traces corruption, the losses and the backbone's checks without reading values
    (a fake tensor has none to read)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ddpd.models.backbone import check_labels, check_time, check_tokens
    from ddpd.training.losses import denoiser_loss

    def step(x1, t, labels):
        x_t, z_t = corrupt(x1, t, "linear", "mask", vocab_size=5)
        check_tokens(x_t, 6)
        check_labels(labels, 2, 3, x1.device)
        logits = torch.zeros(*x1.shape, 5) + check_time(t, 2, x1.device)[:, None, None]
        return denoiser_loss(logits, x1, z_t)

    traced = make_fx(step, tracing_mode="fake")(torch.randint(0, 5, (2, 4)), torch.rand(2), torch.tensor([0, 3]))
    targets = [str(node.target) for node in traced.graph.nodes if node.op == "call_function"]
    assert targets and not any("_local_scalar_dense" in target for target in targets)


@pytest.mark.parametrize("x1, t, error, match", [
    ([[0, 1, 2]], 0.5, TypeError, "x1 must be a torch.Tensor, got list"),
    (torch.tensor([[0, 1, 2]], dtype=torch.int32), 0.5, TypeError, r"x1 must have dtype in \(torch.int64\)"),
    (torch.tensor([0, 1, 2]), 0.5, ValueError, r"x1 must be 2-D, got shape \(3,\)"),
    (torch.tensor([[0, 1, 2]]), None, TypeError, "t must be a number or a tensor, got NoneType"),
    (torch.tensor([[0, 1, 2]]), "0.5", TypeError, "t must be a number or a tensor, got str"),
    (torch.tensor([[0, 1, 2]]), True, TypeError, "t must be a number or a tensor, got bool"),
])
def test_corrupt_names_an_argument_of_the_wrong_type(x1, t, error, match):
    with pytest.raises(error, match=match):
        corrupt(x1, t, "linear", "uniform", 5)


def test_the_linear_inverse_gives_a_float_time_for_an_integer_alpha():
    """As alpha and alpha_dot do: an alpha of 0 or 1 as an int or a Long tensor maps to a floating time,
    a new tensor rather than the caller's own."""
    a = torch.tensor([0, 1])
    for alpha in (1, a):
        t = LinearSchedule().inverse(alpha)
        assert t.is_floating_point() and t.tolist() == torch.as_tensor(alpha, dtype=F64).tolist()
    assert LinearSchedule().inverse(a) is not a


def test_custom_schedule_calls_its_functions_with_a_tensor_for_a_number():
    """A number t or alpha reaches the user's callables as a tensor: callables written with tensor methods
    take a Python float as the named schedules do."""
    schedule = CustomSchedule(lambda t: t.pow(2), lambda t: t.mul(2), lambda a: a.sqrt())
    assert float(schedule.alpha(0.5)) == 0.25
    assert float(schedule.alpha_dot(0.5)) == 1.0
    assert float(schedule.inverse(0.25)) == 0.5


@pytest.mark.parametrize("arg", ["alpha_dot", "inverse"])
def test_custom_schedule_names_a_callable_that_is_not_one(arg):
    """Each of the three is checked, not alpha alone: a number for inverse met "'float' object is not
    callable", naming no argument."""
    fns = dict(alpha=lambda t: t, alpha_dot=lambda t: torch.ones_like(t), inverse=lambda a: a)
    fns[arg] = 1.0
    with pytest.raises(TypeError, match=f"{arg} must be callable, got float"):
        CustomSchedule(**fns)


def test_custom_schedule_refuses_an_alpha_below_0_at_t_0():
    """alpha_0 = -0.5 is off its endpoint as much as alpha_0 = 0.5: the tolerance is on |alpha_0|."""
    with pytest.raises(ValueError, match=r"alpha must map t = 0 to 0 and t = 1 to 1, got -0.5 and 1.0"):
        CustomSchedule(lambda t: 1.5 * t - 0.5, lambda t: torch.full_like(t, 1.5), lambda a: (a + 0.5) / 1.5)


def _flat_alpha(t):
    """alpha_t = 2t, then 0.5 on [0.25, 0.75], then 2t - 1: a schedule with a level stretch."""
    return torch.where(t < 0.25, 2 * t, torch.where(t < 0.75, 0.5, 2 * t - 1))


def _flat_alpha_dot(t):
    return torch.where((t >= 0.25) & (t < 0.75), 0.0, 2.0)


def _flat_inverse(a):
    return torch.where(a < 0.5, a / 2, (a + 1) / 2)


def test_custom_schedule_takes_an_alpha_with_a_flat_stretch():
    """alpha_t must not fall, but may stay level (alpha_dot = 0): alpha_t = 0.5 on [0.25, 0.75]."""
    schedule = CustomSchedule(_flat_alpha, _flat_alpha_dot, _flat_inverse)
    assert float(schedule.alpha(torch.tensor(0.5))) == 0.5


def test_custom_schedule_takes_an_alpha_dot_given_as_a_constant():
    """An alpha_dot returning one number for every t is read at each time of the grid: a constant 1
    is taken, and a constant -1 refused naming t = 0 (not an error from reading a 0-d tensor's index)."""
    CustomSchedule(lambda t: t, lambda t: 1.0, lambda a: a)
    with pytest.raises(ValueError, match=r"alpha_dot must be >= 0 on \[0, 1\] .* got -1 at t = 0$"):
        CustomSchedule(lambda t: t, lambda t: -1.0, lambda a: a)


def test_get_schedule_returns_a_schedule_it_is_given_as_it_is():
    """A Schedule passes through as the same object, a CustomSchedule with its callables included."""
    for schedule in SCHEDULES:
        assert get_schedule(schedule) is schedule


def test_rate_decomposition_reads_a_number_alpha_in_float64():
    """A Python float alpha keeps its float64 value for float64 p_x1 (as a Float64 tensor alpha does),
    not a float32 rounding of it (0.1 in float32 is 0.1 + 1.5e-9)."""
    p_x1 = torch.tensor([[[0.5, 0.3, 0.2]]], dtype=F64)
    x_t = torch.tensor([[0]])
    for fn in RATE_FUNCTIONS:
        x = p_x1.log() if "log" in fn.__name__ else p_x1
        assert torch.equal(fn(x, x_t, 0.1), fn(x, x_t, torch.tensor(0.1, dtype=F64))), fn.__name__


def test_corrupt_keeps_positions_by_the_schedule_it_is_given(monkeypatch):
    """The cosine schedule at t = 0.5 keeps a position with probability 1 - cos(pi / 4) = 0.293 (linear: 0.5)."""
    u = torch.tensor([[0.25, 0.35, 0.6]])
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: u.clone())
    x1 = torch.zeros(1, 3, dtype=torch.long)
    for schedule, noise in (("cosine", [False, True, True]), ("linear", [False, False, True])):
        _, z_t = corrupt(x1, 0.5, schedule, "mask", 5)
        assert z_t.tolist() == [noise], schedule


def test_corrupt_reads_a_time_in_float32(monkeypatch):
    """t = 0.7 in float32 is 0.69999999: a uniform of that float32 value noises its position whether t came
    as a float, a Float32 tensor or a Float64 tensor (one rounding for all, as the uniforms are float32)."""
    u = torch.tensor([[0.7]])
    monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: u.clone())
    x1 = torch.zeros(1, 1, dtype=torch.long)
    for t in (0.7, torch.tensor([0.7]), torch.tensor([0.7], dtype=F64)):
        assert corrupt(x1, t, "linear", "mask", 5)[1].tolist() == [[True]], t


def test_corrupt_refuses_a_time_below_0_among_times_in_range():
    """The low end of t's range is checked as well as the high: t = [-0.5, 0.5] is refused, not read as
    alpha_t = -0.5 for the first row."""
    with pytest.raises(ValueError, match=r"t must be in \[0, 1\], got range \[-0.5, 0.5\]"):
        corrupt(torch.zeros(2, 3, dtype=torch.long), torch.tensor([-0.5, 0.5]), "linear", "mask", 5)


@pytest.mark.parametrize("alpha, inverse, match", [
    (lambda t: torch.where(t == 0, math.nan, t), lambda a: a, r"alpha must map t = 0 to 0 .* got nan and 1.0"),
    (lambda t: t, lambda a: torch.where(a == 0, math.nan, a), r"inverse must map alpha = 0 to 0 .* got nan and 1.0"),
])
def test_custom_schedule_refuses_a_nan_at_an_endpoint(alpha, inverse, match):
    """NaN compares false with everything: a check written as 'off by more than 1e-6' would take it,
    and nothing else looks at the inverse's values."""
    with pytest.raises(ValueError, match=match):
        CustomSchedule(alpha, lambda t: torch.ones_like(t), inverse)


def test_custom_schedule_refuses_an_alpha_dot_that_is_nan_inside_0_1():
    """A NaN slope is neither below 0 nor infinite: it is refused as not finite, naming its time."""
    with pytest.raises(ValueError, match=r"alpha_dot must be finite on \[0, 1\], got nan at t = 0.5$"):
        CustomSchedule(lambda t: t, lambda t: torch.where(t == 0.5, math.nan, 1.0), lambda a: a)


def test_custom_schedule_reads_alpha_in_float64_for_a_fall_under_float32_resolution():
    """alpha = 0.5 on [0.25, 0.75] with 0.5 + 1e-9 at t = 0.5: a fall of 1e-9, which float32 rounds away."""
    with pytest.raises(ValueError, match=r"alpha must not fall .* got alpha\(0.5\) = 0.5 > alpha\(0.500977\) = 0.5$"):
        CustomSchedule(lambda t: _flat_alpha(t) + 1e-9 * (t == 0.5), _flat_alpha_dot, _flat_inverse)


def test_uniform_token_gives_long_tokens():
    """Tokens index embeddings and compare with Long x_t: int64, not int32."""
    tokens = uniform_token(torch.tensor([0.0, 0.5, 1.0]), 4)
    assert tokens.dtype == torch.long and tokens.tolist() == [0, 2, 3]


def test_rate_decomposition_leaves_a_traced_alpha_unread():
    """make_fx traces the planner and the denoiser with alpha one per row without reading values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def rates(log_p, x_t, alpha):
        return planner_log_prob_from_uniform(log_p, x_t, alpha), denoiser_log_prob_from_uniform(log_p, x_t, alpha)

    args = (torch.full((2, 3, 4), 0.25).log(), torch.zeros(2, 3, dtype=torch.long), torch.tensor([0.2, 0.7]))
    traced = make_fx(rates, tracing_mode="fake")(*args)
    targets = [str(node.target) for node in traced.graph.nodes if node.op == "call_function"]
    assert targets and not any("_local_scalar_dense" in target for target in targets)


def test_a_named_schedule_is_rebuilt_from_its_name():
    """`name` of the named schedules rebuilds them through get_schedule; a CustomSchedule is "custom"."""
    for schedule in SCHEDULES[:2]:
        assert type(get_schedule(schedule.name)) is type(schedule)
    assert SCHEDULES[2].name == "custom"


def test_unknown_schedule_and_noise_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"^schedule must be one of \['cosine', 'linear'\] or a Schedule, got 'sqrt'$"):
        get_schedule("sqrt")
    with pytest.raises(ValueError, match=r"^noise must be one of \('uniform', 'mask'\), got 'gaussian'$"):
        corrupt(torch.zeros(1, 2, dtype=torch.long), 0.5, "linear", "gaussian", 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_probabilities_and_uniforms_are_taken(dtype):
    """The rate decomposition and uniform_token take float16 and bfloat16 as well as float32 and float64,
    and the rates keep the dtype they are given."""
    p_x1, x_t = torch.tensor([[[0.5, 0.25, 0.25]]], dtype=dtype), torch.tensor([[0]])
    for fn in RATE_FUNCTIONS:
        assert fn(p_x1.log() if "log" in fn.__name__ else p_x1, x_t, 0.5).dtype == dtype, fn.__name__
    assert uniform_token(torch.tensor([0.0, 0.5], dtype=dtype), 4).tolist() == [0, 2]


def test_custom_schedule_refuses_an_alpha_0_off_by_more_than_1e_6():
    """The tolerance at t = 0 is the documented 1e-6, as at t = 1: alpha_0 = 2e-6 is refused (a
    position at t = 0 kept with probability 2e-6 is not all noise)."""
    with pytest.raises(ValueError, match=r"alpha must map t = 0 to 0 and t = 1 to 1, got 2e-06 and 1.0$"):
        CustomSchedule(lambda t: 2e-6 + (1 - 2e-6) * t, lambda t: torch.full_like(t, 1 - 2e-6),
                       lambda a: (a - 2e-6) / (1 - 2e-6))


def test_custom_schedule_refuses_an_alpha_that_falls_on_the_first_step_of_its_grid():
    """Every step of the grid is read, the first from t = 0 included: an alpha dipping to -0.001 just
    after t = 0 (between grid points 0 and 1/1024) is refused."""
    with pytest.raises(ValueError, match=r"alpha must not fall .* got alpha\(0\) = 0 > alpha\(0.000976562\) = -0.001$"):
        CustomSchedule(lambda t: torch.where((t > 0) & (t < 0.001), -0.001, t), lambda t: torch.ones_like(t),
                       lambda a: a)


def test_corrupt_refuses_a_time_one_float32_step_above_1():
    """The range [0, 1] of t has no tolerance: the float32 just above 1 is refused."""
    above = torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"t must be in \[0, 1\], got range \[1.0000001"):
        corrupt(torch.zeros(1, 3, dtype=torch.long), above, "linear", "mask", 5)


def test_corrupt_refuses_a_single_time_in_a_1d_tensor_for_several_rows():
    """A [1] t for two rows of x1 is refused, not broadcast: one time per row, or a number or 0-d tensor."""
    with pytest.raises(ValueError, match=r"t must be a number, a 0-d tensor or of shape \[2\] .* got shape \(1,\)"):
        corrupt(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0.5]), "linear", "mask", 5)


@pytest.mark.parametrize("fn", RATE_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("toward", [-1.0, 2.0])
def test_rate_decomposition_refuses_an_alpha_one_float_step_outside_0_1(fn, toward):
    """The range [0, 1] of alpha has no tolerance at either end: the floats just below 0 and just above 1
    are refused, each with an alpha in range beside it (both ends of the range read)."""
    end = torch.tensor(0.0 if toward < 0 else 1.0, dtype=F64)
    alpha = torch.stack([torch.nextafter(end, torch.tensor(toward, dtype=F64)), torch.tensor(0.5, dtype=F64)])
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got range"):
        fn(torch.full((2, 3, 4), 0.25), torch.zeros(2, 3, dtype=torch.long), alpha)


@pytest.mark.parametrize("noise", ["uniform", "mask"])
def test_corrupt_reads_float32_uniforms_then_draws_the_noise_tokens(noise):
    """The draws, in order, from `generator`: float32 uniforms of x1's shape, z = N where u >= alpha_t,
    then (uniform noise) tokens over [0, V) of x1's shape, each written where its own position is noise:
    a seed gives the same (x_t, z_t) across versions."""
    x1 = torch.randint(0, 7, (4, 16), generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.2, 0.4, 0.6, 0.8])
    x_t, z_t = corrupt(x1, t, "cosine", noise, 7, mask_id=9, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    want_z = torch.rand(x1.shape, generator=g) >= CosineSchedule().alpha(t)[:, None]
    fill = torch.randint(0, 7, x1.shape, generator=g) if noise == "uniform" else torch.full_like(x1, 9)
    assert torch.equal(z_t, want_z) and torch.equal(x_t, torch.where(want_z, fill, x1))


def test_corrupt_refuses_an_x1_id_between_vocab_size_and_mask_id():
    """x1's ids are read against vocab_size, not against a larger mask_id: with V = 5 and mask_id = 7, a
    clean token 5 is no token (uniform noise never draws it)."""
    with pytest.raises(ValueError, match=r"x1 must hold ids in \[0, 5\), got range \[0, 5\]"):
        corrupt(torch.tensor([[0, 1, 5]]), 0.5, "linear", "mask", 5, mask_id=7)


def test_the_linear_schedule_gives_alpha_and_its_derivative_in_one_dtype_for_an_integer_time():
    """An int or Long time: alpha_t and alpha_dot both come back in torch's default float32, as they do in
    float64 for a Float64 time."""
    for t in (1, torch.tensor([0, 1]), torch.tensor([0.0, 1.0], dtype=F64)):
        alpha, alpha_dot = LinearSchedule().alpha(t), LinearSchedule().alpha_dot(t)
        want = F64 if isinstance(t, torch.Tensor) and t.dtype == F64 else torch.float32
        assert alpha.dtype == alpha_dot.dtype == want, t


class _CubicSchedule(Schedule):
    """A user's own Schedule, subclassing the base class: alpha_t = t**3."""

    name = "cubic"

    def alpha(self, t):
        return torch.as_tensor(t) ** 3

    def alpha_dot(self, t):
        return 3 * torch.as_tensor(t) ** 2

    def inverse(self, a):
        return torch.as_tensor(a) ** (1 / 3)


def test_get_schedule_passes_a_user_subclass_of_schedule_through():
    """Any Schedule instance is taken as it is, not only the three classes ddpd defines."""
    schedule = _CubicSchedule()
    assert get_schedule(schedule) is schedule
    _, z_t = corrupt(torch.zeros(1, 4, dtype=torch.long), 1.0, schedule, "mask", 5)
    assert not z_t.any()


@pytest.mark.parametrize("alpha, alpha_dot, match", [
    (lambda t: torch.where(t == 0.5, math.nan, t), lambda t: torch.ones_like(t),
     r"alpha must be finite on \[0, 1\], got nan at t = 0.5$"),
    (lambda t: t, lambda t: torch.where((t == 0.25) | (t == 0.75), math.inf, 1.0),
     r"alpha_dot must be finite on \[0, 1\], got inf at t = 0.25$"),
])
def test_custom_schedule_names_the_first_time_alpha_or_alpha_dot_is_not_finite(alpha, alpha_dot, match):
    """alpha is read for NaN as alpha_dot is (a NaN alpha inside [0, 1] neither falls nor rises, and the
    endpoints are fine), and of several times the first is named."""
    with pytest.raises(ValueError, match=match):
        CustomSchedule(alpha, alpha_dot, lambda a: a)


@pytest.mark.parametrize("alpha, alpha_dot, match", [
    (lambda t: t, lambda t: torch.where(t == 1, -1.0, 1.0), r"alpha_dot must be >= 0 .* got -1 at t = 1$"),
    (lambda t: torch.where(t == 1023 / 1024, 1.001, t), lambda t: torch.ones_like(t),
     r"alpha must not fall .* got alpha\(0.999023\) = 1.001 > alpha\(1\) = 1$"),
])
def test_custom_schedule_reads_its_grid_up_to_t_1(alpha, alpha_dot, match):
    """The grid ends at t = 1 itself: a negative slope there, or a fall on the last step into alpha_1 = 1,
    is refused as one anywhere inside."""
    with pytest.raises(ValueError, match=match):
        CustomSchedule(alpha, alpha_dot, lambda a: a)


@pytest.mark.parametrize("mask_id, error, match", [
    (2, ValueError, r"mask_id must be >= 5"), (5.0, TypeError, "mask_id must be an int"),
])
def test_corrupt_checks_mask_id_under_uniform_noise_too(mask_id, error, match):
    """mask_id is checked whatever the noise: uniform noise never writes it, yet a mask_id below vocab_size
    given with it is refused as with mask noise, not passed over."""
    with pytest.raises(error, match=match):
        corrupt(torch.tensor([[0, 1, 2]]), 0.5, "linear", "uniform", 5, mask_id=mask_id)


def test_a_complex_time_or_alpha_is_refused_naming_its_argument():
    """A complex number is no time and no alpha: the TypeError names t or alpha, not torch's 'must be real
    number, not complex', which names neither."""
    with pytest.raises(TypeError, match="t must be a number or a tensor, got complex"):
        corrupt(torch.tensor([[0, 1, 2]]), 0.5j, "linear", "mask", 5)
    for fn in RATE_FUNCTIONS:
        with pytest.raises(TypeError, match="alpha must be a number or a tensor, got complex"):
            fn(torch.full((1, 3, 4), 0.25), torch.zeros(1, 3, dtype=torch.long), 0.5j)
