"""Commit policies (parallel decoding) against exact oracles and against Algorithm 1.

(a) at its one-token limit (bound 0, or max_k 1) ErrorBudget draws Algorithm 1's tokens, the
    same tokens from the same seed, fused and reference; a threshold of 1 commits one token a
    step; (b) ErrorBudget's empirical law (B = 50k) against its exact law (oracles/policy_laws.py);
    (c) a wrong planner is caught; (d) the mask loop's policies: fused and reference draw the same
    tokens, and their total variation to p_data against their mean passes is tabled.
"""
import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch

from ddpd.sampling import Execution, NaNOutputWarning, Prompt, ddpd_sample, ddpd_sample_uniform, mask_sample
from ddpd.sampling.common import row
from ddpd.sampling.gillespie import _unwritten_first
from ddpd.sampling.options import DDPDOptions, Truncation
from ddpd.sampling.policies import (
    MAX_TABLE_STEPS,
    ConfidenceFactor,
    ConfidenceThreshold,
    EntropyBound,
    ErrorBudget,
    MaskGIT,
    ReMDM,
    Step,
    annealed,
    commit_risk,
    cosine_left,
    cosine_table,
    ddpd_steps,
    least_confident,
    parse_policy,
    policy_spec,
    spread_minimum,
)
from oracles import laws, policy_laws
from oracles.fixtures import noise, single_thread, tiny_network, tiny_networks, toy  # noqa: F401  (single_thread: autouse)
from oracles.stats import TVTable, empirical, threshold, tv

B = 50_000
TABLE = TVTable("Commit policies: TV to own exact law and to p_data (B = 50k)")
NETWORKS = tiny_networks((27,))[27]
D = 8


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n" + TABLE.render())


# ----------------------------------------------------------------------------- (a) one-token limit

LIMITS = [ErrorBudget(0.0, 8), ErrorBudget(0.0, 8, order="planner"), ErrorBudget(50.0, 1)]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("kind", ["mask", "uniform", "model"])
@pytest.mark.parametrize("policy", LIMITS, ids=[policy_spec(p) for p in LIMITS])
def test_error_budget_at_its_one_token_limit_draws_algorithm_1(policy, kind, fused):
    def run(**options):
        if kind == "model":
            return ddpd_sample_uniform(NETWORKS["model"], 6, D, 27, steps=12, seed=3, execution=Execution(fused=fused),
                                       **options)
        return ddpd_sample(NETWORKS["planner"], NETWORKS[kind], 6, D, 27, steps=12, seed=3, denoiser_type=kind,
                           execution=Execution(fused=fused), **options)

    today, limit = run(), run(ddpd=DDPDOptions(policy=policy))
    assert torch.equal(today.tokens, limit.tokens)
    assert torch.equal(today.stop_step, limit.stop_step)
    assert torch.equal(today.commits, limit.commits)
    assert int(limit.commits.max()) <= int(limit.stop_step.max())  # one token a step at most


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_bound_0_commits_one_token_where_float32_rounds_the_risk_to_0(fused):
    """A planner certain of noise (sigmoid(30) is 1 in float32) and a denoiser certain of its
    token (probability 1) make every risk 1 - p c exactly 0: bound 0 still commits one a step."""
    def planner(x):
        return torch.where(x == 0, -30.0, 30.0)

    def denoiser(x, t):
        return torch.full((*x.shape, 5), -50.0).index_fill_(-1, torch.tensor([0]), 50.0)

    def run(policy):
        return ddpd_sample(planner, denoiser, 4, D, 5, steps=3, seed=0, execution=Execution(fused=fused),
                           ddpd=DDPDOptions(stop="budget", policy=policy))

    limit = run(ErrorBudget(0.0, 8))
    assert limit.commits.tolist() == [3] * 4
    assert torch.equal(limit.tokens, run(None).tokens)
    assert int(run(ErrorBudget(1e-6, 8)).commits.min()) > 3  # any bound above 0 takes the free commits


@pytest.mark.parametrize("kind", ["mask", "uniform", "model"])
def test_error_budget_commits_several_tokens_a_step_and_fused_draws_the_reference_tokens(kind):
    def run(fused):
        if kind == "model":
            return ddpd_sample_uniform(NETWORKS["model"], 6, D, 27, steps=12, seed=3, execution=Execution(fused=fused),
                                       ddpd=DDPDOptions(policy=ErrorBudget(3.0, 8)))
        return ddpd_sample(NETWORKS["planner"], NETWORKS[kind], 6, D, 27, steps=12, seed=3, denoiser_type=kind,
                           execution=Execution(fused=fused), ddpd=DDPDOptions(policy=ErrorBudget(3.0, 8)))

    reference, fused = run(False), run(True)
    assert torch.equal(reference.tokens, fused.tokens)
    assert torch.equal(reference.commits, fused.commits)
    assert torch.equal(reference.passes, fused.passes)
    steps = reference.stop_step.clamp(min=1)
    assert bool((reference.commits > steps).any()), "no step committed more than one token"


NUMPY_OPTIONS = [  # an options object whose int fields are given by the function `i`
    lambda i: ErrorBudget(2.0, max_k=i(4), plan_every=i(2), known_noise=True),
    lambda i: DDPDOptions(stop="budget", k=i(3), parallel_steps=i(2)),
    lambda i: DDPDOptions(policy=ErrorBudget(max_k=i(3))),
    lambda i: Truncation(top_k=i(5), top_p=0.9),
    lambda i: Execution(sync_every=i(4)),
]


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint16])
@pytest.mark.parametrize("build", NUMPY_OPTIONS, ids=lambda build: type(build(int)).__name__)
def test_options_take_numpy_integers_and_keep_ints(build, integer):
    """An options object with numpy integer fields (a budget computed with numpy) was refused
    as not an int; it keeps ints, equals and hashes as the int-built one, and its fields are JSON."""
    options, plain = build(integer), build(int)
    assert options == plain and hash(options) == hash(plain)
    fields = dataclasses.asdict(options)
    assert json.loads(json.dumps(fields)) == dataclasses.asdict(plain)
    ints = [v for v in fields.values() if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    assert ints and all(type(v) is int for v in ints)


@pytest.mark.parametrize("build", [lambda v: ErrorBudget(max_k=v), lambda v: ErrorBudget(plan_every=v),
                                   lambda v: DDPDOptions(k=v, parallel_steps=1), lambda v: Truncation(top_k=v),
                                   lambda v: Execution(sync_every=v)])
@pytest.mark.parametrize("value", [True, 2.0, np.float64(2), np.bool_(True)])
def test_options_still_refuse_a_bool_or_a_float_as_an_int(build, value):
    with pytest.raises(TypeError, match=f" must be an int, got {type(value).__name__} "):
        build(value)


@pytest.mark.parametrize("kind", ["mask", "uniform", "model"])
def test_numpy_integer_policy_fields_draw_what_ints_draw(kind):
    """ErrorBudget's max_k and plan_every, and the run's sizes, given as numpy integers."""
    def run(i):
        policy = DDPDOptions(policy=ErrorBudget(3.0, max_k=i(4), plan_every=i(2)))
        sizes = (i(6), i(D), i(27))
        if kind == "model":
            return ddpd_sample_uniform(NETWORKS["model"], *sizes, steps=i(12), seed=i(3), ddpd=policy)
        return ddpd_sample(NETWORKS["planner"], NETWORKS[kind], *sizes, steps=i(12), seed=i(3), denoiser_type=kind,
                           ddpd=policy)

    got, want = run(np.int64), run(int)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.commits, want.commits)


@pytest.mark.parametrize("kind", ["mask", "uniform"])
def test_error_budget_replays_from_step_graphs(kind):
    """The commits are a mask over a fixed shape: the steps between stop checks replay from
    graphs (emulated here) and draw the reference's tokens."""
    def run(**options):
        return ddpd_sample(NETWORKS["planner"], NETWORKS[kind], 6, D, 27, steps=12, seed=3, denoiser_type=kind,
                           ddpd=DDPDOptions(policy=ErrorBudget(3.0, 8)), **options)

    reference, replayed = run(), run(execution=Execution(fused=True, graphs="emulate", sync_every=4))
    assert torch.equal(reference.tokens, replayed.tokens)
    assert torch.equal(reference.commits, replayed.commits)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_bound_0_with_one_candidate_is_algorithm_1(fused):
    """max_k 1 (or D = 1) leaves no candidate past the first pick: bound 0's zero count
    indexed an empty column and raised IndexError."""
    def run(policy, length=D):
        return ddpd_sample(NETWORKS["planner"], NETWORKS["uniform"], 6, length, 27, steps=12, seed=3,
                           ddpd=DDPDOptions(policy=policy), execution=Execution(fused=fused))

    assert torch.equal(run(ErrorBudget(0.0, 1)).tokens, run(None).tokens)
    assert torch.equal(run(ErrorBudget(0.0, 8), length=1).tokens, run(None, length=1).tokens)


def test_a_threshold_of_1_commits_one_token_a_step():
    result = mask_sample(NETWORKS["mask"], 6, D, 27, steps=D, seed=1, policy=ConfidenceThreshold(1.0))
    assert torch.equal(result.commits, torch.full((6,), D))
    assert torch.equal(result.denoiser_passes, torch.full((6,), D))


def test_a_threshold_of_0_commits_everything_in_one_pass():
    result = mask_sample(NETWORKS["mask"], 6, D, 27, steps=D, seed=1, policy=ConfidenceThreshold(0.0))
    assert torch.equal(result.denoiser_passes, torch.ones(6, dtype=torch.long))
    assert result.tokens_per_pass == D


def test_a_threshold_of_0_commits_a_token_whose_probability_rounds_to_0():
    """A drawn token 120 nats below the best (drawn at a high temperature) has probability 0
    in float32, and p > 0 kept it masked: a threshold of 0 took two passes."""
    def denoiser(x, t):
        return torch.tensor([0.0, -120.0]).expand(*x.shape, 2)

    result = mask_sample(denoiser, 6, D, 2, steps=D, seed=1, temperature=200.0, policy=ConfidenceThreshold(0.0))
    assert (result.tokens == 1).any()  # drawn where the untempered probability is 0
    assert torch.equal(result.denoiser_passes, torch.ones(6, dtype=torch.long))


@pytest.mark.parametrize("policy", [ConfidenceThreshold(0.9), ConfidenceFactor(1.0), EntropyBound(0.1)],
                         ids=lambda p: type(p).__name__)
def test_a_nan_output_still_unmasks_one_position_a_step(policy):
    """A NaN entropy sorted after the filled positions: the entropy bound unmasked nothing
    before the last step, where the other rules unmask one position a step."""
    def denoiser(x, t):
        return torch.full((*x.shape, 5), float("nan"))

    with pytest.warns(NaNOutputWarning):
        result = mask_sample(denoiser, 2, 6, 5, steps=10, seed=0, policy=policy)
    assert torch.equal(result.denoiser_passes, torch.full((2,), 6))


# ----------------------------------------------------------------------------- the rules at their edges


def test_error_budget_commits_a_candidate_whose_risk_brings_the_sum_exactly_to_the_bound():
    """sum r_j <= bound: risks 0.25 + 0.25 reach 0.5 exactly and both are committed."""
    risk, eligible = torch.tensor([[0.9, 0.25, 0.25, 0.5]]), torch.ones(1, 4, dtype=torch.bool)
    assert ErrorBudget(0.5, 4).commit(risk, eligible).tolist() == [[True, True, True, False]]


def test_error_budget_never_commits_an_ineligible_candidate():
    """Eligible candidates rank first and the rest never count: the bound left over after them,
    or a spread's minimum above their number, committed the ineligible ones (picks a mask
    denoiser saw unmasked)."""
    risk, eligible = torch.tensor([[0.1, 0.1, 0.1, 0.1]]), torch.tensor([[True, False, True, False]])
    assert ErrorBudget(1.0, 4).commit(risk, eligible).tolist() == [[True, False, True, False]]
    spread = ErrorBudget(0.0, 4, spread="linear").commit(risk, eligible, torch.tensor([4]))
    assert spread.tolist() == [[True, False, True, False]]


def test_an_unwritten_candidate_that_is_not_eligible_is_neither_ranked_first_nor_counted():
    """`first` counts only the eligible candidates: two ineligible ones marked first raised the
    commits to two, and the second went to an ineligible candidate."""
    risk, eligible = torch.tensor([[0.1, 0.1, 0.1]]), torch.tensor([[True, False, False]])
    first = torch.tensor([[False, True, True]])
    policy = ErrorBudget(0.0, 3, spread="cosine", known_noise=True)
    assert policy.commit(risk, eligible, torch.ones(1).long(), None, first).tolist() == [[True, False, False]]


def test_a_risk_stays_in_0_1_where_a_float32_probability_rounds_above_1():
    """r = 1 - p c is a probability: a certain planner and a drawn token's probability rounded to
    1 + 2**-23 made it negative, and a negative risk lowers the sum the bound reads."""
    risk = commit_risk(torch.tensor([[30.0, 30.0]]), torch.tensor([[0, 1]]), torch.tensor([[1.0 + 2**-23, -1e-7]]))
    assert torch.sigmoid(torch.tensor(30.0)) == 1.0
    assert risk.tolist() == [[0.0, 1.0]]


def test_the_choice_temperatures_gumbel_noise_raises_a_candidates_rank():
    """log(1 - r) + tau_i g, highest first: at equal risks the candidate of the largest noise goes first."""
    risk, eligible = torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3, dtype=torch.bool)
    policy, noise = ErrorBudget(0.0, 3, spread="cosine", known_noise=True, choice_temperature=1.0), \
        torch.tensor([[0.0, 3.0, -3.0]])
    assert policy.commit(risk, eligible, torch.tensor([1]), noise).tolist() == [[False, True, False]]
    assert policy.commit(risk, eligible, torch.tensor([2]), noise).tolist() == [[True, True, False]]


def test_every_unwritten_candidate_is_committed_above_the_spreads_minimum():
    risk, eligible = torch.tensor([[0.1, 0.2, 0.9, 0.95]]), torch.ones(1, 4, dtype=torch.bool)
    first = torch.tensor([[False, False, True, True]])
    policy = ErrorBudget(0.0, 4, spread="cosine", known_noise=True)
    assert policy.commit(risk, eligible, torch.ones(1).long(), None, first).tolist() == [[False, False, True, True]]


def test_bound_0_with_a_spread_commits_more_than_one_a_step():
    """The spread's minimum is above one: ddpd-sample must not warn of one commit a step."""
    assert not ErrorBudget(0.0, 8, spread="cosine").commits_one_a_step()
    assert not ErrorBudget(0.0, 8, spread="linear").commits_one_a_step()
    assert ErrorBudget(0.0, 8).commits_one_a_step() and ErrorBudget(5.0, 1, spread="cosine").commits_one_a_step()


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_revise_above_keeps_a_written_position_whose_noise_probability_equals_q(fused):
    """p > q redraws: a planner of logit 0 (p = 0.5 exactly) under q = 0.5 keeps every written
    token, so the masks fall as the cosine spreads them, 8 -> 7 -> 5 -> 3."""
    masks = []

    def denoiser(x, t):
        masks.append((x == 27).sum(-1).tolist())
        return torch.zeros(*x.shape, 27)

    policy = ErrorBudget(0.0, 8, spread="cosine", known_noise=True, revise_above=0.5)
    ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 2, 8, 27, steps=4, seed=0, denoiser_type="mask",
                ddpd=DDPDOptions(stop="budget", policy=policy), execution=Execution(fused=fused))
    assert masks == [[8, 8], [7, 7], [5, 5], [3, 3]]


def _step(logprob, masked=None, **fields):
    logprob = torch.tensor([logprob])
    masked = torch.ones_like(logprob, dtype=torch.bool) if masked is None else torch.tensor([masked])
    return Step(1, 100, masked, logprob, torch.tensor([logprob.shape[1]]), **fields)


def test_a_probability_equal_to_the_threshold_stays_masked():
    """p > threshold: a token of probability exactly the threshold waits (the most confident still goes)."""
    step = _step([-1.0, -1.0, -2.0])
    threshold = float(step.prob[0, 0])
    assert ConfidenceThreshold(threshold).unmask(step).tolist() == [[True, False, False]]


def test_entropy_bound_takes_the_prefix_whose_sum_less_its_maximum_equals_gamma():
    """sum_U H - max_U H <= gamma: entropies 0.25, 0.25, 0.25 reach gamma 0.5 exactly and are all unmasked."""
    step = _step([0.0] * 4, entropy=torch.tensor([[0.25, 1.0, 0.25, 0.25]]))
    assert EntropyBound(0.5).unmask(step).tolist() == [[True, False, True, True]]


def test_entropy_bound_leaves_a_nan_entropy_out_of_a_prefix_that_fits_gamma():
    """A NaN entropy ranks last of the masked and is taken only as the step's one position: as
    float32's largest its sum less its maximum rounds to the others' sum, which fit gamma."""
    step = _step([0.0] * 4, entropy=torch.tensor([[0.1, float("nan"), 0.1, 0.1]]))
    assert EntropyBound(0.5).unmask(step).tolist() == [[True, False, True, True]]
    only = _step([0.0] * 2, entropy=torch.tensor([[float("nan"), float("nan")]]))
    assert EntropyBound(0.5).unmask(only).tolist() == [[True, False]]


def test_maskgit_unmasks_a_position_where_the_cosine_schedule_keeps_every_mask():
    """With T well above the masks, floor(m0 cos) stays at the masks left; the clamp to m - 1 unmasks one."""
    step = _step([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, 0.0], [True] * 7 + [False],
                 gumbel=torch.zeros(1, 8), table=cosine_table(100)[1:2])
    assert int(cosine_left(8, step.table[0])) == 7
    assert MaskGIT(0.0).unmask(step).tolist() == [[True] + [False] * 7]


def test_maskgit_keeps_a_mask_where_the_cosine_schedule_keeps_none():
    """n clamped to [1, m - 1]: floor(2 cos(3 pi / 8)) = 0 before the last step still keeps the least confident."""
    step = _step([-1.0, -2.0], gumbel=torch.zeros(1, 2), table=cosine_table(4)[2:3])
    assert int(cosine_left(2, step.table[0])) == 0
    assert MaskGIT(0.0).unmask(step).tolist() == [[True, False]]


def test_maskgit_scales_its_gumbel_noise_by_the_annealed_choice_temperature():
    """Confidence log p + tau_i g: at temperature 0 the noise is ignored and the less likely token
    stays masked; at 2 (tau_1 = 1.96 of 100 steps) a noise of 0.6 lifts it past the other."""
    step = _step([-1.0, -2.0], gumbel=torch.tensor([[0.0, 0.6]]), table=cosine_table(4)[2:3])
    assert MaskGIT(0.0).unmask(step).tolist() == [[True, False]]
    assert MaskGIT(2.0).unmask(step).tolist() == [[False, True]]


def test_the_factor_rule_waits_where_its_two_sides_are_equal():
    """(n + 1)(1 - c_(n)) < factor: the second token waits where 3 (1 - c_(2)) is the factor exactly."""
    step = _step([-0.1, -0.5, -3.0])
    factor = float(3 * (1.0 - step.prob[0, 1]))
    assert ConfidenceFactor(factor).unmask(step).tolist() == [[True, False, False]]
    assert ConfidenceFactor(factor * 1.001).unmask(step).tolist() == [[True, True, False]]


def test_remdm_step_tables_of_cap_and_rescale():
    """sigma_max = min(1, (1 - alpha_s) / alpha_t), 1 at alpha_t = 0 (a prompt's unfrozen tokens at
    step 0), and a mask's (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), on a linear schedule."""
    def linear(u):
        return u

    cap = [[1.0, 0.25], [1.0, 2 / 3], [0.5, 1.0], [0.0, 1.0]]
    rescale = [[0.5, 0.25], [0.5, 0.5], [0.25, 0.75], [0.0, 1.0]]
    assert torch.allclose(ReMDM("cap", 1.0).step_table(4, linear), torch.tensor(cap, dtype=torch.float64))
    assert torch.allclose(ReMDM("rescale", 0.5).step_table(4, linear), torch.tensor(rescale, dtype=torch.float64))


def test_error_budget_breaks_equal_risks_in_the_planners_order():
    """Equal risks rank in the planner's order (a stable sort): of 19 candidates after the pick at
    0.1 each, bound 0.45 commits the planner's next four, not four of its choosing."""
    risk, eligible = torch.full((1, 20), 0.1), torch.ones(1, 20, dtype=torch.bool)
    assert ErrorBudget(0.45, 20).commit(risk, eligible).tolist() == [[True] * 5 + [False] * 15]


def test_a_nan_risk_ranks_after_the_other_eligible_candidates():
    """A NaN risk (a NaN output) keys last of the eligible: the candidates after it in the
    planner's order are still committed within the bound, it is not."""
    risk, eligible = torch.tensor([[0.1, float("nan"), 0.1, 0.1]]), torch.ones(1, 4, dtype=torch.bool)
    assert ErrorBudget(1.0, 4).commit(risk, eligible).tolist() == [[True, False, True, True]]


def test_least_confident_breaks_ties_to_the_lower_position():
    """Ties go to the lower position (a stable sort), at a row length where torch's default sort
    does not keep the order of equal keys."""
    masked = torch.ones(1, 20, dtype=torch.bool)
    masked[0, 2] = False
    kept = least_confident(torch.zeros(1, 20), masked, torch.tensor([5]))
    assert kept.tolist() == [[True, True, False, True, True, True] + [False] * 14]


def test_the_factor_rule_breaks_equal_probabilities_to_the_lower_position():
    """Of 20 masks at probability 0.9, factor 0.45 unmasks three ((n + 1) 0.1 < 0.45 up to n = 3):
    positions 0, 1, 2, as the stable sort ranks them."""
    step = _step([math.log(0.9)] * 20)
    assert ConfidenceFactor(0.45).unmask(step).tolist() == [[True] * 3 + [False] * 17]


def test_the_factor_rule_counts_the_prefix_where_it_holds_not_every_position():
    """A NaN probability ranks first and fails the rule, which ends the prefix: the step unmasks
    that one position (at least one), not also the later ones where the rule holds."""
    step = _step([float("nan"), 0.0, 0.0])
    assert ConfidenceFactor(1.0).unmask(step).tolist() == [[True, False, False]]


def test_entropy_bound_stops_at_the_first_position_past_gamma():
    """U is a prefix: ranked 1e-7, 1e-7, 8, at gamma 0 the second is past it, and so is the
    third, though float32's cumsum rounds 1e-7 + 1e-7 + 8 to 8 (its sum less maximum 0)."""
    step = _step([0.0] * 3, entropy=torch.tensor([[1e-7, 8.0, 1e-7]]))
    assert EntropyBound(0.0).unmask(step).tolist() == [[True, False, False]]


def test_entropy_bound_unmasks_nothing_in_a_row_with_no_mask():
    """A row with no mask left (filled while others run on) gets no position: the prefix's first
    entry is taken only where it is a mask."""
    step = _step([0.0] * 3, [False] * 3, entropy=torch.zeros(1, 3))
    assert EntropyBound(0.5).unmask(step).tolist() == [[False] * 3]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_entropy_bound_keeps_the_tokens_of_a_row_filled_before_the_others(fused):
    """Row 0's one mask is filled at step 0 while the others run on: its tokens and its one
    commit stay, as the fused loop too hands the policy rows with no mask (whose lowest
    position, were it taken, would be drawn again)."""
    given = torch.full((3, D), -1)
    given[0, :D - 1], given[1, :2] = 5, 7
    result = mask_sample(NETWORKS["mask"], 3, D, 27, steps=6, seed=1, policy=EntropyBound(0.01),
                         prompt=Prompt(given, torch.zeros_like(given, dtype=torch.bool)),
                         execution=Execution(fused=fused))
    assert result.stop_step.tolist()[0] == 1 and result.commits.tolist()[0] == 1
    assert torch.equal(result.tokens[0, :D - 1], given[0, :D - 1])


def test_remdm_unmasks_every_mask_from_an_alpha_of_1():
    """A schedule that reaches alpha 1 before the budget's end: a step from alpha_t = 1 unmasks
    with probability 1 (1 - alpha_t is no divisor there) and remasks nothing."""
    def early(u):
        return min(1.0, 2.0 * u)

    table = ReMDM("cap", 0.5).step_table(4, early)
    assert table[2:].tolist() == [[0.0, 1.0], [0.0, 1.0]]


def test_remdm_step_table_keeps_a_masks_probability_at_0_where_the_schedule_falls():
    """A schedule that falls within a step (alpha 0.6 -> 0.4) gives (alpha_s - alpha_t) / (1 - alpha_t)
    = -0.5 at eta 0: the table's unmask probability is a probability, 0 there, not negative."""
    def dips(u):
        return {0.0: 0.0, 0.5: 0.6, 1.0: 0.4}[u]

    table = ReMDM("cap", 0.0).step_table(2, dips)
    assert torch.allclose(table, torch.tensor([[0.0, 0.6], [0.0, 0.0]], dtype=torch.float64))
    assert bool((table >= 0).all())


def test_remdm_loop_takes_an_eta_of_exactly_its_most():
    """eta <= (1 - alpha_on) / alpha_on: at alpha_on 0.5 an eta of 1 holds alpha there and is taken."""
    assert ReMDM("loop", 1.0, alpha_on=0.5).eta == 1.0
    with pytest.raises(ValueError, match="eta <= "):
        ReMDM("loop", 1.0, alpha_on=0.6)


def test_known_noise_commits_one_candidate_where_the_spreads_minimum_is_0():
    """At least one is committed under known_noise: a linear spread's minimum of 0 (no expected
    noise left) at bound 0 still commits the lowest risk."""
    risk, eligible = torch.tensor([[0.3, 0.1, 0.2]]), torch.ones(1, 3, dtype=torch.bool)
    policy = ErrorBudget(0.0, 3, spread="linear", known_noise=True)
    assert policy.commit(risk, eligible, torch.tensor([0])).tolist() == [[False, True, False]]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_maskgit_spreads_the_masks_a_prompted_row_starts_with(fused):
    """m0 counts a row's masks at the start, not D: 8 of 16 go 8 -> 7 -> 5 -> 3 (8, 7, 6, 5 from 16)."""
    masks = []

    def denoiser(x, t):
        masks.append((x == 27).sum(-1).tolist())
        return torch.zeros(*x.shape, 27)

    x_init = torch.full((2, 16), -1)
    x_init[:, ::2] = 3
    mask_sample(denoiser, 2, 16, 27, steps=4, seed=0, policy=MaskGIT(), prompt=Prompt(x_init, x_init >= 0),
                execution=Execution(fused=fused))
    assert masks == [[8, 8], [7, 7], [5, 5], [3, 3]]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_remdm_never_masks_a_frozen_position(fused):
    x_init = torch.full((8, D), -1)
    x_init[:, :4] = 5
    frozen = x_init >= 0
    result = mask_sample(NETWORKS["mask"], 8, D, 27, steps=12, seed=0, policy=ReMDM("rescale", 1.0),
                         prompt=Prompt(x_init, frozen), execution=Execution(fused=fused))
    assert torch.equal(result.tokens[frozen], x_init[frozen])


def test_a_row_filled_at_step_i_stops_after_i_plus_1_steps():
    result = mask_sample(NETWORKS["mask"], 6, D, 27, steps=8, seed=1, policy=ConfidenceThreshold(0.0))
    assert result.stop_step.tolist() == [1] * 6


# ----------------------------------------------------------------------------- (b) exact law

BUDGET_CASES = [
    # name, toy, steps, bound, max_k, order, denoiser
    ("uniform denoiser, bound 1", "dir S3 D3", 3, 1.0, 3, "risk", "uniform"),
    ("uniform denoiser, bound 0.6 planner order", "dir S3 D3", 3, 0.6, 3, "planner", "uniform"),
    ("mask denoiser, bound 1", "dir S3 D3", 3, 1.0, 3, "risk", "mask"),
    ("mask denoiser, bound 2, max_k 2", "sparse S2 D4", 3, 2.0, 2, "risk", "mask"),
    ("mask denoiser, bound 0.3 spread", "dir S3 D3", 3, 0.3, 3, "spread", "mask"),
    ("uniform denoiser, bound 0 spread", "sparse S2 D4", 2, 0.0, 4, "spread", "uniform"),
    ("mask denoiser, bound 0 cosine spread", "dir S3 D3", 3, 0.0, 3, "cosine", "mask"),
]


@pytest.mark.parametrize("name,toy_name,steps,bound,max_k,order,denoiser", BUDGET_CASES,
                         ids=[c[0] for c in BUDGET_CASES])
def test_error_budget_matches_its_exact_law(name, toy_name, steps, bound, max_k, order, denoiser):
    problem = toy(toy_name)
    models = problem.models()
    network = models.mask_denoiser if denoiser == "mask" else models.uniform_denoiser
    spread = {"spread": "linear", "cosine": "cosine"}.get(order, "none")
    order = "risk" if spread != "none" else order
    result = ddpd_sample(models.planner, network, B, problem.D, problem.S, steps=steps, noise=noise(),
                         ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(bound, max_k, order, spread)),
                         denoiser_type=denoiser)
    law = policy_laws.error_budget_law(problem, steps, bound, max_k, order, denoiser, spread=spread)
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(law, B)
    TABLE.add(f"ErrorBudget {name} [{toy_name}]", tv(emp, law), tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, law) < limit
    assert float(result.tokens_per_pass) > 0.5  # more than one token a step on average


KNOWN_NOISE_CASES = [("mask denoiser, bound 0.5", "dir S3 D3", 3, 0.5, 3, "mask", "none", 0.0, None),
                     ("uniform denoiser, bound 0 spread", "sparse S2 D4", 2, 0.0, 4, "uniform", "linear", 0.0, None),
                     ("mask denoiser, bound 0.8 spread, choice temperature 2", "dir S3 D3", 3, 0.8, 3, "mask",
                      "cosine", 2.0, None),
                     ("mask denoiser, cosine spread, revise above 0.5", "dir S3 D3", 4, 0.5, 3, "mask", "cosine", 2.0,
                      0.5),
                     ("mask denoiser, cosine spread, revise above 0.8", "dir S3 D3", 4, 0.5, 3, "mask", "cosine", 2.0,
                      0.8),
                     ("uniform denoiser, max_k 2 of 3, cosine spread", "dir S3 D3", 2, 0.0, 2, "uniform", "cosine",
                      0.0, None)]


@pytest.mark.parametrize("name,toy_name,steps,bound,max_k,denoiser,spread,tau,revise", KNOWN_NOISE_CASES,
                         ids=[c[0] for c in KNOWN_NOISE_CASES])
def test_known_noise_matches_its_exact_law(name, toy_name, steps, bound, max_k, denoiser, spread, tau, revise):
    problem = toy(toy_name)
    models = problem.models()
    network = models.mask_denoiser if denoiser == "mask" else models.uniform_denoiser
    policy = ErrorBudget(bound, max_k, spread=spread, known_noise=True, choice_temperature=tau, revise_above=revise)
    result = ddpd_sample(models.planner, network, B, problem.D, problem.S, steps=steps, noise=noise(),
                         ddpd=DDPDOptions(stop="budget", policy=policy), denoiser_type=denoiser)
    law = policy_laws.known_noise_law(problem, steps, bound, max_k, denoiser, spread, tau, revise)
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(law, B)
    TABLE.add(f"ErrorBudget known_noise {name} [{toy_name}]", tv(emp, law), tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, law) < limit


def test_plan_every_runs_the_planner_every_m_steps_and_replays_from_graphs():
    policy = ErrorBudget(1.0, 8, spread="cosine", known_noise=True, plan_every=3)

    def run(**options):
        return ddpd_sample(NETWORKS["planner"], NETWORKS["mask"], 6, D, 27, steps=10, seed=3, denoiser_type="mask",
                           ddpd=DDPDOptions(stop="budget", policy=policy), **options)

    reference, replayed = run(), run(execution=Execution(fused=True, graphs="emulate", sync_every=4))
    assert torch.equal(reference.tokens, replayed.tokens)
    # steps 3, 6, 9: at step 0 every position is unwritten, noise for certain (known_noise)
    assert reference.planner_passes.eq(3).all() and reference.denoiser_passes.eq(10).all()


def test_known_noise_skips_the_first_plan_which_nothing_reads():
    """Without a prompt every position starts unwritten, so under known_noise the first plan is
    overridden everywhere: it is not run, and a planner that would mislead changes nothing."""
    calls = []

    def counted(planner):
        return lambda x: calls.append(1) or planner(x)

    def wrong(x):
        return -NETWORKS["planner"](x)

    policy = ErrorBudget(1.0, 8, spread="cosine", known_noise=True, plan_every=1000)

    def run(planner, **options):
        return ddpd_sample(counted(planner), NETWORKS["mask"], 6, D, 27, steps=6, seed=3, denoiser_type="mask",
                           ddpd=DDPDOptions(stop="budget", policy=policy), **options)

    right, misled = run(NETWORKS["planner"]), run(wrong, execution=Execution(fused=True))
    assert not calls and right.planner_passes.eq(0).all()
    assert torch.equal(right.tokens, misled.tokens)
    x_init = torch.full((6, D), -1)
    x_init[:, 0] = 5  # a prompt's value is data: the planner's first judgement of it is read
    run(wrong, prompt=Prompt(x_init))
    assert calls


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_between_planner_passes_the_eps_stop_reads_the_held_plan(fused):
    """A planner that calls every position noise never lets a row stop when it runs each step;
    with plan_every beyond the budget and known_noise the stop reads the held plan, in which a
    written position is clean: the row stops once every position is written (documented)."""
    def run(plan_every):
        return ddpd_sample(lambda x: torch.full(x.shape, 10.0), lambda x, t: torch.zeros(*x.shape, 5), 2, 8, 5,
                           steps=40, seed=0, denoiser_type="mask", execution=Execution(fused=fused),
                           ddpd=DDPDOptions(stop="eps", policy=ErrorBudget(8.0, 4, known_noise=True,
                                                                          plan_every=plan_every)))

    assert run(1).stop_step.tolist() == [40, 40]
    unseen = run(1000)
    assert unseen.stop_step.tolist() == [2, 2] and unseen.planner_passes.eq(0).all()


@pytest.mark.parametrize("fused", [False, True])
def test_the_cosine_spread_spreads_the_noise_a_prompted_row_starts_with(fused):
    """A prompt's positions are data, frozen or not: the cosine spreads the 8 positions of 16 a
    row starts unwritten over the 4 steps, 8 -> 7 -> 5 -> 3 masks (floor(8 cos(pi/2 i / 4))),
    where counting the 8 given ones as noise put off the commits to the last step (8, 7, 6, 5)."""
    length, masks = 16, []

    def clean(x):  # every written position is clean: none is masked again
        return torch.full(x.shape, -30.0)

    def denoiser(x, t):
        masks.append((x == 27).sum(-1).tolist())
        return torch.zeros(*x.shape, 27)

    x_init = torch.full((2, length), -1)
    x_init[:, ::2] = 3
    frozen = torch.zeros_like(x_init, dtype=torch.bool)
    frozen[1, ::4] = True  # one row freezes half its prompt, the other none of it
    policy = ErrorBudget(0.0, length, spread="cosine", known_noise=True, revise_above=0.5)
    ddpd_sample(clean, denoiser, 2, length, 27, steps=4, seed=0, denoiser_type="mask", prompt=Prompt(x_init, frozen),
                ddpd=DDPDOptions(stop="budget", policy=policy), execution=Execution(fused=fused))
    assert masks == [[8, 8], [7, 7], [5, 5], [3, 3]]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_the_cosine_spread_starts_from_the_unwritten_positions_not_the_prompts(fused):
    """n0 is the positions a row starts unwritten: 12 of 16 beside a prompt of 4, so the masks
    fall 12 -> 11 -> 8 -> 4 (floor(12 cos(pi/2 i / 4))); n0 = 4, the prompt's, spent them early."""
    length, masks = 16, []

    def denoiser(x, t):
        masks.append((x == 27).sum(-1).tolist())
        return torch.zeros(*x.shape, 27)

    x_init = torch.full((2, length), -1)
    x_init[:, ::4] = 3
    frozen = torch.zeros_like(x_init, dtype=torch.bool)
    frozen[1, ::8] = True
    policy = ErrorBudget(0.0, length, spread="cosine", known_noise=True, revise_above=0.5)
    ddpd_sample(lambda x: torch.full(x.shape, -30.0), denoiser, 2, length, 27, steps=4, seed=0, denoiser_type="mask",
                prompt=Prompt(x_init, frozen), ddpd=DDPDOptions(stop="budget", policy=policy),
                execution=Execution(fused=fused))
    assert masks == [[12, 12], [11, 11], [8, 8], [4, 4]]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("kind", ["mask", "uniform"])
def test_error_budget_candidates_of_zero_weight_keep_their_tokens(kind, fused):
    """max_k above the positions that can be noise ranks frozen positions (planner weight 0) among
    the candidates: they keep their prompt's token whatever the bound admits."""
    x_init = torch.full((3, D), -1)
    x_init[:, :6] = 3
    frozen = x_init >= 0
    result = ddpd_sample(NETWORKS["planner"], NETWORKS[kind], 3, D, 27, steps=6, seed=0, denoiser_type=kind,
                         prompt=Prompt(x_init, frozen), ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(8.0, D)),
                         execution=Execution(fused=fused))
    assert (result.tokens[:, :6] == 3).all(), result.tokens


def test_a_choice_temperature_below_one_ranks_with_gumbel_noise():
    """Any choice_temperature > 0 adds the annealed Gumbel noise to the ranking: 0.5 draws other
    tokens than 0 from the same seed (a cut at 1 would have ignored it)."""
    def run(tau):
        return ddpd_sample(NETWORKS["planner"], NETWORKS["mask"], 16, D, 27, steps=4, seed=0, denoiser_type="mask",
                           ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(1.0, D, choice_temperature=tau))).tokens

    assert not torch.equal(run(0.5), run(0.0))


SPREADS_TO_THE_END = [(ErrorBudget(0.0, 16, spread="cosine", known_noise=True), 4),
                      (ErrorBudget(1.0, 16, spread="linear", known_noise=True), 4),
                      (ErrorBudget(0.0, 6, spread="cosine", known_noise=True, plan_every=2), 6)]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("kind", ["mask", "uniform"])
@pytest.mark.parametrize("policy,steps", SPREADS_TO_THE_END, ids=["cosine", "linear", "cosine max_k 6"])
def test_the_spread_leaves_no_unwritten_position_after_the_budget(policy, steps, kind, fused):
    """Under known_noise the budget's last step commits every position no draw has written (noise
    for certain; here at most max_k are left), not a written one the planner doubts in its place.
    The denoiser draws tokens 0-3 only, so a larger token is the run's initial noise."""
    length = 16
    net = tiny_network(f"{kind}-denoiser", 27, 2, 20.0, length=length)

    def denoiser(x, t):
        logits = net(x, t)
        return torch.cat([logits[..., :4], torch.full_like(logits[..., 4:], -1e4)], -1)

    result = ddpd_sample(tiny_network("planner", 27, 0, 1.0, length=length), denoiser, 64, length, 27, steps=steps,
                         seed=0, denoiser_type=kind, ddpd=DDPDOptions(stop="budget", policy=policy),
                         execution=Execution(fused=fused))
    assert result.tokens.lt(4).all()


def test_the_last_step_puts_the_unwritten_positions_in_place_of_the_last_written_picks():
    unwritten = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    picks = torch.tensor([[0, 3, 2], [5, 0, 4], [0, 1, 2]])
    positions, first = _unwritten_first(picks, unwritten)
    # row 0: 1 and 4 replace 2 and 0, the written picks ranked last; row 1: 1, 2 of 1, 2, 3 fit
    assert positions.tolist() == [[4, 3, 1], [2, 0, 1], [0, 1, 5]]
    assert first.tolist() == [[True] * 3, [True] * 3, [False, False, True]]


def test_the_last_step_takes_the_missing_unwritten_positions_in_position_order_on_a_long_row():
    """Over 64 positions, 32 unwritten (the even ones) and none picked: the four written picks give
    their places to positions 0, 2, 4, 6, the first in position order, the last pick to 0."""
    unwritten = (torch.arange(64) % 2 == 0)[None]
    positions, first = _unwritten_first(torch.tensor([[1, 3, 5, 7]]), unwritten)
    assert positions.tolist() == [[6, 4, 2, 0]] and first.all()


def test_the_unwritten_candidates_are_committed_first():
    """At bound 0 the lowest risk would be column 0; the unwritten column 2 is committed instead."""
    risk, eligible, one = torch.tensor([[0.1, 0.2, 0.9]]), torch.ones(1, 3, dtype=torch.bool), torch.ones(1).long()
    policy = ErrorBudget(0.0, 3, spread="cosine", known_noise=True)
    assert policy.commit(risk, eligible, one).tolist() == [[True, False, False]]
    first = torch.tensor([[False, False, True]])
    assert policy.commit(risk, eligible, one, None, first).tolist() == [[False, False, True]]


@pytest.mark.parametrize("policy", [None, ErrorBudget(1.0, 8, known_noise=True, plan_every=4),
                                    ErrorBudget(1.0, 8, plan_every=3), ErrorBudget(1.0, 8, known_noise=True,
                                                                                   plan_every=1000)])
@pytest.mark.parametrize("passes", [6, 13, 32])
def test_ddpd_steps_spends_the_pass_budget(policy, passes):
    steps = ddpd_steps(passes, policy)
    result = ddpd_sample(NETWORKS["planner"], NETWORKS["mask"], 2, D, 27, steps=steps, seed=1, denoiser_type="mask",
                         ddpd=DDPDOptions(stop="budget", policy=policy))
    spent = result.planner_passes + result.denoiser_passes
    assert spent.le(passes).all() and spent.ge(passes - 1).all()  # one more step would pass the budget


@pytest.mark.parametrize("policy", [None, ErrorBudget(1.0, 8, known_noise=True, plan_every=4),
                                    ErrorBudget(1.0, 8, plan_every=1)])
@pytest.mark.parametrize("one_pass", [False, True])
def test_ddpd_steps_spends_the_uniform_models_pass_budget(policy, one_pass):
    """The single uniform model plans and draws in two passes a planning step, or in one with
    one_pass: a pass a step whether the step plans or not."""
    from ddpd.sampling.policies import ddpd_passes

    steps = ddpd_steps(13, policy, one_pass=one_pass)
    assert ddpd_passes(steps, policy, one_pass=one_pass) <= 13
    result = ddpd_sample_uniform(NETWORKS["model"], 2, D, 27, steps=steps, seed=1,
                                 ddpd=DDPDOptions(stop="budget", policy=policy, one_pass=one_pass))
    spent = result.planner_passes + result.denoiser_passes
    assert spent.eq(ddpd_passes(steps, policy, one_pass=one_pass)).all()
    assert spent.ge(12).all() and (steps == 13 if one_pass else steps < 13)
    with pytest.raises(TypeError, match="^one_pass must be a bool"):
        ddpd_steps(13, policy, one_pass=1)


@pytest.mark.parametrize("plan_every", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("known_noise", [False, True])
def test_ddpd_steps_is_the_most_steps_a_budget_buys(plan_every, known_noise):
    policy = ErrorBudget(0.0, 4, known_noise=known_noise, plan_every=plan_every)

    def cost(steps):  # a denoiser pass a step, a planner pass at steps 0, m, 2m, ... (not 0 when unread)
        return steps + len(range(0, steps, plan_every)) - known_noise

    for passes in range(2, 400):
        steps = ddpd_steps(passes, policy)
        assert cost(steps) <= passes < cost(steps + 1), (passes, steps)
    assert [ddpd_steps(p) for p in range(2, 40)] == [p // 2 for p in range(2, 40)]


@pytest.mark.parametrize("plan_every", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("known_noise", [False, True])
def test_ddpd_passes_is_what_ddpd_steps_spends(plan_every, known_noise):
    """A budget below one step's cost bought one step all the same: ddpd_passes says the cost."""
    from ddpd.sampling.policies import ddpd_passes

    policy = ErrorBudget(0.0, 4, known_noise=known_noise, plan_every=plan_every)
    for steps in range(1, 200):
        assert ddpd_passes(steps, policy) == steps + len(range(0, steps, plan_every)) - known_noise
        assert ddpd_steps(ddpd_passes(steps, policy), policy) == steps
    assert [ddpd_passes(s) for s in range(1, 40)] == [2 * s for s in range(1, 40)]
    assert ddpd_passes(1) == 2 and ddpd_passes(1, ErrorBudget(known_noise=True)) == 1


def test_ddpd_steps_and_passes_check_their_counts():
    """A float or bool count went through (ddpd_steps(12.5) was 6.0), a numpy one came back numpy."""
    from ddpd.sampling.policies import ddpd_passes

    policy = ErrorBudget(0.0, 4, plan_every=3)
    for count, policy_ in ((np.int64(13), None), (np.int32(13), policy), (np.uint8(13), policy)):
        assert type(ddpd_steps(count, policy_)) is int and ddpd_steps(count, policy_) == ddpd_steps(13, policy_)
        assert type(ddpd_passes(count, policy_)) is int and ddpd_passes(count, policy_) == ddpd_passes(13, policy_)
    for function, name in ((ddpd_steps, "passes"), (ddpd_passes, "steps")):
        for bad in (12.5, 12.0, True, np.float64(12.0), "12", torch.tensor(12)):
            with pytest.raises(TypeError, match=f"^{name} must be an int"):
                function(bad)
        with pytest.raises(ValueError, match=f"^{name} must be >= 1, got 0"):
            function(np.int64(0))
        with pytest.raises(TypeError, match="policy must be an ErrorBudget or None, got MaskGIT"):
            function(8, MaskGIT())


def test_a_pass_budget_below_one_steps_cost_still_buys_one_step():
    """ddpd_steps is at least 1: one pass (a step costs two), or one pass under plan_every 3."""
    assert ddpd_steps(1) == 1 and ddpd_steps(1, ErrorBudget(plan_every=3)) == 1


def test_error_budget_law_at_bound_0_is_algorithm_1s():
    problem = toy("dir S3 D3")
    one = laws.ddpd_planner_clock_law(problem, 4, ddpd=DDPDOptions(stop="budget"))
    assert tv(policy_laws.error_budget_law(problem, 4, 0.0, 3), one) < 1e-12


# ----------------------------------------------------------------------------- (c) a wrong planner


def test_a_wrong_planner_is_caught():
    problem = toy("dir S3 D3")
    models = problem.models()

    def inverted(x):  # says clean where the oracle says noise
        return -models.planner(x)

    result = ddpd_sample(inverted, models.uniform_denoiser, B, problem.D, problem.S, steps=3, noise=noise(),
                         ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(1.0, 3)))
    law = policy_laws.error_budget_law(problem, 3, 1.0, 3)
    emp = empirical(problem.index(result.tokens), problem.N)
    TABLE.add("(c) ErrorBudget, planner logits negated [dir S3 D3]", tv(emp, law), tv(emp, problem.p_data),
              threshold(law, B), problem.N)
    assert tv(emp, law) > threshold(law, B)


# ----------------------------------------------------------------------------- (d) the mask loop

MASK_POLICIES = [MaskGIT(), ConfidenceThreshold(0.5), ConfidenceFactor(1.0), EntropyBound(0.5),
                 ReMDM("cap", 0.1), ReMDM("rescale", 0.5), ReMDM("loop", 0.1, 0.3, 0.7)]


@pytest.mark.parametrize("policy", MASK_POLICIES, ids=[policy_spec(p) for p in MASK_POLICIES])
def test_mask_loop_policies_fused_draw_the_reference_tokens(policy):
    reference, fused = (mask_sample(NETWORKS["mask"], 6, D, 27, steps=6, seed=2, policy=policy,
                                    execution=Execution(fused=f))
                        for f in (False, True))
    assert torch.equal(reference.tokens, fused.tokens)
    assert torch.equal(reference.denoiser_passes, fused.denoiser_passes)
    assert not bool((reference.tokens == 27).any()), "a mask was left"


@pytest.mark.parametrize("policy", [ReMDM("cap", 0.5), ReMDM("rescale", 1.0), ReMDM("loop", 0.5, 0.3, 0.9, 0.6)],
                         ids=["cap", "rescale", "loop"])
def test_remdm_runs_to_the_budget_and_fused_leaves_no_mask(policy):
    """ReMDM may mask a filled row again, so no row stops before the budget; with rows filled
    early and stop checks every 8 steps the fused run draws the reference's tokens. A step
    counts a pass only for a row with a mask to fill: a filled row uses no logits."""
    with_masks = []

    def network(x, t):
        with_masks.append((x == 27).any(-1).long())
        return NETWORKS["mask"](x, t)

    reference = mask_sample(network, 16, D, 27, steps=40, seed=1, policy=policy)
    fused = mask_sample(NETWORKS["mask"], 16, D, 27, steps=40, seed=1, policy=policy,
                        execution=Execution(fused=True, sync_every=8))
    assert reference.stop_step.eq(40).all() and len(with_masks) == 40
    assert torch.equal(reference.denoiser_passes, torch.stack(with_masks).sum(0))
    assert reference.denoiser_passes.lt(40).any(), "no row was filled early: the test checks nothing"
    assert torch.equal(reference.tokens, fused.tokens) and torch.equal(reference.commits, fused.commits)
    assert torch.equal(reference.denoiser_passes, fused.denoiser_passes)
    assert not bool((fused.tokens == 27).any())


def test_remdm_loop_holds_alpha_on_between_t_on_and_t_off():
    """ReMDM-loop's alphas (Wang et al. 2025, sec. 4.1): the run's schedule scaled to reach
    alpha_on at t_on, alpha_on held (sigma = eta) until t_off, then linear to 1."""
    policy, linear = ReMDM("loop", 0.1, 0.25, 0.75, alpha_on=0.8), (lambda u: u)
    steps = [policy.alphas(i, 8, linear) for i in range(8)]
    assert [round(a, 6) for a, _, _ in steps] == [0.0, 0.4, 0.8, 0.8, 0.8, 0.8, 0.8, 0.9]
    assert [looping for _, _, looping in steps] == [False, False, True, True, True, True, False, False]
    assert [policy.sigma(*step) for step in steps] == [0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0]
    assert steps[-1][1] == 1.0
    # the rows a step reads (sigma, unmask probability): inside the loop a mask is filled with
    # probability sigma alpha_on / (1 - alpha_on), which holds alpha; before it, MDLM's step
    table = policy.step_table(8, linear)
    assert table[:, 0].tolist() == [0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.0, 0.0]
    assert torch.allclose(table[:, 1], torch.tensor([0.4, 2 / 3, 0.4, 0.4, 0.4, 0.4, 0.5, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("policy", [MaskGIT(), ConfidenceThreshold(0.5), ReMDM("cap", 0.0), ReMDM("cap", 0.3)],
                         ids=["maskgit", "threshold", "remdm-eta-0", "remdm-frozen"])
@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_a_row_the_prompt_fills_costs_no_pass(policy, fused):
    given = torch.full((3, D), -1)
    given[0], given[1, :4] = 5, 7
    result = mask_sample(NETWORKS["mask"], 3, D, 27, steps=6, seed=1, policy=policy,
                         prompt=Prompt(given, given >= 0), execution=Execution(fused=fused))
    assert result.stop_step[0] == 0 and result.denoiser_passes[0] == 0 and result.commits[0] == 0
    assert bool(result.denoiser_passes[1:].gt(0).all()) and torch.equal(result.tokens[0], given[0])


def test_maskgit_policy_draws_maskgit_samples_law():
    problem = toy("dir S3 D3")
    result = mask_sample(problem.models().mask_denoiser, B, problem.D, problem.S, steps=3, noise=noise(),
                         policy=MaskGIT(2.0))
    law = laws.maskgit_law(problem, 3, 2.0)
    emp = empirical(problem.index(result.tokens), problem.N)
    TABLE.add("MaskGIT policy of mask_sample [dir S3 D3]", tv(emp, law), tv(emp, problem.p_data), threshold(law, B),
              problem.N)
    assert tv(emp, law) < threshold(law, B)


BASELINE_LAWS = [
    (ConfidenceThreshold(0.3), lambda toy, steps: policy_laws.confidence_rule_law(
        toy, steps, policy_laws.threshold_rule(0.3))),
    (ConfidenceFactor(2.0), lambda toy, steps: policy_laws.confidence_rule_law(
        toy, steps, policy_laws.factor_rule(2.0))),
    (EntropyBound(0.8), lambda toy, steps: policy_laws.confidence_rule_law(
        toy, steps, policy_laws.entropy_bound_rule(0.8))),
    (ReMDM("cap", 0.3), lambda toy, steps: policy_laws.remdm_law(toy, steps, "cap", 0.3)),
    (ReMDM("rescale", 0.6), lambda toy, steps: policy_laws.remdm_law(toy, steps, "rescale", 0.6)),
    (ReMDM("loop", 0.3, 0.25, 0.75, 0.6), lambda toy, steps: policy_laws.remdm_law(toy, steps, "loop", 0.3, 0.25,
                                                                                    0.75, 0.6)),
]


@pytest.mark.parametrize("policy,law", BASELINE_LAWS, ids=[policy_spec(p) for p, _ in BASELINE_LAWS])
def test_mask_loop_baselines_draw_their_exact_laws(policy, law):
    """Fast-dLLM's threshold and factor rules, EB-sampler and ReMDM's three schedules against
    their laws built from the papers' rules (oracles/policy_laws.py), B = 50k. The parameters
    make laws far (TV 0.11-0.65) from committing one position a step and from committing all
    at once, and the factor's from the threshold's, so a rule that degenerates is caught."""
    problem = toy("dir S3 D3")
    steps = 8 if isinstance(policy, ReMDM) else 3  # the loop needs steps wholly inside [t_on, t_off]
    result = mask_sample(problem.models().mask_denoiser, B, problem.D, problem.S, steps=steps, noise=noise(),
                         policy=policy)
    exact = law(problem, steps)
    emp = empirical(problem.index(result.tokens), problem.N)
    TABLE.add(f"{policy_spec(policy)} [dir S3 D3]", tv(emp, exact), tv(emp, problem.p_data), threshold(exact, B),
              problem.N)
    assert tv(emp, exact) < threshold(exact, B)


def test_a_wrong_rule_is_told_from_the_threshold_law():
    """The law of another threshold is far from the sampler's: the check can fail."""
    problem = toy("dir S3 D3")
    result = mask_sample(problem.models().mask_denoiser, B, problem.D, problem.S, steps=3, noise=noise(),
                         policy=ConfidenceThreshold(0.3))
    wrong = policy_laws.confidence_rule_law(problem, 3, policy_laws.threshold_rule(0.5))
    emp = empirical(problem.index(result.tokens), problem.N)
    TABLE.add("threshold 0.3 against threshold 0.5's law [dir S3 D3]", tv(emp, wrong), tv(emp, problem.p_data),
              threshold(wrong, B), problem.N)
    assert tv(emp, wrong) > threshold(wrong, B)


def test_at_half_the_passes_error_budget_is_as_close_to_p_data_as_algorithm_1():
    """TV to p_data against mean passes, oracle planner + mask denoiser (docs/parallel.md): at
    half of Algorithm 1's passes ErrorBudget is no farther from p_data than Algorithm 1 at all of
    them, up to the noise floor."""
    problem = toy("dir S3 D3")
    models = problem.models()
    distance = {}
    cases = [("one-at-a-time", None, 6), ("ErrorBudget(0.5)", ErrorBudget(0.5, 3), 3),
             ("ErrorBudget(1.5)", ErrorBudget(1.5, 3), 3), ("ErrorBudget(1.5)", ErrorBudget(1.5, 3), 2)]
    for name, policy, steps in cases:
        result = ddpd_sample(models.planner, models.mask_denoiser, B, problem.D, problem.S, steps=steps, noise=noise(),
                             ddpd=DDPDOptions(stop="budget", policy=policy), denoiser_type="mask")
        assert result.passes.eq(2 * steps).all()
        distance[name, 2 * steps] = tv(empirical(problem.index(result.tokens), problem.N), problem.p_data)
        TABLE.add(f"mask denoiser {name}, {2 * steps} passes [dir S3 D3]", None, distance[name, 2 * steps], None,
                  problem.N)
    floor = threshold(problem.p_data, B)
    assert distance["ErrorBudget(1.5)", 6] <= distance["one-at-a-time", 12] + floor


def test_a_graphs_step_tensor_gives_the_eager_steps_spread_and_annealing():
    """A CUDA graph replays a step with its index as a tensor: the cosine spread and the annealed
    choice temperature must come out as for the int index (n0 cos(pi/3) lands on an integer)."""
    sum_p, g = torch.tensor([200.0, 3.0]), torch.linspace(-2.0, 5.0, 1001)
    for steps in (3, 6, 26, 103):
        cos = cosine_table(steps)
        for step in range(steps):
            replayed = torch.tensor(step)
            for n0 in (256, 6, torch.tensor([256.0, 6.0])):
                assert torch.equal(spread_minimum("cosine", sum_p, step, steps, n0, row(cos, step)),
                                   spread_minimum("cosine", sum_p, replayed, steps, n0, row(cos, replayed)))
            assert torch.equal(annealed(4.5, step, steps) * g, annealed(4.5, replayed, steps) * g)
    cos = cosine_table(3)[1]
    assert spread_minimum("cosine", sum_p, 1, 3, 256, cos).tolist() == [72, 1]  # floor(256 cos(pi/3)) = 128


def test_a_graphs_step_tensor_gives_the_eager_steps_linear_spread():
    """ceil(sum_p / (T - i)): a replayed step divides by the steps left as the int index does."""
    sum_p = torch.tensor([200.0, 3.0, 7.5])
    for steps in (3, 6, 26):
        for step in range(steps):
            assert torch.equal(spread_minimum("linear", sum_p, step, steps, 256),
                               spread_minimum("linear", sum_p, torch.tensor(step), steps, 256))
    assert spread_minimum("linear", sum_p, torch.tensor(2), 6, 256).tolist() == [50, 1, 2]


def test_maskgit_and_the_cosine_spread_keep_the_committed_frontiers_draws():
    """MaskGIT and ErrorBudget's cosine spread share one schedule (cosine_left); each computed it
    its own way before (MaskGIT from math.cos, the spread rounded to float32 before its floor).
    At the budgets of the committed frontier (docs/parallel) both must leave what they left."""
    frontier_steps = (32, 64, 128, 256, 26, 52, 103, 205, 31, 61, 121, 241, 16, 4)
    for steps in frontier_steps:
        cos, maskgit_table = cosine_table(steps), MaskGIT().step_table(steps, None)
        assert torch.equal(maskgit_table[:, 0], cos)
        for step in range(steps - 1):  # the last step fills every position left
            angle = (step + 1) / steps * (math.pi / 2)
            for n0 in (256, 6):
                maskgit = math.floor(n0 * math.cos(0.5 * math.pi * (step + 1) / steps))
                spread = math.floor(float(torch.tensor(n0 * math.cos(angle))))  # float32
                assert cosine_left(n0, cos[step]) == maskgit == spread, (steps, step, n0)
    # where they floored apart, the one schedule floors as exact arithmetic does
    assert cosine_left(2, cosine_table(39)[25]) == 1  # 2 cos(pi/3); math.cos's angle gave 0
    assert cosine_left(torch.tensor([256]), cosine_table(60)[36]) == 144  # 144.999997; float32 gave 145


def test_the_cosine_table_is_one_tensor_op_with_the_per_step_values():
    """cosine_table made one 0-d tensor a step: seven seconds of setup at 10**5 steps for a
    run that may stop at step 0. It is now built in a few tensor ops, bit for bit the entries
    the per-step ops gave (every step of small budgets, spot checks of large ones)."""
    class Count(torch.overrides.TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        cosine_table(1000)
    assert Count.calls <= 5

    def entry(step, steps):  # the per-step op of the table before
        return torch.cos(torch.tensor(step + 1, device="cpu").double() / steps * (math.pi / 2))

    for steps in range(1, 41):
        assert torch.equal(cosine_table(steps), torch.stack([entry(i, steps) for i in range(steps)]))
    for steps in (3000, 65537, 10**5):
        table = cosine_table(steps)
        for step in (0, 1, steps // 3, steps // 2, steps - 2, steps - 1):
            assert torch.equal(table[step], entry(step, steps)), (steps, step)


def test_a_cosine_budget_past_its_table_is_refused_naming_steps():
    """steps=10**9 made cosine_table ask the allocator for 8 GB, whose error names no argument;
    MaskGIT refuses it before its first step, and a budget at the limit still gets its table."""
    with pytest.raises(ValueError, match=r"steps must be <= 16777216 with the cosine schedule .* got 1000000000"):
        cosine_table(10**9)
    with pytest.raises(ValueError, match=r"steps must be <= 16777216 .* got 16777217"):
        mask_sample(NETWORKS["mask"], 1, 4, 27, steps=2**24 + 1, seed=0, policy=MaskGIT())
    assert cosine_table(MAX_TABLE_STEPS).shape == (2**24,)


def test_a_remdm_budget_past_its_table_is_refused_before_the_table_is_built():
    """ReMDM's table is a host loop of one row a step: steps=10**9 ran for hours before its first
    step; it is refused at once by name, and a budget at the limit is not."""
    with pytest.raises(ValueError, match=r"steps must be <= 16777216 with ReMDM, .* got 1000000000"):
        ReMDM().step_table(10**9, lambda u: u)
    with pytest.raises(ValueError, match=r"steps must be <= 16777216 with ReMDM, .* got 16777217"):
        mask_sample(NETWORKS["mask"], 1, 4, 27, steps=2**24 + 1, seed=0, policy=ReMDM())
    assert ReMDM().step_table(4, lambda u: u).shape == (4, 2)


def test_a_certain_risk_under_a_choice_temperature_stays_ahead_of_ineligible_candidates():
    """A risk of exactly 1 (p c below float32's resolution) keys +inf under a choice
    temperature; it must still rank before the ineligible candidates, which are never committed."""
    risk = 1 - torch.tensor([[0.9, 0.5, 1e-3]]) * torch.tensor([[0.9, 0.9, 1e-5]])
    assert risk[0, 2] == 1.0
    eligible = torch.tensor([[True, False, True]])
    tempered = ErrorBudget(0.5, 3, choice_temperature=1.0).commit(risk, eligible, torch.tensor([2]),
                                                                  torch.zeros(1, 3))
    assert tempered.tolist() == [[True, False, True]]
    assert ErrorBudget(0.5, 3).commit(risk, eligible, torch.tensor([2])).tolist() == [[True, False, True]]


@pytest.mark.parametrize("spec,message", [
    ("error-budget:known_noise", "policy field known_noise needs a value: known_noise=true"),
    ("error-budget:max_k=8,known_noise", "policy field known_noise needs a value: known_noise=true"),
    ("maskgit:choice_temperature", "policy field choice_temperature needs a value: choice_temperature=VALUE"),
    ("error-budget:max_k=8,0.5", "policy error-budget takes a bare value only as its first item (bound); "
                                 "write '0.5' as FIELD=VALUE"),
    ("threshold:0.9,0.8", "policy threshold takes a bare value only as its first item (threshold); "
                          "write '0.8' as FIELD=VALUE"),
])
def test_a_bare_field_name_or_a_later_bare_value_asks_for_field_equals_value(spec, message):
    """A bare value set the first field, so a bare flag was read as the bound."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_policy(spec)
    assert parse_policy("error-budget:0.5,max_k=8") == ErrorBudget(0.5, 8)


def test_a_policy_name_is_read_as_its_fields_are_stripped_and_a_spec_must_be_text():
    """' threshold : 0.9' was refused as an unknown policy, though its field's spaces are stripped."""
    assert parse_policy(" threshold : 0.9") == parse_policy("threshold:0.9")
    assert parse_policy("maskgit ") == parse_policy("maskgit")
    with pytest.raises(TypeError, match="^policy spec must be a str, got float 0.9$"):
        parse_policy(0.9)


def test_error_budget_refuses_a_known_noise_not_bool_and_revise_above_without_it():
    with pytest.raises(TypeError, match="^known_noise must be a bool, got int$"):
        ErrorBudget(known_noise=1)
    message = "revise_above needs known_noise=True (it judges the written positions only)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ErrorBudget(revise_above=0.5)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_policy("error-budget:revise_above=0.5")


def test_policy_specs_round_trip_and_bad_ones_are_named():
    for policy in MASK_POLICIES + LIMITS:
        assert parse_policy(policy_spec(policy)) == policy
    with pytest.raises(ValueError, match="no field 'x'"):
        parse_policy("threshold:x=1")
    with pytest.raises(ValueError, match="policy must be one of"):
        parse_policy("fastest")
    with pytest.raises(ValueError, match="bound"):
        ErrorBudget(-1.0)
    with pytest.raises(TypeError, match="order must be a str, one of .'risk', 'planner'., got NoneType None"):
        ErrorBudget(order=None)
    with pytest.raises(ValueError, match="sets threshold twice"):
        parse_policy("threshold:0.9,threshold=0.8")
    with pytest.raises(ValueError, match="needs order='risk'"):
        parse_policy("error-budget:order=planner,choice_temperature=1")
    with pytest.raises(ValueError, match="t_on < t_off"):
        ReMDM("loop", t_on=0.0)
    with pytest.raises(ValueError, match=r"eta <= \(1 - alpha_on\) / alpha_on = 0.1111"):
        ReMDM("loop", eta=0.2)
    with pytest.raises(ValueError, match="0 < alpha_on < 1"):
        ReMDM("loop", alpha_on=0.0)
    with pytest.raises(ValueError, match="ReMDM cap has no alpha_on: fields of schedule='loop'"):
        ReMDM("cap", alpha_on=0.0)  # ignored by cap: refused, not divided by
    with pytest.raises(ValueError, match="ReMDM rescale has no t_on, t_off"):
        parse_policy("remdm:schedule=rescale,t_on=0.9,t_off=0.1")
    precise = ErrorBudget(0.1234567, known_noise=True, revise_above=0.75)
    assert parse_policy(policy_spec(precise)) == precise  # no digit lost to a short format
    short = policy_spec(precise, defaults=False)
    assert short == "error-budget:bound=0.1234567,known_noise=True,revise_above=0.75"
    assert parse_policy(short) == precise and policy_spec(MaskGIT(), defaults=False) == "maskgit:choice_temperature=4.5"
    assert parse_policy("error-budget:known_noise=true,revise_above=none").revise_above is None
    with pytest.raises(TypeError, match="policy must be one of"):
        mask_sample(NETWORKS["mask"], 2, D, 27, steps=4, seed=0, policy=ErrorBudget())
    with pytest.raises(ValueError, match="clock='planner'"):
        ddpd_sample(NETWORKS["planner"], NETWORKS["uniform"], 2, D, 27, steps=4, seed=0,
                    ddpd=DDPDOptions(clock="exact", policy=ErrorBudget()))


@pytest.mark.parametrize("fused", [False, True])
def test_tokens_per_pass_counts_the_planners_passes_too(fused):
    # a DDPD step is two passes, planner and denoiser: one token a step is half a token a pass
    result = ddpd_sample(NETWORKS["planner"], NETWORKS["mask"], 3, D, 27, steps=D, seed=1, denoiser_type="mask",
                         execution=Execution(fused=fused))
    assert torch.equal(result.passes, result.planner_passes + result.denoiser_passes)
    assert int(result.planner_passes.sum()) > 0
    assert result.tokens_per_pass == float(result.commits.sum()) / int(result.passes.sum()) == 0.5


@pytest.mark.parametrize("fused", [False, True])
def test_a_run_with_nothing_to_draw_commits_0_tokens_a_pass(fused):
    # a prompt with no noise left: no pass at all, and tokens_per_pass is 0, not a division by zero
    x_init = torch.randint(0, 27, (3, D), generator=torch.Generator().manual_seed(0))
    result = mask_sample(NETWORKS["mask"], 3, D, 27, steps=D, seed=1, prompt=Prompt(x_init),
                         execution=Execution(fused=fused))
    assert int(result.passes.sum()) == 0 and result.tokens_per_pass == 0.0


def test_policy_specs_read_spaces_flags_none_and_types_as_documented():
    """What a spec's text can hold besides NAME:FIELD=VALUE: spaces around items, keys and
    values; a flag as true/false/1/0 in any case; None in any case for an optional field;
    each field's type named where the value is not of it."""
    spaced = parse_policy("error-budget: bound = 0.5 , max_k = 8, order = planner, known_noise = true")
    assert spaced == ErrorBudget(0.5, 8, order="planner", known_noise=True)
    assert [parse_policy(f"error-budget:known_noise={text}").known_noise
            for text in ("1", "0", "TRUE", "False")] == [True, False, True, False]
    assert parse_policy("error-budget:known_noise=true,revise_above=None") == ErrorBudget(known_noise=True)
    for spec, message in [("error-budget:known_noise=yes", "policy field known_noise must be a bool, got 'yes'"),
                          ("error-budget:max_k=2.5", "policy field max_k must be an int, got '2.5'"),
                          ("error-budget:bound=many", "policy field bound must be a float, got 'many'"),
                          ("error-budget:bound=0.5, ,max_k=8", "policy error-budget has an empty field in "
                                                               "'error-budget:bound=0.5, ,max_k=8'")]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            parse_policy(spec)


def test_a_policy_number_with_an_underscore_is_refused():
    """Python's int() and float() read `1_6` as 16: a typo in a field set another number."""
    for spec, message in [("error-budget:max_k=1_6", "policy field max_k must be an int, got '1_6'"),
                          ("error-budget:bound=0_5", "policy field bound must be a float, got '0_5'"),
                          ("threshold:0.9_5", "policy field threshold must be a float, got '0.9_5'")]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}: a number has no underscores or spaces$"):
            parse_policy(spec)
    assert parse_policy("error-budget: bound = 1e-1 , max_k = +8") == ErrorBudget(0.1, 8)


def test_a_full_policy_spec_leaves_out_the_fields_that_are_none():
    """policy_spec names every field set (the frontier's rows), none of those at None."""
    assert policy_spec(ErrorBudget()) == ("error-budget:bound=1,max_k=16,order=risk,spread=none,known_noise=False,"
                                          "plan_every=1,choice_temperature=0")


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_a_row_the_prompt_fills_without_freezing_it_stops_at_step_0(fused):
    """A row whose x_init gives every position but freezes none has no mask to fill: it stops
    at step 0 with no pass and no commit, and keeps the given tokens; the other rows commit
    each mask they start with once, a pass a step up to the step they stop at (one that
    commits every mask at step 0 stops at step 1)."""
    given = torch.full((3, D), -1)
    given[0], given[1, :4] = 5, 7
    result = mask_sample(NETWORKS["mask"], 3, D, 27, steps=6, seed=1, policy=MaskGIT(),
                         prompt=Prompt(given, torch.zeros_like(given, dtype=torch.bool)),
                         execution=Execution(fused=fused))
    assert result.stop_step.tolist()[0] == 0 and result.denoiser_passes[0] == 0 and result.commits[0] == 0
    assert bool(result.stop_step[1:].gt(0).all()) and torch.equal(result.tokens[0], given[0])
    assert result.commits.tolist() == [0, D - 4, D]
    assert result.stop_step.tolist() == result.denoiser_passes.tolist() == [0, 6, 6]
    eager = mask_sample(NETWORKS["mask"], 3, D, 27, steps=6, seed=1, policy=ConfidenceThreshold(1e-9),
                        prompt=Prompt(given, torch.zeros_like(given, dtype=torch.bool)),
                        execution=Execution(fused=fused))
    assert eager.stop_step.tolist() == eager.denoiser_passes.tolist() == [0, 1, 1]


def test_a_denoiser_that_is_not_callable_is_named():
    """The mask loop refuses a denoiser that is not callable before the run, naming it."""
    with pytest.raises(TypeError, match="denoiser must be callable, got str"):
        mask_sample("runs/mask", 2, D, 27, steps=4, seed=0)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_entropy_bound_reads_a_token_of_probability_zero_as_adding_no_entropy(fused):
    """A law with -inf logits has a finite entropy (0 log 0 = 0), not NaN: under a bound every
    entropy fits, each row commits all its masks at step 0."""
    def sparse(x, t):
        logits = torch.zeros(*x.shape, 27)
        logits[..., 3:] = float("-inf")  # three tokens, entropy log 3 at every position
        return logits
    result = mask_sample(sparse, 2, D, 27, steps=4, seed=0, policy=EntropyBound(100.0),
                         execution=Execution(fused=fused))
    assert result.stop_step.tolist() == [1, 1] and bool((result.tokens < 3).all())


def test_the_mask_loop_calls_the_denoiser_at_the_time_of_its_masked_share():
    """Under the linear schedule (alpha_t = t) the denoiser sees t = 1 - #masked / D: 0 at the
    all-mask start, then the share each row has unmasked."""
    seen = []

    def recording(x, t):
        seen.append((t.clone(), (x == 27).float().mean(-1)))
        return NETWORKS["mask"](x, t)
    mask_sample(recording, 2, D, 27, steps=4, seed=0, policy=MaskGIT())
    assert torch.equal(seen[0][0], torch.zeros(2)) and len(seen) == 4
    for t, share in seen:
        assert torch.allclose(t.float(), 1 - share)


def test_remdm_reads_the_alphas_of_the_runs_schedule():
    """ReMDM's step table comes from the run's schedule: with a denoiser blind to t, the cosine
    schedule's alphas (not the step's share of the time) change which tokens are committed."""
    def blind(x, t):
        return NETWORKS["mask"](x, torch.zeros_like(t))

    def run(schedule):
        return mask_sample(blind, 64, D, 27, steps=6, seed=0, policy=ReMDM("cap", 0.5), schedule=schedule).tokens
    assert not torch.equal(run("cosine"), run("linear"))


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_plan_every_2_holds_the_plan_between_planner_passes(fused):
    """Pins that a step without a planner pass reads the held plan at plan_every=2 as at any larger
    m: a position the planner called clean (logit -inf) is never written, while a blank plan would
    make every position a candidate at the odd steps."""
    def planner(x):
        logits = torch.zeros(x.shape)
        logits[:, :4] = float("-inf")
        return logits

    def denoiser(x, t):
        logits = torch.zeros(*x.shape, 27)
        logits[..., 26] = 50.0
        return logits

    def run(plan_every):
        return ddpd_sample(planner, denoiser, 6, D, 27, steps=6, seed=1, temperature=0.0,
                           execution=Execution(fused=fused),
                           ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(8.0, 4, plan_every=plan_every)))

    every, held = run(1), run(2)
    assert held.planner_passes.eq(3).all()
    assert torch.equal(held.tokens, every.tokens)
    assert held.tokens[:, 4:].eq(26).all() and not held.tokens[:, :4].eq(26).all()


def test_a_spreads_minimum_counts_the_planners_pick_among_its_commits():
    """The minimum is of the step's commits, the always-committed pick included: a minimum of 2
    at bound 0 commits the pick and the lowest risk after it, not two more."""
    risk, eligible = torch.tensor([[0.9, 0.3, 0.1, 0.2]]), torch.ones(1, 4, dtype=torch.bool)
    policy = ErrorBudget(0.0, 4, spread="linear")
    assert policy.commit(risk, eligible, torch.tensor([2])).tolist() == [[True, False, True, False]]


def test_the_choice_temperatures_noise_is_read_from_the_candidates_after_the_pick():
    """Without known_noise column 0 is the pick, committed unranked: candidate j's rank reads noise
    column j, so at equal risks the candidate of column 2's large noise goes first."""
    risk, eligible = torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3, dtype=torch.bool)
    policy, noise = ErrorBudget(0.0, 3, spread="linear", choice_temperature=1.0), torch.tensor([[5.0, 0.0, 3.0]])
    assert policy.commit(risk, eligible, torch.tensor([2]), noise).tolist() == [[True, False, True]]


def test_the_annealed_choice_temperature_falls_to_0_at_the_last_step_as_a_float32_tensor_for_a_graph():
    """tau (1 - (i + 1) / T): 4 at T = 4 gives 3, 2, 1, 0; a graph's step tensor gets a float32 tensor."""
    assert [annealed(4.0, i, 4) for i in range(4)] == [3.0, 2.0, 1.0, 0.0]
    replayed = annealed(4.0, torch.tensor(1), 4)
    assert replayed.dtype == torch.float32 and replayed.item() == 2.0


def test_remdm_with_an_eta_of_0_stops_a_row_the_prompt_fills_while_any_eta_runs_it_to_the_budget():
    """eta 0 is MDLM: nothing committed is masked again, so a filled row is done; with eta > 0
    even a row the prompt fills (unfrozen) may be masked again and runs every step."""
    given = torch.full((2, D), 5)
    for eta, stop in ((0.0, 0), (0.01, 4)):
        result = mask_sample(NETWORKS["mask"], 2, D, 27, steps=4, seed=1, policy=ReMDM("cap", eta),
                             prompt=Prompt(given, torch.zeros_like(given, dtype=torch.bool)))
        assert ReMDM("cap", eta).remasks == (eta > 0) and result.stop_step.tolist() == [stop, stop]


def test_entropy_bound_breaks_equal_entropies_to_the_lower_position():
    """Of 20 masks of entropy 0.1, gamma 0.25 takes three (sums less maxima 0, 0.1, 0.2): positions
    0, 1, 2, as the stable sort ranks them at a length where torch's default sort may not."""
    step = _step([0.0] * 20, entropy=torch.full((1, 20), 0.1))
    assert EntropyBound(0.25).unmask(step).tolist() == [[True] * 3 + [False] * 17]


def test_remdm_refuses_an_eta_above_1_a_loop_of_no_length_and_an_alpha_on_of_1():
    """sigma is a probability, the loop phase needs t_on before t_off, and alpha_on 1 would hold
    the run at alpha 1 with no mask left to loop over: each edge is refused, just inside it taken."""
    with pytest.raises(ValueError, match="^eta must be"):
        ReMDM("cap", 1.5)
    assert ReMDM("cap", 1.0).eta == 1.0
    with pytest.raises(ValueError, match=r"^ReMDM loop needs 0 < t_on < t_off < 1, got t_on=0.5, t_off=0.5$"):
        ReMDM("loop", t_on=0.5, t_off=0.5)
    with pytest.raises(ValueError, match=r"^ReMDM loop needs 0 < alpha_on < 1, got alpha_on=1.0$"):
        ReMDM("loop", 0.0, alpha_on=1.0)


def test_a_threshold_outside_0_1_a_negative_eta_and_a_loop_ending_at_1_are_refused():
    """The threshold and eta are probabilities, and ReMDM's loop must end before t = 1, where the
    run's last MDLM phase would have no length: each outside end is refused, each edge taken."""
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=re.escape(f"threshold must be in [0.0, 1.0], got {bad}")):
            ConfidenceThreshold(bad)
    assert ConfidenceThreshold(0.0).threshold == 0.0 and ConfidenceThreshold(1.0).threshold == 1.0
    with pytest.raises(ValueError, match=re.escape("eta must be in [0.0, 1.0], got -0.1")):
        ReMDM("cap", -0.1)
    assert ReMDM("cap", 0.0).eta == 0.0
    with pytest.raises(ValueError, match=r"^ReMDM loop needs 0 < t_on < t_off < 1, got t_on=0.45, t_off=1.0$"):
        ReMDM("loop", 0.0, t_off=1.0)


def test_an_unknown_spread_or_remdm_schedule_is_refused_not_read_as_another():
    """spread_minimum reads any spread but none and linear as the cosine, and ReMDM's sigma any
    schedule but cap and loop as rescale: a misspelt name is refused by name instead."""
    with pytest.raises(ValueError, match=re.escape("spread must be one of ('none', 'linear', 'cosine'), got 'cos'")):
        ErrorBudget(spread="cos")
    with pytest.raises(ValueError, match=re.escape("schedule must be one of ('cap', 'rescale', 'loop'), got 'loops'")):
        ReMDM("loops")
    with pytest.raises(ValueError, match="spread must be one of"):
        parse_policy("error-budget:spread=cos")


def test_revise_above_and_the_factor_refuse_their_open_ends():
    """revise_above q is in (0, 1): at 1 no position is ever redrawn and at 0 every one is, which
    known_noise without revise_above already reads; a factor of 0 would commit none by the rule."""
    for q in (0.0, 1.0):
        with pytest.raises(ValueError, match=re.escape(f"revise_above must be in (0.0, 1.0), got {q}")):
            ErrorBudget(known_noise=True, revise_above=q)
    with pytest.raises(ValueError, match=re.escape("factor must be in (0.0, inf), got 0.0")):
        ConfidenceFactor(0.0)
    assert ErrorBudget(known_noise=True, revise_above=1e-6).revise_above == 1e-6
    assert ConfidenceFactor(1e-6).factor == 1e-6


@pytest.mark.parametrize("build, field", [
    (lambda v: ErrorBudget(v), "bound"),
    (lambda v: ErrorBudget(choice_temperature=v), "choice_temperature"),
    (lambda v: MaskGIT(v), "choice_temperature"),
    (lambda v: EntropyBound(v), "gamma"),
], ids=["bound", "error-budget-temperature", "maskgit-temperature", "gamma"])
def test_a_policys_unbounded_field_refuses_infinity_and_takes_a_large_number(build, field):
    """An infinite bound or gamma reads as "commit everything", an infinite choice temperature
    scales the Gumbel noise to inf and NaN: each is refused by name, a large finite value taken."""
    with pytest.raises(ValueError, match=re.escape(f"{field} must be in [0.0, inf), got inf")):
        build(float("inf"))
    assert getattr(build(1e30), field) == 1e30


def test_error_budget_refuses_no_candidates_and_a_plan_every_of_0():
    """max_k counts the candidates a step draws, the pick among them, and plan_every the steps a
    plan serves: at 0 a step would have no pick and ddpd_steps would divide by zero."""
    for field in ("max_k", "plan_every"):
        with pytest.raises(ValueError, match=f"^{field} must be >= 1, got 0"):
            ErrorBudget(**{field: 0})
        with pytest.raises(ValueError, match=f"{field} must be >= 1, got 0"):
            parse_policy(f"error-budget:{field}=0")
        assert getattr(ErrorBudget(**{field: 1}), field) == 1


def test_remdm_loop_refuses_a_t_on_that_is_not_a_number():
    """A bool t_on compared as 1 and was refused as out of order, a str failed a comparison:
    each is named as not a number."""
    for bad, shown in ((True, "bool True"), ("0.3", "str '0.3'")):
        with pytest.raises(TypeError, match=f"^t_on must be a number, got {shown}$"):
            ReMDM("loop", t_on=bad)


def test_remdm_moves_read_the_steps_event_uniforms():
    """ReMDM decides each position's unmasking or remasking on the step's EVENT uniform (Step.uniforms),
    the stream tau-leaping's events read; the CONFIDENCE stream (MaskGIT's Gumbel noise) is not drawn."""
    from ddpd.sampling.noise import CONFIDENCE, EVENT, PhiloxNoise

    streams = []

    class Recorded(PhiloxNoise):
        def uniform(self, step, stream, rows, cols):
            streams.append(stream)
            return super().uniform(step, stream, rows, cols)

    def denoiser(x, t):
        return torch.zeros(*x.shape, 3)

    mask_sample(denoiser, 2, 6, 3, steps=4, policy=ReMDM("cap", 0.5), noise=Recorded(0))
    assert streams.count(EVENT) == 4 and CONFIDENCE not in streams


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_error_budget_commits_no_pick_a_mask_denoiser_saw_unmasked(fused):
    """With a mask denoiser only the picks the denoiser saw masked are candidates: a planner near
    0 everywhere masks the first pick alone (the others at p = 2e-9), so a bound above every risk
    still writes one token a row, not the denoiser's guess at the D - 1 positions it saw."""
    def denoiser(x, t):  # token 2, certain, wherever it is asked
        return torch.tensor([0.0, 0.0, 50.0]).expand(*x.shape, 3)

    x_init = torch.zeros((4, 6), dtype=torch.long)
    result = ddpd_sample(lambda x: torch.full(x.shape, -20.0), denoiser, 4, 6, 3, steps=1, seed=0,
                         denoiser_type="mask", prompt=Prompt(x_init),
                         ddpd=DDPDOptions(stop="budget", policy=ErrorBudget(8.0, 6)), execution=Execution(fused=fused))
    assert (result.tokens == 2).sum(1).tolist() == [1, 1, 1, 1], result.tokens
    assert result.commits.tolist() == [1, 1, 1, 1]
