"""Baseline samplers (tau-leaping, MaskGIT) against exact oracles.

(a) each sampler's empirical distribution (B = 50k) against the exact law of its
chain; (b) mask tau-leaping with >= 512 steps reaches p_data; (c) wrong denoisers
are caught. Threshold: 99th percentile of the TV noise floor at 50k draws + 0.005.
MaskGIT's Gumbel-perturbed ranking is a Plackett-Luce draw, so its law is exact too;
its noise-free ranking (choice_temperature = 0, ties by position) is checked token for
token against a deliberately simple per-row implementation fed the same uniforms.
"""
import math

import pytest
import torch

from ddpd.sampling import PhiloxNoise, maskgit_sample, tau_leaping_mask, tau_leaping_planned, tau_leaping_uniform
from ddpd.sampling.noise import CONFIDENCE, TOKEN, gumbel
from ddpd.sampling.options import Execution, Temperature
from oracles import laws
from oracles.fixtures import noise, single_thread, toy  # noqa: F401  (single_thread: autouse)
from oracles.stats import TVTable, empirical, threshold, tv
from oracles.toy import tempered, token_zeroed

B = 50_000
TABLE = TVTable("Baseline samplers: TV to own exact law and to p_data (B = 50k)")


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    print("\n" + TABLE.render())


def compare(name, problem, result, law=None, against_data=False):
    emp = empirical(problem.index(result.tokens), problem.N)
    target = problem.p_data if against_data else law
    limit = threshold(target, B)
    TABLE.add(name, None if law is None else tv(emp, law), tv(emp, problem.p_data), limit, problem.N)
    return tv(emp, target), limit


# ----------------------------------------------------------------------------- tau-leaping mask (DFM)

MASK_CASES = [
    ("eta 0, 512 steps", "dir S3 D3", 512, dict()),
    ("eta 0, 10 steps", "dir S5 D2", 10, dict()),
    ("eta 2, 20 steps, T 1.0->0.5", "sparse S2 D4", 20, dict(eta=2.0, temperature=Temperature(1.0, 0.5))),
]


@pytest.mark.parametrize("name,toy_name,steps,options", MASK_CASES, ids=[c[0] for c in MASK_CASES])
def test_tau_leaping_mask_matches_its_law(name, toy_name, steps, options):
    problem = toy(toy_name)
    result = tau_leaping_mask(problem.models().mask_denoiser, B, problem.D, problem.S, steps=steps, noise=noise(),
                              **options)
    law = laws.tau_leaping_mask_law(problem, steps, **options)
    distance, limit = compare(f"tau-leaping mask {name} [{toy_name}]", problem, result, law)
    assert distance < limit


@pytest.mark.parametrize("toy_name", ["dir S3 D3", "sparse S2 D4"])
def test_tau_leaping_mask_512_steps_reaches_p_data(toy_name):
    problem = toy(toy_name)
    result = tau_leaping_mask(problem.models().mask_denoiser, B, problem.D, problem.S, steps=512, noise=noise(1))
    distance, limit = compare(f"tau-leaping mask eta 0, 512 steps vs p_data [{toy_name}]", problem, result,
                              against_data=True)
    assert distance < limit
    assert tv(laws.tau_leaping_mask_law(problem, 512), problem.p_data) < 0.005


def test_tau_leaping_mask_with_eta_stops_only_at_the_end():
    problem = toy("dir S3 D3")
    result = tau_leaping_mask(problem.models().mask_denoiser, 64, problem.D, problem.S, steps=16, eta=1.0, seed=3)
    assert (result.stop_step == 16).all() and (result.tokens < problem.S).all()
    result = tau_leaping_mask(problem.models().mask_denoiser, 64, problem.D, problem.S, steps=16, seed=3)
    assert (result.stop_step <= 16).all() and (result.stop_step < 16).any()
    assert result.denoiser_rows <= 64 * problem.D  # only rows with an unmasking call the denoiser


def test_tau_leaping_mask_without_remasking_stops_a_row_at_the_step_after_its_last_mask():
    """With eta = 0 a row's stop_step is the step after the one that unmasked its last mask:
    the reference run calls the denoiser of a one-row batch at t = i / T in the steps that
    unmask, so stop_step is T times the last call's time plus 1."""
    early = 0
    for seed in range(6):
        times = []

        def denoiser(x, t):
            times.append(float(t[0]))
            return torch.zeros(*x.shape, 2)

        result = tau_leaping_mask(denoiser, 1, 3, 2, steps=16, seed=seed)
        assert int(result.stop_step[0]) == round(16 * times[-1]) + 1
        assert int(result.denoiser_passes[0]) == len(times)
        early += int(result.stop_step[0]) < 16
    assert early > 0


@pytest.mark.parametrize("fused", [False, True])
def test_tau_leaping_last_step_clears_a_mask_whose_uniform_is_one(fused):
    from ddpd.sampling.noise import EVENT

    # row 15765 of seed 0 draws the top grid value at step 0, column 475 of the EVENT stream:
    # 1.0 in float32, which a plain u < 1 takes for no event
    noise_source = PhiloxNoise(0, first_row=15765)
    assert noise_source.uniform(0, EVENT, torch.tensor([0]), 476)[0, 475] == 1.0

    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    result = tau_leaping_mask(denoiser, 1, 476, 2, steps=1, noise=noise_source, execution=Execution(fused=fused))
    assert int(result.tokens.max()) < 2, "a mask id (2) is left in the sample"


@pytest.mark.parametrize("eta", [0.0, 0.5])
@pytest.mark.parametrize("steps", [1, 2])
def test_tau_leaping_last_step_clears_every_mask_whatever_the_schedule(steps, eta):
    """The last step unmasks with probability 1: on the linear schedule the rate there gives 1
    anyway, on alpha = t^2 it gives dt alpha_dot / (1 - alpha) = 0 (T = 1) or 2/3 (T = 2), and
    with remasking dt (alpha_dot + eta alpha) / (1 - alpha) = 0 (T = 1) or 3/4 (T = 2, eta = 1/2)."""
    from ddpd.process import CustomSchedule

    square = CustomSchedule(lambda t: t**2, lambda t: 2 * t, lambda a: a.sqrt())

    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    result = tau_leaping_mask(denoiser, 4, 16, 2, steps=steps, eta=eta, schedule=square, seed=0)
    assert int(result.tokens.max()) < 2, "a mask id (2) is left in the sample"


@pytest.mark.parametrize("name,wrong", [("token 0 zeroed", lambda d: token_zeroed(d, 0)),
                                        ("tempered^0.8", lambda d: tempered(d, 0.8))])
def test_tau_leaping_mask_wrong_denoiser_fails(name, wrong):
    problem = toy("dir S3 D3")
    result = tau_leaping_mask(wrong(problem.models().mask_denoiser), B, problem.D, problem.S, steps=512,
                              noise=noise(1))
    distance, limit = compare(f"(c) tau-leaping mask 512, denoiser {name} [dir S3 D3]", problem, result,
                              against_data=True)
    assert distance > limit


# ----------------------------------------------------------------------------- tau-leaping uniform (DFM-Uni)

UNIFORM_CASES = [
    ("20 steps", "dir S3 D3", 20, dict()),
    ("16 steps, T 0.8->0.5", "sparse S2 D4", 16, dict(temperature=Temperature(0.8, 0.5))),
]


@pytest.mark.parametrize("name,toy_name,steps,options", UNIFORM_CASES, ids=[c[0] for c in UNIFORM_CASES])
def test_tau_leaping_uniform_matches_its_law(name, toy_name, steps, options):
    problem = toy(toy_name)
    result = tau_leaping_uniform(problem.models().uniform_model, B, problem.D, problem.S, steps=steps, noise=noise(),
                                 **options)
    law = laws.tau_leaping_uniform_law(problem, steps, **options)
    distance, limit = compare(f"tau-leaping uniform {name} [{toy_name}]", problem, result, law)
    assert distance < limit


@pytest.mark.slow
def test_tau_leaping_uniform_many_steps_reaches_p_data():
    problem = toy("dir S3 D3")
    result = tau_leaping_uniform(problem.models().uniform_model, B, problem.D, problem.S, steps=1024, noise=noise(1))
    distance, limit = compare("tau-leaping uniform 1024 steps vs p_data [dir S3 D3]", problem, result,
                              against_data=True)
    assert distance < limit


# ----------------------------------------------------------------------------- planner x denoiser tau-leaping

PLANNED_CASES = [
    ("P x UniD, 20 steps", "dir S3 D3", 20, dict()),
    ("P x MaskD, 20 steps", "sparse S2 D4", 20, dict(denoiser_type="mask")),
    ("P_t x UniD, 16 steps, T 0.9", "dir S5 D2", 16, dict(time_conditioned_planner=True, temperature=0.9)),
]


@pytest.mark.parametrize("name,toy_name,steps,options", PLANNED_CASES, ids=[c[0] for c in PLANNED_CASES])
def test_tau_leaping_planned_matches_its_law(name, toy_name, steps, options):
    problem = toy(toy_name)
    models = problem.models()
    planner = models.planner_t if options.get("time_conditioned_planner") else models.planner
    denoiser = models.mask_denoiser if options.get("denoiser_type") == "mask" else models.uniform_denoiser
    result = tau_leaping_planned(planner, denoiser, B, problem.D, problem.S, steps=steps, noise=noise(), **options)
    law = laws.tau_leaping_planned_law(problem, steps, **options)
    distance, limit = compare(f"tau-leaping {name} [{toy_name}]", problem, result, law)
    assert distance < limit


def test_tau_leaping_planned_mask_denoiser_runs_at_the_time_of_its_masked_share():
    """The mask denoiser sees t = alpha^{-1}(1 - #masked / D), not the grid time (the oracle
    denoiser ignores t, so the laws above cannot tell)."""
    problem = toy("sparse S2 D4")
    models = problem.models()
    times = []

    def denoiser(x, t):
        times.append((t, 1.0 - (x == problem.S).float().mean(-1)))
        return models.mask_denoiser(x, t)

    tau_leaping_planned(models.planner, denoiser, 64, problem.D, problem.S, steps=6, denoiser_type="mask", seed=0)
    assert times
    for got, share in times:
        torch.testing.assert_close(got, share)


@pytest.mark.slow
def test_tau_leaping_planned_time_conditioned_many_steps_reaches_p_data():
    problem = toy("dir S3 D3")
    models = problem.models()
    result = tau_leaping_planned(models.planner_t, models.uniform_denoiser, B, problem.D, problem.S, steps=1024,
                                 time_conditioned_planner=True, noise=noise(1))
    distance, limit = compare("tau-leaping P_t x UniD 1024 steps vs p_data [dir S3 D3]", problem, result,
                              against_data=True)
    assert distance < limit


# ----------------------------------------------------------------------------- MaskGIT

MASKGIT_CASES = [
    ("3 steps, choice T 1.0", "dir S3 D3", 3, dict(choice_temperature=1.0)),
    ("4 steps, choice T 2.0, T 1.0->0.5", "sparse S2 D4", 4,
     dict(choice_temperature=2.0, temperature=Temperature(1.0, 0.5))),
    ("2 steps, choice T 4.5", "dir S5 D2", 2, dict(choice_temperature=4.5)),
]


@pytest.mark.parametrize("name,toy_name,steps,options", MASKGIT_CASES, ids=[c[0] for c in MASKGIT_CASES])
def test_maskgit_matches_its_law(name, toy_name, steps, options):
    problem = toy(toy_name)
    result = maskgit_sample(problem.models().mask_denoiser, B, problem.D, problem.S, steps=steps, noise=noise(),
                            **options)
    law = laws.maskgit_law(problem, steps, **options)
    distance, limit = compare(f"maskgit {name} [{toy_name}]", problem, result, law)
    assert distance < limit


def simple_maskgit(denoiser, rows, length, vocab, steps, temperature, choice_temperature, noise):
    """MaskGIT one row at a time, written from its description with plain Python lists."""
    out = []
    for row in rows:
        x = [vocab] * length
        ids = torch.tensor([row])
        for i in range(steps):
            masked = [d for d in range(length) if x[d] == vocab]
            t = torch.tensor([1.0 - len(masked) / length])
            logits = denoiser(torch.tensor([x]), t)[0]
            u_token = noise.uniform(i, TOKEN, ids, length * vocab).view(length, vocab)
            u_conf = noise.uniform(i, CONFIDENCE, ids, length)[0]
            tau = choice_temperature * (1 - (i + 1) / steps)
            draws, confidence = {}, {}
            for d in masked:
                draws[d] = int((logits[d] + temperature * gumbel(u_token[d])).argmax())
                confidence[d] = float(logits[d].log_softmax(-1)[draws[d]] + tau * gumbel(u_conf[d]))
            if i == steps - 1:
                keep = 0
            else:
                keep = max(1, min(len(masked) - 1, math.floor(length * math.cos(math.pi / 2 * (i + 1) / steps))))
            stay_masked = sorted(masked, key=lambda d: (confidence[d], d))[:keep]
            for d in masked:
                if d not in stay_masked:
                    x[d] = draws[d]
        out.append(x)
    return torch.tensor(out)


@pytest.mark.parametrize("choice_temperature", [0.0, 3.0])
def test_maskgit_equals_simple_implementation_draw_for_draw(choice_temperature):
    problem = toy("sparse S2 D4")
    denoiser = problem.models().mask_denoiser
    n, steps = 60, 4
    result = maskgit_sample(denoiser, n, problem.D, problem.S, steps=steps, choice_temperature=choice_temperature,
                            temperature=0.9, noise=PhiloxNoise(7))
    expected = simple_maskgit(denoiser, range(n), problem.D, problem.S, steps, 0.9, choice_temperature,
                              PhiloxNoise(7))
    assert torch.equal(result.tokens, expected)


def test_maskgit_fused_equals_reference_when_ranking_by_confidence_alone():
    """A confident denoiser (log-probabilities within 1e-13 of 0) ranked without noise
    (choice_temperature 0): the confidence comes from the same torch code on both paths. (It
    once came from the draws' own log-probabilities, 0 in the kernels' float32 tile sums and
    -5e-14 in the reference's float64, and the fused run unmasked other positions.)"""
    g = torch.Generator().manual_seed(0)
    length, vocab = 6, 5
    embed, position = torch.randn(vocab + 1, vocab, generator=g) * 50, torch.randn(length, vocab, generator=g) * 50
    context = torch.randn(vocab + 1, vocab, generator=g) * 200

    def denoiser(x, t):  # mask id = vocab
        return embed[x] + position + context[x].mean(1, keepdim=True)

    for seed in range(4):
        kw = dict(steps=4, choice_temperature=0.0, noise=PhiloxNoise(seed))
        assert torch.equal(maskgit_sample(denoiser, 4, length, vocab, execution=Execution(fused=True), **kw).tokens,
                           maskgit_sample(denoiser, 4, length, vocab, **kw).tokens)


def test_maskgit_calls_the_denoiser_at_the_time_of_its_schedule():
    """Under the cosine schedule the denoiser sees t = alpha^{-1}(1 - #masked / D) of that
    schedule, (2 / pi) acos(#masked / D), not the linear schedule's unmasked share."""
    problem = toy("sparse S2 D4")
    seen = []

    def recording(x, t):
        seen.append((t.clone(), (x == problem.S).double().mean(-1)))
        return problem.models().mask_denoiser(x, t)
    maskgit_sample(recording, 3, problem.D, problem.S, steps=3, schedule="cosine", seed=0)
    assert len(seen) == 3
    for t, share in seen:
        assert torch.allclose(t.double(), torch.acos(share) * (2 / math.pi), atol=1e-6)
    t, share = seen[1]
    assert bool(((t.double() - (1 - share)).abs() > 0.05).all())


def test_maskgit_draws_from_the_generator_it_is_given():
    """Two runs from generators seeded alike draw the same tokens, one seeded otherwise others."""
    problem = toy("dir S5 D2")

    def run(seed):
        return maskgit_sample(problem.models().mask_denoiser, 64, problem.D, problem.S, steps=2,
                              generator=torch.Generator().manual_seed(seed)).tokens
    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))


def test_maskgit_runs_the_denoiser_in_the_execution_precision():
    """Execution(dtype="bfloat16") reaches the denoiser as an autocast to bfloat16 on the CPU."""
    problem = toy("sparse S2 D4")
    seen = []

    def recording(x, t):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return problem.models().mask_denoiser(x, t)
    maskgit_sample(recording, 2, problem.D, problem.S, steps=2, seed=0, execution=Execution(dtype="bfloat16"))
    assert seen == [(True, torch.bfloat16)] * 2


def test_tau_leaping_uniform_clamps_the_rate_before_the_stay_factor():
    """On alpha = 1 - (1 - t)^4 with T = 2 the first step's dt alpha_dot / (1 - alpha) is 2: it
    is clamped to 1 and then times 1 - p_stay = 1/2, so about half the positions jump (the law
    of tau_leaping_uniform_law); clamping only after the product would move every position."""
    from ddpd.process import CustomSchedule

    quartic = CustomSchedule(lambda t: 1 - (1 - t) ** 4, lambda t: 4 * (1 - t) ** 3, lambda a: 1 - (1 - a) ** 0.25)
    seen = []

    def model(x, t):
        seen.append(x.clone())
        return torch.zeros(*x.shape, 2)  # p_stay = 1/2, and a jump always changes the token

    tau_leaping_uniform(model, 1, 400, 2, steps=2, schedule=quartic, seed=0)
    moved = float((seen[1] != seen[0]).float().mean())
    assert 0.4 < moved < 0.6, moved


@pytest.mark.parametrize("sampler", ["uniform", "planned uniform", "planned mask"])
def test_tau_leaping_uniform_noise_last_step_moves_every_noisy_position(sampler):
    """The last step jumps with rate times dt taken as 1 whatever the schedule: on alpha = t^2
    with T = 1 the rate there is 0, yet a model sure of token 0 (p_stay = 0 elsewhere), or a
    planner sure every position is noise, moves every position to 0."""
    from ddpd.process import CustomSchedule

    square = CustomSchedule(lambda t: t**2, lambda t: 2 * t, lambda a: a.sqrt())

    def sure_of_zero(x, t):
        logits = torch.full((*x.shape, 2), -30.0)
        logits[..., 0] = 0.0
        return logits

    def planner(x):
        return torch.full(x.shape, 30.0)

    kw = dict(steps=1, schedule=square, seed=0)
    if sampler == "uniform":
        result = tau_leaping_uniform(sure_of_zero, 4, 64, 2, **kw)
    else:
        result = tau_leaping_planned(planner, sure_of_zero, 4, 64, 2, denoiser_type=sampler.split()[1], **kw)
    assert (result.tokens == 0).all()


@pytest.mark.parametrize("fused", [False, True])
def test_tau_leaping_mask_denoiser_sees_the_step_start_at_the_grid_time(fused):
    """Every jump of a step is applied at its end: step i's denoiser is called at t = i / T on
    the state the step starts from, so a position remasked in the step (EVENT uniform below
    eta dt = 1/2 at a token) still holds its token in the denoiser's input."""
    from ddpd.sampling.noise import EVENT, happens

    calls = []

    def denoiser(x, t):
        calls.append((x.clone(), t.clone()))
        return torch.zeros(*x.shape, 2)

    tau_leaping_mask(denoiser, 1, 64, 2, steps=4, eta=2.0, noise=PhiloxNoise(0), execution=Execution(fused=fused))
    assert [t.tolist() for _, t in calls] == [[0.0], [0.25], [0.5], [0.75]]
    assert all(t.dtype == torch.float32 for _, t in calls)
    x1 = calls[1][0]
    remasked = (x1 != 2) & happens(PhiloxNoise(0).uniform(1, EVENT, torch.tensor([0]), 64), 0.5)
    assert remasked.any()


def test_tau_leaping_mask_reference_run_never_calls_the_denoiser_on_no_rows():
    """A step where no row unmasks costs no call: the reference run passes only the rows with
    a draw, and an empty batch is not one a denoiser has to accept."""
    sizes = []

    def denoiser(x, t):
        sizes.append(x.shape[0])
        return torch.zeros(*x.shape, 2)

    result = tau_leaping_mask(denoiser, 2, 1, 2, steps=10, seed=0)
    assert int(result.tokens.max()) < 2
    assert sizes and min(sizes) >= 1, sizes
    assert len(sizes) < 10  # steps with no unmasking in any row were skipped


def test_tau_leaping_planned_mask_denoiser_also_masks_non_jumping_positions_on_their_own_draw():
    """A position that does not jump is masked with the planner's probability p on its own
    uniform (prop:draw_with_maskD): at T = 1 with p = 1/2 everywhere a jump takes half the
    positions and the denoiser sees 1 - (1/2)^2 = 3/4 of them masked; reusing the jump's
    uniform would mask only the jumping half."""
    shares = []

    def planner(x):
        return torch.zeros(x.shape, dtype=torch.float32)

    def denoiser(x, t):
        shares.append(float((x == 2).float().mean()))
        return torch.zeros(*x.shape, 2)

    tau_leaping_planned(planner, denoiser, 1, 400, 2, steps=1, denoiser_type="mask", seed=0)
    assert len(shares) == 1 and 0.67 < shares[0] < 0.83, shares


def test_tau_leaping_uniform_counts_every_jump_as_a_commit():
    """commits (and tokens_per_pass) count the jumps: each jump changes its token, so a row's
    commits are the changes between the model's successive inputs and the final tokens."""
    seen = []

    def model(x, t):
        seen.append(x.clone())
        return torch.zeros(*x.shape, 3)

    result = tau_leaping_uniform(model, 3, 8, 3, steps=5, seed=1)
    states = seen + [result.tokens]
    changes = sum((b != a).sum(-1) for a, b in zip(states, states[1:]))
    assert int(changes.sum()) > 0
    assert torch.equal(result.commits, changes)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_tau_leaping_mask_fused_run_counts_the_passes_the_reference_counts(eta):
    """The fused run calls the denoiser on every row but counts a pass only for the rows with
    an unmasking in the step, as the reference run does."""
    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    runs = [tau_leaping_mask(denoiser, 6, 3, 2, steps=12, eta=eta, seed=2, execution=Execution(fused=fused))
            for fused in (False, True)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert torch.equal(runs[0].denoiser_passes, runs[1].denoiser_passes)
    assert int(runs[0].denoiser_passes.max()) < 12


@pytest.mark.parametrize("fused", [False, True], ids=["reference", "fused"])
def test_tau_leaping_mask_without_remasking_counts_each_position_once_as_a_commit(fused):
    """With eta = 0 every position is unmasked exactly once and never again: each row commits
    its length, and tokens_per_pass is the length over the passes."""
    def denoiser(x, t):
        return torch.zeros(*x.shape, 2)

    result = tau_leaping_mask(denoiser, 5, 7, 2, steps=6, seed=4, execution=Execution(fused=fused))
    assert torch.equal(result.commits, torch.full((5,), 7))
    assert result.tokens_per_pass == pytest.approx(35 / int(result.passes.sum()))


@pytest.mark.parametrize("denoiser_type", ["uniform", "mask"])
def test_tau_leaping_planned_counts_every_jump_as_a_commit(denoiser_type):
    """A planner sure of noise makes every position jump at the last step (rate 1): each row
    commits its length, whatever the denoiser draws (here often the current value)."""
    def planner(x):
        return torch.full(x.shape, 30.0)

    def denoiser(x, t):
        return torch.zeros(*x.shape, 3)

    result = tau_leaping_planned(planner, denoiser, 4, 6, 3, steps=1, denoiser_type=denoiser_type, seed=0)
    assert torch.equal(result.commits, torch.full((4,), 6))
