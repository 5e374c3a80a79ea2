"""ddpd.ops.sample_categorical: C++ CPU path, Triton kernel (interpreter) and the
torch reference agree token for token; the seeded draws follow softmax(logits / T)."""

import importlib
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy import stats

from ddpd.ops import _dispatch
from ddpd.ops.controls import DrawControls
from ddpd.ops.rng import philox_uniform
from ddpd.ops.sample_categorical import (
    categorical_launch,
    categorical_reference,
    float64_rows,
    masked_logits,
    noise_width,
    prepare_categorical,
    sample_categorical,
    sample_categorical_reference,
    sample_categorical_triton,
)

# An all -inf tile has log-sum-exp log(0) = -inf by design; the Triton interpreter
# computes it with numpy, which warns.
# and inf - inf in the branch a where() does not take.
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
CHI2_MIN_P = 1e-3  # a distribution test fails when its chi-square p-value is below this
sample_categorical_module = importlib.import_module("ddpd.ops.sample_categorical")  # the package exports the op


def triton_draw(logits, temperature=1.0, exclude_ids=(), exclude_per_row=None, seed=None, offset=0,
                row_ids=None, noise=None, **controls):
    """The Triton kernels on CPU tensors (TRITON_INTERPRET=1), arguments as the public op."""
    call = prepare_categorical(logits, temperature, list(exclude_ids), exclude_per_row, controls.get("allowed"),
                               controls.get("top_k"), controls.get("top_p"), controls.get("min_p"),
                               controls.get("return_logprob", False), controls.get("confidence"), seed, offset, None,
                               row_ids, noise)
    x = logits.reshape(-1, logits.shape[-1])
    if x.dtype == torch.float64:  # as the public op hands float64 rows to every kernel
        x = float64_rows(x, call.exclude_ids, call.exclude_per_row, call.allowed)
    return call.finish(*sample_categorical_triton(x, *call.args()))


def chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of the observed token counts against probs (bins with expectation < 5 pooled)."""
    observed = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() / probs.double().sum() * tokens.numel()
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue)


@pytest.mark.parametrize("vocab", [1, 2, 111, 700])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_cpu_and_reference_agree_on_explicit_noise(vocab, dtype):
    g = torch.Generator().manual_seed(vocab)
    logits = (3 * torch.randn(4, vocab, generator=g)).to(dtype)
    noise = torch.rand(4, noise_width(vocab), generator=g).clamp(1e-7, 1 - 1e-7)
    excl = [vocab - 1] if vocab > 1 else []
    per_row = torch.randint(0, vocab, (4,), generator=g) if vocab > 2 else None
    ref = sample_categorical_reference(logits, 0.8, excl, per_row, noise=noise)
    cpu = sample_categorical(logits, 0.8, excl, per_row, noise=noise)
    tri = triton_draw(logits, 0.8, excl, per_row, noise=noise)
    for out in (cpu, tri):
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    if vocab > 2:
        assert not (ref[0] == per_row).any() and not (ref[0] == vocab - 1).any()


def test_triton_single_gpt2_row_matches_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 50257, generator=g)
    ref = sample_categorical_reference(logits, 1.3, [50256], seed=2**64 - 3, offset=2**40 + 9)
    tri = triton_draw(logits, 1.3, [50256], seed=2**64 - 3, offset=2**40 + 9)
    cpu = sample_categorical(logits, 1.3, [50256], seed=2**64 - 3, offset=2**40 + 9)
    assert torch.equal(tri[0], ref[0]) and torch.equal(cpu[0], ref[0]) and bool(ref[1].all())


@pytest.mark.parametrize("vocab", [1, 7, 257, 600])
def test_seeded_paths_read_the_philox_stream(vocab):
    """The seeded kernel draws what the explicit-noise path draws from philox_uniform."""
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([9, 2**33 + 1, 0])
    noise = philox_uniform(77, 5, rows, noise_width(vocab))
    expected = sample_categorical_reference(logits, noise=noise)[0]
    assert torch.equal(triton_draw(logits, seed=77, offset=5, row_ids=rows)[0], expected)
    assert torch.equal(sample_categorical(logits, seed=77, offset=5, row_ids=rows)[0], expected)
    assert torch.equal(sample_categorical_reference(logits, seed=77, offset=5, row_ids=rows)[0], expected)


@pytest.mark.parametrize("vocab,temperature", [(5, 1.0), (600, 0.7)])
def test_seeded_draws_follow_softmax(vocab, temperature):
    n = 200_000
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1] = float("-inf")
    tokens, valid, _, _ = sample_categorical(logits.expand(n, vocab), temperature, [0], seed=123, offset=4,
                                       row_ids=torch.arange(n))
    allowed = logits.clone()
    allowed[0] = float("-inf")
    probs = torch.softmax(allowed / temperature, dim=0)
    assert bool(valid.all()) and not ((tokens == 0) | (tokens == 1)).any()
    assert chi_square_p(tokens, probs) > CHI2_MIN_P


def test_excluded_and_minus_inf_tokens_are_never_drawn():
    n, vocab = 20_000, 300
    logits = torch.zeros(n, vocab)
    logits[:, ::3] = float("-inf")
    logits[:, 5] = float("nan")
    current = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(3))
    tokens, valid, _, _ = sample_categorical(logits, 1.0, [1, 299], current, seed=9)
    assert bool(valid.all())
    assert not ((tokens % 3 == 0) | (tokens == 1) | (tokens == 299) | (tokens == 5) | (tokens == current)).any()
    tri = triton_draw(logits[:8], 1.0, [1, 299], current[:8], seed=9)
    assert torch.equal(tri[0], tokens[:8])


def test_excluded_tokens_at_the_start_of_a_tile_are_never_drawn():
    """Tokens 0 and 256, the first of the first two tiles, hold a logit far above the rest:
    excluded by the shared list or per row, in either combination, they are never drawn,
    and the C++ draws are the reference's."""
    n, vocab = 64, 600
    logits = torch.zeros(n, vocab)
    logits[:, [0, 256]] = 50.0
    for shared, own in ((0, 256), (256, 0)):
        kw = dict(exclude_ids=[shared], exclude_per_row=torch.full((n,), own), seed=4, return_logprob=True)
        tokens, valid, logprob, _ = sample_categorical(logits, **kw)
        assert bool(valid.all()) and not ((tokens == 0) | (tokens == 256)).any()
        assert torch.allclose(logprob, torch.full((n,), -math.log(vocab - 2)))
        ref = sample_categorical_reference(logits, **kw)
        assert torch.equal(tokens, ref.tokens)


def test_a_top_uniform_never_draws_an_excluded_token():
    """float32 rounds the largest Philox uniform to 1.0; an unclamped Gumbel would be
    +inf there and could pick an excluded or -inf token (-inf + inf = NaN)."""
    vocab = 300
    logits = torch.zeros(2, vocab)
    logits[:, 4] = float("-inf")
    noise = torch.full((2, noise_width(vocab)), 0.5)
    noise[:, [4, 9, vocab, vocab + 1]] = 1.0  # tokens 4 (-inf) and 9 (excluded), both tiles
    for tokens, valid, *_ in (sample_categorical(logits, 1.0, [9], noise=noise),
                          sample_categorical_reference(logits, 1.0, [9], noise=noise),
                          triton_draw(logits, 1.0, [9], noise=noise)):
        assert bool(valid.all()) and not ((tokens == 4) | (tokens == 9)).any()


def test_reference_masking_ignores_ids_outside_the_vocabulary():
    """What the kernels do with ids that reach them unchecked (CUDA tensors): an id outside
    [0, V) excludes nothing; -1 is not the last token, and V is no index error."""
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    expected = x.clone()
    expected[:, 2] = float("-inf")
    expected[1, 1] = float("-inf")
    assert torch.equal(masked_logits(x, torch.tensor([-1, 5, 2]), torch.tensor([7, 1])), expected)


def test_rows_with_nothing_drawable_are_flagged_and_in_range():
    vocab = 300
    logits = torch.randn(5, vocab)
    logits[0] = float("-inf")
    logits[1] = float("nan")
    logits[2, :] = float("-inf")
    logits[2, 7] = 0.0  # only token 7 is allowed, and it is excluded per row below
    per_row = torch.tensor([0, 0, 7, 0, 0])
    for tokens, valid, *_ in (sample_categorical(logits, 1.0, None, per_row, seed=1),
                          sample_categorical_reference(logits, 1.0, None, per_row, seed=1),
                          triton_draw(logits, 1.0, (), per_row, seed=1)):
        assert valid.tolist() == [False, False, False, True, True]
        assert tokens[:3].tolist() == [0, 0, 0]
        assert bool(((tokens >= 0) & (tokens < vocab)).all())


def test_plus_inf_logits_are_drawn_uniformly_among_themselves():
    """Ties at +inf: every +inf entry equally likely (tiles weighted by their count)."""
    n, vocab = 30_000, 700
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0))
    logits[:, [10, 450, 451]] = float("inf")  # one in tile 0, two in tile 1
    tokens, valid, _, _ = sample_categorical(logits, 0.5, seed=2)
    assert bool(valid.all()) and set(tokens.unique().tolist()) == {10, 450, 451}
    probs = torch.zeros(vocab)
    probs[[10, 450, 451]] = 1.0
    assert chi_square_p(tokens, probs) > CHI2_MIN_P
    for tokens_, valid_, *_ in (triton_draw(logits[:6], 0.5, seed=2), sample_categorical_reference(logits[:6], 0.5,
                                                                                              seed=2)):
        assert torch.equal(tokens_, tokens[:6]) and bool(valid_.all())
    # planner_select's softmax mode shares the rule; [inf, inf, 0] used to give [4000, 0, 0].
    two = torch.tensor([[float("inf"), float("inf"), 0.0]]).expand(4000, 3)
    assert chi_square_p(sample_categorical(two, seed=5)[0], torch.tensor([1.0, 1.0, 0.0])) > CHI2_MIN_P


@pytest.mark.parametrize("row,expected", [([1e8, 1e8], [0.5, 0.5]), ([1e30, 1e30], [0.5, 0.5]),
                                          ([-3e38, -3e38], [0.5, 0.5]), ([3e38, -3e38], [1.0, 0.0])])
def test_huge_logits_keep_their_noise(row, expected):
    """The noise is added to logits minus their maximum: at 1e8 it used to be absorbed
    (20,000 rows gave [19633, 367]), at 1e30 entirely ([20000, 0])."""
    n = 20_000
    logits = torch.tensor([row]).expand(n, 2)
    tokens, valid, _, _ = sample_categorical(logits, seed=3)
    assert bool(valid.all())
    if expected[1] == 0.0:
        assert not bool(tokens.any())
    else:
        assert chi_square_p(tokens, torch.tensor(expected)) > CHI2_MIN_P
    assert torch.equal(triton_draw(logits[:64], seed=3)[0], tokens[:64])
    assert torch.equal(sample_categorical_reference(logits[:64], seed=3)[0], tokens[:64])


@pytest.mark.parametrize("row,temperature,expected", [
    ([-1e39, -1e39 + 1e30, -2e39], 1.0, [0.0, 1.0, 0.0]),  # was an empty row (valid False, logprob -inf)
    ([1e39, 5e38, 0.0], 1.0, [1.0, 0.0, 0.0]),  # token 1 half the time
    ([3e39, 3e39 - 1e36, 3e39 - 2e36, -3e39], 1e36, None),  # differences of 1e36 at 1e36: softmax of [0, -1, -2]
    ([float("inf"), 1e39, float("nan"), float("inf")], 1.0, [1.0, 0.0, 0.0, 1.0]),  # ties at +inf only
])
def test_float64_logits_beyond_float32_range_keep_their_differences(row, temperature, expected):
    """float64 logits are taken relative to their row maximum in float64 before the float32
    read: a cast first made them +-inf."""
    n = 20_000
    logits = torch.tensor([row], dtype=torch.float64).expand(n, len(row))
    if expected is None:
        expected = ((logits[0] - logits[0].max()) / temperature).softmax(0).tolist()
    tokens, valid, logprob, _ = sample_categorical(logits, temperature, seed=7, return_logprob=True)
    assert bool(valid.all()) and bool(torch.isfinite(logprob).all())
    probs = torch.tensor(expected)
    if int((probs > 0).sum()) == 1:
        assert bool((tokens == probs.argmax()).all()) and bool((logprob == 0).all())
    else:
        assert chi_square_p(tokens, probs) > CHI2_MIN_P
    for path in (sample_categorical_reference, triton_draw):
        assert torch.equal(path(logits[:64], temperature, seed=7)[0], tokens[:64])


def test_float64_row_maximum_is_taken_over_the_drawable_tokens():
    """An excluded, not allowed or NaN logit of 1e39 above the others must not push them to -inf."""
    n, row = 20_000, [1e39, 1.0, 2.0, 1e39]
    logits = torch.tensor([row], dtype=torch.float64).expand(n, 4)
    allowed = torch.tensor([False, True, True, False]).expand(n, 4)
    per_row = torch.full((n,), 3)
    want = torch.tensor([0.0, 1.0, math.e, 0.0])
    for kw in (dict(exclude_ids=[0, 3]), dict(allowed=allowed), dict(exclude_ids=[0], exclude_per_row=per_row)):
        tokens, valid, _, _ = sample_categorical(logits, seed=8, **kw)
        assert bool(valid.all()) and chi_square_p(tokens, want) > CHI2_MIN_P
        assert torch.equal(sample_categorical_reference(logits[:64], seed=8, **_first(kw, 64))[0], tokens[:64])
        assert torch.equal(triton_draw(logits[:64], seed=8, **_first(kw, 64))[0], tokens[:64])
    greedy = sample_categorical(logits, 0.0, exclude_ids=[0, 3], return_logprob=True)
    assert bool((greedy[0] == 2).all()) and torch.allclose(greedy[2], torch.tensor(-math.log1p(math.exp(-1))))


def _first(kw: dict, n: int) -> dict:
    """The keyword arguments of a call restricted to its first n rows."""
    return {k: v[:n] if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def test_huge_logits_over_many_tiles_are_uniform():
    """Equal logits of 1e30 over 3 tiles (V = 600): the tile race as well as the token race."""
    n, vocab = 60_000, 600
    logits = torch.full((n, vocab), 1e30)
    tokens, valid, _, _ = sample_categorical(logits, 2.0, seed=4)
    assert bool(valid.all()) and chi_square_p(tokens, torch.ones(vocab)) > CHI2_MIN_P
    assert chi_square_p(tokens // 256, torch.tensor([256.0, 256.0, 88.0])) > CHI2_MIN_P
    assert torch.equal(triton_draw(logits[:8], 2.0, seed=4)[0], tokens[:8])


def test_tiny_temperatures_keep_their_noise_and_their_maxima():
    """[5, 5, 1] at T = 1e-6: the two maxima half the time each (used to be [11278, 8722, 0]
    in 20,000 rows); T = 1e-300 rounds to 0 in float32 and leaves the maxima only (it used to
    return token 0 for [1, 2] and an invalid row for [-2, -1])."""
    n = 20_000
    logits = torch.tensor([[5.0, 5.0, 1.0]]).expand(n, 3)
    tokens, valid, _, _ = sample_categorical(logits, 1e-6, seed=6)
    assert bool(valid.all()) and chi_square_p(tokens, torch.tensor([1.0, 1.0, 0.0])) > CHI2_MIN_P
    assert torch.equal(triton_draw(logits[:64], 1e-6, seed=6)[0], tokens[:64])
    rows = torch.tensor([[1.0, 2.0], [-2.0, -1.0], [3.0, 3.0 + 2**-21]])
    for temperature in (1e-300, 1e-40):  # below float32's range; a float32 denormal
        for tokens, valid, *_ in (sample_categorical(rows, temperature, seed=1),
                              sample_categorical_reference(rows, temperature, seed=1),
                              triton_draw(rows, temperature, seed=1)):
            assert tokens.tolist() == [1, 1, 1] and bool(valid.all())


def test_a_temperature_below_float32_draws_the_maxima_across_tiles():
    """T = 1e-300 is 0 in the kernels: with several tiles the statistics kernel's (x - m) / T
    was 0 / 0 at each tile's maximum, every tile mass NaN, and the Triton path returned the
    first tile's maximum with a NaN log-probability and confidence."""
    logits = torch.zeros(3, 600)
    logits[0, 599], logits[1, 300], logits[2, [10, 500]] = 5.0, 1.0, 2.0
    draws = [draw(logits, 1e-300, seed=3, return_logprob=True, confidence="prob")
             for draw in (sample_categorical_reference, sample_categorical, triton_draw)]
    tokens, valid, logprob, confidence = draws[0]
    assert tokens[:2].tolist() == [599, 300] and tokens[2] in (10, 500) and bool(valid.all())
    assert torch.allclose(logprob, torch.tensor([0.0, 0.0, -math.log(2)]))
    for got in draws[1:]:
        assert torch.equal(got[0], tokens) and torch.equal(got[1], valid)
        assert torch.allclose(got[2], logprob) and torch.allclose(got[3], confidence)


@pytest.mark.parametrize("temperature", [1e-300, 1e-40])
def test_the_entropy_below_float32_temperatures_leaves_out_the_tiles_off_the_maxima(temperature):
    """T = 1e-300 (0 in float32) or a float32 denormal over several tiles: a tile below the
    row maximum sits at shift -inf and weight 0, so it adds nothing to sum_j p_j log p_j
    (0 times -inf would be NaN). The C++ entropy is the reference's: 0 for one maximum,
    -log 2 for two."""
    logits = torch.zeros(3, 600)
    logits[0, 599], logits[1, 300], logits[2, [10, 500]] = 5.0, 1.0, 2.0
    expected = torch.tensor([0.0, 0.0, -math.log(2)])
    for draw in (sample_categorical_reference, sample_categorical):
        entropy = draw(logits, temperature, seed=3, confidence="entropy").confidence
        assert torch.allclose(entropy, expected), (draw, entropy)


def test_categorical_reference_is_the_law_of_every_path():
    """categorical_reference (raw logits, temperature, noise) draws what every path draws;
    with one tile it reads no tile uniform (noise of width V)."""
    g = torch.Generator().manual_seed(8)
    for vocab in (5, 256, 300, 1000):
        logits = 4 * torch.randn(6, vocab, generator=g)
        logits[0, :] = float("-inf")
        logits[1, 3] = float("nan")
        noise = torch.rand(6, noise_width(vocab), generator=g)
        tokens, valid, _, _ = categorical_reference(logits, 0.7, noise)
        for got in (sample_categorical(logits, 0.7, noise=noise), triton_draw(logits, 0.7, noise=noise)):
            assert torch.equal(got[0], tokens) and torch.equal(got[1], valid)
        assert valid.tolist() == [False] + [True] * 5 and tokens[0] == 0
        if vocab <= 256:
            assert torch.equal(categorical_reference(logits, 0.7, noise[:, :vocab])[0], tokens)


@pytest.mark.parametrize("multiprocessors", [1, 3, 64])
@pytest.mark.parametrize("rows,vocab", [(1, 3000), (3, 1025), (5, 256 * 7)])
def test_split_vocabulary_matches_reference(monkeypatch, multiprocessors, rows, vocab):
    """Any split of the tiles over programs (one tile each, a partial last chunk, whole
    rows) draws the reference's tokens: V not a multiple of the tile, a single row, rows
    with everything excluded, NaN and inf logits, huge logits."""
    monkeypatch.setattr(_dispatch, "multiprocessors", lambda device: multiprocessors)
    g = torch.Generator().manual_seed(rows * vocab + multiprocessors)
    logits = 3 * torch.randn(rows, vocab, generator=g)
    if rows > 1:
        logits[1, :] = float("-inf")
        logits[1, 700] = 1.0  # the only drawable token of row 1, excluded per row below
        logits[-1, 1000] = float("inf")
        logits[-1, 2] = float("nan")
    logits[0, 2000 % vocab] = 1e30
    per_row = torch.randint(0, vocab, (rows,), generator=g)
    if rows > 1:
        per_row[1] = 700
    launch = categorical_launch(rows, vocab, multiprocessors)
    assert launch.splits * launch.tiles_per_split >= -(-vocab // 256) > (launch.splits - 1) * launch.tiles_per_split
    for kwargs in (dict(seed=2**64 - 5, offset=7, row_ids=torch.arange(rows) * 2**31), dict(noise=torch.rand(
            rows, noise_width(vocab), generator=g))):
        ref = sample_categorical_reference(logits, 0.9, [5], per_row, **kwargs)
        tri = triton_draw(logits, 0.9, [5], per_row, **kwargs)
        assert torch.equal(tri[0], ref[0]) and torch.equal(tri[1], ref[1])
        assert torch.equal(sample_categorical(logits, 0.9, [5], per_row, **kwargs)[0], ref[0])
    if rows > 1:
        assert ref[1].tolist()[:2] == [True, False] and ref[0][1] == 0 and ref[0][-1] == 1000


@pytest.mark.parametrize("whole_rows", [False, True])
@pytest.mark.parametrize("vocab", [2 * 256 + 37, 3 * 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tiles_read_through_aligned_windows_keep_every_column(monkeypatch, whole_rows, vocab, dtype):
    """The tile statistics read a row through windows aligned to 16 bytes, each tile's last
    `skew` columns from the next window. Rows starting at every offset from such a boundary
    (9 rows of V = 549: row r at r * 549 logits), whose only drawable tokens are the first
    and last 8 columns of each tile and a few inside it, draw the reference's tokens with its
    log-probabilities and confidences: a column lost or read twice changes a tile's mass.
    With exclusions and the allowed mask too (they read each value's column), one tile a
    program and whole rows a program (two tiles a load, the last tile partial or not)."""
    monkeypatch.setattr(_dispatch, "multiprocessors", lambda device: 1)
    if whole_rows:
        launch = categorical_launch
        monkeypatch.setattr(sample_categorical_module, "categorical_launch",
                            lambda rows, vocab, sms: launch(rows, vocab, sms, programs_per_sm=1))
    rows = 9
    g = torch.Generator().manual_seed(vocab)
    logits = torch.full((rows, vocab), float("-inf"))
    edges = torch.tensor([c for t in range(0, vocab, 256) for c in [*range(t, t + 8), *range(t + 248, t + 256), t + 99]
                          if c < vocab])
    logits[:, edges] = 3 * torch.randn(rows, edges.numel(), generator=g)
    logits[2, 255], logits[5, 256 + 250] = 40.0, float("nan")  # one maximum in a tile's last column
    logits = logits.to(dtype)
    if whole_rows:  # and a view 3 values into its storage: the windows' alignment is then the storage's
        logits = torch.cat([logits.new_zeros(3), logits.flatten()])[3:].view(rows, vocab)
    allowed = torch.rand(rows, vocab, generator=g) < 0.8
    masks = dict(exclude_ids=[255, 256 + 3], exclude_per_row=edges[torch.randint(0, edges.numel(), (rows,),
                                                                                 generator=g)], allowed=allowed)
    for kw in (dict(noise=torch.rand(rows, noise_width(vocab), generator=g).clamp_min(1e-7)),
               dict(seed=11, offset=3, return_logprob=True, confidence="prob"),
               dict(seed=12, confidence="entropy", **masks), dict(seed=13, confidence="margin", **masks)):
        ref = sample_categorical_reference(logits, **kw)
        out = triton_draw(logits, **kw)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1]) and bool(ref[1].all())
        for a, b in zip(out[2:], ref[2:]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_triton_seeded_draws_follow_softmax(monkeypatch):
    """A coarse chi-square of the Triton kernels' own seeded draws (the interpreter runs a
    program in tens of milliseconds, so 96 draws; p > CHI2_MIN_P): the two tiles of V = 300
    at probabilities 0.3 / 0.7, whole rows per program. The law itself rests on the exact
    agreement with the reference (above), whose draws are tested with 1e5 samples."""
    monkeypatch.setattr(_dispatch, "multiprocessors", lambda device: 1)
    n, vocab = 96, 300
    logits = torch.zeros(vocab)
    logits[256:] = torch.log(torch.tensor(0.7 / 0.3 * 256 / 44))
    tokens, valid, _, _ = triton_draw(logits.expand(n, vocab).contiguous(), 1.0, seed=8)
    assert bool(valid.all())
    assert chi_square_p(tokens // 256, torch.tensor([0.3, 0.7])) > CHI2_MIN_P


def test_same_seed_same_tokens_and_batch_composition_invariance():
    logits = torch.randn(16, 1000)
    a = sample_categorical(logits, seed=5, offset=1)[0]
    assert torch.equal(a, sample_categorical(logits, seed=5, offset=1)[0])
    assert not torch.equal(a, sample_categorical(logits, seed=6, offset=1)[0])
    keep = torch.tensor([3, 11, 12])
    assert torch.equal(sample_categorical(logits[keep], seed=5, offset=1, row_ids=keep)[0], a[keep])
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(sample_categorical(logits, generator=g1)[0], sample_categorical(logits, generator=g2)[0])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    rows=st.integers(1, 4),
    vocab=st.integers(1, 600),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    temperature=st.floats(0.05, 5.0),
    scale=st.floats(0.0, 30.0),
    special=st.lists(st.sampled_from(["-inf", "nan", "inf"]), max_size=3),
    seed=st.integers(0, 2**64 - 1),
)
def test_fuzz_cpu_matches_reference(rows, vocab, dtype, temperature, scale, special, seed):
    g = torch.Generator().manual_seed(seed % 2**63)
    logits = scale * torch.randn(rows, vocab, generator=g)
    for kind in special:
        logits[torch.randint(0, rows, (1,), generator=g), torch.randint(0, vocab, (1,), generator=g)] = float(kind)
    logits = logits.to(dtype)
    ref = sample_categorical_reference(logits, temperature, seed=seed, offset=3)
    cpu = sample_categorical(logits, temperature, seed=seed, offset=3)
    assert torch.equal(cpu[0], ref[0]) and torch.equal(cpu[1], ref[1])
    assert bool(((cpu[0] >= 0) & (cpu[0] < vocab)).all())


@settings(max_examples=10, deadline=None, derandomize=True)
@given(rows=st.integers(1, 3), vocab=st.integers(1, 600), seed=st.integers(0, 2**64 - 1),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_fuzz_triton_matches_reference(rows, vocab, seed, dtype):
    logits = (4 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed % 2**63))).to(dtype)
    ref = sample_categorical_reference(logits, 0.9, seed=seed)
    tri = triton_draw(logits, 0.9, seed=seed)
    assert torch.equal(tri[0], ref[0]) and torch.equal(tri[1], ref[1])


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: sample_categorical(x.long(), seed=1), TypeError, "logits must have dtype"),
        (lambda x: sample_categorical(x[0, 0], seed=1), ValueError, r"logits must have shape \[..., V\]"),
        (lambda x: sample_categorical(x.to("meta"), seed=1), ValueError,
         "^logits must be on a cpu or cuda device, got meta$"),
        (lambda x: sample_categorical(x, -1.0, seed=1), ValueError, r"temperature must be in \[0.0, 1e\+36\]"),
        (lambda x: sample_categorical(x, 1e37, seed=1), ValueError, r"temperature must be in \[0.0, 1e\+36\]"),
        (lambda x: sample_categorical(x, float("nan"), seed=1), ValueError, "temperature"),
        (lambda x: sample_categorical(x, 1.0, [10], seed=1), ValueError, r"exclude_ids\[\] must be in \[0, 9\]"),
        (lambda x: sample_categorical(x, 1.0, [-1], seed=1), ValueError, r"exclude_ids\[\] must be in .*, got -1"),
        (lambda x: sample_categorical(x, 1.0, [1.0], seed=1), TypeError, r"exclude_ids\[\] must be ints"),
        (lambda x: sample_categorical(x, 1.0, "ab", seed=1), TypeError, "exclude_ids must be a sequence of ints"),
        (lambda x: sample_categorical(x, 1.0, torch.tensor([1.0]), seed=1), TypeError, "exclude_ids must have dtype"),
        (lambda x: sample_categorical(x, 1.0, torch.tensor([12]), seed=1), ValueError,
         r"exclude_ids values must be in \[0, 10\)"),
        (lambda x: sample_categorical(x, 1.0, None, torch.tensor([0, 10, 0]), seed=1), ValueError,
         "exclude_per_row values"),
        (lambda x: sample_categorical(x, 1.0, None, torch.tensor([0, 1]), seed=1), ValueError,
         r"exclude_per_row must have the leading shape \(3,\)"),
        (lambda x: sample_categorical(x, noise=torch.rand(3, 10)), ValueError, r"noise must have shape \(3, 11\)"),
        (lambda x: sample_categorical(x, noise=torch.rand(1, 3, 11)), ValueError, r"noise must have shape \(3, 11\)"),
        (lambda x: sample_categorical(x, noise=torch.rand(3, 11, dtype=torch.float64)), TypeError,
         "noise must have dtype"),
        (lambda x: sample_categorical(x, 1.0, None, torch.tensor([0, 1, 2], dtype=torch.int32), seed=1), TypeError,
         "exclude_per_row must have dtype"),
        (lambda x: sample_categorical(x, allowed=torch.ones(1, 10, dtype=torch.bool), seed=1), ValueError,
         r"allowed must have shape \(3, 10\)"),
        (lambda x: sample_categorical(x, seed=1, noise=torch.rand(3, 11)), ValueError, "either noise or seed"),
        (lambda x: sample_categorical(x, 0.5, controls=DrawControls(), seed=1), TypeError,
         "got controls and temperature"),
        (lambda x: sample_categorical(x, seed=-1), ValueError, "seed must be an int"),
        (lambda x: sample_categorical(x, offset=3), ValueError, "offset needs an explicit seed"),
        (lambda x: sample_categorical(x, seed=1, row_ids=torch.arange(2)), ValueError,
         r"row_ids must have the leading shape \(3,\)"),
        (lambda x: sample_categorical(x, seed=1, generator=torch.Generator()), ValueError, "either seed or generator"),
        (lambda x: sample_categorical(x.reshape(3, 2, 5), torch.ones(6), seed=1), ValueError,
         r"temperature must be a number, a 0-d tensor or a tensor of the leading shape \(3, 2\)"),
        (lambda x: sample_categorical(x.reshape(3, 2, 5), top_k=torch.ones(2, 3, dtype=torch.long), seed=1),
         ValueError, r"top_k must be a number, a 0-d tensor or a tensor of the leading shape \(3, 2\)"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.randn(3, 10))


def test_a_float_temperature_of_zero_and_top_k_zero_draw_as_documented():
    """temperature=0.0 (a float) is greedy, its logprob at temperature 1; top_k=0 is off, not an error."""
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(0))
    for op in (sample_categorical, sample_categorical_reference):
        draw = op(logits, 0.0, seed=1, return_logprob=True)
        assert torch.equal(draw.tokens, logits.argmax(1))
        torch.testing.assert_close(draw.logprob, logits.log_softmax(1).amax(1))
        assert torch.equal(op(logits, top_k=0, seed=1).tokens, op(logits, seed=1).tokens)


def test_traces_with_fake_tensors_and_passes_opcheck():
    logits = torch.randn(4, 300)

    def step(x):
        tokens, valid, _, _ = sample_categorical(x * 2.0, 0.5, [3], seed=11, offset=2)
        return tokens + valid.long()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(logits), step(logits))
    op = torch.ops.ddpd.sample_categorical.default
    ids = torch.tensor([3])
    torch.library.opcheck(op, (logits, 0.5, None, ids, torch.zeros(4, dtype=torch.long), None, 0, None, 1.0, None,
                               -float("inf"), None, None, 11, 2, None, None, None, False, 0))
    noise = torch.rand(4, noise_width(300))
    torch.library.opcheck(op, (logits, 1.0, torch.tensor([0.5, -1.0, 1.0, 2.0]), None, None,
                               torch.rand(4, 300) < 0.5, 5, torch.tensor([0, 3, 300, 7]), 0.9, None, -2.0, None,
                               noise, 0, 0, None, None, None, True, 2))


def test_a_compiled_call_without_seed_draws_its_counters_from_torch_and_refuses_a_generator():
    """Traced, a call without seed takes (seed, offset) from torch's global generator as
    tensors (an int would need the value on the host); a torch.Generator cannot be traced."""
    logits = 3 * torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(7)
    got = torch.compile(lambda x: sample_categorical(x)[0], fullgraph=True, backend="eager")(logits)
    torch.manual_seed(7)
    seed, offset = torch.randint(0, 2**62, (2,), dtype=torch.int64)
    assert torch.equal(got, sample_categorical(logits, seed=seed, offset=offset)[0])
    g = torch.Generator()
    with pytest.raises(Exception, match="generator= cannot be traced by torch.compile: pass seed="):
        torch.compile(lambda x: sample_categorical(x, generator=g)[0], fullgraph=True, backend="eager")(logits)


@pytest.mark.parametrize("outputs", [dict(), dict(return_logprob=True, confidence="margin")])
def test_every_path_accepts_an_empty_batch(outputs):
    """Zero rows give empty outputs on every path (the references used to fail to reshape
    a tensor of 0 elements into [0, -1, 256])."""
    from ddpd.ops.sample_from_hidden import sample_from_hidden, sample_from_hidden_reference

    for shape in ((0, 300), (2, 0, 700)):
        logits = torch.randn(*shape)
        lead = shape[:-1]
        for out in (sample_categorical(logits, seed=1, **outputs),
                    sample_categorical_reference(logits, seed=1, **outputs),
                    sample_categorical_reference(logits, seed=1, top_p=0.9, **outputs),
                    triton_draw(logits, seed=1, **outputs)):
            asked = [t for t in out if t is not None]
            assert all(t.shape == lead for t in asked) and len(asked) == 2 + len(outputs)
    hidden, weight = torch.randn(0, 8), torch.randn(300, 8)
    for out in (sample_from_hidden(hidden, weight, seed=1, **outputs),
                sample_from_hidden_reference(hidden, weight, seed=1, **outputs),
                sample_from_hidden_reference(hidden, weight, seed=1, top_k=5, **outputs)):
        assert all(t.shape == (0,) for t in out if t is not None)


@pytest.mark.parametrize("logprob, confidence", [(False, 0), (True, 0), (False, 2)])
def test_eager_launches_share_the_outputs_they_do_not_ask_for(logprob, confidence):
    """An eager call passes its kernels one shared empty tensor for an output it does not
    ask for, and draws what the op's launch draws; the op's own outputs are distinct
    tensors (a registered op's outputs may not alias). Both launchers, in the interpreter."""
    from ddpd.ops.sample_from_hidden import sample_from_hidden_triton

    g = torch.Generator().manual_seed(5)
    logits, hidden, weight = torch.randn(3, 700, generator=g), torch.randn(3, 8, generator=g), torch.randn(300, 8)
    call = prepare_categorical(logits, 1.0, None, None, None, None, None, None, logprob, None, 1, 2, None, None, None)
    args = call.args()[:-2] + (logprob, confidence)
    hidden_args = (None, 1.0, None, None, None, None, None, 1, 2, None, None, None, logprob, confidence)
    for draw in (lambda **kw: sample_categorical_triton(logits, *args, **kw),
                 lambda **kw: sample_from_hidden_triton(hidden, weight, *hidden_args, **kw)):
        op, eager = draw(), draw(eager=True)
        assert len({id(t) for t in op}) == 4
        unused = [i for i, asked in ((2, logprob), (3, confidence)) if not asked]
        assert all(eager[i] is _dispatch.unused_output(logits.device) for i in unused)
        assert all(eager[i].numel() == 0 for i in unused) and all(op[i].numel() == 0 for i in unused)
        for i in range(4):
            assert torch.equal(eager[i], op[i])


def test_references_take_float32_noise_only_as_the_ops_do():
    """Uniforms of another dtype are other draws (bfloat16 ones changed 16% of the tokens): the
    references refuse them as the public ops do, and a float16 temperature tensor holding inf
    is refused like the float inf (in float16 the bound 1e36 is itself inf)."""
    logits, width = torch.randn(4, 300), noise_width(300)
    u = torch.rand(4, width, generator=torch.Generator().manual_seed(0)).clamp_min(1e-6)
    for dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool):
        for op in (sample_categorical, sample_categorical_reference):
            with pytest.raises(TypeError, match="noise must have dtype"):
                op(logits, noise=u.to(dtype))
        with pytest.raises(TypeError, match="noise must have dtype"):
            categorical_reference(logits, 1.0, u.to(dtype))
    for temperature in (torch.tensor([float("inf")] * 4, dtype=torch.float16), torch.full((4,), 1e37)):
        for op in (sample_categorical, sample_categorical_reference):
            with pytest.raises(ValueError, match=r"temperature values must be in \[0, 1e\+36\]"):
                op(logits, temperature, seed=0)


def test_explicit_noise_is_range_checked():
    """Uniforms of 0 (a Gumbel variable of -inf) or NaN are refused with a clear error (an
    all-zero noise used to return valid=False for finite logits)."""
    logits = torch.randn(3, 300)
    for bad in (torch.zeros(3, noise_width(300)), torch.full((3, noise_width(300)), float("nan")),
                torch.full((3, noise_width(300)), 1.5)):
        for op in (sample_categorical, sample_categorical_reference):
            with pytest.raises(ValueError, match=r"noise values must be uniforms in \(0, 1\]"):
                op(logits, noise=bad)
    from ddpd.ops import planner_mask, planner_select, planner_select_mask, sample_from_hidden

    with pytest.raises(ValueError, match=r"noise values must be uniforms in \(0, 1\]"):
        sample_from_hidden(torch.randn(3, 4), torch.randn(300, 4), noise=torch.zeros(3, noise_width(300)))
    planner, x, zeros = torch.randn(2, 5), torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5)
    for call in (lambda: planner_select(planner, noise=zeros), lambda: planner_mask(planner, x, None, 9, noise=zeros),
                 lambda: planner_select_mask(planner, x, 9, noise=zeros + 0.5, mask_noise=zeros)):
        with pytest.raises(ValueError, match=r"noise values must be uniforms in \(0, 1\]"):
            call()
    ones = torch.ones(3, noise_width(300))  # the top Philox uniform, 1.0 in float32, is a uniform
    assert torch.equal(sample_categorical(logits, noise=ones)[0], sample_categorical_reference(logits, noise=ones)[0])


def kernel_call(logits, exclude_ids=None, exclude_per_row=None, temperature=1.0, temperature_t=None, logprob=False,
                confidence=0):
    """The C++ kernel itself, past the op's own checks: seeded, no truncation."""
    from ddpd.ops._dispatch import cpu_ops

    return cpu_ops().sample_categorical_cpu(logits, temperature, temperature_t, exclude_ids, exclude_per_row, None, 0,
                                            None, 1.0, None, -math.inf, None, None, 3, 0, None, None, None, logprob,
                                            confidence)


@pytest.mark.parametrize("name", ["exclude_ids", "exclude_per_row"])
@pytest.mark.parametrize("bad", [-1, 10])
def test_the_cpu_kernel_refuses_token_ids_outside_the_vocabulary(name, bad):
    """The kernel's own range check: an id of V or -1 is an error, not a token silently left drawable."""
    for at in range(3):  # the last value is checked too
        ids = torch.tensor([0, 1, 2])
        ids[at] = bad
        with pytest.raises(ValueError, match=rf"{name} values must be in \[0, 10\), got {bad} at {at}"):
            kernel_call(torch.zeros(3, 10), **{name: ids})
    ok = kernel_call(torch.zeros(3, 10), **{name: torch.tensor([0, 9, 1])})
    assert ok[1].all()


@pytest.mark.parametrize("logits", [torch.zeros(10, 3).t(), torch.zeros(10), torch.zeros(2, 3, 4)])
def test_the_cpu_kernel_refuses_logits_it_cannot_read_as_rows(logits):
    with pytest.raises(RuntimeError, match=r"logits must be a contiguous \[N, V\] tensor"):
        kernel_call(logits)


@pytest.mark.parametrize("vocab", [4, 600])
def test_the_cpu_kernel_reads_a_nan_temperature_as_greedy(vocab):
    """A NaN temperature (scalar or per row) draws as the negative one of temperature 0 does: the argmax, with
    its log-probability and entropy at temperature 1."""
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab))
    greedy = kernel_call(logits, temperature=-1.0, logprob=True, confidence=3)
    assert torch.equal(greedy[0], logits.argmax(-1))
    torch.testing.assert_close(greedy[2], logits.log_softmax(-1).max(-1).values)
    nan = float("nan")
    for out in (kernel_call(logits, temperature=nan, logprob=True, confidence=3),
                kernel_call(logits, temperature_t=torch.tensor([nan, -1.0]), logprob=True, confidence=3)):
        for a, b in zip(out, greedy):
            assert torch.equal(a, b)


@pytest.mark.parametrize("vocab", [3, 600])
def test_the_margin_of_a_maximum_held_twice_is_zero(vocab):
    """The runner-up counts with multiplicity: two tokens at the row maximum, in one tile or in two, leave no
    margin, whatever the logits below them."""
    logits = torch.zeros(3, vocab)
    logits[0, :2] = 2.0
    logits[1, 0] = logits[1, vocab - 1] = 2.0
    logits[2, 1] = 2.0
    for op in (sample_categorical, sample_categorical_reference):
        conf = op(logits, confidence="margin", seed=1).confidence
        assert conf[0] == 0 and conf[1] == 0
        assert conf[2] > 0


def test_a_row_with_nothing_drawable_has_minus_inf_log_probability_and_confidences():
    """Over one tile and several: a row whose every token is excluded reports -inf for each output, not NaN."""
    for vocab in (5, 600):
        logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(vocab))
        allowed = torch.ones(2, vocab, dtype=torch.bool)
        allowed[1] = False
        for confidence in ("prob", "margin", "entropy"):
            out = sample_categorical(logits, allowed=allowed, return_logprob=True, confidence=confidence, seed=2)
            assert out.valid.tolist() == [True, False]
            assert out.logprob[1] == -math.inf and out.confidence[1] == -math.inf
            assert out.logprob[0] > -math.inf and out.confidence[0] > -math.inf


def test_a_single_token_vocabulary_is_drawn_with_certainty():
    """V = 1: the one token, log-probability 0, probability and margin 1 (no runner-up), entropy 0,
    on every path (the margin's runner-up is -inf, not a missing column)."""
    logits = torch.tensor([[0.3], [-7.0], [2.0]])
    expected = {"prob": 1.0, "margin": 1.0, "entropy": 0.0}
    for confidence, value in expected.items():
        for draw in (sample_categorical(logits, 0.5, seed=4, return_logprob=True, confidence=confidence),
                     sample_categorical_reference(logits, 0.5, seed=4, return_logprob=True, confidence=confidence),
                     categorical_reference(logits, 0.5, torch.full((3, 1), 0.5), return_logprob=True,
                                           confidence=confidence)):
            assert draw.tokens.tolist() == [0, 0, 0] and bool(draw.valid.all())
            assert draw.logprob.tolist() == [0.0] * 3 and draw.confidence.tolist() == [value] * 3


@pytest.mark.parametrize("shape", [(0, 5), (2, 0, 5), (5,), (1, 1), (2, 3, 4)])
def test_outputs_have_the_leading_shape_and_fixed_dtypes(shape):
    """Tokens int64, valid bool, log-probability and confidence float32 (float64 logits too), each of
    the leading shape: empty for no rows, 0-d for a single row given as [V]."""
    logits = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    dtypes = (torch.int64, torch.bool, torch.float32, torch.float32)
    for op in (sample_categorical, sample_categorical_reference):
        draw = op(logits, 0.9, return_logprob=True, confidence="entropy", seed=6)
        assert [t.dtype for t in draw] == list(dtypes)
        assert all(tuple(t.shape) == shape[:-1] for t in draw)


def test_a_per_row_temperature_below_float32_is_not_greedy():
    """A float64 temperature tensor of 1e-300 (0 once in float32) draws as the number 1e-300 does:
    the tied maxima half the time each, log-probability log(1/2), not the first argmax at T = 1."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0]]).expand(32, 4)
    per_row = torch.full((32,), 1e-300, dtype=torch.float64)
    for op in (sample_categorical, sample_categorical_reference):
        want = op(logits, 1e-300, seed=3, return_logprob=True)
        for temperature in (per_row, torch.tensor(1e-300, dtype=torch.float64)):
            got = op(logits, temperature, seed=3, return_logprob=True)
            assert torch.equal(got.tokens, want.tokens) and torch.equal(got.logprob, want.logprob)
            assert set(got.tokens.tolist()) == {1, 2}
            assert torch.allclose(got.logprob, torch.full((32,), -math.log(2)))


@pytest.mark.parametrize("vocab", [3, 600])
def test_triton_margin_counts_a_maximum_held_twice(vocab):
    """The Triton kernels' runner-up with multiplicity: two maxima in one tile (the tile's
    second value) or in two tiles (the row's top two) leave no margin; a lone maximum leaves
    the reference's margin, its runner-up in the maximum's own tile."""
    logits = torch.zeros(4, vocab)
    logits[0, :2] = 2.0
    logits[1, 0] = logits[1, vocab - 1] = 2.0
    logits[2, 1] = 2.0
    logits[3, 0], logits[3, 1] = 2.0, 1.0
    conf = triton_draw(logits, confidence="margin", seed=1)[3]
    assert conf[0] == 0 and conf[1] == 0 and conf[2] > 0
    ref = sample_categorical_reference(logits, confidence="margin", seed=1).confidence
    torch.testing.assert_close(conf, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab", [5, 600])
def test_triton_rows_with_nothing_drawable_report_minus_inf_outputs(vocab):
    """The Triton kernels, over one tile and several: a row of -inf logits and a row whose
    every token is excluded report -inf log-probability and -inf for each confidence, not
    NaN; a drawable row beside them reports finite values."""
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[1] = float("-inf")
    allowed = torch.ones(3, vocab, dtype=torch.bool)
    allowed[2] = False
    for confidence in ("prob", "margin", "entropy"):
        _, valid, logprob, conf = triton_draw(logits, allowed=allowed, return_logprob=True, confidence=confidence,
                                              seed=2)
        assert valid.tolist() == [True, False, False]
        assert logprob[1:].tolist() == [-math.inf] * 2 and conf[1:].tolist() == [-math.inf] * 2
        assert logprob[0] > -math.inf and conf[0] > -math.inf


@pytest.mark.parametrize("mask", ["exclude_ids", "exclude_per_row", "allowed"])
def test_triton_each_mask_alone_masks_the_tile_statistics(mask):
    """Shared excluded ids, a per-row exclusion or an allowed mask, each alone, masks the tile
    statistics of several tiles: each row's excluded token, far above the rest, gives its
    tile no mass, so the draws and log-probabilities are the reference's."""
    vocab = 600
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, vocab, generator=g)
    per_row = torch.tensor([0, 255, 256, 511, 599, 300])
    logits[torch.arange(6), per_row] = 30.0
    allowed = torch.ones(6, vocab, dtype=torch.bool)
    allowed[torch.arange(6), per_row] = False
    kw = dict(exclude_ids=per_row.tolist(), exclude_per_row=per_row, allowed=allowed)
    kw = {mask: kw[mask]}
    noise = torch.rand(6, noise_width(vocab), generator=g).clamp_min(1e-7)
    ref = sample_categorical_reference(logits, 1.0, noise=noise, return_logprob=True, **kw)
    out = triton_draw(logits, 1.0, noise=noise, return_logprob=True, **kw)
    assert torch.equal(out[0], ref[0]) and bool(out[1].all()) and not bool((out[0] == per_row).any())
    torch.testing.assert_close(out[2], ref[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [50, 256, 600])
def test_triton_confidences_are_the_softmax_ones_in_one_tile_and_several(vocab):
    """Each confidence kind of the Triton kernels, against the softmax of the row at T = 0.7:
    the drawn token's probability, p(top 1) - p(top 2), and sum p log p, over a single tile
    (its own epilogue) and several (the tile records)."""
    logits = 2 * torch.randn(3, vocab, generator=torch.Generator().manual_seed(vocab))
    probs = torch.softmax(logits / 0.7, dim=-1)
    top = probs.topk(2, dim=-1).values
    for confidence in ("prob", "margin", "entropy"):
        tokens, _, _, conf = triton_draw(logits, 0.7, confidence=confidence, seed=4)
        expected = {"prob": probs.gather(1, tokens[:, None])[:, 0], "margin": top[:, 0] - top[:, 1],
                    "entropy": (probs * probs.log()).sum(-1)}[confidence]
        torch.testing.assert_close(conf, expected, rtol=1e-5, atol=1e-5)


def test_triton_reads_strided_exclusions_by_value():
    """exclude_ids and exclude_per_row as views that skip memory (every other entry of a wider
    tensor): the Triton launch masks the tokens they hold, as the reference does, and never
    draws the per-row token that would otherwise win."""
    g = torch.Generator().manual_seed(21)
    logits = torch.randn(6, 40, generator=g)
    ids = torch.arange(0, 40, 2)[::2]  # 0, 4, ..., 36
    per_row = torch.tensor([1, 9, 3, 11, 5, 13, 7, 15, 9, 17, 11, 19])[::2]  # 1, 3, ..., 11
    logits[torch.arange(6), per_row] += 20  # each row's excluded token would win every draw
    assert not ids.is_contiguous() and not per_row.is_contiguous()
    noise = torch.rand(6, noise_width(40), generator=g)
    expected = sample_categorical_reference(logits, 1.0, ids.contiguous(), per_row.contiguous(), noise=noise)
    call = prepare_categorical(logits, 1.0, ids, per_row, None, None, None, None, False, None, None, 0, None, None,
                               noise)
    got = call.finish(*sample_categorical_triton(logits, *call.args()))
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not (got[0] == per_row).any() and not (got[0] % 4 == 0).any()
