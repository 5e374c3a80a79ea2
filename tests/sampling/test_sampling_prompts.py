"""Prompts and infilling: x_init / frozen in every sampler.

(a) Mechanics: frozen positions keep their values in every sampler, reference and fused,
    rows may carry different prompts, -1 entries start from the sampler's noise, and the
    fused run draws what the reference run draws.
(b) Laws: a prompt on a toy is the toy of the free positions with
    p_data(x_free | x_frozen) (oracles.toy.Conditioned), so each sampler with a prompt
    must follow the exact law of the same sampler on that sub-problem — which checks that
    frozen positions are never selected, masked or counted in the time estimate — and the
    exact samplers reach p_data(x | x_frozen). B = 50k rows; threshold: the 99th
    percentile of TV(law, 50k draws of the law) over 300 repeats, plus 0.005.
"""
import pytest
import torch

from ddpd.sampling import (
    PhiloxNoise,
    ddpd_sample,
    ddpd_sample_uniform,
    maskgit_sample,
    tau_leaping_mask,
    tau_leaping_planned,
    tau_leaping_uniform,
)
from ddpd.sampling.options import DDPDOptions, Execution, Prompt
from ddpd.sampling.policies import ErrorBudget
from oracles import laws
from oracles.fixtures import noise, single_thread, toy  # noqa: F401  (single_thread: autouse)
from oracles.stats import TVTable, empirical, threshold, tv
from oracles.toy import Conditioned

B = 50_000
T_END = 1.0 - 1e-4
TABLE = TVTable("Samplers with a prompt: TV to own exact conditional law and to p_data(x | x_frozen) (B = 50k)")


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n" + TABLE.render())


@pytest.fixture(scope="module")
def cond():
    """dir S3 D3 with position 1 frozen at 2: the sub-problem has 2 free positions (9 states)."""
    return Conditioned(toy("dir S3 D3"), [1], [2])


def run_all(cond, n, **kw):
    """Every sampler with the prompt of `cond` on its n rows: name -> SampleResult."""
    m = cond.models
    x_init, frozen = cond.prompt(n)
    common = dict(prompt=Prompt(x_init, frozen), **kw)
    return {
        "ddpd uniform A": ddpd_sample(m.planner, m.uniform_denoiser, n, 3, 3, steps=8, ddpd=DDPDOptions(eps=0.3),
                                      **common),
        "ddpd mask B+C k=2 x1": ddpd_sample(m.planner, m.mask_denoiser, n, 3, 3, steps=5,
                                            ddpd=DDPDOptions(selection="softmax", stop="budget", k=2, parallel_steps=1),
                                            denoiser_type="mask", **common),
        "ddpd exact clock": ddpd_sample(m.planner_t, m.uniform_denoiser, n, 3, 3, steps=220,
                                        ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True,
                                        **common),
        "ddpd uniform model A": ddpd_sample_uniform(m.uniform_model, n, 3, 3, steps=8, ddpd=DDPDOptions(eps=0.3),
                                                    **common),
        "tau mask eta 1": tau_leaping_mask(m.mask_denoiser, n, 3, 3, steps=8, eta=1.0, **common),
        "tau uniform": tau_leaping_uniform(m.uniform_model, n, 3, 3, steps=8, **common),
        "tau planned mask": tau_leaping_planned(m.planner, m.mask_denoiser, n, 3, 3, steps=8, denoiser_type="mask",
                                                **common),
        "maskgit": maskgit_sample(m.mask_denoiser, n, 3, 3, steps=2, choice_temperature=2.0, **common),
    }


# ----------------------------------------------------------------------------- (a) mechanics


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_frozen_positions_keep_their_values_in_every_sampler(cond, fused):
    for name, result in run_all(cond, 200, seed=3, execution=Execution(fused=fused)).items():
        assert (result.tokens[:, 1] == 2).all(), name
        assert ((result.tokens >= 0) & (result.tokens < 3)).all(), name


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_frozen_positions_hold_against_networks_that_call_them_noise(fused):
    """The toy's exact networks call a frozen position clean anyway; these do not (planner p = 1/2,
    uniform laws everywhere), so only the sampler keeps the prompt."""
    x_init = torch.tensor([[1, -1, -1, 0], [-1, 2, -1, -1]])
    frozen = x_init >= 0

    def logits(x, t=None):
        return torch.zeros(*x.shape, 3)

    def planner(x):
        return torch.zeros(x.shape, dtype=torch.float32)

    common = dict(prompt=Prompt(x_init, frozen), seed=0, execution=Execution(fused=fused))
    for name, result in {
        "tau uniform": tau_leaping_uniform(logits, 2, 4, 3, steps=6, **common),
        "tau planned uniform": tau_leaping_planned(planner, logits, 2, 4, 3, steps=6, **common),
        "tau planned mask": tau_leaping_planned(planner, logits, 2, 4, 3, steps=6, denoiser_type="mask", **common),
    }.items():
        assert torch.equal(result.tokens[frozen], x_init[frozen]), name


def test_fused_run_draws_what_the_reference_draws_with_a_prompt(cond):
    reference = run_all(cond, 300, noise=PhiloxNoise(8))
    fused = run_all(cond, 300, noise=PhiloxNoise(8), execution=Execution(fused=True, sync_every=3))
    for name in reference:
        assert torch.equal(reference[name].tokens, fused[name].tokens), name
        assert torch.equal(reference[name].stop_step, fused[name].stop_step), name


def test_rows_carry_their_own_prompts_and_minus_one_starts_from_noise():
    m = toy("sparse S2 D4").models()
    x_init = torch.tensor([[1, -1, -1, 0], [-1, -1, -1, -1], [0, 1, -1, -1]])
    frozen = torch.tensor([[True, False, False, True], [False] * 4, [True, True, False, False]])
    for sampler in (lambda **kw: ddpd_sample(m.planner, m.uniform_denoiser, 3, 4, 2, steps=12, **kw),
                    lambda **kw: tau_leaping_mask(m.mask_denoiser, 3, 4, 2, steps=6, **kw)):
        result = sampler(prompt=Prompt(x_init, frozen), seed=1)
        assert torch.equal(result.tokens[frozen], x_init[frozen])
    # x_init without frozen: a starting point the sampler may change
    start = torch.zeros(3, 4, dtype=torch.long)
    first = ddpd_sample(m.planner, m.uniform_denoiser, 3, 4, 2, steps=1, ddpd=DDPDOptions(stop="budget"),
                        prompt=Prompt(start), seed=0)
    assert int((first.tokens != start).sum()) <= 3  # one position per row redrawn, from the given start


def test_a_prompt_that_gives_nothing_is_the_unprompted_run():
    """Every x_init -1: the same tokens, but ErrorBudget under known_noise paid the planner pass
    of step 0 that a prompt needs and an unprompted run skips."""
    m = toy("sparse S2 D4").models()
    policy = ErrorBudget(0.0, 4, known_noise=True, plan_every=4)
    runs = [ddpd_sample(m.planner, m.mask_denoiser, 3, 4, 2, steps=8, denoiser_type="mask", seed=2,
                        ddpd=DDPDOptions(policy=policy), prompt=prompt)
            for prompt in (None, Prompt(torch.full((3, 4), -1)))]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert torch.equal(runs[0].planner_passes, runs[1].planner_passes)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("clock", ["planner", "exact"])
def test_the_mask_denoiser_always_sees_the_prompt(fused, clock):
    """k above the number of free positions, and a fully fixed row under the step budget: the
    fixed positions, picked with weight 0, used to be masked in the denoiser's input."""
    seen = []

    def denoiser(x, t):
        seen.append(x.clone())
        return torch.zeros(*x.shape, 4)

    x_init = torch.tensor([[0, 1, 2, 3, -1, -1], [0, 1, 2, 3, 0, 1], [-1, 2, -1, 2, -1, 2]])
    frozen = x_init >= 0
    k = dict(k=6, parallel_steps=1) if clock == "planner" else {}
    result = ddpd_sample(lambda x: torch.zeros(x.shape), denoiser, 3, 6, 4, steps=4,
                         ddpd=DDPDOptions(stop="budget", clock=clock, **k), denoiser_type="mask",
                         prompt=Prompt(x_init, frozen), seed=0, execution=Execution(fused=fused))
    assert torch.equal(result.tokens[frozen], x_init[frozen]) and seen
    for x in seen:  # every denoiser input, fused (all rows) or reference (the rows it denoises)
        if x.shape[0] == 3:
            assert torch.equal(x[frozen], x_init[frozen])
        else:  # the reference's accepted rows only (exact clock): each row keeps its 3 or more fixed values
            assert bool(((x != 4).sum(1) >= 3).all())


def _every_sampler(m, n, **kw):
    """Every sampler on sparse S2 D4's oracle networks: name -> SampleResult."""
    return {
        "ddpd planner clock": ddpd_sample(m.planner, m.uniform_denoiser, n, 4, 2, steps=10, ddpd=DDPDOptions(eps=0.1),
                                          **kw),
        "ddpd exact clock": ddpd_sample(m.planner_t, m.uniform_denoiser, n, 4, 2, steps=40,
                                        ddpd=DDPDOptions(clock="exact", t_end=T_END), time_conditioned_planner=True,
                                        **kw),
        "ddpd uniform model": ddpd_sample_uniform(m.uniform_model, n, 4, 2, steps=10, **kw),
        "tau uniform": tau_leaping_uniform(m.uniform_model, n, 4, 2, steps=10, **kw),
        "tau planned mask": tau_leaping_planned(m.planner, m.mask_denoiser, n, 4, 2, steps=10, denoiser_type="mask",
                                                **kw),
        "tau mask eta 1": tau_leaping_mask(m.mask_denoiser, n, 4, 2, steps=10, eta=1.0, **kw),
        "maskgit": maskgit_sample(m.mask_denoiser, n, 4, 2, steps=4, **kw),
    }


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_a_fully_frozen_row_stops_at_once_and_costs_no_pass(fused):
    """Such a row cannot change. It used to cost a planner pass (DDPD), or run the whole budget
    (the exact clock, the uniform model's tau-leaping, P x D): passes spent on nothing."""
    m = toy("sparse S2 D4").models()
    x_init = torch.tensor([[1, 0, 1, 1], [-1, 0, -1, -1]])
    results = _every_sampler(m, 2, prompt=Prompt(x_init, x_init >= 0), noise=PhiloxNoise(5),
                             execution=Execution(fused=fused, sync_every=3))
    alone = _every_sampler(m, 1, prompt=Prompt(x_init[1:], x_init[1:] >= 0), noise=PhiloxNoise(5, first_row=1))
    for name, result in results.items():
        assert result.stop_step[0] == 0 and torch.equal(result.tokens[0], x_init[0]), name
        assert result.planner_passes[0] == result.denoiser_passes[0] == 0, name
        assert torch.equal(result.tokens[1], alone[name].tokens[0]), name  # the other row draws as it did


@pytest.mark.parametrize("make,error,match", [
    (lambda: Prompt(None, torch.zeros(2, 3, dtype=torch.bool)), TypeError,
     "x_init must be a torch.Tensor, got NoneType"),
    (lambda: Prompt(torch.zeros(2, 3)), TypeError, r"x_init must have dtype in \(torch.int64\), got torch.float32"),
    (lambda: Prompt(torch.zeros(3, dtype=torch.long)), ValueError, r"x_init must be 2-D, got shape \(3,\)"),
    (lambda: Prompt(torch.zeros(2, 3, dtype=torch.long).to_sparse()), TypeError, "x_init must be a dense tensor"),
    (lambda: Prompt(torch.full((2, 3), -1), torch.ones(2, 3, dtype=torch.bool)), ValueError, "every frozen position"),
    (lambda: Prompt(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)), TypeError,
     r"frozen must have dtype in \(torch.bool\), got torch.float32"),
    (lambda: Prompt(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.bool)), ValueError,
     r"frozen must be a Bool tensor of shape \[2, 3\]"),
])
def test_bad_prompts_are_refused(make, error, match):
    """A value of the wrong kind is a TypeError, as the ops raise; a wrong shape a ValueError."""
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("x_init,match", [
    (torch.zeros(2, 4, dtype=torch.long), r"x_init must be a Long tensor of shape \[2, 3\]"),
    (torch.full((2, 3), 3), r"x_init values must be in \[-1, 3\)"),
    (torch.full((2, 3), -2), r"x_init values must be in \[-1, 3\) \(-1: start from noise\), got range \[-2, -2\]"),
])
def test_prompts_that_do_not_fit_the_run_are_refused(x_init, match):
    m = toy("dir S3 D3").models()
    with pytest.raises(ValueError, match=match):
        ddpd_sample(m.planner, m.uniform_denoiser, 2, 3, 3, steps=2, seed=0, prompt=Prompt(x_init))


# ----------------------------------------------------------------------------- (b) laws


def conditional_laws(cond):
    sub = cond.sub
    return {
        "ddpd uniform A": laws.ddpd_planner_clock_law(sub, 8, ddpd=DDPDOptions(stop="eps", eps=0.3)),
        "ddpd mask B+C k=2 x1": laws.ddpd_planner_clock_law(
            sub, 5, ddpd=DDPDOptions(selection="softmax", stop="budget", k=2, parallel_steps=1), denoiser_type="mask"),
        "ddpd exact clock": sub.p_data,  # exact: the conditional law of the data
        "ddpd uniform model A": laws.ddpd_uniform_model_law(sub, 8, ddpd=DDPDOptions(stop="eps", eps=0.3)),
        "tau mask eta 1": laws.tau_leaping_mask_law(sub, 8, eta=1.0),
        "tau uniform": laws.tau_leaping_uniform_law(sub, 8),
        "tau planned mask": laws.tau_leaping_planned_law(sub, 8, denoiser_type="mask"),
        "maskgit": laws.maskgit_law(sub, 2, choice_temperature=2.0),
    }


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_each_sampler_follows_its_exact_conditional_law(cond, fused):
    if fused:
        results = run_all(cond, B, seed=6, execution=Execution(fused=True))
    else:
        results = run_all(cond, B, noise=noise(6))
    for name, law in conditional_laws(cond).items():
        emp = empirical(cond.sub_index(results[name].tokens), cond.sub.N)
        limit = threshold(law, B)
        TABLE.add(f"{name}, prompt x^1 = 2{' (fused)' if fused else ''} [dir S3 D3]", tv(emp, law),
                  tv(emp, cond.sub.p_data), limit, cond.sub.N)
        assert tv(emp, law) < limit, f"{name}: TV {tv(emp, law):.4f} to its conditional law >= {limit:.4f}"


def test_mask_tau_leaping_with_an_unconditional_mask_denoiser_reaches_the_conditional_data_law():
    """A prompt needs no conditional network for mask diffusion: the exact mask denoiser
    p_data(x^d | unmasked positions) already conditions on the prompt."""
    cond = Conditioned(toy("sparse S2 D4"), [0], [0])
    x_init, frozen = cond.prompt(B)
    result = tau_leaping_mask(toy("sparse S2 D4").models().mask_denoiser, B, 4, 2, steps=512,
                              prompt=Prompt(x_init, frozen), noise=noise(7))
    emp = empirical(cond.sub_index(result.tokens), cond.sub.N)
    limit = threshold(cond.sub.p_data, B)
    TABLE.add("tau mask eta 0, 512 steps, prompt x^0 = 0 [sparse S2 D4]", None, tv(emp, cond.sub.p_data),
              limit, cond.sub.N)
    assert tv(emp, cond.sub.p_data) < limit


def test_uniform_noise_networks_trained_without_prompts_bias_a_prompt():
    """Which networks make a prompt exact. The exact clock with a time-conditioned planner and a
    uniform denoiser is exact, and with the networks of the prompted problem (oracles.toy.Conditioned)
    a prompt is too: their law ends < 0.001 from p_data(x_free | x_frozen). The toy's own networks,
    trained without prompts, take the frozen tokens for possibly noise: their posteriors at the free
    positions average over prompts the data could have had. The sampler keeps the frozen positions
    out of the plan and follows the law of that chain (both runs of it: planner and denoiser, and the
    single uniform model), which ends TV 0.123 from p_data(x_free | x_frozen) on dir S3 D3 with
    x^1 = 2, and 0.289 on the Markov chain S2 D4 with x^0 x^1 = 1 0 (docs/conditional.md quotes both)."""
    cond = Conditioned(toy("dir S3 D3"), [1], [2])
    prompted = laws.ddpd_exact_clock_law(cond.sub, T_END)
    assert tv(prompted, cond.sub.p_data) < 1e-3
    keep = (cond.toy.states[:, cond.frozen] == torch.tensor(cond.values)).all(-1)
    biased = laws.ddpd_exact_clock_law(cond.toy, T_END, prompt=(cond.frozen, cond.values))[keep]
    assert tv(biased, cond.sub.p_data) == pytest.approx(0.1226, abs=5e-4)
    TABLE.add("law: exact clock, networks without prompts, prompt x^1 = 2 [dir S3 D3]", None,
              tv(biased, cond.sub.p_data), None, cond.sub.N)
    chain = Conditioned(toy("markov S2 D4"), [0, 1], [1, 0])
    on_chain = laws.ddpd_exact_clock_law(chain.toy, T_END, prompt=(chain.frozen, chain.values))
    on_chain = on_chain[(chain.toy.states[:, :2] == torch.tensor([1, 0])).all(-1)]
    assert tv(on_chain, chain.sub.p_data) == pytest.approx(0.2888, abs=5e-4)
    TABLE.add("law: exact clock, networks without prompts, prompt x^0 x^1 = 1 0 [markov S2 D4]", None,
              tv(on_chain, chain.sub.p_data), None, chain.sub.N)

    m = cond.toy.models()
    x_init, frozen = cond.prompt(B)
    runs = {
        "planner + uniform denoiser": ddpd_sample(m.planner_t, m.uniform_denoiser, B, 3, 3, steps=220,
                                                  ddpd=DDPDOptions(clock="exact", t_end=T_END),
                                                  time_conditioned_planner=True, prompt=Prompt(x_init, frozen),
                                                  noise=noise(9)),
        "single uniform model": ddpd_sample_uniform(m.uniform_model, B, 3, 3, steps=220,
                                                    ddpd=DDPDOptions(clock="exact", t_end=T_END),
                                                    prompt=Prompt(x_init, frozen), noise=noise(10)),
    }
    limit = threshold(biased, B)
    for name, result in runs.items():
        emp = empirical(cond.sub_index(result.tokens), cond.sub.N)
        TABLE.add(f"ddpd exact clock, {name} without prompts, prompt x^1 = 2 [dir S3 D3]", tv(emp, biased),
                  tv(emp, cond.sub.p_data), limit, cond.sub.N)
        assert tv(emp, biased) < limit < tv(emp, cond.sub.p_data), name


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_mask_tau_leaping_without_remasking_stops_a_row_the_prompt_fills_at_step_0(fused):
    """With eta = 0 a row given whole (nothing frozen) has no mask and can never change: it
    stops at step 0, not after a step spent on nothing."""
    x_init = torch.tensor([[1, 0, 1, 1], [-1, 0, -1, -1]])

    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    given = Prompt(x_init, torch.zeros_like(x_init, dtype=torch.bool))
    result = tau_leaping_mask(denoiser, 2, 4, 2, steps=10, prompt=given, seed=0, execution=Execution(fused=fused))
    assert result.stop_step[0] == 0 and result.denoiser_passes[0] == 0
    assert torch.equal(result.tokens[0], x_init[0])


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_mask_tau_leaping_with_remasking_runs_a_row_the_prompt_fills_to_the_end(fused):
    """With eta > 0 a row given whole (nothing frozen) still remasks and redraws its tokens: it
    runs every step and calls the denoiser, unlike the eta = 0 run that stops it at step 0."""
    x_init = torch.tensor([[1] * 8, [-1] * 8])

    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    given = Prompt(x_init, torch.zeros_like(x_init, dtype=torch.bool))
    result = tau_leaping_mask(denoiser, 2, 8, 2, steps=10, eta=2.0, prompt=given, seed=0,
                              execution=Execution(fused=fused))
    assert torch.equal(result.stop_step, torch.tensor([10, 10]))
    assert result.denoiser_passes[0] > 0
    assert not torch.equal(result.tokens[0], x_init[0])
