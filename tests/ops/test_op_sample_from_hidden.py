"""ddpd.ops.sample_from_hidden: the fused head + draw equals sample_categorical on
the full logits, token for token, on the C++ CPU path, the Triton kernels
(interpreter) and the torch reference; it never materialises the [N, V] logits."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy import stats

from ddpd.ops import _dispatch
from ddpd.ops.sample_categorical import noise_width, sample_categorical
from ddpd.ops.sample_from_hidden import (
    HEAD_CHUNK,
    dot_in_float32,
    head_launch,
    head_logits_triton,
    prepare_hidden,
    sample_from_hidden,
    sample_from_hidden_reference,
    sample_from_hidden_triton,
)
from ddpd.testing.memory import peak_rss_growth
from oracles.devices import MISMATCHES, fake_tensors, moved

# An all -inf tile has log-sum-exp log(0) = -inf by design; the Triton interpreter
# computes it with numpy, which warns.
# and inf - inf in the branch a where() does not take.
pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
CHI2_MIN_P = 1e-3  # a distribution test fails when its chi-square p-value is below this


def head(rows, width, vocab, seed, dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g)
    weight = 2 * torch.randn(vocab, width, generator=g) / width**0.5
    b = torch.randn(vocab, generator=g) if bias else None
    return hidden.to(dtype), weight.to(dtype), (b.to(dtype) if bias else None)


def triton_draw(hidden, weight, bias=None, temperature=1.0, exclude_ids=(), exclude_per_row=None, seed=None,
                offset=0, row_ids=None, noise=None, allowed=None, return_logprob=False, confidence=None):
    """The Triton kernels on CPU tensors (TRITON_INTERPRET=1), arguments as the public op
    (no truncation: that path is sample_categorical's)."""
    call = prepare_hidden(hidden, weight, bias, temperature, list(exclude_ids), exclude_per_row, allowed, None, None,
                          None, return_logprob, confidence, seed, offset, None, row_ids, noise)
    c = call.controls
    seed, offset, seed_t, offset_t = call.counters
    out = sample_from_hidden_triton(hidden.reshape(-1, hidden.shape[-1]), weight, bias, c.temperature,
                                    c.temperature_t, call.exclude_ids, call.exclude_per_row, call.allowed, call.noise,
                                    seed, offset, call.row_ids, seed_t, offset_t, call.logprob, call.confidence)
    return call.finish(*out)


def assert_same(out, ref):
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("rows,width,vocab,multiprocessors", [(1, 8, 1, 1), (3, 16, 2, 1), (5, 24, 111, 4),
                                                              (17, 40, 700, 1), (2, 33, 600, 4), (33, 8, 520, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paths_agree_on_explicit_noise_and_seed(monkeypatch, rows, width, vocab, multiprocessors, dtype):
    """Row blocks of 16 and 32 (a partial last one), one or several tiles per program, a
    single tile (no finish pass), V not a multiple of the tile."""
    monkeypatch.setattr(_dispatch, "multiprocessors", lambda device: multiprocessors)
    hidden, weight, bias = head(rows, width, vocab, vocab + rows, dtype)
    noise = torch.rand(rows, noise_width(vocab), generator=torch.Generator().manual_seed(rows))
    excl = [0] if vocab > 1 else []
    per_row = torch.randint(0, vocab, (rows,)) if vocab > 2 else None
    for kw in (dict(noise=noise), dict(seed=2**64 - 9, offset=2**33, row_ids=torch.arange(rows) * 3 + 2**40)):
        ref = sample_from_hidden_reference(hidden, weight, bias, 0.7, excl, per_row, **kw)
        assert_same(sample_from_hidden(hidden, weight, bias, 0.7, excl, per_row, **kw), ref)
        assert_same(triton_draw(hidden, weight, bias, 0.7, excl, per_row, **kw), ref)


def test_a_last_split_of_fewer_tiles_stays_inside_the_vocabulary(monkeypatch):
    """Three tiles in two splits of two: the second split holds one tile and must not run a
    fourth, whose statistics would land in the next row's first record. Every row draws the
    reference's token, log-probability and confidence."""
    monkeypatch.setattr(_dispatch, "multiprocessors", lambda device: 1)
    launch = head_launch(33, 8, 600, 2, 1)
    assert launch.tiles_per_split == 2 and launch.tiles_grid == (2, 2)
    hidden, weight, bias = head(33, 8, 600, 7, torch.bfloat16)
    kw = dict(seed=4, return_logprob=True, confidence="prob")
    ref = sample_from_hidden_reference(hidden, weight, bias, **kw)
    out = triton_draw(hidden, weight, bias, **kw)
    assert_same(out, ref)
    for got, want in zip(out[2:], ref[2:]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_tiny_temperature_beside_ordinary_ones_in_one_row_block():
    """Per-row temperatures, one below float32's range (0 in the kernels) beside 1 and 0.5 in
    the same row block over several tiles: the block's tile statistics avoid (x - m) / T, 0 / 0
    at the maximum, so the tiny row draws one of its two maxima with log-probability
    log 1/2 and the others the reference's."""
    bias = torch.zeros(600)
    bias[[10, 500]] = 2.0
    hidden, weight = torch.zeros(3, 3), torch.zeros(600, 3)
    temperature = torch.tensor([1e-300, 1.0, 0.5], dtype=torch.float64)
    kw = dict(seed=1, return_logprob=True, confidence="prob")
    ref = sample_from_hidden_reference(hidden, weight, bias, temperature, **kw)
    out = triton_draw(hidden, weight, bias, temperature, **kw)
    assert int(ref[0][0]) in (10, 500) and ref[2][0] == pytest.approx(-math.log(2))
    assert_same(out, ref)
    for got, want in zip(out[2:], ref[2:]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gpt2_vocabulary_single_row():
    hidden, weight, _ = head(2, 8, 50257, 0)
    ref = sample_from_hidden_reference(hidden, weight, seed=5, offset=1)
    assert_same(sample_from_hidden(hidden, weight, seed=5, offset=1), ref)
    assert_same(triton_draw(hidden[:1], weight, seed=5, offset=1), (ref[0][:1], ref[1][:1], None, None))


def test_equals_sample_categorical_on_the_logits():
    hidden, weight, bias = head(40, 32, 5000, 1)
    logits = hidden @ weight.T + bias
    fused = sample_from_hidden(hidden, weight, bias, 1.2, [7], seed=11, offset=6)
    assert_same(fused, sample_categorical(logits, 1.2, [7], seed=11, offset=6))


def test_truncated_draws_over_several_head_chunks():
    """A truncating call on CPU builds the logits HEAD_CHUNK weight rows at a time: past one
    chunk, with a bias, its draw and log-probability are sample_categorical's on the logits."""
    hidden, weight, bias = head(8, 16, HEAD_CHUNK + 300, 13)
    kw = dict(top_k=HEAD_CHUNK + 299, seed=4, offset=2, return_logprob=True)
    fused = sample_from_hidden(hidden, weight, bias, 1.0, **kw)
    want = sample_categorical(hidden @ weight.T + bias, 1.0, **kw)
    assert_same(fused, want)
    torch.testing.assert_close(fused.logprob, want.logprob, rtol=1e-5, atol=1e-5)


def test_seeded_draws_follow_softmax():
    n, vocab = 100_000, 600
    hidden, weight, bias = head(1, 16, vocab, 2)
    tokens, valid, _, _ = sample_from_hidden(hidden.expand(n, -1), weight, bias, 0.8, [3], seed=31)
    logits = (hidden @ weight.T + bias)[0] / 0.8
    logits[3] = float("-inf")
    probs = torch.softmax(logits.double(), 0)
    observed = torch.bincount(tokens, minlength=vocab).double()
    expected = probs * n
    pooled = expected < 5
    obs = torch.cat([observed[~pooled], observed[pooled].sum()[None]])
    exp = torch.cat([expected[~pooled], expected[pooled].sum()[None]])
    assert bool(valid.all()) and not (tokens == 3).any()
    assert stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > CHI2_MIN_P


def test_nothing_drawable_and_non_finite_head():
    hidden, weight, bias = head(4, 8, 300, 3)
    bias[:] = float("-inf")
    bias[10] = 0.0
    per_row = torch.tensor([10, 0, 0, 10])
    hidden[1, 0] = float("nan")  # every logit of row 1 is NaN
    for tokens, valid, *_ in (sample_from_hidden(hidden, weight, bias, 1.0, None, per_row, seed=1),
                          sample_from_hidden_reference(hidden, weight, bias, 1.0, None, per_row, seed=1),
                          triton_draw(hidden, weight, bias, 1.0, (), per_row, seed=1)):
        assert valid.tolist() == [False, False, True, False]
        assert tokens.tolist() == [0, 0, 10, 0]


def test_a_one_tile_vocabulary_with_nothing_drawable_is_invalid_on_the_triton_path():
    """With one tile the kernel draws the token itself: a row with no allowed token is
    invalid and draws token 0 there too, as in the reference."""
    hidden, weight, bias = head(3, 8, 28, 5)
    allowed = torch.ones(3, 28, dtype=torch.bool)
    allowed[1] = False
    ref = sample_from_hidden_reference(hidden, weight, bias, 1.0, seed=1, allowed=allowed)
    out = triton_draw(hidden, weight, bias, seed=1, allowed=allowed)
    assert ref[1].tolist() == [True, False, True] and ref[0][1] == 0
    assert_same(out, ref)


def test_a_first_row_with_nothing_drawable_stays_invalid_beside_a_partial_row_block():
    """One tile, three rows in a block of 16: the block's lanes past the last row read row 0's
    controls and a hidden state of zeros (logits = bias, drawable). Row 0, whose logits are
    all NaN, stays invalid with token 0 and -inf outputs: the lanes past the batch store
    nothing into its slots."""
    hidden, weight, bias = head(3, 8, 28, 5)
    hidden[0, 0] = float("nan")
    kw = dict(seed=1, return_logprob=True, confidence="prob")
    ref = sample_from_hidden_reference(hidden, weight, bias, **kw)
    out = triton_draw(hidden, weight, bias, **kw)
    assert ref[1].tolist() == [False, True, True] and ref[0][0] == 0
    assert_same(out, ref)
    for got, want in zip(out[2:], ref[2:]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab", [28, 600])
def test_nan_logits_of_a_few_tokens_read_as_minus_inf(vocab):
    """Rows where only some logits are NaN (NaN weights): those tokens have probability 0 on
    the Triton path as in the reference, and the draw, the log-probability and the margin and
    entropy confidences are the reference's, in one tile and in several."""
    hidden, weight, bias = head(5, 16, vocab, 4)
    weight[[1, 7, 300 % vocab]] = float("nan")
    for kw in (dict(temperature=1.0, return_logprob=True, confidence="margin"),
               dict(temperature=0.0, confidence="entropy")):
        ref = sample_from_hidden_reference(hidden, weight, bias, seed=3, **kw)
        assert not bool(torch.isin(ref[0], torch.tensor([1, 7, 300 % vocab])).any())
        out = triton_draw(hidden, weight, bias, seed=3, **kw)
        assert_same(out, ref)
        for got, want in zip(out[2:], ref[2:]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_head_that_overflows_float32_never_draws_a_token_the_race_did_not_see():
    """|h . w| > 3.4e38: the C++ path's recomputed winning tile can be NaN (its partial sums
    reach +inf and -inf) where the race saw an infinity; such a row comes back invalid, with
    -inf outputs, never valid with a token whose logit is NaN. Other rows draw the reference's."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 16, generator=g), torch.randn(300, 16, generator=g) * 1e20
    hidden[:3] *= 1e20  # rows 3 and 4 stay within float32
    bias = torch.randn(300, generator=g)
    got = sample_from_hidden(hidden, weight, bias, seed=1, return_logprob=True)
    want = sample_from_hidden_reference(hidden, weight, bias, seed=1, return_logprob=True)
    lost = ~got.valid
    assert lost.any() and got.valid[3:].all()  # the case this test is about, beside rows it does not touch
    assert (got.logprob[lost] == float("-inf")).all()
    assert torch.equal(got.tokens[~lost], want.tokens[~lost])
    assert torch.isfinite(got.logprob[~lost]).all()


@pytest.mark.parametrize("confidence", ["prob", "margin", "entropy"])
def test_a_row_the_overflowing_head_lost_has_minus_inf_confidences(confidence):
    """The rows of a head beyond float32 that come back invalid (their recomputed winning
    tile held no drawable logit) report -inf confidences, as a row with nothing drawable
    does, not those of the tile statistics the race read."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 16, generator=g) * 1e20, torch.randn(300, 16, generator=g) * 1e20
    bias = torch.randn(300, generator=g)
    got = sample_from_hidden(hidden, weight, bias, seed=1, return_logprob=True, confidence=confidence)
    lost = ~got.valid
    assert lost.any()  # the case this test is about
    assert (got.logprob[lost] == float("-inf")).all() and (got.confidence[lost] == float("-inf")).all()


def test_exact_at_any_scale_and_uniform_among_plus_inf():
    """Huge logits keep their noise, +inf logits tie uniformly, a temperature below
    float32's range draws the maxima: on the C++ path (chi-square, p > CHI2_MIN_P) and in
    the Triton kernels (the same tokens as the reference)."""
    n, vocab = 20_000, 300
    hidden, weight = torch.zeros(n, 4), torch.zeros(vocab, 4)
    cases = [(1e30, [3, 290], 1.0), (float("inf"), [3, 4, 290], 1.0), (1e8, [5, 6], 1e-6)]
    for value, hot, temperature in cases:
        bias = torch.full((vocab,), -1.0)
        bias[hot] = value
        tokens, valid, _, _ = sample_from_hidden(hidden, weight, bias, temperature, seed=2)
        probs = torch.zeros(vocab)
        probs[hot] = 1.0
        observed = torch.bincount(tokens, minlength=vocab)
        assert bool(valid.all()) and observed[probs == 0].sum() == 0
        assert stats.chisquare(observed[hot].double().numpy()).pvalue > CHI2_MIN_P
        ref = sample_from_hidden_reference(hidden[:20], weight, bias, temperature, seed=2)
        assert torch.equal(ref[0], tokens[:20])
        assert_same(triton_draw(hidden[:20], weight, bias, temperature, seed=2), ref)
    bias = torch.tensor([1.0, 2.0, -1.0, 2.0 + 2**-21])
    for out in (sample_from_hidden(torch.zeros(2, 3), torch.zeros(4, 3), bias, 1e-300, seed=1),
                triton_draw(torch.zeros(2, 3), torch.zeros(4, 3), bias, 1e-300, seed=1)):
        assert out[0].tolist() == [3, 3] and bool(out[1].all())
    # several tiles: each tile's (x - m) / T was 0 / 0 at its maximum, a NaN log-probability
    bias = torch.zeros(600)
    bias[[10, 500]] = 2.0
    for out in (sample_from_hidden(torch.zeros(2, 3), torch.zeros(600, 3), bias, 1e-300, seed=1,
                                   return_logprob=True, confidence="prob"),
                triton_draw(torch.zeros(2, 3), torch.zeros(600, 3), bias, 1e-300, seed=1, return_logprob=True,
                            confidence="prob")):
        assert set(out[0].tolist()) <= {10, 500} and bool(out[1].all())
        assert torch.allclose(out[2], torch.full((2,), -math.log(2))) and torch.allclose(out[3], torch.full((2,), 0.5))


@pytest.mark.parametrize("temperature", [1e-6, 1e-30])
def test_log_probability_and_confidence_at_tiny_temperatures(temperature):
    """At a temperature near 0 the drawn token is its row's maximum: log-probability 0,
    probability 1, on every path. The C++ path computes the winning tile's logits a second
    time, in a matmul of another shape that may round them differently in the last bit;
    divided by the temperature, that difference once gave log-probabilities far from 0,
    some of them positive (fuzzing: up to 6e22; here, before the fix, about half the rows
    off by multiples of 0.48 at 1e-6)."""
    kwargs = dict(return_logprob=True, confidence="prob", seed=3, offset=1)
    for seed in range(4):
        hidden, weight, _ = head(8, 64, 600, seed=seed, bias=False)
        ref = sample_from_hidden_reference(hidden, weight, None, temperature, **kwargs)
        paths = [sample_from_hidden(hidden, weight, None, temperature, **kwargs)]
        if seed == 0:
            paths.append(triton_draw(hidden, weight, None, temperature, **kwargs))
        for out in paths:
            assert torch.equal(out[0], ref[0]) and bool(out[1].all())
            assert out[2].tolist() == [0.0] * 8 and out[3].tolist() == [1.0] * 8


@pytest.mark.parametrize("confidence", ["prob", "margin", "entropy"])
def test_statistics_of_the_kernels_match_the_reference(confidence):
    """Log-probability and confidence of the Triton kernels against the reference, with
    exclusions, allowed masks and per-row temperatures (a greedy row among them), over
    several tiles."""
    hidden, weight, bias = head(6, 24, 900, 8)
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3, 0.5, 2.0])
    allowed = torch.rand(6, 900, generator=torch.Generator().manual_seed(1)) < 0.8
    kw = dict(return_logprob=True, confidence=confidence, seed=9, offset=4, allowed=allowed)
    ref = sample_from_hidden_reference(hidden, weight, bias, temperature, [2], **kw)
    out = triton_draw(hidden, weight, bias, temperature, [2], **kw)
    assert_same(out, ref)
    torch.testing.assert_close(out[2], ref[2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out[3], ref[3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vocab", [28, 600])
def test_greedy_rows_take_the_first_of_tied_maxima(vocab):
    """Greedy rows whose largest logit is shared by several tokens draw the first of them on
    the Triton path as in the reference, in a vocabulary of one tile (drawn in the GEMM's
    epilogue) and of several (drawn by the finish kernel). Small integers: every product
    and sum is exact, so the ties are exact on every path."""
    g = torch.Generator().manual_seed(vocab)
    hidden = torch.randint(-2, 3, (8, 16), generator=g).float()
    weight = torch.randint(-2, 3, (7, 16), generator=g).float()[torch.arange(vocab) % 7]  # seven rows, repeated
    logits = hidden @ weight.T
    assert bool(((logits == logits.amax(1, keepdim=True)).sum(1) > 1).all())  # every row ties at its top
    ref = sample_from_hidden_reference(hidden, weight, None, 0.0, seed=1)
    assert torch.equal(ref[0], logits.argmax(1))  # torch's argmax: the first maximum
    assert_same(triton_draw(hidden, weight, None, 0.0, seed=1), ref)


@pytest.mark.parametrize("confidence", [None, "prob", "margin", "entropy"])
def test_one_tile_vocabulary_draws_from_its_statistics_logits(confidence):
    """A vocabulary of one tile (text8's 28 symbols): the C++ path draws from the logits of
    its statistics pass; tokens, validity, log-probability and confidence as the reference,
    with a greedy row, an excluded token and a row with nothing allowed."""
    hidden, weight, bias = head(6, 24, 28, 12)
    temperature = torch.tensor([0.7, 1.0, 0.0, 1.3, 0.5, 2.0])
    allowed = torch.rand(6, 28, generator=torch.Generator().manual_seed(2)) < 0.7
    allowed[4] = False
    kw = dict(return_logprob=True, confidence=confidence, seed=3, offset=8, allowed=allowed)
    out = sample_from_hidden(hidden, weight, bias, temperature, [5], **kw)
    ref = sample_from_hidden_reference(hidden, weight, bias, temperature, [5], **kw)
    assert_same(out, ref)
    assert out[1].tolist() == [True, True, True, True, False, True]
    for got, want in zip(out[2:], ref[2:]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    plain = sample_from_hidden(hidden, weight, bias, temperature, [5], seed=3, offset=8, allowed=allowed)
    assert_same(plain, ref)  # the draw that reads only the tile's maximum


def test_determinism_and_batch_composition_invariance():
    hidden, weight, bias = head(10, 16, 1000, 4)
    a = sample_from_hidden(hidden, weight, bias, seed=2, offset=9)[0]
    assert torch.equal(a, sample_from_hidden(hidden, weight, bias, seed=2, offset=9)[0])
    keep = torch.tensor([1, 8])
    assert torch.equal(sample_from_hidden(hidden[keep], weight, bias, seed=2, offset=9, row_ids=keep)[0], a[keep])


def test_peak_memory_stays_far_below_the_logits():
    hidden, weight, _ = head(2048, 32, 50257, 6, bias=False)
    sample_from_hidden(hidden[:2], weight, seed=1)  # load the extension first
    growth = peak_rss_growth(lambda: sample_from_hidden(hidden, weight, seed=1))
    if growth is None:
        pytest.skip("needs Linux /proc and glibc")
    logits_bytes = 2048 * 50257 * 4  # 412 MB
    assert growth < logits_bytes / 4, f"peak resident memory grew by {growth / 2**20:.0f} MiB"


@settings(max_examples=25, deadline=None, derandomize=True)
@given(rows=st.integers(1, 5), width=st.integers(1, 40), vocab=st.integers(1, 5000), bias=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**64 - 1))
def test_fuzz_cpu_matches_reference(rows, width, vocab, bias, dtype, seed):
    hidden, weight, b = head(rows, width, vocab, seed % 2**63, dtype, bias)
    assert_same(sample_from_hidden(hidden, weight, b, 0.9, seed=seed),
                sample_from_hidden_reference(hidden, weight, b, 0.9, seed=seed))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda op, h, w, b: op(h, w[:, :4], seed=1), ValueError, r"weight must have shape \[V, 8\]"),
        (lambda op, h, w, b: op(h, w.long(), seed=1), TypeError, "weight must have dtype"),
        (lambda op, h, w, b: op(h[0, 0], w, seed=1), ValueError, r"hidden must have shape \[..., H\]"),
        (lambda op, h, w, b: op(h, w[0], seed=1), ValueError, r"weight must be 2-D, got shape \(8,\)"),
        (lambda op, h, w, b: op(h, w, b[None], seed=1), ValueError, r"bias must be 1-D, got shape \(1, 20\)"),
        (lambda op, h, w, b: op(h, w, b[:5], seed=1), ValueError, r"bias must have shape \(20,\)"),
        (lambda op, h, w, b: op(h, w, b.long(), seed=1), TypeError, "bias must have dtype"),
        (lambda op, h, w, b: op(h, w[:0], seed=1), ValueError, r"V \(weight.shape\[0\]\) must be in \[1, "),
        (lambda op, h, w, b: op(h, w, b, -0.5, seed=1), ValueError, "temperature"),
        (lambda op, h, w, b: op(h, w, b, 1.0, [20], seed=1), ValueError, "exclude_ids"),
        (lambda op, h, w, b: op(h, w, b, 1.0, torch.tensor([20]), seed=1), ValueError,
         r"exclude_ids values must be in \[0, 20\)"),
        (lambda op, h, w, b: op(h, w, b, 1.0, None, torch.tensor([0, 20, 1]), seed=1), ValueError,
         "exclude_per_row"),
        (lambda op, h, w, b: op(h, w, noise=torch.rand(3, 20)), ValueError, r"noise must have shape"),
        (lambda op, h, w, b: op(h, w, noise=torch.zeros(3, noise_width(20))), ValueError,
         r"noise values must be uniforms in \(0, 1\]"),
    ],
)
@pytest.mark.parametrize("op", [sample_from_hidden, sample_from_hidden_reference])
def test_bad_arguments_raise_clear_errors(op, call, error, match):
    """Each bad argument gets the same named error from the op and from its reference."""
    hidden, weight, bias = head(3, 8, 20, 0)
    with pytest.raises(error, match=match):
        call(op, hidden, weight, bias)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["weight", "bias"])
@pytest.mark.parametrize("op", [sample_from_hidden, sample_from_hidden_reference])
def test_a_head_on_another_device_than_hidden_is_refused(op, name, like, other):
    """weight or bias on another device than hidden: the op's own ValueError, naming the
    argument and both devices (fake tensors stand in for a GPU)."""
    with fake_tensors(like):
        head = dict(weight=torch.randn(4, 3), bias=torch.zeros(4))
        head[name] = moved(head[name], other)
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of hidden \({like}\), got {other}$"):
            op(torch.randn(2, 3), seed=1, **head)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name, value", [
    ("temperature", torch.ones(2)), ("top_k", torch.ones(2, dtype=torch.long)), ("top_p", torch.ones(2)),
    ("min_p", torch.zeros(2)), ("exclude_ids", torch.zeros(1, dtype=torch.long)),
    ("exclude_per_row", torch.zeros(2, dtype=torch.long)), ("allowed", torch.ones(2, 4, dtype=torch.bool)),
])
@pytest.mark.parametrize("op", [sample_from_hidden, sample_from_hidden_reference])
def test_controls_and_masks_on_another_device_name_hidden(op, name, value, like, other):
    """A per-row control or a token mask on another device than hidden: the error names hidden,
    the argument the op takes (it said "the device of logits", which it has none of)."""
    with fake_tensors(like):
        hidden, weight = torch.randn(2, 3), torch.randn(4, 3)
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of hidden \({like}\), got {other}$"):
            op(hidden, weight, seed=1, **{name: moved(value, other)})


def test_traces_with_fake_tensors_and_passes_opcheck():
    hidden, weight, bias = head(3, 8, 300, 5)

    def denoise(h):
        return sample_from_hidden(torch.tanh(h), weight, bias, 0.9, [2], seed=3, offset=1)

    compiled = torch.compile(denoise, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(hidden)[:2], denoise(hidden)[:2]):
        assert torch.equal(a, b)
    op = torch.ops.ddpd.sample_from_hidden.default
    torch.library.opcheck(op, (hidden, weight, bias, 0.9, None, torch.tensor([2]), None, None, None, 3, 1, None, None,
                               None, False, 0))
    torch.library.opcheck(op, (hidden, weight, None, 1.0, torch.tensor([0.5, -1.0, 2.0]), None,
                               torch.tensor([0, 1, 2]), torch.rand(3, 300) < 0.7, None, 3, 1, None, None, None,
                               True, 3))
    torch.library.opcheck(torch.ops.ddpd.head_logits.default, (hidden, weight, bias))


@pytest.mark.slow
def test_fused_step_compiles_with_inductor():
    """A whole fused sampler step through torch.compile's default (inductor) backend."""
    from ddpd.ops.planner_select import planner_select_mask

    hidden, weight, bias = head(4 * 16, 8, 300, 7)
    hidden = hidden.view(4, 16, 8)
    planner_logits = torch.randn(4, 16)
    x = torch.randint(0, 300, (4, 16))

    def step(logits, tokens, states):
        positions, _, stop, masked, _, _ = planner_select_mask(logits, tokens, 300, 1, seed=1, offset=4)
        chosen = states.gather(1, positions[:, :, None].expand(-1, -1, states.shape[2])).squeeze(1)
        drawn, _, _, _ = sample_from_hidden(chosen, weight, bias, seed=1, offset=6)
        return tokens.scatter(1, positions, drawn[:, None]), masked, stop

    compiled = torch.compile(step, fullgraph=True)
    for a, b in zip(compiled(planner_logits, x, hidden), step(planner_logits, x, hidden)):
        assert torch.equal(a, b)


def test_an_empty_hidden_width_draws_from_the_bias():
    """H = 0: the logits are the bias alone; both paths agree for any leading shape (the
    reference's reshape(-1, 0) used to fail on a leading shape of two dimensions)."""
    weight, bias = torch.randn(5, 0), torch.randn(5)
    for hidden in (torch.randn(2, 0), torch.randn(2, 3, 0)):
        got = sample_from_hidden(hidden, weight, bias, seed=1, return_logprob=True)
        want = sample_from_hidden_reference(hidden, weight, bias, seed=1, return_logprob=True)
        assert torch.equal(got[0], want[0]) and torch.allclose(got[2], want[2])


def test_sparse_tensors_are_refused_by_name():
    dense = torch.randn(2, 8)
    with pytest.raises(TypeError, match="hidden must be a dense tensor, got layout torch.sparse_coo"):
        sample_from_hidden(dense.to_sparse(), torch.randn(5, 8), None, seed=1)
    with pytest.raises(TypeError, match="weight must be a dense tensor"):
        sample_from_hidden(dense, torch.randn(5, 8).to_sparse(), None, seed=1)


def test_no_rows_draw_nothing_on_the_triton_path():
    """Zero rows (every row of a batch finished): the kernels' path returns empty outputs."""
    hidden, weight, bias = head(0, 8, 300, 0)
    out = triton_draw(hidden, weight, bias, seed=1, return_logprob=True, confidence="prob")
    assert [o.shape for o in out] == [(0,)] * 4


@pytest.mark.parametrize("rows,width,vocab", [(0, 8, 300), (1, 8, 1), (5, 24, 700), (40, 16, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_logits_kernel_is_the_matmul(rows, width, vocab, dtype):
    """The logits GEMM of the truncated draws on CUDA, in the interpreter: every (row block,
    tile) pair of its one-axis grid, partial blocks and tiles included, equals the float32
    matmul of the same inputs."""
    g = torch.Generator().manual_seed(rows)
    hidden, weight = torch.randn(rows, width, generator=g).to(dtype), torch.randn(vocab, width, generator=g).to(dtype)
    bias = torch.randn(vocab, generator=g)
    expected = hidden.float() @ weight.float().T + bias
    torch.testing.assert_close(head_logits_triton(hidden, weight, bias), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head_logits_triton(hidden, weight, None), expected - bias, rtol=1e-5, atol=1e-5)


def test_a_non_finite_weight_spoils_only_its_own_tokens_logit():
    """A width (24) that fills no slice of the GEMM's H loop (32): the slice's lanes past the
    width read as 0 in both operands, so the +inf that opens the next weight row does not
    turn the row before it into 0 * inf = NaN, in the logits kernel and in the draws."""
    hidden, weight, bias = head(4, 24, 300, 5)
    weight[2, 0] = float("inf")
    expected = hidden @ weight.T + bias
    got = head_logits_triton(hidden, weight, bias)
    keep = torch.arange(300) != 2
    assert bool(torch.isfinite(got[:, keep]).all())
    torch.testing.assert_close(got[:, keep], expected[:, keep], rtol=1e-5, atol=1e-5)
    weight[2, 0], bias[2] = 0.0, 50.0  # the draws: token 2 all but certain, NaN in the row after it
    weight[3, :] = float("nan")
    out = triton_draw(hidden, weight, bias, seed=1)
    assert out[0].tolist() == [2] * 4
    assert_same(out, sample_from_hidden_reference(hidden, weight, bias, seed=1))


def test_a_rows_own_excluded_token_stays_out_of_its_winning_tile():
    """Over several tiles the finish kernel draws again inside the winning tile: a row's own
    excluded token (its largest logit, in the same tile as the runner-up) stays excluded
    there, greedy or sampled."""
    hidden, weight, bias = head(4, 24, 600, 6)
    bias[10], bias[20] = 80.0, 60.0
    per_row = torch.full((4,), 10)
    for temperature in (0.0, 1.0):
        ref = sample_from_hidden_reference(hidden, weight, bias, temperature, exclude_per_row=per_row, seed=2)
        out = triton_draw(hidden, weight, bias, temperature, exclude_per_row=per_row, seed=2)
        assert out[0].tolist() == [20] * 4
        assert_same(out, ref)


def test_the_cpu_kernel_refuses_a_head_of_another_width():
    """The kernel's own check, past the op's: hidden [N, H] against weight [V, H'] is refused by name."""
    ops = _dispatch.cpu_ops()
    call = dict(bias=None, temperature=1.0, temperature_t=None, exclude_ids=None, exclude_per_row=None, allowed=None,
                noise=None, seed=3, offset=0, row_ids=None, seed_tensor=None, offset_tensor=None, logprob=False,
                confidence=0)
    assert ops.sample_from_hidden_cpu(torch.zeros(2, 4), torch.zeros(5, 4), **call)[1].all()
    for hidden, weight in [(torch.zeros(2, 4), torch.zeros(5, 3)), (torch.zeros(4), torch.zeros(5, 4))]:
        with pytest.raises(RuntimeError, match=r"hidden \[N, H\] and weight \[V, H\] must share H"):
            ops.sample_from_hidden_cpu(hidden, weight, **call)


def test_head_logits_passes_opcheck_on_16_bit_heads():
    """The logits a truncating call builds are float32 whatever the head's dtype, under
    fake tensors as in the kernels."""
    hidden, weight, bias = head(3, 8, 300, 5, torch.bfloat16)
    torch.library.opcheck(torch.ops.ddpd.head_logits.default, (hidden, weight, bias))


def test_the_cuda_dot_runs_on_16_bit_operands_only_when_both_match():
    with fake_tensors("cuda:0"):
        bf16, fp16, fp32 = (torch.empty(2, 4, dtype=d) for d in (torch.bfloat16, torch.float16, torch.float32))
        assert not dot_in_float32(bf16, bf16) and not dot_in_float32(fp16, fp16)
        assert dot_in_float32(fp32, fp32) and dot_in_float32(bf16, fp32) and dot_in_float32(fp32, bf16)
        assert dot_in_float32(fp16, bf16)
    assert dot_in_float32(torch.empty(2, 4, dtype=torch.bfloat16), torch.empty(2, 4, dtype=torch.bfloat16))


def test_a_compiled_truncated_draw_keeps_the_bias():
    """A truncating call under torch.compile goes through the registered logits op, bias
    included: the same draws as eager with a bias that decides the top-k."""
    hidden, weight, _ = head(6, 8, 300, 9)
    bias = torch.zeros(300)
    bias[[7, 11]] = 50.0

    def draw(h):
        return sample_from_hidden(h, weight, bias, top_k=2, seed=3, offset=1).tokens

    tokens = torch.compile(draw, fullgraph=True, backend="aot_eager")(hidden)
    assert torch.equal(tokens, draw(hidden)) and set(tokens.tolist()) <= {7, 11}


def test_the_triton_path_keeps_out_every_excluded_token():
    """Several excluded tokens, in different tiles, each with a bias that would win every draw:
    the Triton kernels draw none of them, and the reference's tokens."""
    hidden, weight, bias = head(6, 16, 600, 8)
    excluded = [0, 5, 300, 599]
    bias[excluded] = 50.0
    ref = sample_from_hidden_reference(hidden, weight, bias, 1.0, excluded, seed=4)
    out = triton_draw(hidden, weight, bias, 1.0, excluded, seed=4)
    assert_same(out, ref)
    assert out.valid.all() and not any(t in excluded for t in out.tokens.tolist())


def test_the_triton_path_reads_a_strided_head_by_its_values():
    """A weight and a bias that are strided views (every other row, every other entry): the
    Triton kernels draw the reference's tokens from their contiguous copies."""
    hidden, wide_weight, wide_bias = head(5, 16, 1200, 9)
    weight, bias = wide_weight[::2], wide_bias[::2]
    assert not weight.is_contiguous() and not bias.is_contiguous()
    ref = sample_from_hidden_reference(hidden, weight.contiguous(), bias.contiguous(), 1.0, seed=6)
    assert_same(triton_draw(hidden, weight, bias, 1.0, seed=6), ref)
