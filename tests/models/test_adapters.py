"""Adapters for mask denoisers trained elsewhere (ddpd.models.adapters).

No SEDD or MDLM weights can be downloaded here, so each adapter wraps a small local
network with that codebase's interface, forward(indices, sigma), whose outputs are
built from the exact mask denoiser of an enumerable toy distribution, as a perfect
network of that parameterisation would output them (SEDD: exact log-scores passed
through SEDD's own output steps; MDLM: exact logits up to a per-position constant,
with anything in the mask column). The adapter must recover the exact denoiser, and
a sampler run with it must draw what it draws with the exact denoiser.
"""
import collections
import math
import re
import types
import warnings

import pytest
import torch
import torch.nn as nn

from ddpd.models import MDLMSubsDenoiser, SEDDAbsorbingDenoiser, prepare_for_sampling
from ddpd.models.adapters import CARRY_OVER_LOGIT, MAX_ALPHA, MIN_ALPHA
from ddpd.process import CosineSchedule
from ddpd.sampling import ddpd_sample, tau_leaping_mask
from ddpd.sampling.options import Execution
from oracles.toy import ToyProblem, dirichlet_p_data, sparse_p_data

S, D = 3, 4


@pytest.fixture(scope="module")
def toy():
    return ToyProblem(sparse_p_data(S, D, support=20, seed=7), S, D)


def exact(toy, x):
    """p(x_1^d = j | x_t) [B, D, S] float64 at masked positions (mask id S)."""
    return toy.mask_denoiser(toy.mask_index(x))


def masked_inputs(batch=64, seed=0):
    """Random partly masked sequences (mask id S), including all-masked and unmasked rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, S, (batch, D), generator=gen)
    masked = torch.rand(batch, D, generator=gen) < torch.rand(batch, 1, generator=gen)
    masked[0], masked[1] = True, False
    return torch.where(masked, S, x), torch.rand(batch, generator=gen).clamp(0.05, 0.95)


class ToySEDD(nn.Module):
    """SEDD's absorbing-state score network interface: forward(indices [B, D] in [0, S],
    sigma [B]) -> log-scores [B, D, S + 1]. The exact score at a masked position is
    s_j = (alpha / (1 - alpha)) p(x_1^d = j | x_t), alpha = e^-sigma; a perfect network's
    last layer therefore outputs log p_j + log(N - 1) (N = S + 1 states), which SEDD's
    forward turns into log s_j by subtracting log(e^sigma - 1) + log(N - 1)
    (scale_by_sigma) and then zeroes the log-score of the current token. Unmasked
    positions (a different score the adapter must not read) get random values."""

    def __init__(self, toy):
        super().__init__()
        self.toy = toy
        self.weight = nn.Parameter(torch.ones(()))  # so that .to() and prepare_for_sampling have work
        self.sigmas = []

    def forward(self, indices, sigma):
        self.sigmas.append(sigma)
        n = S + 1
        gen = torch.Generator().manual_seed(int(indices.sum()))
        raw = torch.randn(*indices.shape, n, generator=gen, dtype=torch.float64)
        perfect = torch.log(exact(self.toy, indices).clamp_min(1e-300)) + math.log(n - 1)
        masked = (indices == S)[..., None]
        raw[..., :S] = torch.where(masked, perfect, raw[..., :S])
        sigma = sigma.double()
        esigm1_log = torch.where(sigma < 0.5, torch.expm1(sigma), sigma.exp() - 1).log()
        out = raw - esigm1_log[:, None, None] - math.log(n - 1)
        out = torch.scatter(out, -1, indices[..., None], torch.zeros_like(out[..., :1]))
        return (out * self.weight.double()).to(self.weight.dtype)


class ToyMDLM(nn.Module):
    """MDLM's DiT interface through its Hugging Face port: forward(input_ids, timesteps)
    returning an object with .logits [B, D, S + 1]. A perfect SUBS network's logits are
    log p_j plus any per-position constant, with anything in the mask column (SUBS
    overrides it with -inf); unmasked positions get random values."""

    def __init__(self, toy):
        super().__init__()
        self.toy = toy
        self.weight = nn.Parameter(torch.ones(()))
        self.sigmas = []

    def forward(self, input_ids, timesteps):
        self.sigmas.append(timesteps)
        gen = torch.Generator().manual_seed(int(input_ids.sum()) + 1)
        logits = 3.0 * torch.randn(*input_ids.shape, S + 1, generator=gen, dtype=torch.float64)
        shift = 5.0 * torch.randn(*input_ids.shape, 1, generator=gen, dtype=torch.float64)
        perfect = torch.log(exact(self.toy, input_ids).clamp_min(1e-300)) + shift
        masked = (input_ids == S)[..., None]
        logits[..., :S] = torch.where(masked, perfect, logits[..., :S])
        return types.SimpleNamespace(logits=(logits * self.weight.double()).to(self.weight.dtype))


ADAPTERS = {"sedd": lambda toy, **kw: SEDDAbsorbingDenoiser(ToySEDD(toy), S, **kw),
            "mdlm": lambda toy, **kw: MDLMSubsDenoiser(ToyMDLM(toy), S, **kw)}


# ---- recovering the exact denoiser --------------------------------------------------------

@pytest.mark.parametrize("name", ADAPTERS)
def test_adapter_recovers_the_exact_denoiser(toy, name):
    denoiser = ADAPTERS[name](toy)
    x, t = masked_inputs()
    logits = denoiser(x, t)
    assert logits.shape == (x.shape[0], D, S) and logits.dtype == torch.float32
    masked = x == S
    p = exact(toy, x)
    # SEDD: log s_j + log expm1(sigma) are the log-probabilities themselves (no renormalisation)
    got = logits.double().exp() if name == "sedd" else logits.double().softmax(-1)
    torch.testing.assert_close(got[masked], p[masked], rtol=1e-5, atol=1e-6)
    # unmasked positions: their known clean value (carry-over), whatever the network said there
    probs = logits.softmax(-1)
    assert torch.equal(probs[~masked].argmax(-1), x[~masked])
    assert (probs[~masked].max(-1).values == 1.0).all()
    assert (logits[~masked].min(-1).values == CARRY_OVER_LOGIT).all()


@pytest.mark.parametrize("schedule", ["linear", CosineSchedule()])
def test_networks_see_sigma_minus_log_alpha(toy, schedule):
    # both codebases condition on the total noise sigma with P(masked) = 1 - exp(-sigma)
    sedd = ADAPTERS["sedd"](toy, schedule=schedule)
    mdlm = ADAPTERS["mdlm"](toy, schedule=schedule, time_conditioning=True)
    x = torch.full((4, D), S)
    t = torch.tensor([0.0, 0.25, 0.5, 1.0])
    alpha = (t if schedule == "linear" else 1.0 - torch.cos(0.5 * math.pi * t)).double()
    expected = -torch.log(alpha.clamp(MIN_ALPHA, MAX_ALPHA))
    assert (MIN_ALPHA, MAX_ALPHA) == (1e-3, 1.0 - 1e-5)  # their eps 1e-3; sigma >= 1e-5 at their end
    for adapter in (sedd, mdlm):
        adapter(x, t)
        torch.testing.assert_close(adapter.network.sigmas[-1].double(), expected, rtol=1e-6, atol=1e-7)
    assert math.isclose(float(expected[1]), math.log(4.0), rel_tol=1e-6) or schedule != "linear"


def test_mdlm_without_time_conditioning_sees_zero_sigma(toy):
    mdlm = ADAPTERS["mdlm"](toy)
    mdlm(*masked_inputs(8))
    assert torch.equal(mdlm.network.sigmas[-1], torch.zeros(8))


def test_sedd_conversion_at_extreme_noise(toy):
    # at alpha = MIN_ALPHA, expm1(sigma) ~ 1000; near alpha = 1, expm1(sigma) ~ 1e-5: both exact
    sedd = ADAPTERS["sedd"](toy)
    x, _ = masked_inputs(16, seed=3)
    masked = x == S
    for t in (0.0, 1.0):
        got = sedd(x, torch.full((16,), t)).double().exp()
        torch.testing.assert_close(got[masked], exact(toy, x)[masked], rtol=1e-4, atol=1e-6)


# ---- in a sampler --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ADAPTERS)
def test_samplers_draw_the_same_with_the_adapter(toy, name):
    # the same seed gives the same tokens as with the exact mask denoiser (logits equal to ~1e-7)
    adapter, models = ADAPTERS[name](toy), toy.models()
    for sampler in (lambda den: tau_leaping_mask(den, 200, D, S, steps=8, seed=5),
                    lambda den: ddpd_sample(models.planner, den, 200, D, S, steps=12, denoiser_type="mask",
                                            seed=5)):
        assert torch.equal(sampler(adapter).tokens, sampler(models.mask_denoiser).tokens)


def test_adapter_in_bfloat16(toy):
    # the wrapped network can be cast like any other; the adapter's arithmetic stays float32
    adapter = prepare_for_sampling(ADAPTERS["mdlm"](toy), "bfloat16", "cpu")
    assert adapter.network.weight.dtype == torch.bfloat16
    x, t = masked_inputs(16)
    logits = adapter(x, t)
    assert logits.dtype == torch.float32
    masked = x == S
    torch.testing.assert_close(logits.softmax(-1)[masked].double(), exact(toy, x)[masked], rtol=0, atol=2e-2)


class TimeFeatures(nn.Module):
    """A network that, like SEDD's TimestepEmbedder, computes float32 features of sigma
    (`sigma.float()`) and feeds them to an nn.Linear: cast to bfloat16 it needs autocast."""

    def __init__(self, toy):
        super().__init__()
        self.toy = ToyMDLM(toy)
        self.time = nn.Linear(8, 1)

    def forward(self, input_ids, sigma):
        features = sigma[:, None].float() * torch.arange(8, dtype=torch.float32)
        return self.toy(input_ids, sigma).logits + 0.0 * self.time(features.cos())[:, None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cast_network_that_mixes_in_float32_features_runs_outside_a_sampler(toy, dtype):
    adapter = prepare_for_sampling(MDLMSubsDenoiser(TimeFeatures(toy), S), "bfloat16", "cpu")
    x, t = masked_inputs(16)
    masked = x == S
    torch.testing.assert_close(adapter(x, t).softmax(-1)[masked].double(), exact(toy, x)[masked], rtol=0, atol=2e-2)
    result = tau_leaping_mask(adapter, 8, D, S, steps=4, seed=0,
                              execution=Execution(dtype=dtype))  # float32: no autocast of the run
    assert torch.all(result.tokens < S)


# ---- errors ----------------------------------------------------------------------------------

def test_adapter_argument_errors(toy):
    with pytest.raises(ValueError, match="vocab_size"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), 0)
    with pytest.raises(TypeError, match="network"):
        MDLMSubsDenoiser(None, S)
    with pytest.raises(ValueError, match="min_alpha"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), S, min_alpha=0.0)
    with pytest.raises(ValueError, match="schedule"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), S, schedule="quadratic")
    with pytest.raises(TypeError, match="time_conditioning"):
        MDLMSubsDenoiser(ToyMDLM(toy), S, time_conditioning=1)


def test_adapter_call_errors(toy):
    sedd = ADAPTERS["sedd"](toy)
    x, t = masked_inputs(4)
    with pytest.raises(ValueError, match=r"x: expected token ids in \[0, 4\)"):
        sedd(x + 1, t)
    with pytest.raises(ValueError, match="t: expected shape"):
        sedd(x, t[:2])
    integers = SEDDAbsorbingDenoiser(lambda x, sigma: torch.zeros(*x.shape, S + 1, dtype=torch.long), S)
    with pytest.raises(ValueError, match="network: expected floating-point log-scores or logits, got torch.int64"):
        integers(x, t)
    wrong = SEDDAbsorbingDenoiser(ToySEDD(toy), S + 1)  # the network has S + 1 columns, not S + 2
    with pytest.raises(ValueError, match=r"network: expected output of shape \[4, 4, 5\].*vocab_size=4"):
        wrong(x, t)
    assert sedd.mask_id == S


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_number_or_a_0d_time_is_the_time_of_every_row_and_is_checked(toy, name):
    adapter = ADAPTERS[name](toy, **({"time_conditioning": True} if name == "mdlm" else {}))
    x, _ = masked_inputs(8)
    per_row = adapter(x, torch.full((8,), 0.25))
    assert torch.equal(adapter(x, 0.25), per_row) and torch.equal(adapter(x, torch.tensor(0.25)), per_row)
    with pytest.raises(ValueError, match=r"^t: "):
        adapter(x, 1.5)


def test_the_common_part_of_the_adapters_says_it_is_no_adapter(toy):
    """MaskDenoiserAdapter is exported, and called raised a NotImplementedError without a word."""
    from ddpd.models import MaskDenoiserAdapter

    with pytest.raises(NotImplementedError, match=r"^MaskDenoiserAdapter.masked_logits: the subclasses .* define "
                                                  "it; wrap the network in SEDDAbsorbingDenoiser or MDLMSubsDenoiser"):
        MaskDenoiserAdapter(ToySEDD(toy), S)(*masked_inputs(4))


def test_dirichlet_toy_too():
    # a dense p_data: every masked pattern is consistent with some data
    toy = ToyProblem(dirichlet_p_data(S, D, seed=11), S, D)
    x, t = masked_inputs(seed=4)
    masked = x == S
    for name in ADAPTERS:
        logits = ADAPTERS[name](toy)(x, t).double()
        torch.testing.assert_close(logits.softmax(-1)[masked], exact(toy, x)[masked], rtol=1e-5, atol=1e-6)


def test_mdlm_logits_are_log_probabilities_and_the_alpha_range_is_ordered(toy):
    """The MDLM adapter's logits at masked positions are log p (their logsumexp is 0), not the
    network's unnormalised SUBS logits; a max_alpha below min_alpha is refused."""
    x, t = masked_inputs(8)
    masked = x == S
    logits = MDLMSubsDenoiser(ToyMDLM(toy), S)(x, t)
    torch.testing.assert_close(logits.logsumexp(-1)[masked], torch.zeros(int(masked.sum())), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_alpha"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), S, min_alpha=0.5, max_alpha=0.1)


# ---- what the adapters read and return (each check below caught a change nothing else did) ----

@pytest.mark.parametrize("wrap", [lambda out: (out, None), lambda out: [out, out[..., :1]]])
def test_a_network_returning_a_tuple_or_list_gives_its_first_item(toy, wrap):
    x, t = masked_inputs(8)
    plain = ADAPTERS["sedd"](toy)
    wrapped = SEDDAbsorbingDenoiser(lambda ids, sigma: wrap(plain.network(ids, sigma)), S)
    assert torch.equal(wrapped(x, t), plain(x, t))


def test_a_named_tuple_with_a_logits_field_gives_its_logits_not_its_first_item(toy):
    # a .logits output is read as such even when it is also a tuple whose first item is a loss
    Output = collections.namedtuple("Output", ["loss", "logits"])
    x, t = masked_inputs(8)
    plain = ADAPTERS["mdlm"](toy)
    wrapped = MDLMSubsDenoiser(lambda ids, sigma: Output(torch.zeros(*ids.shape, S + 1),
                                                         plain.network(ids, sigma).logits), S)
    assert torch.equal(wrapped(x, t), plain(x, t))


def test_carry_over_logits_are_log_probabilities(toy):
    # logit 0 = log 1 at the known value (docs/models.md), not merely the largest logit
    x, t = masked_inputs(16)
    unmasked = x != S
    for name in ADAPTERS:
        logits = ADAPTERS[name](toy)(x, t)
        assert torch.equal(logits[unmasked].max(-1).values, torch.zeros(int(unmasked.sum())))


def test_sedd_conversion_beyond_the_float32_range_of_expm1(toy):
    # min_alpha = 1e-60: sigma = 138 at t = 0, where expm1(sigma) overflows float32
    sedd = ADAPTERS["sedd"](toy, min_alpha=1e-60)
    x, _ = masked_inputs(16, seed=3)
    masked = x == S
    logits = sedd(x, torch.zeros(16))
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[masked].double().softmax(-1), exact(toy, x)[masked], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("min_alpha", [1e-60, 1e-320])
def test_sedd_log_expm1_stays_finite_past_the_float64_range_of_expm1(min_alpha):
    # zero log-scores give logits log(e^sigma - 1), which is sigma itself once e^-sigma is negligible,
    # even where e^sigma overflows float64 (sigma = 737 for a subnormal min_alpha)
    sedd = SEDDAbsorbingDenoiser(lambda ids, sigma: torch.zeros(*ids.shape, S + 1), S, min_alpha=min_alpha)
    logits = sedd(torch.full((2, D), S), torch.zeros(2))
    torch.testing.assert_close(logits, torch.full((2, D, S), -math.log(min_alpha), dtype=torch.float32))


def test_sedd_leaves_a_learned_score_unnormalised(toy):
    # docs/models.md: log s_j + log expm1(sigma) as they are; the sampler's softmax renormalises
    gen = torch.Generator().manual_seed(2)
    log_scores = torch.randn(8, D, S + 1, generator=gen)
    sedd = SEDDAbsorbingDenoiser(lambda ids, sigma: log_scores, S)
    x, t = torch.full((8, D), S), torch.rand(8, generator=gen).clamp(0.05, 0.95)
    log_expm1 = torch.log(torch.expm1(-torch.log(t.double()))).float()
    torch.testing.assert_close(sedd(x, t), log_scores[..., :S] + log_expm1[:, None, None], rtol=1e-5, atol=1e-5)


def test_sigma_at_the_end_is_minus_log_max_alpha(toy):
    # alpha is clamped in float64: a float32 clamp to 1 - 1e-5 gives a sigma 1.4e-4 too large
    sedd = ADAPTERS["sedd"](toy)
    sedd(torch.full((2, D), S), torch.ones(2))
    torch.testing.assert_close(sedd.network.sigmas[-1].double(), torch.full((2,), -math.log(MAX_ALPHA),
                                                                             dtype=torch.float64), rtol=1e-6, atol=0)


def test_the_alpha_range_excludes_one(toy):
    # max_alpha = 1 would give sigma = 0 at t = 1, where expm1(sigma) = 0 makes every logit -inf
    with pytest.raises(ValueError, match="max_alpha"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), S, max_alpha=1.0)
    with pytest.raises(ValueError, match="min_alpha"):
        SEDDAbsorbingDenoiser(ToySEDD(toy), S, min_alpha=1.0)


def test_a_float16_network_runs_outside_a_sampler(toy):
    # float32 time features reach a float16 nn.Linear: the adapter calls it under float16 autocast
    adapter = prepare_for_sampling(MDLMSubsDenoiser(TimeFeatures(toy), S), "float16", "cpu")
    x, t = masked_inputs(16)
    masked = x == S
    torch.testing.assert_close(adapter(x, t).softmax(-1)[masked].double(), exact(toy, x)[masked], rtol=0, atol=2e-2)


class AutocastProbe(nn.Module):
    """The toy MDLM network, recording the autocast dtype each call runs under."""

    def __init__(self, toy):
        super().__init__()
        self.toy, self.seen = ToyMDLM(toy), []

    def forward(self, input_ids, sigma):
        self.seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return self.toy(input_ids, sigma)


def test_a_cast_network_keeps_the_autocast_its_caller_has_on(toy):
    """A sampler's autocast (Execution.dtype) is left as it is: the adapter turns on the network's own
    precision only where none is on (the network cast to float16 here, the caller in bfloat16)."""
    probe = AutocastProbe(toy)
    adapter = prepare_for_sampling(MDLMSubsDenoiser(probe, S), "float16", "cpu")
    x, t = masked_inputs(4)
    adapter(x, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        adapter(x, t)
    assert probe.seen == [torch.float16, torch.bfloat16]


def test_carry_over_logits_are_minus_a_million_and_their_entropy_is_zero(toy):
    # docs/models.md: -1e6 off the known value, finite, so that p log p is 0 rather than nan
    x, t = masked_inputs(16)
    unmasked = x != S
    logits = ADAPTERS["sedd"](toy)(x, t)[unmasked]
    assert set(logits.unique().tolist()) == {-1e6, 0.0}
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    assert torch.equal(entropy, torch.zeros(int(unmasked.sum())))


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_max_alpha_equal_to_min_alpha_holds_sigma_fixed(toy, name):
    # each adapter clamps alpha to [min_alpha, max_alpha], closed below: max_alpha = min_alpha is one fixed alpha
    timed = {"time_conditioning": True} if name == "mdlm" else {}
    adapter = ADAPTERS[name](toy, min_alpha=0.5, max_alpha=0.5, **timed)
    adapter(torch.full((3, D), S), torch.tensor([0.0, 0.5, 1.0]))
    torch.testing.assert_close(adapter.network.sigmas[-1].double(),
                               torch.full((3,), math.log(2.0), dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("empty", [(), []])
def test_a_network_returning_an_empty_tuple_or_list_is_refused_by_shape(empty):
    adapter = SEDDAbsorbingDenoiser(lambda ids, sigma: empty, S)
    x, t = masked_inputs(4)
    expected = rf"network: expected output of shape \[4, 4, 4\].*got {type(empty).__name__};"
    with pytest.raises(ValueError, match=expected):
        adapter(x, t)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_the_network_sees_a_float32_sigma(toy, time_conditioning):
    # Float[B] as the docstring says, the zeros of an untimed MDLM network included
    sedd, mdlm = ADAPTERS["sedd"](toy), ADAPTERS["mdlm"](toy, time_conditioning=time_conditioning)
    x, t = masked_inputs(8)
    for adapter in (sedd, mdlm):
        adapter(x, t.double())
        assert adapter.network.sigmas[-1].dtype == torch.float32 and adapter.network.sigmas[-1].shape == (8,)


def test_an_output_of_another_batch_or_length_is_refused_with_its_shape(toy):
    # every dimension is checked, not only the V + 1 columns: a broadcastable [1, D, V + 1] is refused too
    x, t = masked_inputs(4)
    for shape in [(1, D, S + 1), (4, D - 1, S + 1), (4, D, S + 1, 1)]:
        adapter = SEDDAbsorbingDenoiser(lambda ids, sigma, shape=shape: torch.zeros(shape), S)
        expected = rf"network: expected output of shape \[4, 4, 4\] .* got {re.escape(str(shape))};"
        with pytest.raises(ValueError, match=expected):
            adapter(x, t)


@pytest.mark.parametrize("network", [3, "sedd", torch.zeros(2)])
def test_a_network_that_cannot_be_called_is_refused_by_type(network):
    with pytest.raises(TypeError, match=rf"^network: expected a callable nn.Module, got {type(network).__name__}$"):
        SEDDAbsorbingDenoiser(network, S)


def test_the_default_schedule_is_linear(toy):
    # alpha_t = t by default: t = 0.25 gives sigma = log 4 for both adapters
    sedd, mdlm = SEDDAbsorbingDenoiser(ToySEDD(toy), S), MDLMSubsDenoiser(ToyMDLM(toy), S, time_conditioning=True)
    for adapter in (sedd, mdlm):
        adapter(torch.full((2, D), S), torch.full((2,), 0.25))
        expected = torch.full((2,), math.log(4.0), dtype=torch.float64)
        torch.testing.assert_close(adapter.network.sigmas[-1].double(), expected, rtol=1e-6, atol=0)


class FloatNormFirst(nn.Module):
    """A float32 norm weight registered before a bfloat16 network, as prepare_for_sampling leaves norms."""

    def __init__(self, toy):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(2))
        self.probe = AutocastProbe(toy).to(torch.bfloat16)

    def forward(self, input_ids, sigma):
        return self.probe(input_ids, sigma)


def test_the_autocast_follows_the_first_cast_parameter_not_the_first_parameter(toy):
    network = FloatNormFirst(toy)
    MDLMSubsDenoiser(network, S)(*masked_inputs(4))
    assert network.probe.seen == [torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_a_network_output_of_any_non_float_dtype_is_refused(dtype):
    adapter = SEDDAbsorbingDenoiser(lambda ids, sigma: torch.zeros(*ids.shape, S + 1, dtype=dtype), S)
    with pytest.raises(ValueError, match=f"network: expected floating-point log-scores or logits, got {dtype}"):
        adapter(*masked_inputs(4))


def test_a_float64_network_runs_without_autocast(toy):
    # only a network cast below float32 turns autocast on (a CPU autocast to float64 would warn)
    probe = AutocastProbe(toy).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits = MDLMSubsDenoiser(probe, S)(*masked_inputs(4))
    assert probe.seen == [None] and logits.dtype == torch.float32


def test_a_single_symbol_vocabulary_is_accepted():
    # V = 1: the mask is id 1, and every position's one clean value has probability 1
    adapter = MDLMSubsDenoiser(lambda ids, sigma: torch.randn(*ids.shape, 2), 1)
    x = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert torch.equal(adapter(x, torch.full((2,), 0.5)), torch.zeros(2, 3, 1))
