"""Denoising performance at a fixed corruption level (ddpd.eval.denoising) on the
enumerable toy, where the exact denoisers are known."""
import math

import pytest
import torch

from ddpd.eval.denoising import denoising_stats
from tests.oracles.toy import ToyProblem, dirichlet_p_data, tempered

S, D = 3, 4
ALPHA = 0.7


@pytest.fixture(scope="module")
def toy():
    return ToyProblem(dirichlet_p_data(S, D, 0.4, seed=2), S, D)


@pytest.fixture(scope="module")
def x1(toy):
    g = torch.Generator().manual_seed(0)
    return toy.states[torch.multinomial(toy.p_data.float(), 4000, replacement=True, generator=g)]


def test_uniform_model_split_by_the_decomposition_is_the_exact_uniform_denoiser(toy, x1):
    """eq. denoising_prob applied to the exact p(x_1 | x_t) gives the exact
    p(x_1 | x_t, z = N): same cross-entropy and accuracy on the same corruption."""
    m = toy.models()
    split = denoising_stats("uniform", m.uniform_model, x1, S, alpha=ALPHA, seed=1)
    direct = denoising_stats("uniform-denoiser", m.uniform_denoiser, x1, S, alpha=ALPHA, seed=1)
    torch.testing.assert_close(split.nats, direct.nats, rtol=1e-4, atol=1e-4)
    assert torch.equal(split.noisy, direct.noisy) and torch.equal(split.correct, direct.correct)


def test_uniform_model_split_uses_alpha_not_the_time_under_the_cosine_schedule(x1):
    """The decomposition weighs the uniform model by alpha itself: under the cosine schedule,
    where t = alpha^{-1}(alpha) differs from alpha, it still gives the exact uniform denoiser."""
    from ddpd.process import get_schedule

    cosine = get_schedule("cosine")
    m = ToyProblem(dirichlet_p_data(S, D, 0.4, seed=2), S, D, cosine).models()
    split = denoising_stats("uniform", m.uniform_model, x1, S, alpha=ALPHA, schedule=cosine, seed=1)
    direct = denoising_stats("uniform-denoiser", m.uniform_denoiser, x1, S, alpha=ALPHA, schedule=cosine, seed=1)
    torch.testing.assert_close(split.nats, direct.nats, rtol=1e-4, atol=1e-4)
    assert torch.equal(split.correct, direct.correct)


def test_uniform_model_split_keeps_tiny_probabilities_finite():
    """A model 120 nats sure of token 0: the clean token 2 has p(x_1 = 2 | x_t) ~ e^-120, below
    float32's smallest, yet its cross-entropy is finite: 120 nats a noisy position, less
    log p(z = N | x_t) (down to log(1/6) where x_t = 0); through probabilities it was inf."""
    def sure_of_0(x, t):
        return torch.full((*x.shape, S), -120.0).index_fill(-1, torch.tensor([0]), 0.0)

    x1 = torch.full((64, 6), 2)
    split = denoising_stats("uniform", sure_of_0, x1, S, alpha=0.5, seed=0)
    assert bool(torch.isfinite(split.nats).all()) and float(split.noisy.sum()) > 0
    per_position = split.nats.sum() / split.noisy.sum()
    assert 120.0 - math.log(6.0) <= float(per_position) <= 120.0 + 1e-3


def test_exact_denoisers_beat_wrong_ones(toy, x1):
    """On the same noisy positions the exact denoiser's cross-entropy is the lower one
    (by more than 4 standard errors of the paired difference)."""
    m = toy.models()
    for kind, exact in (("uniform-denoiser", m.uniform_denoiser), ("mask-denoiser", m.mask_denoiser)):
        right = denoising_stats(kind, exact, x1, S, alpha=ALPHA, seed=2)
        wrong = denoising_stats(kind, tempered(exact, 0.3), x1, S, alpha=ALPHA, seed=2)
        assert torch.equal(right.noisy, wrong.noisy)
        diff = (wrong.nats - right.nats).double()
        assert float(diff.mean()) > 4 * float(diff.std()) / math.sqrt(diff.numel())


def test_counts_and_accuracy_of_an_oracle_that_knows_x1():
    x1 = torch.randint(0, S, (50, 16), generator=torch.Generator().manual_seed(3))

    def knows(x, t):
        return torch.nn.functional.one_hot(x1, S).float() * 30.0

    stats = denoising_stats("mask-denoiser", knows, x1, S, alpha=0.5, seed=4)
    assert torch.equal(stats.correct, stats.noisy)
    assert float(stats.nats.max()) < 1e-6  # -log(1 + 2 exp(-30)) per position
    frac = float(stats.noisy.sum()) / x1.numel()
    assert abs(frac - 0.5) < 4 * math.sqrt(0.25 / x1.numel())  # z = N with probability 1 - alpha


def test_noisy_positions_are_a_one_minus_alpha_share_at_the_default_alpha_of_0_85():
    x1 = torch.zeros(200, 16, dtype=torch.long)
    stats = denoising_stats("uniform-denoiser", lambda x, t: torch.zeros(*x.shape, S), x1, S, seed=3)
    frac = float(stats.noisy.sum()) / x1.numel()
    assert abs(frac - 0.15) < 4 * math.sqrt(0.15 * 0.85 / x1.numel()), frac


@pytest.mark.parametrize("kind", ["uniform", "uniform-denoiser", "mask-denoiser"])
def test_the_denoiser_runs_at_the_time_the_schedule_gives_alpha(kind):
    """Under the cosine schedule t = alpha^{-1}(alpha) is not alpha itself: every row sees it."""
    from ddpd.process import get_schedule

    seen = []

    def records_t(x, t):
        seen.append(t)
        return torch.zeros(*x.shape, S)

    denoising_stats(kind, records_t, torch.zeros(5, 4, dtype=torch.long), S, alpha=0.85, schedule="cosine", seed=1)
    expected = get_schedule("cosine").inverse(torch.full((5,), 0.85))
    assert len(seen) == 1 and abs(float(expected[0]) - 0.85) > 0.01
    torch.testing.assert_close(seen[0], expected)


def test_the_planner_masks_denoiser_runs_at_the_time_of_its_masked_share_under_the_schedule():
    """With the planner's mask the time is alpha^{-1}(1 - #masked / D) under the schedule given:
    a planner sure of clean text masks nothing, and each noisy position's own pass masks one of 4."""
    from ddpd.process import get_schedule

    seen = []

    def records_t(x, t):
        seen.append(t)
        return torch.zeros(*x.shape, S)

    x1 = torch.zeros(16, 4, dtype=torch.long)
    stats = denoising_stats("mask-denoiser-planner", records_t, x1, S, alpha=0.5, schedule="cosine",
                            planner=lambda x: torch.full(x.shape, -30.0), seed=1)
    cosine = get_schedule("cosine")
    assert float(stats.noisy.sum()) > 0 and len(seen) > 1
    torch.testing.assert_close(seen[0], cosine.inverse(torch.ones(16)))
    extra = torch.cat(seen[1:])
    assert extra.numel() == int(stats.noisy.sum()) and abs(float(cosine.inverse(torch.tensor(0.75))) - 0.75) > 0.01
    torch.testing.assert_close(extra, cosine.inverse(torch.full_like(extra, 0.75)))


def test_denoising_stats_are_float32_counts_and_nats():
    x1 = torch.zeros(3, 4, dtype=torch.long)
    stats = denoising_stats("uniform-denoiser", lambda x, t: torch.zeros(*x.shape, S), x1, S, seed=0)
    assert [v.dtype for v in (stats.nats, stats.noisy, stats.correct)] == [torch.float32] * 3


def test_planner_mask_scores_each_noisy_position_with_itself_masked(toy):
    """A denoiser that reports whether position d is masked in its input: every scored
    (noisy) position must see itself masked, including those the planner's draw
    left unmasked (their extra pass)."""
    x1 = toy.states.repeat(20, 1)

    def reveals_mask(x, t):
        logits = torch.zeros(*x.shape, S)
        logits[..., 0] = torch.where(x == S, 20.0, -20.0)
        return logits

    def planner(x):
        return torch.zeros(x.shape)  # p = 1/2: about half of the noisy positions need an extra pass

    target = torch.zeros_like(x1)
    stats = denoising_stats("mask-denoiser-planner", reveals_mask, target, S, alpha=0.4, planner=planner, seed=5)
    assert float(stats.noisy.sum()) > 0
    assert torch.equal(stats.correct, stats.noisy)


def _sees_itself_alone(x, t):
    """Token 0 where the position is masked and no other position of its row is."""
    masked = x == S
    logits = torch.zeros(*x.shape, S)
    logits[..., 0] = torch.where(masked & (masked.sum(-1, keepdim=True) == 1), 20.0, -20.0)
    return logits


@pytest.mark.parametrize("logit, alone", [(-30.0, True), (30.0, False)])
def test_the_planner_mask_follows_the_planners_probability(logit, alone):
    """A planner sure the text is clean masks nothing beyond the scored position (each noisy
    position seen masked alone, though its row has other noisy positions); one sure of noise
    masks every position."""
    x1 = torch.zeros(64, 6, dtype=torch.long)
    stats = denoising_stats("mask-denoiser-planner", _sees_itself_alone, x1, S, alpha=0.5,
                            planner=lambda x: torch.full(x.shape, logit), seed=8)
    assert float(stats.noisy.sum()) > 64  # rows with two noisy positions and more
    assert torch.equal(stats.correct, stats.noisy if alone else torch.zeros_like(stats.noisy))


def test_the_planner_reads_the_noisy_tokens():
    """The planner sees x_t, the tokens every denoiser is given at this seed, not the clean x1: one
    sure of noise wherever a token is off 0 masks the positions that show noise, so a noisy
    position beside another one that shows noise is no longer seen masked alone."""
    x1 = torch.zeros(64, 6, dtype=torch.long)
    given, planned = [], []

    def records_x(x, t):
        given.append(x)
        return torch.zeros(*x.shape, S)

    def sure_where_off_0(x):
        planned.append(x)
        return torch.where(x != 0, 30.0, -30.0)

    denoising_stats("uniform-denoiser", records_x, x1, S, alpha=0.5, seed=8)
    stats = denoising_stats("mask-denoiser-planner", _sees_itself_alone, x1, S, alpha=0.5,
                            planner=sure_where_off_0, seed=8)
    assert len(planned) == 1 and torch.equal(planned[0], given[0]) and not torch.equal(planned[0], x1)
    assert 0 < float(stats.correct.sum()) < float(stats.noisy.sum())


def test_the_planner_mask_is_drawn_apart_from_the_corruption():
    """The planner's mask is its own draw (prop. draw_with_maskD), independent of the corruption
    given x_t: a noisy position is scored right by this denoiser iff every other position that
    shows noise (noisy, drawn off 0) is masked, which with independent coins happens with
    probability (1 - q)^(L - 1) in rows of L, q = (1 - alpha) (S - 1) / S (1 - p). Masks drawn from the
    corruption's own uniforms would make it 1 or near (1 - q / (1 - p))^(L - 1)."""
    def clean_if_no_noise_shows(x, t):  # token 0 where no unmasked position of the row is off 0
        shown = ((x != S) & (x != 0)).any(-1, keepdim=True)
        logits = torch.zeros(*x.shape, S)
        logits[..., 0] = torch.where(shown, -20.0, 20.0)
        return logits

    length = 6
    x1 = torch.zeros(4096, length, dtype=torch.long)
    stats = denoising_stats("mask-denoiser-planner", clean_if_no_noise_shows, x1, S, alpha=0.5,
                            planner=lambda x: torch.full(x.shape, 0.1), seed=10)
    p = 1 / (1 + math.exp(-0.1))
    expected = (1 - 0.5 * (S - 1) / S * (1 - p)) ** (length - 1)
    share = float(stats.correct.sum()) / float(stats.noisy.sum())
    assert abs(share - expected) < 0.02, (share, expected)  # s.d. about 0.005 (12k noisy positions)


def test_the_planner_mask_is_the_first_samples_planned_mask_draw_of_each_row():
    """The planner's mask is EvalNoise(seed)'s sample 0 of the PLANNED_MASK stream at the row ids
    given, below p(z = N | x_t): a denoising table is reproducible from its seed and row ids."""
    from ddpd.eval.corruption import PLANNED_MASK, EvalNoise

    seen = []

    def records_x(x, t):
        seen.append(x)
        return torch.zeros(*x.shape, S)

    x1, rows = torch.zeros(16, 8, dtype=torch.long), torch.arange(40, 56)
    denoising_stats("mask-denoiser-planner", records_x, x1, S, alpha=0.5, planner=lambda x: torch.zeros(x.shape),
                    seed=11, row_ids=rows)
    expected = EvalNoise(11).uniform(0, PLANNED_MASK, rows, 8) < 0.5
    assert torch.equal(seen[0] == S, expected)


def test_a_planner_sure_of_noise_masks_a_position_whose_uniform_is_1():
    """Uniforms lie in (0, 1]: row 277064 of seed 0 draws exactly 1.0 at column 7 of the planned
    mask (one uniform in 2**24). A planner sure of noise (p = 1 in float32) still masks it, as
    ddpd.ops.bernoulli reads u = 1 as the largest float32 below 1; a plain u < p left it shown."""
    from ddpd.eval.corruption import PLANNED_MASK, EvalNoise

    rows = torch.tensor([277064])
    assert float(EvalNoise(0).uniform(0, PLANNED_MASK, rows, 8)[0, 7]) == 1.0
    seen = []

    def records_x(x, t):
        seen.append(x)
        return torch.zeros(*x.shape, S)

    denoising_stats("mask-denoiser-planner", records_x, torch.zeros(1, 8, dtype=torch.long), S, alpha=0.5,
                    planner=lambda x: torch.full(x.shape, 30.0), seed=0, row_ids=rows)
    assert torch.equal(seen[0], torch.full((1, 8), S))


@pytest.mark.parametrize("kind", ["mask-denoiser", "mask-denoiser-planner"])
def test_the_mask_denoisers_see_the_mask_id_given(kind):
    def reveals(x, t):  # token 0 where the input holds mask id S + 1
        logits = torch.zeros(*x.shape, S)
        logits[..., 0] = torch.where(x == S + 1, 20.0, -20.0)
        return logits

    x1 = torch.zeros(32, 6, dtype=torch.long)
    stats = denoising_stats(kind, reveals, x1, S, alpha=0.5, planner=lambda x: torch.zeros(x.shape), mask_id=S + 1,
                            seed=9)
    assert float(stats.noisy.sum()) > 0 and torch.equal(stats.correct, stats.noisy)


def test_denoising_stats_are_batch_invariant_and_seeded(toy):
    m = toy.models()
    x1 = toy.states
    rows = torch.arange(x1.shape[0])
    whole = denoising_stats("mask-denoiser-planner", m.mask_denoiser, x1, S, planner=m.planner, seed=6)
    parts = [denoising_stats("mask-denoiser-planner", m.mask_denoiser, x1[i:i + 5], S, planner=m.planner, seed=6,
                             row_ids=rows[i:i + 5]) for i in range(0, x1.shape[0], 5)]
    torch.testing.assert_close(whole.nats, torch.cat([p.nats for p in parts]))
    other = denoising_stats("mask-denoiser-planner", m.mask_denoiser, x1, S, planner=m.planner, seed=7)
    assert not torch.equal(whole.nats, other.nats)


@pytest.mark.parametrize("kwargs, error", [
    (dict(kind="mask"), "kind must be one of"),
    (dict(alpha=1.0), "alpha must be in \\(0.0, 1.0\\)"),
    (dict(kind="mask-denoiser-planner", planner=None), "planner must be callable"),
    (dict(x1=torch.zeros(2, 3)), "x1 must have dtype torch.int64"),
    (dict(x1=torch.full((2, 3), 5)), "x1 must hold ids in \\[0, 3\\)"),
    (dict(x1=torch.full((2, 3), -1)), "x1 must hold ids in \\[0, 3\\)"),
    (dict(x1=torch.zeros(2, 3, dtype=torch.long), row_ids=torch.tensor([-1, 0])), "row_ids must be >= 0"),
    (dict(denoiser=lambda x, t: torch.zeros(*x.shape, S, dtype=torch.long)), "denoiser must return floating logits"),
    (dict(kind="uniform", denoiser=lambda x, t: torch.zeros(*x.shape, S, dtype=torch.long)),
     "denoiser must return floating logits"),
    (dict(kind="mask-denoiser", mask_id=S - 1), f"mask_id must be >= {S}, got {S - 1}"),
    (dict(vocab_size=1, x1=torch.zeros(2, 3, dtype=torch.long)), "vocab_size must be >= 2, got 1"),
])
def test_denoising_stats_validates_inputs(toy, kwargs, error):
    args = dict(kind="uniform-denoiser", denoiser=toy.models().uniform_denoiser, x1=toy.states, vocab_size=S)
    args.update(kwargs)
    kind, denoiser, x1, vocab = args.pop("kind"), args.pop("denoiser"), args.pop("x1"), args.pop("vocab_size")
    with pytest.raises((ValueError, TypeError), match=error):
        denoising_stats(kind, denoiser, x1, vocab, **args)
