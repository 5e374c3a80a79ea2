"""DDPD Gillespie samplers against exact oracles.

(a) implementation: each option's empirical distribution (B = 50k rows) against the
    exact law of the same chain (tests/oracles/laws.py); (b) consistency: the exact
    clock with the time-conditioned oracle planner reaches p_data; (c) a deliberately
    wrong denoiser is caught. Threshold: the 99th percentile of TV(law, 50k draws of
    the law) over 300 repeats, plus 0.005 (oracles/stats.py).
"""
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from ddpd.process import CosineSchedule
from ddpd.sampling import ddpd_sample, ddpd_sample_uniform
from ddpd.sampling.noise import CLOCK, PhiloxNoise, exponential
from ddpd.sampling.options import DDPDOptions, Execution, Prompt, Temperature
from oracles import laws
from oracles.fixtures import noise, single_thread, toy  # noqa: F401  (single_thread: autouse)
from oracles.stats import TVTable, empirical, threshold, tv
from oracles.toy import ToyProblem, dirichlet_p_data, tempered, token_zeroed

B = 50_000
T_END = 1.0 - 1e-4
TABLE = TVTable("DDPD samplers: TV to own exact law and to p_data (B = 50k)")


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n" + TABLE.render())


def check_law(name, problem, result, law):
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(law, B)
    TABLE.add(name, tv(emp, law), tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, law) < limit, f"{name}: TV to its exact law {tv(emp, law):.4f} >= {limit:.4f}"


def median_stop_eps(problem):
    """An eps at which the stop rule of option A fires for about half of the states."""
    return float(problem.planner_free.max(-1).values.median()) + 1e-6


# ----------------------------------------------------------------------------- (a) planner clock

PLANNER_CLOCK_CASES = [
    # name, toy, steps, options
    ("A sigmoid eps-stop", "dir S3 D3", 10, dict(ddpd=DDPDOptions(stop="eps"))),
    ("B sigmoid budget", "sparse S2 D4", 12, dict(ddpd=DDPDOptions(stop="budget"))),
    ("B+C softmax budget", "dir S5 D2", 8, dict(ddpd=DDPDOptions(selection="softmax", stop="budget"))),
    ("A+C softmax eps-stop", "dir S3 D3", 9, dict(ddpd=DDPDOptions(selection="softmax", stop="eps"))),
    ("B temperature 0.7", "dir S5 D2", 6, dict(ddpd=DDPDOptions(stop="budget"), temperature=0.7)),
    ("B k=2 x2 then 1, T 1.2->0.6", "dir S3 D3", 6,
     dict(ddpd=DDPDOptions(stop="budget", k=2, parallel_steps=2), temperature=Temperature(1.2, 0.6))),
    ("mask-denoiser B", "sparse S4 D3", 7, dict(ddpd=DDPDOptions(stop="budget"), denoiser_type="mask")),
    ("mask-denoiser A eps-stop", "dir S3 D3", 8, dict(ddpd=DDPDOptions(stop="eps"), denoiser_type="mask")),
    # under the eps stop a schedule follows the planner's time estimate, not the steps
    ("A k=2 x2 then 1, T 1.2->0.4 over the estimate", "dir S3 D3", 10,
     dict(ddpd=DDPDOptions(stop="eps", k=2, parallel_steps=2), temperature=Temperature(1.2, 0.4))),
    ("mask-denoiser k=3 x1 then 1", "sparse S2 D4", 5,
     dict(ddpd=DDPDOptions(stop="budget", k=3, parallel_steps=1), denoiser_type="mask")),
]


@pytest.mark.parametrize("name,toy_name,steps,options", PLANNER_CLOCK_CASES, ids=[c[0] for c in PLANNER_CLOCK_CASES])
def test_planner_clock_matches_its_law(name, toy_name, steps, options):
    problem = toy(toy_name)
    models = problem.models()
    options = dict(options)
    denoiser_type = options.get("denoiser_type", "uniform")
    denoiser = models.mask_denoiser if denoiser_type == "mask" else models.uniform_denoiser
    if options["ddpd"].stop == "eps":
        options["ddpd"] = dataclasses.replace(options["ddpd"], eps=median_stop_eps(problem))
    result = ddpd_sample(models.planner, denoiser, B, problem.D, problem.S, steps=steps, noise=noise(), **options)
    law = laws.ddpd_planner_clock_law(problem, steps, **options)
    check_law(f"ddpd {name} [{toy_name}]", problem, result, law)
    if options["ddpd"].stop == "eps":
        assert (result.stop_step < steps).any() and (result.stop_step == steps).any()


UNIFORM_MODEL_CASES = [
    ("A sigmoid eps-stop", dict(ddpd=DDPDOptions(stop="eps"))),
    ("B+C softmax, k=2 x1, T 1.0->0.5",
     dict(ddpd=DDPDOptions(selection="softmax", stop="budget", k=2, parallel_steps=1),
          temperature=Temperature(1.0, 0.5))),
    ("A eps-stop, T 1.3->0.3 over the estimate",
     dict(ddpd=DDPDOptions(stop="eps"), temperature=Temperature(1.3, 0.3))),
]


@pytest.mark.parametrize("name,options", UNIFORM_MODEL_CASES, ids=[c[0] for c in UNIFORM_MODEL_CASES])
def test_single_uniform_model_matches_its_law(name, options):
    problem = toy("dir S3 D2")
    options = dict(options)
    if options["ddpd"].stop == "eps":
        options["ddpd"] = dataclasses.replace(options["ddpd"], eps=0.3)
    steps = 5
    result = ddpd_sample_uniform(problem.models().uniform_model, B, problem.D, problem.S, steps=steps, noise=noise(),
                                 **options)
    law = laws.ddpd_uniform_model_law(problem, steps, **options)
    check_law(f"ddpd single uniform model {name} [dir S3 D2]", problem, result, law)
    assert result.planner_calls == 0
    assert result.denoiser_calls == (1 if options["ddpd"].one_pass else 2) * result.steps


@pytest.mark.parametrize("options", [dict(stop="budget"), dict(stop="eps", eps=0.3),
                                     dict(selection="softmax", stop="budget", k=2, parallel_steps=1)],
                         ids=["B", "A eps-stop", "B+C k=2 x1"])
def test_one_pass_matches_its_law_and_not_the_two_pass_one(options):
    """DDPDOptions(one_pass=True) draws from the planning pass, one model call a step. On this toy
    the model's time matters (the two laws are 0.03-0.05 apart): each run lies within its own
    law's noise and beyond the other's, so the law check tells a second pass from the first."""
    problem = toy("dir S5 D2")
    model = problem.models().uniform_model
    laws_of = {one: laws.ddpd_uniform_model_law(problem, 5, ddpd=DDPDOptions(**options, one_pass=one))
               for one in (False, True)}
    for one in (False, True):
        result = ddpd_sample_uniform(model, B, problem.D, problem.S, steps=5, noise=noise(5),
                                     ddpd=DDPDOptions(**options, one_pass=one))
        check_law(f"ddpd single uniform model {'one pass' if one else 'two passes'} {options} [dir S5 D2]", problem,
                  result, laws_of[one])
        assert tv(empirical(problem.index(result.tokens), problem.N), laws_of[not one]) > threshold(laws_of[one], B)
        assert result.denoiser_calls == (1 if one else 2) * result.steps


def product_of_marginals(problem):
    law = torch.ones(problem.N, dtype=torch.float64)
    for d in range(problem.D):
        marginal = torch.zeros(problem.S, dtype=torch.float64).index_add_(0, problem.states[:, d], problem.p_data)
        law = law * marginal[problem.states[:, d]]
    return law


def test_single_uniform_model_planner_clock_leaves_t_0():
    """The planner clock's time is the planner's own estimate, so the uniform model's planner
    cannot be eq. corruption_prob at that time: at alpha = 0 it is 1 everywhere, t stayed 0
    for ever, the stop rule never fired, and every step redrew a position from the data
    marginal (the run sampled the product of the marginals)."""
    problem = toy("dir S3 D3")
    result = ddpd_sample_uniform(problem.models().uniform_model, 20_000, problem.D, problem.S, steps=16,
                                 noise=noise(3))
    assert (result.stop_step < 16).float().mean() > 0.9  # the exact model's planner says "clean"
    emp = empirical(problem.index(result.tokens), problem.N)
    assert tv(emp, problem.p_data) < 0.5 * tv(product_of_marginals(problem), problem.p_data)


@pytest.mark.parametrize("fused", [False, True])
def test_single_uniform_model_keeps_a_token_it_is_sure_of(fused):
    """Planned at the previous time, denoised at the new one: where the model is then sure the
    token is clean, the jump law is empty and the position keeps its token (it was token 0)."""
    S, D = 5, 4

    def model(x, t):  # uniform at t = 0, certain of x from any t > 0 on
        sure = torch.nn.functional.one_hot(x, S).float().masked_fill(x[..., None] != torch.arange(S), float("-inf"))
        return torch.where(t.view(-1, 1, 1) > 0, sure, torch.zeros_like(sure))

    x_init = torch.randint(1, S, (64, D), generator=torch.Generator().manual_seed(0))
    result = ddpd_sample_uniform(model, 64, D, S, steps=1, seed=1, prompt=Prompt(x_init),
                                 execution=Execution(fused=fused))
    assert torch.equal(result.tokens, x_init)


@pytest.mark.parametrize("fused", [False, True])
def test_single_uniform_model_jumps_where_it_is_nearly_sure(fused):
    """A model 25 nats sure of x_t at the new time still gives the other tokens probability
    (1.4e-11 each): the chosen position jumps, by the jump law over them. 1 - p(x_1 = x_t)
    rounded to 0 in float32 and the position kept its token."""
    S, D = 5, 4

    def model(x, t):  # uniform at t = 0, 25 nats sure of x from any t > 0 on
        sure = torch.nn.functional.one_hot(x, S).float() * 25.0
        return torch.where(t.view(-1, 1, 1) > 0, sure, torch.zeros_like(sure))

    x_init = torch.randint(0, S, (64, D), generator=torch.Generator().manual_seed(0))
    result = ddpd_sample_uniform(model, 64, D, S, steps=1, seed=1, prompt=Prompt(x_init),
                                 ddpd=DDPDOptions(stop="budget"), execution=Execution(fused=fused))
    assert ((result.tokens != x_init).sum(1) == 1).all()


# ----------------------------------------------------------------------------- (a) exact clock

EXACT = DDPDOptions(clock="exact", t_end=T_END)
EXACT_CLOCK_CASES = [
    ("time-free planner, uniform denoiser", "dir S3 D3", dict()),
    ("time-free planner, mask denoiser", "dir S3 D3", dict(denoiser_type="mask")),
    ("time-free planner, softmax, T 0.8", "dir S5 D2",
     dict(ddpd=dataclasses.replace(EXACT, selection="softmax"), temperature=0.8)),
    ("time-free planner, T 1.2->0.3 over t", "dir S3 D3", dict(temperature=Temperature(1.2, 0.3))),
]


@pytest.mark.parametrize("name,toy_name,options", EXACT_CLOCK_CASES, ids=[c[0] for c in EXACT_CLOCK_CASES])
def test_exact_clock_matches_its_law(name, toy_name, options):
    """The clock is continuous, so the law is the master equation integrated in s."""
    problem = toy(toy_name)
    models = problem.models()
    denoiser = models.mask_denoiser if options.get("denoiser_type") == "mask" else models.uniform_denoiser
    steps = 40 * problem.D + 100  # candidates ~ Poisson(D s_end = 9.2 D): the budget never binds
    options = {"ddpd": EXACT, **options}
    result = ddpd_sample(models.planner, denoiser, B, problem.D, problem.S, steps=steps, noise=noise(), **options)
    assert result.steps < steps
    law = laws.ddpd_exact_clock_law(problem, T_END, time_conditioned_planner=False, **options)
    check_law(f"ddpd exact clock, {name} [{toy_name}]", problem, result, law)


def test_exact_clock_anneals_the_temperature_over_its_own_end_time(monkeypatch):
    """On the exact clock Temperature(start, end) runs from start at t = 0 to end at t_end, where the
    run ends, not at t = 1: with t_end 0.5 an event near t_end draws near `end` (0 here)."""
    from ddpd.sampling import gillespie

    problem, drawn = toy("dir S3 D3"), []
    over_time = gillespie._over_time

    def recording(run, t, t_final, k):
        temperature = over_time(run, t, t_final, k)
        drawn.append(temperature)
        return temperature

    monkeypatch.setattr(gillespie, "_over_time", recording)
    models = problem.models()
    result = ddpd_sample(models.planner, models.uniform_denoiser, 64, problem.D, problem.S, steps=200,
                         ddpd=DDPDOptions(clock="exact", t_end=0.5), temperature=Temperature(1.0, 0.0), noise=noise())
    assert result.steps < 200
    temperatures = torch.cat([torch.as_tensor(t).flatten() for t in drawn])
    assert temperatures.max() <= 1.0 and temperatures.min() < 0.1, temperatures.min()


def test_the_planner_clock_counts_only_the_positions_a_prompt_leaves_noisy():
    """t = alpha^{-1}(1 - sum_d p / D') with D' the positions not frozen: a planner at p = 1/2 on the
    4 free positions of 8 says half of them are noise, t = 0.5 (linear schedule); over all 8
    positions it would say 0.75."""
    times = []

    def planner(x):
        return torch.zeros(x.shape)

    def denoiser(x, t):
        times.append(t.tolist())
        return torch.zeros(*x.shape, 3)

    x_init = torch.full((2, 8), -1)
    x_init[:, :4] = 1
    ddpd_sample(planner, denoiser, 2, 8, 3, steps=1, seed=0, prompt=Prompt(x_init, x_init >= 0),
                ddpd=DDPDOptions(stop="budget"))
    assert times == [[0.5, 0.5]]


@pytest.fixture
def over_time_calls(monkeypatch):
    """(t, t_final, temperatures) of each call of the eps stop's annealing, gillespie._over_time."""
    from ddpd.sampling import gillespie

    calls = []
    over_time = gillespie._over_time

    def recording(run, t, t_final, k):
        temperature = over_time(run, t, t_final, k)
        calls.append((t.tolist(), t_final, temperature.tolist()))
        return temperature

    monkeypatch.setattr(gillespie, "_over_time", recording)
    return calls


def test_the_eps_stop_anneals_over_the_time_of_the_positions_a_prompt_leaves_noisy(over_time_calls):
    """Under the eps stop Temperature(start, end) follows the planner's estimate over the positions
    not frozen: p = 1/2 on the 4 free positions of 8 is t = 0.5, at 0.5 / alpha^{-1}(1 - eps) = 0.5 / 0.9
    of the way to `end`; counted over all 8 positions it would be t = 0.75."""
    x_init = torch.full((2, 8), -1)
    x_init[:, :4] = 1
    ddpd_sample(lambda x: torch.zeros(x.shape), lambda x, t: torch.zeros(*x.shape, 3), 2, 8, 3, steps=1, seed=0,
                prompt=Prompt(x_init, x_init >= 0), ddpd=DDPDOptions(stop="eps", eps=0.1),
                temperature=Temperature(1.0, 0.0))
    assert [(t, t_final) for t, t_final, _ in over_time_calls] == [([0.5, 0.5], pytest.approx(0.9))]


def test_the_eps_stop_gives_each_of_a_rows_k_draws_the_rows_temperature(over_time_calls):
    """With k = 2 the temperatures under the eps stop are a row's two draws after another: row 0
    (p = 1/2 at 4 positions, t = 0.5) draws at 1 - 0.5 / 0.9 twice, then row 1 (p = 1/2 at one
    position, t = 0.875) at 1 - 0.875 / 0.9 twice."""
    def planner(x):
        logits = torch.zeros(x.shape)
        logits[1, 1:] = float("-inf")
        return logits

    ddpd_sample(planner, lambda x, t: torch.zeros(*x.shape, 3), 2, 4, 3, steps=1, seed=0,
                ddpd=DDPDOptions(stop="eps", eps=0.1, k=2, parallel_steps=1), temperature=Temperature(1.0, 0.0))
    first, second = 1.0 - 0.5 / 0.9, 1.0 - 0.875 / 0.9
    assert [temperature for _, _, temperature in over_time_calls] == \
        [pytest.approx([first, first, second, second], abs=1e-6)]


def test_a_row_its_prompt_freezes_whole_gives_the_denoiser_a_time_in_0_1():
    """A row with no position left noisy stays in a fused batch without compaction: its time
    alpha^{-1}(1 - 0 / D') counts D' at least 1, else 0 / 0 gave the denoiser a NaN time."""
    times = []

    def denoiser(x, t):
        times.append(t)
        return torch.zeros(*x.shape, 3)

    x_init = torch.full((2, 8), -1)
    x_init[0], x_init[1, :4] = 1, 1
    ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 2, 8, 3, steps=2, seed=0, prompt=Prompt(x_init, x_init >= 0),
                ddpd=DDPDOptions(stop="budget"), execution=Execution(fused=True, compaction=False))
    t = torch.cat(times)
    assert len(times) == 2 and bool(((t >= 0) & (t <= 1)).all()), times


# ----------------------------------------------------------------------------- (b) consistency


@pytest.mark.parametrize("toy_name", ["dir S3 D3", "sparse S2 D4", "dir S5 D2"])
def test_exact_clock_with_time_conditioned_planner_reaches_p_data(toy_name):
    problem = toy(toy_name)
    models = problem.models()
    steps = 40 * problem.D + 100
    result = ddpd_sample(models.planner_t, models.uniform_denoiser, B, problem.D, problem.S, steps=steps,
                         ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True, noise=noise(1))
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(problem.p_data, B)
    TABLE.add(f"ddpd exact clock, time-conditioned planner [{toy_name}]", None, tv(emp, problem.p_data), limit,
              problem.N)
    assert tv(emp, problem.p_data) < limit


def test_single_uniform_model_exact_clock_reaches_p_data():
    problem = toy("sparse S4 D3")
    steps = 40 * problem.D + 100
    result = ddpd_sample_uniform(problem.models().uniform_model, B, problem.D, problem.S, steps=steps,
                                 ddpd=DDPDOptions(clock="exact", t_end=T_END), noise=noise(2))
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(problem.p_data, B)
    TABLE.add("ddpd single uniform model, exact clock [sparse S4 D3]", None, tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, problem.p_data) < limit


def test_exact_clock_law_is_p_data():
    """The master equation of the self-loop CTMC with exact models ends at p_t_end ~ p_data:
    checks the oracle and the law together (TV at t_end is at most about D (1 - t_end))."""
    problem = toy("sparse S2 D4")
    law = laws.ddpd_exact_clock_law(problem, T_END)
    assert tv(law, problem.p_data) < 1e-3


def test_exact_clock_with_softmax_selection_is_biased_as_documented():
    """Option C on the exact clock picks the accepted event's position by softmax, not in
    proportion to p: even with exact networks the chain is not prop:self-loop-jumps' CTMC,
    and its law stays off p_data (docs/sampling.md quotes the TV)."""
    problem = toy("dir S3 D2")
    law = laws.ddpd_exact_clock_law(problem, T_END, ddpd=dataclasses.replace(EXACT, selection="softmax"))
    far = tv(law, problem.p_data)
    assert far > 0.01
    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "sampling.md").read_text().split())
    assert f"with `selection=\"softmax\"` the exact clock is not exact either: its exact law sits {far:.3f} TV" in docs


def test_exact_clock_with_a_mask_denoiser_is_biased():
    """The exact clock with the time-conditioned planner is exact with a uniform denoiser, but
    not with a mask denoiser: prop:draw_with_maskD draws the mask z^d independently, an
    approximation of p(z | x_t, z^{d'} = N), and the sampler follows its own (biased) law."""
    problem = toy("support5 S3 D3")
    models = problem.models()
    exact = laws.ddpd_exact_clock_law(problem, T_END)
    biased = laws.ddpd_exact_clock_law(problem, T_END, denoiser_type="mask")
    assert tv(exact, problem.p_data) < 1e-3 < 0.01 < tv(biased, problem.p_data)
    TABLE.add("ddpd exact clock law, time-conditioned planner, mask denoiser [support5 S3 D3]", None,
              tv(biased, problem.p_data), None, problem.N)
    markov = toy("markov S2 D2")  # the bias on a chain, too (docs/api.md quotes both)
    law = laws.ddpd_exact_clock_law(markov, T_END, denoiser_type="mask")
    assert tv(law, markov.p_data) > 0.005
    TABLE.add("ddpd exact clock law, time-conditioned planner, mask denoiser [markov S2 D2]", None,
              tv(law, markov.p_data), None, markov.N)
    result = ddpd_sample(models.planner_t, models.mask_denoiser, B, problem.D, problem.S, steps=220,
                         ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True,
                         denoiser_type="mask", noise=noise(4))
    check_law("ddpd exact clock, time-conditioned planner, mask denoiser [support5 S3 D3]", problem, result, biased)


def test_paper_sampler_bias_does_not_shrink_with_D():
    """The paper's sampler (time-free planner, time estimated from the planner) with exact
    networks, on a two-state Markov chain: the TV of its exact law to p_data does not fall as
    D grows, and at D = 8 a longer budget moves it further away."""
    far = {D: [tv(laws.ddpd_planner_clock_law(toy(f"markov S2 D{D}"), T, ddpd=DDPDOptions(stop="budget")),
                  toy(f"markov S2 D{D}").p_data) for T in (2 * D, 4 * D)] for D in (2, 4, 6, 8)}
    for D, (short, long) in far.items():
        TABLE.add(f"ddpd B exact law, {2 * D} steps [markov S2 D{D}]", None, short, None, 2**D)
        TABLE.add(f"ddpd B exact law, {4 * D} steps [markov S2 D{D}]", None, long, None, 2**D)
    assert far[8][1] > far[2][1] > 0.15 and far[8][1] > far[8][0], far
    problem = toy("markov S2 D6")  # the sampler follows that law
    models = problem.models()
    result = ddpd_sample(models.planner, models.uniform_denoiser, B, 6, 2, steps=24, ddpd=DDPDOptions(stop="budget"),
                         noise=noise(5))
    check_law("ddpd B, 24 steps [markov S2 D6]", problem, result,
              laws.ddpd_planner_clock_law(problem, 24, ddpd=DDPDOptions(stop="budget")))


def test_paper_sampler_is_not_exact_at_tiny_D():
    """With perfect models the time-free planner + estimated time is biased when D is tiny, and
    a longer budget does not remove the bias: its exact law stays far from p_data."""
    problem = toy("dir S3 D3")
    far = [tv(laws.ddpd_planner_clock_law(problem, T, ddpd=DDPDOptions(stop="budget")), problem.p_data)
           for T in (3, 12, 24)]
    assert min(far) > 0.05, far
    assert float(problem.planner_free.max(-1).values.min()) > 0.05  # eps = 0.05 would never stop a row


# ----------------------------------------------------------------------------- (c) wrong models are caught

WRONG = [
    ("tempered^0.5", lambda d: tempered(d, 0.5)),
    ("tempered^0.8", lambda d: tempered(d, 0.8)),
    ("token 0 zeroed", lambda d: token_zeroed(d, 0)),
]


@pytest.mark.parametrize("name,wrong", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_denoiser_fails_consistency(name, wrong):
    problem = toy("dir S3 D3")
    models = problem.models()
    steps = 40 * problem.D + 100
    result = ddpd_sample(models.planner_t, wrong(models.uniform_denoiser), B, problem.D, problem.S, steps=steps,
                         ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True, noise=noise(1))
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(problem.p_data, B)
    TABLE.add(f"(c) exact clock, denoiser {name} [dir S3 D3]", None, tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, problem.p_data) > limit


def test_wrong_denoiser_fails_its_law():
    """A sampler run with a tempered denoiser against the law of the right one."""
    problem = toy("sparse S2 D4")
    models = problem.models()
    result = ddpd_sample(models.planner, tempered(models.uniform_denoiser, 0.8), B, problem.D, problem.S, steps=12,
                         ddpd=DDPDOptions(stop="budget"), noise=noise())
    law = laws.ddpd_planner_clock_law(problem, 12, ddpd=DDPDOptions(stop="budget"))
    emp = empirical(problem.index(result.tokens), problem.N)
    limit = threshold(law, B)
    TABLE.add("(c) B sigmoid, denoiser tempered^0.8 vs right law [sparse S2 D4]", tv(emp, law),
              tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, law) > limit


# ----------------------------------------------------------------------------- another schedule


def test_cosine_schedule_exact_clock_and_planner_clock():
    """alpha_t = 1 - cos(pi t / 2): the clock s = -log(1 - alpha_t) and the time estimates
    go through the schedule's alpha and inverse (time-free planner by 64-node quadrature)."""
    problem = ToyProblem(dirichlet_p_data(3, 3, seed=6), 3, 3, CosineSchedule(), quadrature_nodes=64)
    models = problem.models()
    exact = ddpd_sample(models.planner_t, models.uniform_denoiser, B, 3, 3, steps=220,
                        ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True, schedule="cosine",
                        noise=noise(3))
    emp = empirical(problem.index(exact.tokens), problem.N)
    limit = threshold(problem.p_data, B)
    TABLE.add("ddpd exact clock, cosine schedule [dir S3 D3 seed 6]", None, tv(emp, problem.p_data), limit, problem.N)
    assert tv(emp, problem.p_data) < limit
    result = ddpd_sample(models.planner, models.uniform_denoiser, B, 3, 3, steps=8, ddpd=DDPDOptions(stop="budget"),
                         schedule="cosine", noise=noise())
    check_law("ddpd B, cosine schedule [dir S3 D3 seed 6]", problem, result,
              laws.ddpd_planner_clock_law(problem, 8, ddpd=DDPDOptions(stop="budget")))


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_exact_clock_stops_a_row_at_the_first_step_its_clock_reaches_t_end(fused):
    """Pins the exact clock's stop: a row ends at the first step whose clock s = sum of Exp(1) / D
    reaches s_end = -log(1 - alpha(t_end)), not later (rejected candidates only: the planner says
    clean everywhere, so the stop step is the clock's alone)."""
    rows, length, t_end = 32, 4, 0.5
    result = ddpd_sample(lambda x: torch.full(x.shape, float("-inf")), lambda x, t: torch.zeros(*x.shape, 5),
                         rows, length, 5, steps=200, ddpd=DDPDOptions(clock="exact", t_end=t_end),
                         noise=PhiloxNoise(7), execution=Execution(fused=fused, sync_every=1))
    s_end = -torch.log1p(-torch.tensor(t_end, dtype=torch.float64))  # the linear schedule: alpha(t) = t
    source, ids = PhiloxNoise(7), torch.arange(rows)
    s = torch.cumsum(torch.stack([exponential(source.uniform(i, CLOCK, ids, 1)[:, 0]).double() / length
                                  for i in range(200)], 1), 1)
    expected = (s >= s_end).long().argmax(1)
    assert expected.max() < 199 and expected.unique().numel() > 1
    assert torch.equal(result.stop_step.cpu(), expected)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_exact_clock_counts_each_accepted_event_as_one_commit(fused):
    """Pins the exact clock's commits: with a planner that calls every position noise every candidate
    is accepted and writes one token, so a row's commits equal its denoiser passes (one per event)."""
    result = ddpd_sample(lambda x: torch.full(x.shape, 30.0), lambda x, t: torch.zeros(*x.shape, 5), 8, 4, 5,
                         steps=50, ddpd=DDPDOptions(clock="exact", t_end=0.9), seed=3,
                         execution=Execution(fused=fused))
    assert result.commits.gt(0).all()
    assert torch.equal(result.commits, result.denoiser_passes)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_a_pick_the_planner_calls_clean_for_certain_keeps_its_token(fused):
    """Pins the commits of picks of zero weight: a planner at -inf everywhere still has a position
    picked each step under the budget stop, and the denoiser's draw there (token 2, for certain)
    must not be written, nor counted as a commit."""
    x_init = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]])
    result = ddpd_sample(lambda x: torch.full(x.shape, float("-inf")),
                         lambda x, t: torch.tensor([0.0, 0.0, 50.0]).expand(*x.shape, 3), 2, 4, 3, steps=3, seed=0,
                         ddpd=DDPDOptions(stop="budget"), prompt=Prompt(x_init), execution=Execution(fused=fused))
    assert torch.equal(result.tokens, x_init)
    assert result.commits.tolist() == [0, 0]


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
@pytest.mark.parametrize("clock", ["planner", "exact"])
def test_a_mask_denoiser_gets_the_time_of_the_masks_in_its_input(clock, fused):
    """Pins the mask denoiser's time on either clock: t = alpha^{-1}(1 - #masked / D), the time of
    the masked sequence it is handed (1 - #masked / D on the linear schedule), not the clock's."""
    calls = []

    def denoiser(x, t):
        calls.append((x.clone(), t.clone()))
        return torch.zeros(*x.shape, 3)

    options = DDPDOptions(clock="exact", t_end=0.9) if clock == "exact" else DDPDOptions(stop="budget")
    ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 4, 6, 3, steps=8, ddpd=options, denoiser_type="mask",
                seed=0, execution=Execution(fused=fused))
    assert calls
    for x, t in calls:
        assert torch.allclose(t, 1.0 - (x == 3).sum(1) / 6), (x, t)


class _ClockFrom:
    """Philox noise whose CLOCK uniforms are u0 at step 0 and 1.0 (the shortest holding time) after."""

    def __init__(self, u0):
        self.u0, self.source = u0, PhiloxNoise(0)

    def uniform(self, step, stream, rows, cols):
        if stream == CLOCK:
            return torch.full((rows.numel(), cols), self.u0 if step == 0 else 1.0)
        return self.source.uniform(step, stream, rows, cols)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_exact_clock_adds_up_holding_times_below_float32_resolution(fused):
    """The clock s sums Exp(1) / D holding times in float64: after a first time near 4, where the
    float32 spacing is 4.8e-7, 20.5 times of 6e-8 each still reach s_end, and the row stops at
    step 21; summed in float32 they would be lost and the row would run to the budget."""
    first, short = (float(exponential(torch.tensor([u]))) for u in (math.exp(-4.0), 1.0))
    s_end = first + 20.5 * short
    result = ddpd_sample(lambda x: torch.full(x.shape, float("-inf")), lambda x, t: torch.zeros(*x.shape, 3),
                         2, 1, 3, steps=50, ddpd=DDPDOptions(clock="exact", t_end=-math.expm1(-s_end)),
                         noise=_ClockFrom(math.exp(-4.0)), execution=Execution(fused=fused, sync_every=1))
    assert result.stop_step.tolist() == [21, 21]


def test_the_fused_exact_clock_keeps_stopped_rows_until_a_stop_check():
    """Pins where the fused exact clock's rows leave the batch: at a stop check only (every
    sync_every-th step), so with sync_every past every row's stop each planner pass takes all 32
    rows (a check at every step would let each leave as it stops)."""
    result = ddpd_sample(lambda x: torch.full(x.shape, float("-inf")), lambda x, t: torch.zeros(*x.shape, 5),
                         32, 4, 5, steps=200, ddpd=DDPDOptions(clock="exact", t_end=0.5), noise=PhiloxNoise(7),
                         execution=Execution(fused=True, sync_every=16))
    assert result.stop_step.max() < 15 and result.stop_step.unique().numel() > 1
    assert result.planner_calls == 15 and result.planner_rows == 32 * 15


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_single_uniform_model_exact_clock_calls_the_model_once_a_step(fused):
    """On the exact clock the planning call's p(x_1 | x_t) at the clock's time serves the denoiser
    too: a row takes one model pass per candidate before its stop, accepted or not, never a second
    call for the accepted event's draw."""
    result = ddpd_sample_uniform(lambda x, t: torch.zeros(*x.shape, 3), 4, 5, 3, steps=60, seed=0,
                                 ddpd=DDPDOptions(clock="exact", t_end=0.9), execution=Execution(fused=fused))
    assert result.commits.gt(0).all() and result.planner_calls == 0
    assert torch.equal(result.denoiser_passes, result.stop_step)


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_exact_clock_commits_nothing_at_a_rejected_candidate(fused):
    """Pins the thinning's rejections: at p = 1/2 everywhere half the candidates are rejected and
    leave the row as it was, so the commits still equal the denoiser passes (the accepted events)
    and fall well short of the steps run; a rejected candidate must not write its pick's draw."""
    result = ddpd_sample(lambda x: torch.zeros(x.shape), lambda x, t: torch.zeros(*x.shape, 5), 8, 4, 5,
                         steps=60, ddpd=DDPDOptions(clock="exact", t_end=0.9), seed=3,
                         execution=Execution(fused=fused, sync_every=1))
    assert torch.equal(result.commits, result.denoiser_passes)
    assert (result.commits < result.stop_step).all() and result.commits.gt(0).all()


class _HiddenOfX(torch.nn.Module):
    """A denoiser with an nn.Linear head whose hidden takes x alone, not (x, t)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(4, 4), torch.nn.Linear(4, 3)

    def hidden(self, x):
        return self.embed(x)

    def forward(self, x, t):
        return self.head(self.hidden(x))


def test_only_the_fused_run_refuses_a_hidden_that_takes_x_alone():
    """The fused run calls the denoiser's hidden(x, t) and says so before the first step; the
    reference run calls the denoiser whole, so the same network runs there."""
    denoiser = _HiddenOfX()
    result = ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 2, 4, 3, steps=2, seed=0)
    assert result.tokens.shape == (2, 4)
    with pytest.raises(TypeError, match=r"^denoiser \(_HiddenOfX\) has an nn.Linear head, so the fused run calls"):
        ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 2, 4, 3, steps=2, seed=0,
                    execution=Execution(fused=True))
