"""The plain-torch draws the benchmarks time ddpd against (ddpd.testing.baselines) draw
the laws they stand for: a baseline that is fast because it draws something else would
make every ratio a lie. Each draw is repeated on many identical rows of a small
vocabulary and its frequencies are tested (chi-square) against exact probabilities
computed here from the definitions; seeded, so a run is deterministic."""
import functools
import itertools
import math

import pytest
import torch
from scipy.stats import chisquare
from torch.overrides import TorchFunctionMode

from ddpd.testing import baselines

DRAWS = 40_000
LOGITS = torch.tensor([1.3, -0.4, 0.9, 2.1, -1.7, 0.2, 1.8])  # distinct: no ties at a boundary
P_VALUE = 1e-6  # seeded draws: a correct law passes far above this, a wrong one fails far below


def rows(x: torch.Tensor, n: int = DRAWS) -> torch.Tensor:
    return x.expand(n, *x.shape).contiguous()


def assert_law(outcomes: torch.Tensor, probs: torch.Tensor) -> None:
    """outcomes [n] integer codes in [0, len(probs)); probs the exact law (sums to 1)."""
    counts = torch.bincount(outcomes, minlength=len(probs)).double()
    assert counts.shape == probs.shape, "an outcome outside the support"
    support = probs > 0
    assert counts[~support].sum() == 0, f"drew an impossible outcome: {counts[~support]}"
    if support.sum() == 1:
        return  # one possible outcome, and only it was drawn
    expected = probs[support].double() / probs[support].double().sum() * len(outcomes)
    p_value = chisquare(counts[support].numpy(), expected.numpy()).pvalue
    assert p_value > P_VALUE, (p_value, (counts / len(outcomes)).tolist(), probs.tolist())


class Calls(TorchFunctionMode):
    """Records the name of every torch function and tensor method called under it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def calls(fn) -> list[str]:
    with Calls() as recorded:
        fn()
    return recorded.names


def truncated_law(logits, temperature=1.0, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """The exact law of a truncated draw from its definition (ddpd.ops.sample_categorical's
    module docstring): top-k, then top-p over what top-k keeps, then min-p; softmax of y =
    logits / T over what is kept."""
    y = (logits.double() / temperature).tolist()
    order = sorted(range(len(y)), key=lambda j: -y[j])
    kept = order[:top_k] if top_k else order
    if top_p is not None:
        z = sum(math.exp(y[j]) for j in kept)
        above, cut = 0.0, []
        for j in kept:
            if above >= top_p * z:
                break
            cut.append(j)
            above += math.exp(y[j])
        kept = cut
    if min_p is not None:
        kept = [j for j in kept if y[j] >= max(y) + math.log(min_p)]
    probs = torch.zeros(len(y), dtype=torch.float64)
    for j in kept:
        probs[j] = math.exp(y[j])
    return probs / probs.sum()


@pytest.mark.parametrize("name", list(baselines.CATEGORICAL))
@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.6])
def test_categorical_draws(name, temperature):
    torch.manual_seed(1)
    tokens = baselines.CATEGORICAL[name](rows(LOGITS), temperature)
    assert tokens.shape == (DRAWS,)
    assert_law(tokens, torch.softmax(LOGITS.double() / temperature, -1))


ONE_TOKEN_DRAWS = {**baselines.CATEGORICAL, **baselines.TRUNCATED}


@pytest.mark.parametrize("name", list(ONE_TOKEN_DRAWS))
def test_one_row_gives_one_token_and_one_token_is_always_drawn(name):
    """Long[N] tokens also for N = 1 (no squeeze of the row dimension), and a vocabulary of
    one token draws it."""
    draw = ONE_TOKEN_DRAWS[name]
    torch.manual_seed(17)
    for temperature in (1.0, 0.7):
        tokens = draw(LOGITS[None], temperature)
        assert tokens.shape == (1,) and tokens.dtype == torch.long, temperature
        assert draw(torch.tensor([[0.3]]), temperature).tolist() == [0]
        assert draw(torch.full((5, 1), -2.0), temperature).tolist() == [0] * 5


DRAWS_AT_T = {  # every draw that takes a temperature, with and without truncation
    **baselines.CATEGORICAL,
    **{f"{name}, top-p + min-p": functools.partial(draw, top_p=0.7, min_p=0.1)
       for name, draw in baselines.TRUNCATED.items()},
    **{f"{name}, top-k": functools.partial(draw, top_k=3) for name, draw in baselines.TRUNCATED.items()},
}


@pytest.mark.parametrize("name", list(DRAWS_AT_T))
def test_draws_divide_by_the_temperature_only_when_it_is_not_one(name):
    """ddpd skips the division at T = 1; a baseline that pays for it there is timed with a handicap."""
    draw, divisions = DRAWS_AT_T[name], {"div", "div_", "__truediv__", "true_divide"}
    assert not divisions & set(calls(lambda: draw(rows(LOGITS, 8), 1.0)))
    for temperature in (0.7, 1.5):  # below and above one
        assert divisions & set(calls(lambda: draw(rows(LOGITS, 8), temperature))), temperature


@pytest.mark.parametrize("name", list(DRAWS_AT_T))
@pytest.mark.parametrize("temperature", [0.0, -0.7, float("nan")])
def test_draws_refuse_a_temperature_that_is_not_positive(name, temperature):
    """logits / T at T <= 0 (or NaN) are inf or NaN and some draws would still return tokens:
    refused, with the draw and the value named."""
    draw = DRAWS_AT_T[name]
    function = getattr(draw, "func", draw).__name__
    with pytest.raises(ValueError, match=rf"{function}: temperature must be > 0, got {temperature}"):
        draw(rows(LOGITS, 8), temperature)


CONTROLS = [dict(top_k=3), dict(top_k=1), dict(top_p=0.7), dict(top_p=0.2), dict(min_p=0.3), dict(top_k=4, top_p=0.6),
            dict(top_p=0.9, min_p=0.4), dict(top_k=5, top_p=0.8, min_p=0.2), dict(top_k=7), dict(top_p=1.0), dict()]


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: " ".join(f"{k}={v}" for k, v in c.items()) or "none")
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_truncated_draws(name, controls, temperature):
    torch.manual_seed(2)
    tokens = baselines.TRUNCATED[name](rows(LOGITS), temperature, **controls)
    assert tokens.shape == (DRAWS,)
    assert_law(tokens, truncated_law(LOGITS, temperature, **controls))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_truncated_draws_above_a_temperature_of_one(name):
    torch.manual_seed(16)
    for controls in (dict(top_k=3), dict(top_p=0.7), dict(min_p=0.3)):
        tokens = baselines.TRUNCATED[name](rows(LOGITS), 1.8, **controls)
        assert_law(tokens, truncated_law(LOGITS, 1.8, **controls))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_truncated_draws_of_logits_far_below_zero(name):
    """A cut token gets -inf, not a finite stand-in: logits near -30000 (exact to a few
    thousandths in float32) are cut and drawn by the same law as near zero."""
    torch.manual_seed(21)
    logits = LOGITS - 30_000.0
    for controls in (dict(top_k=3), dict(top_p=0.7), dict(min_p=0.3), dict(top_p=0.9, min_p=0.4)):
        tokens = baselines.TRUNCATED[name](rows(logits), 0.7, **controls)
        # the law is shift-invariant: computed from the float32 logits shifted back exactly
        assert_law(tokens, truncated_law(logits.double() + 30_000.0, 0.7, **controls))


def test_the_law_test_catches_a_wrong_truncation():
    """The test has the power to see a wrong cut: top-p 0.7 drawn with top-p 0.8's law fails."""
    torch.manual_seed(2)
    tokens = baselines.kept_token_draw(rows(LOGITS), top_p=0.7)
    with pytest.raises(AssertionError):
        assert_law(tokens, truncated_law(LOGITS, top_p=0.9))


WEIGHTS = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.2, 0.1, 0.2])  # one zero weight: never drawn


def test_inverse_cdf_with_replacement_draws_independent_categories():
    torch.manual_seed(3)
    k = 3
    draws = baselines.inverse_cdf(rows(3.0 * WEIGHTS), k)  # unnormalised weights
    assert draws.shape == (DRAWS, k)
    p = (WEIGHTS.double() / WEIGHTS.double().sum()).tolist()
    joint = torch.tensor([p[a] * p[b] * p[c] for a, b, c in itertools.product(range(7), repeat=3)])
    assert_law((draws[:, 0] * 49 + draws[:, 1] * 7 + draws[:, 2]), joint)


def test_gumbel_top_k_draws_sequential_sampling_without_replacement():
    torch.manual_seed(4)
    k = 3
    draws = baselines.gumbel_top_k(rows(3.0 * WEIGHTS), k)
    assert draws.shape == (DRAWS, k)
    w = WEIGHTS.double().tolist()
    total = sum(w)
    joint = torch.zeros(7**3, dtype=torch.float64)
    for a, b, c in itertools.permutations(range(7), 3):
        joint[a * 49 + b * 7 + c] = w[a] / total * w[b] / (total - w[a]) * w[c] / (total - w[a] - w[b])
    assert_law(draws[:, 0] * 49 + draws[:, 1] * 7 + draws[:, 2], joint)


def test_gumbel_top_k_takes_one_logarithm_a_weight():
    """The exponential race draws the same law with one logarithm a weight, where log w + G
    takes three: the faster torch code for the job."""
    names = calls(lambda: baselines.gumbel_top_k(rows(WEIGHTS, 8), 3))
    assert sum(name in ("log", "log_") for name in names) == 1, names


def test_gumbel_top_k_draws_a_zero_weight_only_when_needed():
    torch.manual_seed(8)
    draws = baselines.gumbel_top_k(rows(WEIGHTS, 2000), len(WEIGHTS))
    assert (draws[:, :-1] != 2).all() and (draws[:, -1] == 2).all()  # index 2 has weight 0
    assert (draws.sort(-1).values == torch.arange(len(WEIGHTS))).all()


def test_gumbel_top_k_draws_a_zero_weight_after_the_tiniest_positive_one():
    """A zero weight's key is infinite: it comes after every positive weight, however small."""
    torch.manual_seed(20)
    draws = baselines.gumbel_top_k(rows(torch.tensor([0.0, 1e-30, 1.0, 1e-20]), 2000), 4)
    assert (draws[:, -1] == 0).all()


PLANNER_LOGITS = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, -0.5])


@pytest.mark.parametrize("select", list(baselines.SELECT))
def test_planner_selection_draws_p_over_its_sum(select):
    torch.manual_seed(5)
    positions, total, stop = baselines.planner_select(rows(PLANNER_LOGITS), select)
    p = torch.sigmoid(PLANNER_LOGITS.double())
    assert positions.shape == (DRAWS, 1) and total.shape == stop.shape == (DRAWS,) and not stop.any()
    assert torch.allclose(total[0].double(), p.sum())
    assert_law(positions[:, 0], p / p.sum())


def test_gumbel_argmax_selection_draws_p_over_its_sum_where_p_underflows():
    """The Gumbel-argmax select works on log sigmoid(logits), not log p: where every p rounds
    to 0 in float32 (logits near -120), its law is still p / sum p, the softmax of the logits."""
    torch.manual_seed(18)
    logits = torch.tensor([-120.0, -121.0, -119.5, -122.5])
    positions, _, stop = baselines.planner_select(rows(logits), "Gumbel-argmax")
    assert stop.all() and (torch.sigmoid(logits) == 0).all()
    assert_law(positions[:, 0], torch.softmax(logits.double(), -1))


def test_each_planner_mask_entry_runs_the_select_and_coin_its_name_says():
    for name, (select, coin) in baselines.PLANNER_MASK.items():
        assert name == f"{select} + {coin}" and select in baselines.SELECT and coin in baselines.COIN


@pytest.mark.parametrize("name", list(baselines.PLANNER_MASK))
def test_planner_mask_coins(name):
    """Each coin z_d is Bernoulli(p_d), independent of the others, and the chosen position is
    always masked: the joint law of (position, z_1, z_2) is tested, and every marginal."""
    torch.manual_seed(6)
    x = torch.arange(7)
    select, coin = baselines.PLANNER_MASK[name]
    positions, _, _, masked, z, count = baselines.planner_select_mask(rows(PLANNER_LOGITS), rows(x), 99, select,
                                                                        coin)
    assert torch.equal(z.gather(1, positions), torch.ones_like(positions, dtype=torch.bool))
    assert torch.equal(masked, torch.where(z, 99, rows(x))) and torch.equal(count, z.sum(-1))
    assert count.dtype == torch.long and z.dtype == torch.bool
    p = torch.sigmoid(PLANNER_LOGITS.double())
    choose = p / p.sum()
    # position d, then the coins of positions 1 and 3 (forced True when chosen)
    def coin(d: int, position: int, value: int) -> float:
        if d == position:
            return float(value)  # the chosen position is always masked
        return float(p[position] if value else 1 - p[position])

    joint = torch.tensor([choose[d] * coin(d, 1, z1) * coin(d, 3, z3)
                          for d in range(7) for z1, z3 in itertools.product((0, 1), repeat=2)])
    assert_law(positions[:, 0] * 4 + z[:, 1].long() * 2 + z[:, 3].long(), joint)
    for coin_fn in baselines.COIN.values():
        freq = coin_fn(rows(p.float())).double().mean(0)
        assert ((freq - p).abs() < 6 * (p * (1 - p) / DRAWS).sqrt() + 1e-9).all()


@pytest.mark.parametrize("coin", list(baselines.COIN))
def test_planner_mask_masks_every_chosen_position(coin):
    """k chosen positions a row are all masked, whatever the coins: with every p = 0 the
    mask is exactly the chosen positions, and the count is k."""
    torch.manual_seed(22)
    logits = torch.full((3, 6), -200.0)
    x = torch.arange(18).view(3, 6)
    positions = torch.tensor([[0, 4], [5, 2], [3, 1]])
    masked, z, count = baselines.planner_mask(logits, x, positions, 99, coin)
    want = torch.zeros(3, 6, dtype=torch.bool).scatter_(1, positions, True)
    assert torch.equal(z, want) and count.tolist() == [2, 2, 2]
    assert torch.equal(masked, torch.where(want, 99, x))


@pytest.mark.parametrize("draw", [baselines.softmax_inverse_cdf, baselines.gumbel_argmax])
def test_gathered_step_draws_the_position_then_its_token(draw):
    """The plain-torch step draws position d with p_d / sum p and its token from the head's
    softmax at d's hidden state; every other position keeps its token."""
    torch.manual_seed(7)
    length, width, vocab = 3, 4, 5
    g = torch.Generator().manual_seed(0)
    planner = torch.tensor([1.0, -0.5, 0.3])
    hidden, weight, bias = torch.randn(length, width, generator=g), torch.randn(vocab, width, generator=g), \
        torch.randn(vocab, generator=g)
    x = torch.full((length,), 7)
    out, masked, stop = baselines.gathered_step(rows(planner), rows(x), rows(hidden), weight, bias, 9, draw)
    changed = out != 7
    assert (changed.sum(1) == 1).all() and not stop.any()
    positions = changed.long().argmax(1)
    assert (masked.gather(1, positions[:, None]) == 9).all()
    p = torch.sigmoid(planner.double())
    token_law = torch.softmax(torch.nn.functional.linear(hidden.double(), weight.double(), bias.double()), -1)
    joint = (p / p.sum())[:, None] * token_law
    assert_law(positions * vocab + out.gather(1, positions[:, None]).squeeze(1), joint.flatten())


@pytest.mark.parametrize("capacity", [3, 9, 16])
def test_sorted_compact_does_compact_fixeds_job(capacity):
    """The sync-free torch compaction returns what ddpd's reference does: the first active rows
    in order, zeros and index -1 past the count, the count (which may exceed capacity)."""
    from ddpd.ops.compact import compact_fixed_reference

    g = torch.Generator().manual_seed(capacity)
    active = torch.rand(16, generator=g) < 0.6
    tensors = (torch.randint(0, 50, (16, 5), generator=g), torch.randn(16, generator=g),
               torch.randn(16, 2, 3, generator=g))
    packed, index, count = baselines.sorted_compact(active, capacity, *tensors)
    want = compact_fixed_reference(active, capacity, *tensors)
    assert index.dtype == count.dtype == torch.long and count.shape == ()
    assert torch.equal(index, want.index) and torch.equal(count, want.count)
    assert all(torch.equal(got, expected) for got, expected in zip(packed, want.tensors))
    rows, source = baselines.nonzero_compact(active, *tensors)
    assert torch.equal(source, active.nonzero().squeeze(1)) and torch.equal(rows[0], tensors[0][active])


DRAWERS = {"multinomial", "searchsorted", "argmax", "bernoulli", "rand_like"}
NAMED_CODE = [  # (table, name, the one drawing call the name promises, the call to run it)
    ("CATEGORICAL", "softmax + torch.multinomial", "multinomial", lambda f: f(rows(LOGITS, 4))),
    ("CATEGORICAL", "Gumbel-argmax", "argmax", lambda f: f(rows(LOGITS, 4))),
    ("CATEGORICAL", "inverse CDF", "searchsorted", lambda f: f(rows(LOGITS, 4))),
    ("TRUNCATED", "masked V + torch.multinomial", "multinomial", lambda f: f(rows(LOGITS, 4), top_k=3)),
    ("TRUNCATED", "kept tokens + inverse CDF", "searchsorted", lambda f: f(rows(LOGITS, 4), top_k=3)),
    ("SELECT", "torch.multinomial", "multinomial", lambda f: f(PLANNER_LOGITS[None], PLANNER_LOGITS[None].sigmoid())),
    ("SELECT", "inverse CDF", "searchsorted", lambda f: f(PLANNER_LOGITS[None], PLANNER_LOGITS[None].sigmoid())),
    ("SELECT", "Gumbel-argmax", "argmax", lambda f: f(PLANNER_LOGITS[None], PLANNER_LOGITS[None].sigmoid())),
    ("COIN", "torch.bernoulli", "bernoulli", lambda f: f(PLANNER_LOGITS[None].sigmoid())),
    ("COIN", "rand < p", "rand_like", lambda f: f(PLANNER_LOGITS[None].sigmoid())),
]


@pytest.mark.parametrize("table, name, drawer, run", NAMED_CODE, ids=[f"{t} {n}" for t, n, _, _ in NAMED_CODE])
def test_each_baseline_runs_the_code_its_name_says(table, name, drawer, run):
    """The benchmarks print these names beside the timings: each entry draws with the call
    its name promises and with no other drawing call."""
    names = set(calls(lambda: run(getattr(baselines, table)[name])))
    assert names & DRAWERS == {drawer}, names


def test_the_sync_free_compaction_sorts_and_never_calls_nonzero():
    active = torch.tensor([False, True, True, False])
    names = calls(lambda: baselines.COMPACT["sort + index_select"](active, 2, torch.arange(4)))
    assert "sort" in names and "nonzero" not in names, names


def test_code_of_another_job_is_kept_apart():
    """nonzero + index_select returns as many rows as are active and no count (and syncs on
    CUDA): less work than compact_fixed's, so it is related code, never a torch candidate."""
    assert "nonzero + index_select" not in baselines.COMPACT
    assert "nonzero + index_select" in baselines.COMPACT_RELATED and baselines.RELATED != baselines.TORCH


def test_a_row_stops_only_when_every_p_is_below_0_01():
    """The planner's stop rule: every p_d < EPS = 0.01; one p at or above it keeps the row going."""
    def logit(p: float) -> float:
        return math.log(p / (1 - p))

    logits = torch.tensor([[logit(0.005)] * 4, [logit(0.015)] * 4, [logit(0.005)] * 3 + [logit(0.5)]])
    for select in baselines.SELECT:
        _, _, stop = baselines.planner_select(logits, select)
        assert stop.tolist() == [True, False, False], select
    assert baselines.EPS == 0.01


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_scaled_logits_are_float32_whatever_the_input_dtype(dtype, temperature):
    logits = torch.tensor([[1.0, -2.0, 0.5]], dtype=dtype)
    y = baselines.scaled(logits, temperature)
    assert y.dtype == torch.float32
    assert torch.equal(y, logits.float() / temperature)


def test_softmax_weights_are_one_at_the_maximum_even_for_huge_logits():
    """exp(y - max y): logits far past float32's exp range still give finite weights."""
    w = baselines.softmax_weights(torch.tensor([[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -1000.0]]), 1.0)
    assert w.dtype == torch.float32
    assert torch.allclose(w, torch.tensor([[1.0, math.exp(-1), 0.0], [1.0, math.exp(-1), 1.0]]))


def test_inverse_cdf_at_a_uniform_of_zero_skips_leading_zero_weights(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda *shape, device=None: torch.zeros(*shape, device=device))
    assert baselines.inverse_cdf(torch.tensor([[0.0, 0.0, 2.0, 1.0]]), 2).tolist() == [[2, 2]]


def test_a_uniform_at_the_top_of_its_range_draws_the_last_category(monkeypatch):
    """u scaled to the total can land on it (rounding, or a generator whose range includes 1):
    a draw gives the last category it keeps, never an index past the vocabulary nor a token
    past a top-k, top-p or min-p cut."""
    monkeypatch.setattr(torch, "rand", lambda *shape, device=None: torch.ones(*shape, device=device))
    assert baselines.inverse_cdf(torch.tensor([[1.0, 2.0, 3.0]]), 2).tolist() == [[2, 2]]
    logits = torch.tensor([[0.5, 2.0, 1.0]])
    assert baselines.kept_token_draw(logits).tolist() == [2]
    # top-k and top-p draw in sorted order: the last kept token is the least likely
    assert baselines.kept_token_draw(logits, top_k=3).tolist() == [0]
    assert baselines.kept_token_draw(logits, top_p=1.0).tolist() == [0]
    # sorted 2.0, 1.0, 0.5: each cut keeps tokens 1 and 2, the last of them token 2
    assert baselines.kept_token_draw(logits, top_k=2).tolist() == [2]
    assert baselines.kept_token_draw(logits, top_p=0.8).tolist() == [2]
    assert baselines.kept_token_draw(logits, top_k=3, min_p=0.3).tolist() == [2]


def test_inverse_cdf_sums_low_precision_weights_in_float32():
    """A bfloat16 running sum past 512 is rounded to a multiple of 4, so most categories there
    would get an empty interval: summed in float32, every one of 600 equal weights is drawn."""
    torch.manual_seed(15)
    draws = baselines.inverse_cdf(torch.ones(1, 600, dtype=torch.bfloat16), 30_000)
    assert torch.bincount(draws[0], minlength=600).min() > 0


def test_inverse_cdf_takes_integer_weights():
    torch.manual_seed(9)
    draws = baselines.inverse_cdf(torch.tensor([[0, 3, 0, 1]]).expand(DRAWS, 4), 1)
    assert draws.dtype == torch.long
    assert_law(draws[:, 0], torch.tensor([0.0, 0.75, 0.0, 0.25], dtype=torch.float64))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_min_p_of_one_keeps_only_the_most_likely_token(name):
    """The token at the maximum is kept: min-p's cut is p >= min_p x max p, not >."""
    torch.manual_seed(10)
    for controls in (dict(min_p=1.0), dict(top_p=0.9, min_p=1.0)):
        tokens = baselines.TRUNCATED[name](rows(LOGITS, 200), **controls)
        assert (tokens == int(LOGITS.argmax())).all(), controls


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_min_p_of_zero_is_no_cut(name):
    """As in ddpd's ops (min_p in [0, 1], 0: off), min_p = 0 keeps every token."""
    torch.manual_seed(23)
    for controls in (dict(), dict(top_k=3), dict(top_p=0.7)):
        tokens = baselines.TRUNCATED[name](rows(LOGITS), min_p=0.0, **controls)
        assert_law(tokens, truncated_law(LOGITS, **controls))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_top_k_of_zero_is_no_cut(name):
    torch.manual_seed(11)
    tokens = baselines.TRUNCATED[name](rows(LOGITS), top_k=0)
    assert_law(tokens, truncated_law(LOGITS))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_top_k_past_the_vocabulary_keeps_every_token(name):
    """As in ddpd's ops and Hugging Face's top-k warper, k >= V is no cut (torch.topk refuses k > V)."""
    torch.manual_seed(12)
    tokens = baselines.TRUNCATED[name](rows(LOGITS), top_k=len(LOGITS) + 3)
    assert_law(tokens, truncated_law(LOGITS))


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_top_p_stops_at_a_token_whose_mass_above_equals_p(name):
    """Probabilities 1/2, 1/4, 1/8, 1/8 are exact in float32: at top_p = 1/2 the second token
    has mass 1/2 above it, so only the first is kept (the cut is mass above >= p)."""
    torch.manual_seed(13)
    logits = torch.tensor([0.0, math.log(0.5), math.log(0.25), math.log(0.25)])
    tokens = baselines.TRUNCATED[name](rows(logits, 200), top_p=0.5)
    assert (tokens == 0).all()


@pytest.mark.parametrize("name", list(baselines.TRUNCATED))
def test_top_p_a_hair_above_a_tokens_mass_above_keeps_it(name):
    """The other side of the boundary: at top_p = 1/2 + 1e-7 the second token's mass above
    (1/2) is below p, so it is kept; the cut is compared in float32, with no tolerance."""
    torch.manual_seed(19)
    logits = torch.tensor([0.0, math.log(0.5), math.log(0.25), math.log(0.25)])
    tokens = baselines.TRUNCATED[name](rows(logits), top_p=0.5 + 1e-7)
    assert_law(tokens, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0], dtype=torch.float64))


def test_a_coin_of_p_zero_never_comes_up_even_at_a_uniform_of_zero(monkeypatch):
    monkeypatch.setattr(torch, "rand_like", lambda p: torch.zeros_like(p))
    p = torch.tensor([[0.0, 0.3, 1.0]])
    assert baselines.COIN["rand < p"](p).tolist() == [[False, True, True]]


def test_nonzero_compact_of_one_active_row_keeps_the_row_dimension():
    tensors = (torch.arange(12).view(4, 3), torch.tensor([0.5, 1.5, 2.5, 3.5]))
    packed, index = baselines.nonzero_compact(torch.tensor([False, False, True, False]), *tensors)
    assert index.tolist() == [2]
    assert packed[0].tolist() == [[6, 7, 8]] and packed[1].tolist() == [2.5]


def test_sorted_compact_of_no_active_row_gives_zeros_and_index_minus_one():
    tensors = (torch.arange(1, 13).view(4, 3), torch.tensor([0.5, 1.5, 2.5, 3.5]))
    packed, index, count = baselines.sorted_compact(torch.zeros(4, dtype=torch.bool), 2, *tensors)
    assert int(count) == 0 and index.tolist() == [-1, -1]
    assert packed[0].tolist() == [[0, 0, 0], [0, 0, 0]] and packed[1].tolist() == [0.0, 0.0]


def test_sorted_compact_keeps_the_active_rows_in_order_in_a_large_batch():
    """The sort of ~active must be stable: an unstable sort reorders the active rows once the
    batch is past a few dozen rows."""
    active = torch.rand(256, generator=torch.Generator().manual_seed(14)) < 0.5
    rows_ = torch.arange(256)
    packed, index, count = baselines.sorted_compact(active, 256, rows_)
    n = int(active.sum())
    assert int(count) == n and torch.equal(index[:n], active.nonzero().squeeze(1))
    assert torch.equal(packed[0][:n], rows_[active])


def test_the_planner_mask_draw_takes_one_sigmoid_of_the_logits():
    """planner_select_mask hands its p to the mask's coins, as ddpd's op computes it once: a
    second sigmoid over [N, D] would time the baseline with a handicap."""
    x = torch.arange(7)
    for select, coin in baselines.PLANNER_MASK.values():
        names = calls(lambda: baselines.planner_select_mask(rows(PLANNER_LOGITS, 8), rows(x, 8), 99, select, coin))
        assert names.count("sigmoid") == 1, (select, coin, names)


def test_min_p_alone_draws_among_the_kept_tokens_without_sorting():
    """min-p alone is a threshold at max y + log(min_p): no sort or topk of the row, which would
    make the kept-token draw slower than it needs to be; top-k takes topk, never a full sort."""
    names = calls(lambda: baselines.kept_token_draw(rows(LOGITS, 8), 0.7, min_p=0.2))
    assert not {"sort", "topk", "argsort"} & set(names), names
    names = calls(lambda: baselines.kept_token_draw(rows(LOGITS, 8), 0.7, top_k=3, top_p=0.8))
    assert "topk" in names and not {"sort", "argsort"} & set(names), names
