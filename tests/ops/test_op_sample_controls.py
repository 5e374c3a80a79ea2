"""The sampling controls of sample_categorical and sample_from_hidden: per-row and
greedy temperatures, top-k / top-p / min-p (exact in law: chi-square against the
truncated law computed here independently, by sorting in float64), exclusions in any
form, the allowed mask, leading dimensions, float64 logits, the log-probability and
confidence outputs; every path (C++, Triton in the interpreter, the torch reference)
token for token; compile, graphs and vmap."""
import math
import os
import random
import warnings

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import Phase, given, settings, strategies as st
from scipy import stats

from ddpd.kernels.sample_categorical import RECORD, TILE_MASS, TILE_MAX, race, row_summary
from ddpd.ops import _dispatch, multinomial, rng
from ddpd.ops.sample_categorical import (
    categorical_reference,
    noise_width,
    prepare_categorical,
    sample_categorical,
    sample_categorical_reference,
    sample_categorical_triton,
)
from ddpd.ops.sample_from_hidden import (
    prepare_hidden,
    sample_from_hidden,
    sample_from_hidden_reference,
    sample_from_hidden_triton,
)
from ddpd.validation import readable
from oracles.devices import MISMATCHES, fake_tensors, moved

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
CHI2_MIN_P = 1e-3  # a distribution test fails when its chi-square p-value is below this
CONTROLS = [dict(), dict(top_k=7), dict(top_p=0.8), dict(min_p=0.05), dict(top_k=40, top_p=0.9, min_p=0.02),
            dict(temperature=0.0), dict(temperature=0.5, top_p=0.5)]
OUTPUTS = [dict(), dict(return_logprob=True, confidence="prob"), dict(confidence="margin"),
           dict(return_logprob=True, confidence="entropy")]


def triton_categorical(logits, temperature=1.0, **kw):
    """sample_categorical's Triton kernels on CPU tensors (TRITON_INTERPRET=1)."""
    call = prepare_categorical(logits, temperature, kw.get("exclude_ids"), kw.get("exclude_per_row"), kw.get("allowed"),
                               kw.get("top_k"), kw.get("top_p"), kw.get("min_p"), kw.get("return_logprob", False),
                               kw.get("confidence"), kw.get("seed"), kw.get("offset", 0), None, kw.get("row_ids"),
                               kw.get("noise"))
    return call.finish(*sample_categorical_triton(logits.reshape(-1, logits.shape[-1]), *call.args()))


def triton_hidden(hidden, weight, bias, temperature=1.0, **kw):
    call = prepare_hidden(hidden, weight, bias, temperature, kw.get("exclude_ids"), kw.get("exclude_per_row"),
                          kw.get("allowed"), None, None, None, kw.get("return_logprob", False), kw.get("confidence"),
                          kw.get("seed"), kw.get("offset", 0), None, kw.get("row_ids"), kw.get("noise"))
    c = call.controls
    seed, offset, seed_t, offset_t = call.counters
    return call.finish(*sample_from_hidden_triton(call.rows(hidden), weight, bias, c.temperature, c.temperature_t,
                                                  call.exclude_ids, call.exclude_per_row, call.allowed, call.noise,
                                                  seed, offset, call.row_ids, seed_t, offset_t, call.logprob,
                                                  call.confidence))


def assert_same(out, ref):
    """Tokens and flags equal; log-probabilities and confidences to 1e-5."""
    assert len(out) == len(ref)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    for a, b in zip(out[2:], ref[2:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def truncated_law(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The law of one row, independently of ddpd: float64, by sorting (module docstring of
    ddpd.ops.sample_categorical, steps 1-2)."""
    logits = np.asarray(logits, dtype=np.float64)
    y = (logits - logits.max()) / temperature
    p = np.exp(y)
    keep = np.isfinite(logits) | (logits == np.inf)
    if top_k:
        keep &= logits >= np.sort(logits)[::-1][top_k - 1]
    if top_p is not None and top_p < 1:
        q = np.where(keep, p, 0.0)
        q = q / q.sum()
        above = np.array([q[logits > v].sum() for v in logits])  # mass strictly above each token
        keep &= above < top_p
    if min_p:
        keep &= p >= min_p * p.max()
    law = np.where(keep, p, 0.0)
    return law / law.sum()


def chi_square_p(tokens, probs):
    observed = np.bincount(tokens.numpy(), minlength=len(probs)).astype(np.float64)
    expected = probs * len(tokens)
    assert observed[expected == 0].sum() == 0, "a token outside the truncated support was drawn"
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep]).pvalue


@pytest.mark.parametrize("vocab", [7, 300, 1000])
@pytest.mark.parametrize("controls", CONTROLS)
@pytest.mark.parametrize("outputs", OUTPUTS)
def test_every_path_agrees_with_controls_and_outputs(vocab, controls, outputs):
    g = torch.Generator().manual_seed(vocab)
    logits = 2 * torch.randn(5, vocab, generator=g)
    logits[1, :vocab // 2] = float("-inf")
    logits[2, 3] = float("nan")
    logits[3, 1] = logits[3, 2] = logits[3].max()  # a tie at the top
    logits[4] = float("-inf")  # nothing drawable
    kw = dict(controls, **outputs, seed=9, offset=2, row_ids=torch.tensor([0, 5, 2**33, 7, 1]))
    ref = sample_categorical_reference(logits, **kw)
    assert_same(sample_categorical(logits, **kw), ref)
    assert_same(triton_categorical(logits, **kw), ref)
    assert ref[1].tolist() == [True] * 4 + [False] and ref[0][4] == 0
    for extra in (e for e in ref[2:] if e is not None):
        assert extra[4] == float("-inf")


@pytest.mark.parametrize("controls", [dict(top_k=3), dict(top_p=0.7), dict(min_p=0.2), dict(top_k=5, top_p=0.6),
                                      dict(top_p=0.5, min_p=0.3, temperature=0.7)])
def test_truncated_draws_follow_the_exact_truncated_law(controls):
    """Chi-square over 1e5 draws of one row of V = 300 (two tiles) from the C++ path, against
    the law computed by sorting; a token outside the support fails outright."""
    n, vocab = 100_000, 300
    logits = 1.5 * torch.randn(vocab, generator=torch.Generator().manual_seed(11))
    tokens, valid, _, _ = sample_categorical(logits.expand(n, vocab), seed=4, row_ids=torch.arange(n), **controls)
    assert bool(valid.all())
    law = truncated_law(logits, controls.get("temperature", 1.0), controls.get("top_k"), controls.get("top_p"),
                        controls.get("min_p"))
    assert chi_square_p(tokens, law) > CHI2_MIN_P


def test_per_row_controls_draw_what_each_row_draws_alone():
    g = torch.Generator().manual_seed(1)
    logits = 2 * torch.randn(6, 500, generator=g)
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.0, 1e-3])
    top_k = torch.tensor([0, 3, 0, 100, 5, 1])
    top_p = torch.tensor([1.0, 0.9, 0.3, 1.0, 0.5, 0.99])
    min_p = torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.5])
    rows = torch.arange(6) + 40
    out = sample_categorical(logits, temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3, row_ids=rows,
                             return_logprob=True)
    for r in range(6):
        one = sample_categorical(logits[r:r + 1], float(temperature[r]), top_k=int(top_k[r]), top_p=float(top_p[r]),
                                 min_p=float(min_p[r]), seed=3, row_ids=rows[r:r + 1], return_logprob=True)
        assert out[0][r] == one[0][0]
        torch.testing.assert_close(out[2][r:r + 1], one[2])
    assert_same(triton_categorical(logits, temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3, row_ids=rows,
                                   return_logprob=True), out)
    # a 0-d tensor applies to every row
    assert_same(sample_categorical(logits, torch.tensor(0.7), top_p=torch.tensor(0.8), seed=3),
                sample_categorical(logits, 0.7, top_p=0.8, seed=3))


def test_per_row_temperatures_temper_the_tile_statistics_of_the_triton_kernels():
    """Per-row temperatures beside the scalar default 1.0 over several tiles: the tile masses,
    the log-probability and the entropy the Triton kernels compute are those of each row's
    temperature, not of temperature 1."""
    g = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(8, 1000, generator=g)
    temperature = torch.tensor([0.25, 0.5, 2.0, 4.0, 0.25, 0.5, 2.0, 4.0])
    want = sample_categorical_reference(logits, temperature, seed=7, return_logprob=True, confidence="entropy")
    got = triton_categorical(logits, temperature, seed=7, return_logprob=True, confidence="entropy")
    assert_same(got, want)


@pytest.mark.parametrize("floats, ints", [(torch.float64, torch.int32), (torch.float16, torch.int16),
                                          (torch.bfloat16, torch.uint8)])
def test_per_row_controls_of_any_dtype_draw_what_float32_and_int64_ones_draw(floats, ints):
    """Per-row controls of every accepted dtype reach the kernels as float32 and int64 (the C++
    kernel reads no other); values exact in each dtype draw what the float32 / int64 ones draw."""
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(0))
    temperature, top_k = torch.tensor([0.5, 2.0, 0.0, 1.25]), torch.tensor([0, 3, 40, 7])
    top_p, min_p = torch.tensor([0.5, 0.75, 1.0, 0.25]), torch.tensor([0.0, 0.125, 0.5, 1.0])
    for op in (sample_categorical, sample_categorical_reference):
        want = op(logits, temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3, return_logprob=True)
        got = op(logits, temperature.to(floats), top_k=top_k.to(ints), top_p=top_p.to(floats),
                 min_p=min_p.to(floats), seed=3, return_logprob=True)
        assert_same(got, want)


def test_a_per_row_min_p_cuts_where_the_number_does():
    """log(min_p) of a per-row tensor is the float64 log rounded to float32, as for a number:
    at this min_p a float32 log rounds an ulp lower and would keep a logit an ulp below the cut."""
    min_p = 0.3410532474517822  # a float32 value
    cut = torch.tensor(math.log(min_p)).float()  # exp(cut) >= min_p > exp(below) in exact arithmetic
    below = torch.nextafter(cut, torch.tensor(-math.inf))
    logits = torch.stack([torch.tensor(0.0), below, cut, torch.tensor(-5.0)]).expand(64, 4)
    rows = torch.arange(64)
    for draw in (sample_categorical, sample_categorical_reference):
        for value in (min_p, torch.tensor(min_p), torch.full((64,), min_p)):
            tokens, valid, _, _ = draw(logits, min_p=value, seed=5, row_ids=rows)
            assert bool(valid.all()) and set(tokens.tolist()) == {0, 2}


def test_greedy_is_the_first_argmax_and_its_statistics_use_temperature_one():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), -1.0, 5.0, 5.0], [0.0, 0.0, 0.0, 0.0]])
    for tokens, valid, lp, _ in (sample_categorical(logits, 0.0, seed=1, return_logprob=True),
                              triton_categorical(logits, 0.0, seed=1, return_logprob=True),
                              sample_categorical_reference(logits, 0.0, seed=1, return_logprob=True)):
        assert tokens.tolist() == [1, 2, 0] and bool(valid.all())
        torch.testing.assert_close(lp, torch.log_softmax(torch.nan_to_num(logits, nan=-math.inf), 1)[[0, 1, 2],
                                                                                                  [1, 2, 0]])
    wide = torch.randn(64, 3000, generator=torch.Generator().manual_seed(2))
    wide[5, 2900] = wide[5, 10] = wide[5].max() + 1  # the first of two maxima, in different tiles
    expected = wide.argmax(1)
    assert expected[5] == 10
    for tokens, _, *_ in (sample_categorical(wide, 0.0, [3], seed=5), triton_categorical(wide, 0.0, seed=5,
                                                                                     exclude_ids=[3])):
        masked = wide.clone()
        masked[:, 3] = -math.inf
        assert torch.equal(tokens, masked.argmax(1))
    # greedy needs no noise: the reference law takes none
    assert torch.equal(categorical_reference(wide, 0.0, None)[0], expected)


def test_top_k_keeps_ties_and_top_p_keeps_tied_groups_together():
    n = 20_000
    logits = torch.tensor([2.0, 2.0, 1.0, 0.0]).expand(n, 4)
    tokens = sample_categorical(logits, top_k=1, seed=1)[0]
    assert set(tokens.tolist()) == {0, 1}  # both maxima kept by top_k = 1
    assert 0.45 < float((tokens == 0).double().mean()) < 0.55
    # p(2) = e^2 / Z: the tied pair holds 0.844 of the mass; top_p = 0.5 keeps both, not one
    tokens = sample_categorical(logits, top_p=0.5, seed=2)[0]
    assert set(tokens.tolist()) == {0, 1}
    tokens = sample_categorical(logits, top_p=0.9, seed=2)[0]
    assert set(tokens.tolist()) == {0, 1, 2}
    # +inf logits share the mass; a finite logit beside them has none
    inf = torch.tensor([float("inf"), 1.0, float("inf")]).expand(n, 3)
    tokens, _, lp, _ = sample_categorical(inf, top_p=0.6, seed=3, return_logprob=True)
    assert set(tokens.tolist()) == {0, 2} and torch.allclose(lp, torch.full((n,), math.log(0.5)))


def test_top_p_stops_at_the_token_whose_mass_above_is_exactly_p():
    """A token is kept when the mass strictly above it is below p Z, not equal to it: with
    weights 1, 1/2, 1/2 (exp(-log 2) is 1/2 in float32, the sums exact), p = 1/2 is reached by
    the maximum alone, the smallest upper set of mass >= p; a p an ulp above adds the pair."""
    half = -math.log(2.0)
    logits = torch.tensor([0.0, half, half, float("-inf")]).expand(64, 4)
    for draw in (sample_categorical, sample_categorical_reference, triton_categorical):
        assert set(draw(logits, top_p=0.5, seed=1)[0].tolist()) == {0}
        assert set(draw(logits, top_p=0.5 + 2**-24, seed=1)[0].tolist()) == {0, 1, 2}


def test_min_p_keeps_a_probability_of_exactly_min_p_times_the_top():
    """min_p keeps p >= min_p p_max: at min_p = 1 the maxima stay drawable, and only they."""
    logits = torch.tensor([2.0, 0.0, 2.0, 1.0]).expand(64, 4)
    for draw in (sample_categorical, sample_categorical_reference):
        tokens, valid, _, _ = draw(logits, min_p=1.0, seed=5, row_ids=torch.arange(64))
        assert bool(valid.all()) and set(tokens.tolist()) == {0, 2}


@pytest.mark.parametrize("position", [1, 4])
def test_min_p_keeps_a_token_exactly_on_its_cut_wherever_it_sits_in_the_row(position):
    """A logit of exactly M + log(min_p) is kept (weights 1 and 1/2 at min_p = 1/2, exact in
    float32), the cut's only token among the first four logits of V = 5 or as the last one,
    past the vectors of four the C++ search reads first."""
    logits = torch.full((64, 5), -3.0)
    logits[:, 0], logits[:, position] = 0.0, -math.log(2.0)
    for draw in (sample_categorical, sample_categorical_reference):
        tokens, valid, _, _ = draw(logits, min_p=0.5, seed=5, row_ids=torch.arange(64))
        assert bool(valid.all()) and set(tokens.tolist()) == {0, position}, draw


def test_logprob_and_confidences_are_those_of_the_truncated_law():
    g = torch.Generator().manual_seed(7)
    logits = 2 * torch.randn(8, 700, generator=g)
    for controls in (dict(), dict(top_k=20, temperature=0.8), dict(top_p=0.7), dict(min_p=0.1, temperature=1.3)):
        t = controls.get("temperature", 1.0)
        for confidence in ("prob", "margin", "entropy"):
            for tokens, _, lp, conf in (sample_categorical(logits, seed=2, return_logprob=True,
                                                           confidence=confidence, **controls),
                                        triton_categorical(logits, seed=2, return_logprob=True,
                                                           confidence=confidence, **controls)):
                for r in range(8):
                    law = truncated_law(logits[r], t, controls.get("top_k"), controls.get("top_p"),
                                        controls.get("min_p"))
                    assert law[tokens[r]] > 0
                    assert abs(float(lp[r]) - math.log(law[tokens[r]])) < 1e-4
                    top = np.sort(law)[::-1]
                    want = {"prob": law[tokens[r]], "margin": top[0] - top[1],
                            "entropy": float(np.sum(law[law > 0] * np.log(law[law > 0])))}[confidence]
                    assert abs(float(conf[r]) - want) < 1e-4, (controls, confidence, r)


@pytest.mark.parametrize("vocab", [700, 1300])
def test_confidences_of_rows_of_negative_logits_over_several_tiles(vocab):
    """Rows whose every logit is below 0, over 3 and 6 tiles (not a power of two: the last
    chunk of tile records has empty lanes): the margin and the other outputs are the
    reference's, on sample_categorical and sample_from_hidden. An empty lane read as 0
    rather than -inf would be the row's two largest values."""
    g = torch.Generator().manual_seed(vocab)
    logits = 2 * torch.randn(3, vocab, generator=g) - 40.0
    hidden = torch.randn(3, 8, generator=g)
    weight = torch.randn(vocab, 8, generator=g)
    bias = torch.full((vocab,), -40.0)
    for confidence in ("prob", "margin", "entropy"):
        kw = dict(seed=2, return_logprob=True, confidence=confidence)
        assert_same(triton_categorical(logits, 0.8, **kw), sample_categorical_reference(logits, 0.8, **kw))
        assert_same(triton_hidden(hidden, weight, bias, 0.8, **kw),
                    sample_from_hidden_reference(hidden, weight, bias, 0.8, **kw))


def test_exclusions_in_every_form_and_the_allowed_mask():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(50, 600, generator=g)
    expected = sample_categorical(logits, 0.9, [5, 300, 599], seed=1)
    for ids in ((5, 300, 599), np.array([5, 300, 599]), [np.int64(5), np.int32(300), 599], range(5, 6),
                torch.tensor([5, 300, 599]), torch.tensor([599, 5, 300], dtype=torch.int32)):
        out = sample_categorical(logits, 0.9, ids, seed=1)
        if isinstance(ids, range):
            assert not (out[0] == 5).any()
        else:
            assert_same(out, expected)
    allowed = torch.ones(50, 600, dtype=torch.bool)
    allowed[:, [5, 300, 599]] = False
    assert_same(sample_categorical(logits, 0.9, allowed=allowed, seed=1), expected)
    assert_same(triton_categorical(logits[:4], 0.9, allowed=allowed[:4], seed=1),
                tuple(None if t is None else t[:4] for t in expected))
    # only some tokens allowed per row; a row with none is invalid
    allowed = torch.rand(50, 600, generator=g) < 0.02
    allowed[0] = False
    tokens, valid, _, _ = sample_categorical(logits, allowed=allowed, seed=2)
    assert not valid[0] and bool(valid[1:].all()) and bool(allowed[torch.arange(1, 50), tokens[1:]].all())
    assert_same(sample_categorical_reference(logits, allowed=allowed, seed=2), (tokens, valid, None, None))


def test_leading_dimensions_and_float64_logits():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 400, generator=g, dtype=torch.float64)
    flat = sample_categorical(logits.reshape(6, 400).float(), top_p=0.9, seed=7, return_logprob=True)
    out = sample_categorical(logits, top_p=0.9, seed=7, return_logprob=True)
    assert out[0].shape == (2, 3) and out[2].shape == (2, 3)
    assert_same(tuple(None if t is None else t.reshape(6) for t in out), flat)
    assert_same(sample_categorical_reference(logits, top_p=0.9, seed=7, return_logprob=True), out)
    assert_same(triton_categorical(logits, top_p=0.9, seed=7, return_logprob=True), out)
    one = sample_categorical(logits[0, 0], seed=7)  # a single row [V]: 0-d outputs
    assert one[0].shape == () and one[0] == flat[0][0]
    temperature = torch.rand(2, 3, generator=g) + 0.5
    expected = sample_categorical(logits.reshape(6, 400), temperature.reshape(6), seed=7)
    assert_same(sample_categorical(logits, temperature, seed=7),
                tuple(None if t is None else t.reshape(2, 3) for t in expected))


def test_float64_rows_are_taken_relative_to_their_drawable_maximum():
    """float64 logits are shifted by the maximum over the drawable tokens before the cast: an
    excluded or not allowed 1e300 beside two drawable zeros leaves those two (a shift by
    1e300 would make them -inf in float32 and the row undrawable), each of probability 1/2."""
    logits = torch.zeros(64, 4, dtype=torch.float64)
    logits[:, 0] = logits[:, 3] = 1e300
    allowed = torch.ones(64, 4, dtype=torch.bool)
    allowed[:, 3] = False
    for draw in (sample_categorical, sample_categorical_reference):
        tokens, valid, lp, _ = draw(logits, exclude_ids=[0], allowed=allowed, seed=3, return_logprob=True)
        assert bool(valid.all()) and set(tokens.tolist()) == {1, 2}
        torch.testing.assert_close(lp, torch.full((64,), -math.log(2.0)))


@pytest.mark.parametrize("outputs", OUTPUTS)
@pytest.mark.parametrize("vocab", [5, 700])
def test_sample_from_hidden_controls_on_every_path(outputs, vocab):
    g = torch.Generator().manual_seed(vocab)
    hidden, weight, bias = torch.randn(5, 16, generator=g), torch.randn(vocab, 16, generator=g) / 2, torch.randn(vocab)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.5, 0.0])
    allowed = torch.rand(5, vocab, generator=g) < 0.8
    kw = dict(outputs, allowed=allowed, exclude_ids=[1], seed=5, row_ids=torch.arange(5) * 7)
    ref = sample_from_hidden_reference(hidden, weight, bias, temperature, **kw)
    assert_same(sample_from_hidden(hidden, weight, bias, temperature, **kw), ref)
    assert_same(triton_hidden(hidden, weight, bias, temperature, **kw), ref)
    logits = hidden @ weight.T + bias
    assert_same(sample_categorical(logits, temperature, **kw), ref)


def test_sample_from_hidden_truncates_through_the_logits():
    g = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(2, 3, 24, generator=g), torch.randn(900, 24, generator=g) / 3
    kw = dict(top_k=30, top_p=0.8, min_p=0.01, seed=8, return_logprob=True, confidence="margin")
    out = sample_from_hidden(hidden, weight, None, 0.9, **kw)
    assert out[0].shape == (2, 3)
    assert_same(out, sample_from_hidden_reference(hidden, weight, None, 0.9, **kw))
    assert_same(out, sample_categorical(hidden @ weight.T, 0.9, **kw))
    half = sample_from_hidden(hidden.bfloat16(), weight.bfloat16(), None, 0.9, **kw)
    assert_same(half, sample_categorical(hidden.bfloat16().float() @ weight.bfloat16().float().T, 0.9, **kw))


def random_call(r: random.Random, hidden: bool) -> tuple:
    """A random call of sample_categorical (or sample_from_hidden): any leading shape,
    vocabularies around the tile and chunk sizes, every dtype, huge, tied and non-finite
    logits, every control as a number or per-row tensor, every exclusion form, explicit
    noise or seeds and offsets at the ends of their range (ints or tensors), row ids with
    high bits. Returns (inputs, kwargs)."""
    lead = r.choice([(1,), (3,), (4,), (2, 2)])
    rows = math.prod(lead)
    vocab = r.choice([1, 2, 7, 255, 256, 257, 511, 513, 1025, 2049, r.randint(1, 3000)])
    dtype = r.choice([torch.float32, torch.bfloat16, torch.float16] + ([] if hidden else [torch.float64]))
    g = torch.Generator().manual_seed(r.randrange(2**62))
    if hidden:
        width = r.choice([1, 8, 33, 64])
        weight = torch.randn(vocab, width, generator=g) * r.choice([0.1, 1.0]) / width**0.5
        inputs = (torch.randn(*lead, width, generator=g).to(dtype), weight.to(r.choice([dtype, torch.float32])),
                  r.choice([None, torch.randn(vocab, generator=g)]))
    else:
        logits = torch.randn(*lead, vocab, generator=g, dtype=torch.float64) * r.choice([0.0, 3.0, 1e4, 1e30])
        if r.random() < 0.3:
            logits = logits.round()  # ties
        for _ in range(r.choice([0, 1, 5])):
            at = tuple(r.randrange(n) for n in lead) + (r.randrange(vocab),)
            logits[at] = r.choice([float("-inf"), float("nan"), float("inf"), 1e38])
        inputs = (logits.to(dtype),)

    def per_row(values):
        return torch.tensor([r.choice(values) for _ in range(rows)]).reshape(lead)

    kw = {"temperature": r.choice([0.0, 1e-6, 0.5, 1.0, 2.0, per_row([0.0, 0.3, 1.0, 3.0])])}
    if r.random() < 0.3:
        kw["exclude_ids"] = r.sample(range(vocab), min(vocab, 2))
    if r.random() < 0.2:
        kw["exclude_per_row"] = torch.randint(0, vocab, lead, generator=g)
    if r.random() < 0.2:
        kw["allowed"] = torch.rand(*lead, vocab, generator=g) < r.choice([0.0, 0.1, 0.9])
    if not hidden:  # sample_from_hidden truncates through sample_categorical
        for name, values in (("top_k", [0, 1, 5, vocab]), ("top_p", [0.1, 0.9, 1.0]), ("min_p", [0.0, 0.05, 0.5])):
            if r.random() < 0.3:
                kw[name] = r.choice(values + [per_row(values)])
    kw["return_logprob"] = r.random() < 0.3
    kw["confidence"] = r.choice([None, None, "prob", "margin", "entropy"])
    if r.random() < 0.15:
        kw["noise"] = torch.rand(*lead, noise_width(vocab), generator=g).clamp_min(1e-7)
    else:
        kw["seed"], kw["offset"] = r.choice([0, 2**64 - 1, r.randrange(2**64)]), r.choice([0, 2**64 - 1, 5])
        if r.random() < 0.2:
            kw["seed"], kw["offset"] = (torch.tensor(rng.as_int64(v)) for v in (kw["seed"], kw["offset"]))
        if r.random() < 0.3:
            kw["row_ids"] = per_row([0, 9, 2**32 + 7, -1, -2**63])
    return inputs, kw


@settings(max_examples=int(os.environ.get("DDPD_RANDOM_CALLS", 30)), deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate])
@given(r=st.randoms(use_true_random=False), hidden=st.booleans(), multiprocessors=st.sampled_from([1, 4, 132]))
def test_every_path_agrees_on_random_calls(r, hidden, multiprocessors):
    """Differential test of every argument at once: the C++ path and the Triton kernels
    (with the splits of a 132-SM device, or few) equal the reference token for token, and
    their log-probabilities and confidences to 1e-5. Except sample_from_hidden's at a
    temperature near 0: its logits are matmuls that may round differently on each path,
    and a last-bit difference divided by 1e-6 moves a probability among near ties."""
    inputs, kw = random_call(r, hidden)
    reference, public, triton = ((sample_from_hidden_reference, sample_from_hidden, triton_hidden) if hidden else
                                 (sample_categorical_reference, sample_categorical, triton_categorical))
    near_zero = hidden and not isinstance(kw["temperature"], torch.Tensor) and 0 < kw["temperature"] < 0.01
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_dispatch, "multiprocessors", lambda device: multiprocessors)
        ref = reference(*inputs, **kw)
        for out in (public(*inputs, **kw), triton(*inputs, **kw)):
            assert_same(out[:2] if near_zero else out, ref[:2] if near_zero else ref)
            assert len(out) == len(ref)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(temperature=torch.tensor([1.0, -1.0, 1.0])), ValueError, r"temperature values must be in \[0, 1e\+36\]"),
        (dict(temperature=torch.tensor([1.0, float("inf"), 1.0])), ValueError, r"temperature values must be in \[0, "),
        (dict(temperature=torch.tensor([1.0, float("inf"), 1.0], dtype=torch.float16)), ValueError,
         r"temperature values must be in \[0, 1e\+36\].*, got inf$"),  # 1e36 is inf in float16 too
        (dict(temperature=torch.tensor([1.0, 2.0])), ValueError, "temperature must be a number, a 0-d tensor or"),
        (dict(temperature=torch.tensor([1, 2, 3])), TypeError, "temperature must have dtype"),
        (dict(top_k=-1), ValueError, r"top_k must be >= 0"),
        (dict(top_k=2.5), TypeError, "top_k must be an int or an integer tensor, got float 2.5"),
        (dict(top_k=True), TypeError, "top_k must be an int or an integer tensor, got bool True"),
        (dict(temperature=10**400), ValueError, r"temperature must be in \[0.0, 1e\+36\], got an int of 1329 bits"),
        (dict(top_k=torch.tensor([1, -2, 3])), ValueError, "top_k values must be >= 0"),
        (dict(top_k=torch.tensor([1.0, 2.0, 3.0])), TypeError, r"top_k must have dtype in \(torch.int64, .*float32$"),
        (dict(top_p=0.0), ValueError, r"top_p must be in \(0.0, 1.0\]"),
        (dict(top_p=torch.tensor([0.5, 1.5, 0.5])), ValueError, r"top_p values must be in \(0, 1\]"),
        (dict(top_p=torch.tensor([0.5, 0.0, 0.5])), ValueError, r"top_p values must be in \(0, 1\].*, got 0.0$"),
        (dict(top_p=torch.tensor([0.5, 0.0, 1.5])), ValueError, r"top_p values must be in \(0, 1\].*, got 0.0$"),
        (dict(min_p=1.5), ValueError, r"min_p must be in \[0.0, 1.0\]"),
        (dict(min_p=torch.tensor([0.5, -0.1, 0.0])), ValueError, r"min_p values must be in \[0, 1\]"),
        (dict(allowed=torch.ones(3, 9, dtype=torch.bool)), ValueError, r"allowed must have shape \(3, 10\)"),
        (dict(allowed=torch.ones(3, 10)), TypeError, "allowed must have dtype"),
        (dict(confidence="max"), ValueError, "confidence must be None or one of"),
        (dict(return_logprob=1), TypeError, "return_logprob must be a bool"),
        (dict(noise=torch.zeros(3, 11)), ValueError, r"noise values must be uniforms in \(0, 1\]"),
        (dict(noise=torch.full((3, 11), float("nan"))), ValueError, r"noise values must be uniforms in \(0, 1\]"),
    ],
)
def test_bad_controls_raise_clear_errors(kwargs, error, match):
    logits = torch.randn(3, 10)
    for op in (sample_categorical, sample_categorical_reference):
        with pytest.raises(error, match=match):
            op(logits, **dict(dict(seed=1) if "noise" not in kwargs else {}, **kwargs))
    with torch.device("cpu"), pytest.raises(error, match=match):  # a default device is no tracing: checked too
        sample_categorical(logits, **dict(dict(seed=1) if "noise" not in kwargs else {}, **kwargs))


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name, value", [
    ("temperature", torch.ones(2)), ("top_k", torch.ones(2, dtype=torch.long)), ("top_p", torch.ones(2)),
    ("min_p", torch.zeros(2)), ("exclude_ids", torch.zeros(1, dtype=torch.long)),
    ("exclude_per_row", torch.zeros(2, dtype=torch.long)), ("allowed", torch.ones(2, 4, dtype=torch.bool)),
])
def test_controls_and_masks_on_another_device_than_the_logits_are_refused(name, value, like, other):
    """A per-row control or a token mask on another device than logits: the op's own
    ValueError, naming the argument and both devices (fake tensors stand in for a GPU)."""
    with fake_tensors(like):
        logits = torch.randn(2, 4)
        for op in (sample_categorical, sample_categorical_reference):
            with pytest.raises(ValueError, match=rf"^{name} must be on the device of logits \({like}\), got {other}$"):
                op(logits, seed=1, **{name: moved(value, other)})


def test_numbers_of_any_kind_and_size():
    """numpy scalars are numbers (float32 ones were refused); a top_k beyond int64 is off,
    as any at or above the number of tokens (it failed in the op's schema)."""
    logits = torch.randn(3, 10)
    expected = sample_categorical(logits, 0.5, top_p=0.75, seed=1)
    assert_same(sample_categorical(logits, np.float32(0.5), top_p=np.float32(0.75), seed=1), expected)
    assert_same(sample_categorical(logits, top_k=2**63, seed=1), sample_categorical(logits, seed=1))


@pytest.mark.parametrize("call, match", [
    (lambda: categorical_reference(torch.zeros(1, 300), 1.0, torch.rand(1, 300)), r"noise must have shape \(1, 302\)"),
    (lambda: categorical_reference(torch.zeros(1, 5), 1.0, torch.rand(1, 4)), r"shape \(1, 5\) or \(1, 6\)"),
    (lambda: categorical_reference(torch.zeros(2, 1, 3), 1.0, torch.rand(2, 1, 3)), "logits must be 2-D"),
    (lambda: categorical_reference(torch.zeros(1, 3), 1.0, torch.zeros(1, 3)), r"noise values must be uniforms in"),
    (lambda: noise_width(0), "vocab_size must be an int >= 1"),
    (lambda: categorical_reference(torch.zeros(2, 3), torch.tensor([0.0, 1.0]), None),
     r"noise is needed unless every row is drawn greedily \(temperature 0\)"),
])
def test_the_reference_checks_its_arguments(call, match):
    """categorical_reference is public: a wrong noise shape was an index error, noise of zeros
    a silent draw."""
    with pytest.raises(ValueError, match=match):
        call()


def test_noise_width_takes_integer_scalars():
    """A numpy vocabulary size (logits.shape of an array, a config read with numpy) was refused."""
    for vocab in (np.int64(300), np.int32(300), np.uint16(300)):
        assert type(noise_width(vocab)) is int and noise_width(vocab) == noise_width(300) == 302
    for bad in (300.0, np.float64(300.0), True, np.bool_(True), torch.tensor(300), "300", np.int64(0)):
        with pytest.raises(ValueError, match="vocab_size must be an int >= 1"):
            noise_width(bad)


def test_calls_under_a_default_device_keep_their_checks():
    """torch.set_default_device and `with torch.device(...)` are torch-function modes, which
    the ops took for tracing: per-row controls went unchecked and multinomial refused every
    call as if under torch.compile."""
    weights = torch.rand(3, 10)
    expected = multinomial(weights, 2, seed=1).tokens
    torch.set_default_device("cpu")
    try:
        assert torch.equal(multinomial(weights, 2, seed=1).tokens, expected)
        with pytest.raises(ValueError, match=r"top_p values must be in \(0, 1\]"):
            sample_categorical(torch.randn(3, 10), top_p=torch.tensor([0.5, 0.5, 7.0]), seed=1)
    finally:
        torch.set_default_device(None)


def test_calls_under_a_watching_dispatch_mode_stay_eager():
    """A dispatch mode that only watches (ddpd.ops.Watcher: the CUDA-graph emulation's
    guard) traces nothing: calls under it take the direct path and keep their checks; under
    any other dispatch mode they go through the custom op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ddpd.ops import Watcher, _dispatch

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Watching(Watcher, Passing):
        pass

    assert _dispatch.eager()
    with Watching():
        assert _dispatch.eager()
        with pytest.raises(ValueError, match=r"top_p values must be in \(0, 1\]"):
            sample_categorical(torch.randn(3, 10), top_p=torch.tensor([0.5, 0.5, 7.0]), seed=1)
    with Passing():
        assert not _dispatch.eager()
        with Watching():
            assert not _dispatch.eager()


@pytest.mark.parametrize("mode", ["flops", "logging"])
def test_calls_under_a_mode_that_traces_nothing_keep_their_checks(mode):
    """A flop counter or a logging dispatch mode sends calls through the custom op, yet
    traces nothing: the per-row controls are still checked (they were drawn from instead)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class Logging(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    logits = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    expected = sample_categorical(logits, seed=1, top_p=torch.tensor([0.5, 1.0])).tokens
    bad = [("min_p", torch.tensor([2.0, -1.0]), r"min_p values must be in \[0, 1\]"),
           ("top_k", torch.tensor([-1, 2]), "top_k values must be >= 0"),
           ("top_p", torch.tensor([5.0, 0.5]), r"top_p values must be in \(0, 1\]"),
           ("temperature", torch.tensor([-1.0, 1.0]), "temperature values must be"),
           ("temperature", torch.tensor([1.0, float("nan")]), "temperature values must be")]
    with FlopCounterMode(display=False) if mode == "flops" else Logging():
        assert not _dispatch.eager() and readable(logits)
        assert torch.equal(sample_categorical(logits, seed=1, top_p=torch.tensor([0.5, 1.0])).tokens, expected)
        for name, value, match in bad:
            with pytest.raises(ValueError, match=match):
                sample_categorical(logits, seed=1, **{name: value})


def test_traced_calls_do_not_read_values():
    """Fake tensors, make_fx and torch.func transforms have no values the host can read."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.ones(3)
    assert readable(x, None)
    with FakeTensorMode() as fake:
        assert not readable(fake.from_tensor(x))
        assert not readable()
    seen = []
    make_fx(lambda t: seen.append(readable(t)) or t + 1)(x)
    torch.vmap(lambda t: seen.append(readable(t)) or t)(x)
    assert seen == [False, False]


def test_values_are_read_from_parameters_not_from_fake_tensors_outside_their_mode():
    """readable answered False for an nn.Parameter (not exactly a Tensor), so the range checks
    let a Parameter alpha of 2 through to the posterior. A fake tensor outside its mode has no
    values (reading one raises torch's DataDependentOutputException): its checks are skipped."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from ddpd.process import planner_prob_from_uniform

    p_x1, x_t = torch.full((2, 3, 4), 0.25), torch.zeros(2, 3, dtype=torch.long)
    alpha = torch.nn.Parameter(torch.tensor(2.0))
    assert readable(alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read detached: no "Converting a tensor with requires_grad=True"
        with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\], got range \[2.0, 2.0\]$"):
            planner_prob_from_uniform(p_x1, x_t, alpha)
        planner_prob_from_uniform(p_x1, x_t, torch.nn.Parameter(torch.tensor(0.5)))
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in (p_x1, x_t, torch.tensor(0.5))]
    assert not readable(fakes[2])
    out = planner_prob_from_uniform(*fakes)
    assert isinstance(out, FakeTensor) and out.shape == (2, 3)


def test_unwrapped_tensors_under_vmap_run_the_op():
    """Inside vmap an op's tensors that vmap does not batch (closed over) are plain: the call
    runs, not refused as transformed, and draws what it draws outside."""
    from ddpd.validation import transformed

    logits, seen = torch.randn(3, 10), []
    want = sample_categorical(logits, seed=1).tokens

    def step(t):
        seen.append(transformed(logits, 1, None))
        return t + sample_categorical(logits, seed=1).tokens

    assert torch.equal(torch.vmap(step)(torch.zeros(2, 3, dtype=torch.long)), want.expand(2, 3))
    assert seen == [False]


def test_vmap_is_refused_with_a_clear_error():
    """Under vmap every slice would be row 0 of its own batch: six identical draws. The
    batch goes in as leading dimensions instead, with distinct rows."""
    logits = torch.randn(6, 1, 50)
    with pytest.raises(ValueError, match="does not run under torch.func transforms"):
        torch.vmap(lambda x: sample_categorical(x, seed=1)[0])(logits)
    weight = torch.randn(50, 1)
    with pytest.raises(ValueError, match="does not run under torch.func transforms"):
        torch.vmap(lambda h: sample_from_hidden(h, weight, seed=1)[0])(torch.randn(6, 1, 1))
    tokens = sample_categorical(torch.zeros(6, 1, 300), seed=1)[0]
    assert len(set(tokens.flatten().tolist())) > 1
    for control in ("top_k", "top_p", "min_p"):  # a control batched alone, once torch's own vmap error
        values = torch.tensor([2, 3]) if control == "top_k" else torch.tensor([0.5, 0.2])
        with pytest.raises(ValueError, match="does not run under torch.func transforms"):
            torch.vmap(lambda v: sample_categorical(logits[0], seed=1, **{control: v[None]})[0])(values)


def test_tensor_temperatures_compile_with_dynamic_shapes():
    """dynamic=True: the range message, once formatted at each call (a format spec Dynamo
    does not trace), failed the compile."""
    logits, hidden, weight, t = torch.randn(3, 27), torch.randn(3, 8), torch.randn(27, 8), torch.full((3,), 0.7)
    for call in (lambda: sample_categorical(logits, t, seed=1)[0], lambda: sample_from_hidden(hidden, weight, None, t,
                                                                                              seed=1)[0]):
        torch._dynamo.reset()
        assert torch.equal(torch.compile(call, fullgraph=True, dynamic=True, backend="eager")(), call())


def test_compiled_calls_with_annealed_tensor_controls_do_not_recompile():
    """Temperatures, truncations and seeds given as tensors are graph inputs: advancing them
    in place between calls gives the new draws, with one compilation."""
    compiles = []

    def backend(gm, inputs):
        compiles.append(gm)
        return gm.forward

    logits = torch.randn(8, 700, generator=torch.Generator().manual_seed(9))

    def step(x, temperature, top_p, offset):
        return sample_categorical(x, temperature, top_p=top_p, top_k=50, seed=3, offset=offset, return_logprob=True,
                                  confidence="margin")

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    temperature, top_p, offset = torch.tensor(1.0), torch.full((8,), 0.9), torch.tensor(0)
    for _ in range(4):
        assert_same(compiled(logits, temperature, top_p, offset), step(logits, temperature, top_p, offset))
        temperature -= 0.2
        top_p -= 0.1
        offset += 1
    assert len(compiles) == 1
    # numbers work too (a float is a constant of the graph: a new value recompiles)
    floats = torch.compile(lambda x, t: sample_categorical(x, t, seed=1)[0], fullgraph=True, backend="aot_eager")
    for t in (1.0, 0.5, 0.0):
        assert torch.equal(floats(logits, t), sample_categorical(logits, t, seed=1)[0])


def test_traced_calls_with_a_float_temperature_warn_of_nothing(monkeypatch):
    """The usual call's controls come from a cache in eager calls; traced, check_controls
    makes them without it (Dynamo warns where it traces through an lru_cache)."""
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())  # Dynamo warns once a process
    compiled = torch.compile(lambda x: sample_categorical(x, 0.7, seed=1)[0], fullgraph=True, backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert torch.equal(compiled(torch.zeros(2, 30)), sample_categorical(torch.zeros(2, 30), 0.7, seed=1)[0])
    assert not [str(w.message) for w in seen if "lru_cache" in str(w.message)]


def test_compiled_calls_without_a_seed_draw_from_the_global_generator():
    compiled = torch.compile(lambda x: sample_categorical(x)[0], fullgraph=True, backend="aot_eager")
    logits = torch.zeros(64, 300)
    torch.manual_seed(0)
    a, b = compiled(logits), compiled(logits)
    assert not torch.equal(a, b) and bool(((a >= 0) & (a < 300)).all())


def test_opcheck_with_controls():
    logits = torch.randn(4, 300)
    op = torch.ops.ddpd.sample_categorical.default
    torch.library.opcheck(op, (logits.double(), 0.7, None, torch.tensor([1, 2]), None, None, 10, None, 0.8,
                               torch.tensor([0.5, 1.0, 0.9, 0.3]), -1.0, torch.tensor([-3.0, -1.0, -2.0, -5.0]),
                               None, 4, 5, torch.tensor([9, 8, 7, 6]), torch.tensor(3), None, True, 1))


@pytest.mark.parametrize("top_k", [1, 7, 256, 257, 8999])
@pytest.mark.parametrize("top_p", [1.0, 0.3])
def test_top_k_by_the_heap_and_by_radix_selection_agree_with_the_reference(top_k, top_p):
    """The C++ path finds the k-th largest logit with a heap up to k = 256 (unless too many
    logits enter it, as in ascending order) and by radix selection otherwise: both keep
    every logit tied with it, as the reference does. Integer logits: ties everywhere, at
    the k-th too. The Triton path searches among the logits at or above the k-th largest
    maximum of 141 groups of 64 (k <= 141), or, when more than the scratch row holds are
    (2048, or 8192 with top-p: the block of 4500 ties falls on either side) or k > 141, over
    the whole row."""
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randint(-20, 20, (6, 9000), generator=g).float()
    logits[1, ::3] = float("-inf")  # fewer allowed than k at the largest k
    logits[2, :4500] = 50.0  # the k-th inside a block of 4500 ties
    logits[3] = torch.arange(9000) / 7.0  # ascending: every logit enters the heap
    kw = dict(top_k=top_k, top_p=top_p, temperature=0.7, seed=3, return_logprob=True)
    reference = sample_categorical_reference(logits, **kw)
    assert_same(sample_categorical(logits, **kw), reference)
    assert_same(triton_categorical(logits, **kw), reference)


def test_the_threshold_kernel_bounds_top_k_by_group_maxima():
    """White box: the Triton threshold kernel's scratch row holds the maximum of each group of
    64 logits (masks applied), then, for k <= the groups, the logits at or above the k-th
    largest of those maxima in index order; the thresholds are the k-th largest logits. A
    row whose bound holds more logits than the scratch keeps (all ties) still gets its
    threshold, from the whole row."""
    from ddpd.ops.sample_categorical import threshold_launch

    kernels = _dispatch.kernels("sample_categorical")
    vocab, k = 5000, 9
    group, n_groups, capacity = threshold_launch(vocab)
    assert (group, n_groups, capacity) == (64, 79, 2048)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(5))
    logits[1, 100:4300] = 7.0  # 4200 ties at the top: more than the candidates' room
    logits[2, ::2] = float("nan")  # read as -inf
    tau = torch.empty(3)
    scratch = torch.full((3, n_groups + capacity), float("nan"))
    ids = _dispatch.device_ids((), logits.device)
    kernels.thresholds_kernel[(3,)](logits, vocab, 1.0, None, ids, 0, None, None, k, None, 1.0, None, -math.inf, None,
                                    tau, scratch, n_groups, capacity, TOP_K=True, TOP_P=False, MIN_P=False,
                                    BLOCK=1024, SCAN_BLOCK=4096, GROUP=group)
    masked = torch.nan_to_num(logits, nan=-math.inf)
    assert torch.equal(tau, masked.sort(dim=1, descending=True).values[:, k - 1])
    padded = torch.cat([masked, torch.full((3, n_groups * group - vocab), -math.inf)], dim=1)
    maxima = padded.view(3, n_groups, group).amax(dim=2)
    assert torch.equal(scratch[:, :n_groups], maxima)
    for row in (0, 2):
        bound = maxima[row].sort(descending=True).values[k - 1]
        candidates = masked[row][masked[row] >= bound]
        assert k <= len(candidates) < 10 * k
        assert torch.equal(scratch[row, n_groups:n_groups + len(candidates)], candidates)
    assert torch.equal(scratch[1, n_groups:], torch.full((capacity,), 7.0))  # the first 2048 of the 4200 ties


def test_beyond_max_groups_scan_blocks_the_threshold_kernel_searches_whole_rows():
    """A vocabulary above MAX_GROUPS scan blocks (2048 * 4096 logits) has no group bound: the
    launch asks for no groups and no candidates (scratch is then tau itself), and the kernel's
    top-k search reads the whole row, with the reference's thresholds."""
    from ddpd.ops.sample_categorical import MAX_GROUPS, THRESHOLD_SCAN_BLOCK, threshold_launch

    largest = MAX_GROUPS * THRESHOLD_SCAN_BLOCK
    assert threshold_launch(largest) == (THRESHOLD_SCAN_BLOCK, MAX_GROUPS, 2048)
    assert threshold_launch(largest + 1) == (THRESHOLD_SCAN_BLOCK, 0, 0)
    kernels = _dispatch.kernels("sample_categorical")
    vocab, k = 5000, 9
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(6))
    logits[1, 100:4300] = 7.0  # the k-th inside a block of ties
    tau = torch.empty(2)
    ids = _dispatch.device_ids((), logits.device)
    kernels.thresholds_kernel[(2,)](logits, vocab, 1.0, None, ids, 0, None, None, k, None, 1.0, None, -math.inf, None,
                                    tau, tau, 0, 0, TOP_K=True, TOP_P=False, MIN_P=False,
                                    BLOCK=1024, SCAN_BLOCK=4096, GROUP=THRESHOLD_SCAN_BLOCK)
    assert torch.equal(tau, logits.sort(dim=1, descending=True).values[:, k - 1])


def test_the_references_refuse_the_exclude_ids_the_kernels_refuse():
    """The C++ kernels refuse an excluded id outside [0, V); the references, which would index
    past the row, raise the same message."""
    logits = torch.randn(3, 10)
    hidden, weight = torch.randn(3, 4), torch.randn(10, 4)
    calls = [(dict(exclude_ids=torch.tensor([2, 12])), r"^exclude_ids values must be in \[0, 10\), got 12 at 1$"),
             (dict(exclude_per_row=torch.tensor([0, -1, 3])),
              r"^exclude_per_row values must be in \[0, 10\), got -1 at 1$"),
             (dict(exclude_per_row=torch.tensor([0, 3, 10])),
              r"^exclude_per_row values must be in \[0, 10\), got 10 at 2$")]
    for kwargs, match in calls:
        for call in (lambda: sample_categorical(logits, seed=1, **kwargs),
                     lambda: sample_categorical_reference(logits, seed=1, **kwargs),
                     lambda: sample_from_hidden(hidden, weight, seed=1, **kwargs),
                     lambda: sample_from_hidden_reference(hidden, weight, seed=1, **kwargs)):
            with pytest.raises(ValueError, match=match):
                call()


def test_the_threshold_kernel_cuts_top_p_to_candidates():
    """White box: without top-k, the Triton threshold kernel finds the tightest of its cuts
    (shift(x, M) >= -1, -2, ..., -16) whose upper set holds (p + 1e-4) Z, copies the logits
    above it to the scratch row in index order and searches those; the thresholds are the
    reference's. A flat row (every cut holds all 9000 logits, more than the scratch keeps),
    and a row where no cut holds p Z with the margin, get theirs from the whole row."""
    from ddpd.ops.sample_categorical import TOP_P_CANDIDATES, truncation_threshold

    kernels = _dispatch.kernels("sample_categorical")
    vocab, t, p = 9000, 0.8, 0.9
    capacity = TOP_P_CANDIDATES
    g = torch.Generator().manual_seed(11)
    logits = 3 * torch.randn(4, vocab, generator=g)
    logits[1] = 7.0  # flat
    logits[2, ::2] = float("nan")  # read as -inf
    logits[3] = 0.0  # 3 logits of 16 and 8997 ties 20 below them (at t = 0.8): every cut holds 1 - 6e-6
    logits[3, :3] = 16.0  # of the mass, less than (p + 1e-4) Z, and the nucleus takes every tie
    top_p = torch.tensor([p, p, p, 1 - 2**-24])
    tau = torch.empty(4)
    scratch = torch.full((4, capacity), float("nan"))
    ids = _dispatch.device_ids((), logits.device)
    kernels.thresholds_kernel[(4,)](logits, vocab, t, None, ids, 0, None, None, 0, None, 1.0, top_p, -math.inf, None,
                                    tau, scratch, 0, capacity, TOP_K=False, TOP_P=True, MIN_P=False, BLOCK=1024,
                                    SCAN_BLOCK=4096, GROUP=4096)
    masked = torch.nan_to_num(logits, nan=-math.inf)
    want = truncation_threshold(masked, torch.full((4,), t), torch.zeros(4, dtype=torch.long), top_p,
                                torch.full((4,), -math.inf))
    assert torch.equal(tau, want)
    cuts = [-c for c in range(1, 17)]
    for row in (0, 2):
        x = masked[row]
        y = torch.where(x == x.max(), 0.0, (x - x.max()) / torch.tensor(t))
        e = torch.exp(y).double()
        mass = [float(e[y >= c].sum()) for c in cuts]
        cut = next(c for c, m in zip(cuts, mass) if m >= (p + 1e-4) * float(e.sum()))
        candidates = x[y >= cut]
        assert len(candidates) < capacity and tau[row] >= candidates.min()  # the nucleus is among them
        assert torch.equal(scratch[row, :len(candidates)], candidates)
        assert scratch[row, len(candidates):].isnan().all()
    assert torch.equal(scratch[1], torch.full((capacity,), 7.0))  # the first 8192 of the flat row
    assert scratch[3].isnan().all()  # no cut: nothing copied


def _float_of_key(key: int) -> float:
    """The float32 whose order-preserving key (kernels/sample_categorical.py ordered_key) is key."""
    bits = key - 0x80000000 if key >= 0x80000000 else 0xFFFFFFFF - key
    return torch.tensor(bits - 2**32 if bits >= 2**31 else bits, dtype=torch.int32).view(torch.float32).item()


def test_top_k_search_keeps_a_key_just_above_its_range_out():
    """The Triton top-k search narrows a range [lo, hi) of keys pass by pass. Here the first
    pass over the row (max 0, so 16 ranges of 2**27 keys from the smallest float's) puts the
    3rd largest logit as the largest key of range 14, the 2nd largest as the first key of range
    15: the second pass's hi is the 2nd largest's key, which must stay outside, or it is counted
    twice and top-k keeps 2 logits, not 3."""
    first_of_15 = 0x00800000 + 15 * 2**27
    row = [0.0, _float_of_key(first_of_15), _float_of_key(first_of_15 - 1), _float_of_key(first_of_15 - 100)]
    logits = torch.full((16, 8), float("-inf"))
    logits[:, :4] = torch.tensor(row)
    kw = dict(top_k=3, seed=1, return_logprob=True)
    ref = sample_categorical_reference(logits, **kw)
    assert set(ref[0].tolist()) == {0, 1, 2}
    assert_same(triton_categorical(logits, **kw), ref)


def test_top_p_keeps_the_logits_exactly_on_its_cut():
    """The Triton top-p search copies out the logits with shift(x, M) >= its cut (here -1,
    the tightest cut holding p Z) and searches those: logits exactly on the cut belong to
    them. Here the nucleus is the maximum and four logits exactly 1 below it (p Z > 1, the
    maximum's weight), which the reference's draws and log-probabilities keep."""
    logits = torch.full((64, 300), -5.0)
    logits[:, 0] = 0.0
    logits[:, 1:5] = -1.0
    kw = dict(top_p=0.5, seed=4, return_logprob=True)
    ref = sample_categorical_reference(logits, **kw)
    assert 0 < int((ref[0] > 0).sum()) < 64 and bool((ref[0] < 5).all())
    assert_same(triton_categorical(logits, **kw), ref)


def test_top_p_keeps_every_logit_when_its_target_rounds_above_the_bucket_sums():
    """The Triton top-p search sums each block's weights per key range in float32, p Z in
    float64: at p = 1 - 2**-24, on 200 logits evenly from -3 to 0, p Z is above the sum of
    every range of the first pass (in the interpreter's order of summation). No range then
    holds p Z, and the search keeps the lowest: every logit, as the reference does (each holds
    more than 2**-24 of the mass), not the maximum's range alone."""
    logits = torch.linspace(-3.0, 0.0, 200).expand(16, 200).contiguous()
    kw = dict(top_p=1 - 2**-24, seed=4, return_logprob=True)
    ref = sample_categorical_reference(logits, **kw)
    assert len(set(ref[0].tolist())) > 8
    assert_same(triton_categorical(logits, **kw), ref)


def test_the_threshold_kernel_searches_the_whole_row_past_the_scratch():
    """White box: top-p copies the logits above its cut to the scratch row and searches those
    only when they fit. Of 9 logits above the cut (-1), a scratch of 8 holds the first 8 in
    index order, not the maximum, the whole nucleus at p = 0.2: that row is searched whole;
    a row of exactly 8 searches its copy. Both thresholds are the reference's, the maximum."""
    from ddpd.ops.sample_categorical import truncation_threshold

    kernels = _dispatch.kernels("sample_categorical")
    vocab, capacity, p = 64, 8, 0.2
    logits = torch.full((2, vocab), -40.0)
    logits[0, 10:18] = -1.0  # capacity + 1 candidates with the maximum, the last in index order
    logits[1, 10:17] = -1.0  # capacity
    logits[:, 40] = 0.0
    tau = torch.empty(2)
    scratch = torch.full((2, capacity), float("nan"))
    ids = _dispatch.device_ids((), logits.device)
    kernels.thresholds_kernel[(2,)](logits, vocab, 1.0, None, ids, 0, None, None, 0, None, p, None, -math.inf, None,
                                    tau, scratch, 0, capacity, TOP_K=False, TOP_P=True, MIN_P=False, BLOCK=1024,
                                    SCAN_BLOCK=4096, GROUP=4096)
    want = truncation_threshold(logits, torch.ones(2), torch.zeros(2, dtype=torch.long), torch.full((2,), p),
                                torch.full((2,), -math.inf))
    assert want.tolist() == [0.0, 0.0] and torch.equal(tau, want)
    assert torch.equal(scratch[0], torch.full((capacity,), -1.0))  # the maximum did not fit
    assert torch.equal(scratch[1], logits[1][logits[1] > -40.0])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3e-3, 3e5])
def test_the_threshold_kernel_finds_min_p_without_reading_the_row(temperature):
    """White box: min-p's threshold is the smallest float32 v with shift(v, M) >= log(min_p),
    found by bisection (shift is non-decreasing in v), not a pass over the row. Its kept set
    is the reference's on rows crowded around the boundary, ulp by ulp, where the rounding
    of the difference and of the division decide, with min_p 1 (the maxima only), with a +inf
    maximum, and with a min_p of 1e-30."""
    from ddpd.ops.sample_categorical import truncation_threshold

    kernels = _dispatch.kernels("sample_categorical")
    vocab, rows = 700, 5
    g = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(rows, vocab, generator=g)
    min_p = torch.tensor([0.05, 0.3, 1.0, 0.05, 1e-30])
    t = torch.tensor(temperature, dtype=torch.float32)
    for row in (0, 1, 2):
        m = logits[row].max()
        edge = (m + t * math.log(float(min_p[row]))).float()  # about where the kept set ends
        ulps = torch.arange(-150, 150, dtype=torch.float32) * torch.finfo(torch.float32).eps * edge.abs()
        logits[row, :300] = torch.minimum(edge + ulps, m)
    logits[3, 9] = float("inf")
    log_min_p = torch.log(min_p)
    tau = torch.empty(rows)
    ids = _dispatch.device_ids((), logits.device)
    kernels.thresholds_kernel[(rows,)](logits, vocab, temperature, None, ids, 0, None, None, 0, None, 1.0, None, 0.0,
                                       log_min_p, tau, tau, 0, 0, TOP_K=False, TOP_P=False, MIN_P=True, BLOCK=1024,
                                       SCAN_BLOCK=4096, GROUP=4096)
    want = truncation_threshold(logits, torch.full((rows,), temperature), torch.zeros(rows, dtype=torch.long),
                                torch.ones(rows), log_min_p)
    for row in range(rows):
        assert torch.equal(logits[row] >= tau[row], logits[row] >= want[row]), row
    kept = [int((logits[row] >= want[row]).sum()) for row in range(rows)]
    assert kept[3] == 1  # +inf alone
    for row in (0, 1):  # the boundary falls inside the crowd
        assert 0 < int((logits[row, :300] >= want[row]).sum()) < 300


def test_min_p_bound_reaches_down_to_the_smallest_float():
    """min-p's bisection starts at the smallest finite float32: at a maximum of -1e30 and a
    temperature of 1e29, min_p = 0.05 keeps logits down to about -1.3e30 (-1.2e30 here,
    at exp(-2) of the top), below a bisection started at -1e30."""
    logits = torch.tensor([[-1e30, -1.2e30, -1.5e30, -3e38]]).repeat(16, 1)
    kw = dict(min_p=0.05, seed=2, return_logprob=True)
    ref = sample_categorical_reference(logits, 1e29, **kw)
    assert set(ref[0].tolist()) == {0, 1}
    assert_same(triton_categorical(logits, 1e29, **kw), ref)


def threshold_rows(vocab: int, allowed: int, seed: int) -> torch.Tensor:
    """Masked float32 rows of `vocab` logits, `allowed` of them finite or +inf, the rest -inf:
    continuous logits, integer logits (ties everywhere, at every boundary too), a flat row,
    rows holding +inf, in ascending order (every logit would enter a heap) and in
    descending order."""
    g = torch.Generator().manual_seed(seed)
    rows = [2.5 * torch.randn(vocab, generator=g), torch.randint(-6, 6, (vocab,), generator=g).float(),
            torch.full((vocab,), 3.0), torch.randn(vocab, generator=g), torch.arange(vocab) / 7.0,
            -torch.arange(vocab) / 3.0]
    rows[3][torch.randperm(vocab, generator=g)[:2]] = float("inf")
    x = torch.stack(rows)
    for row in x:
        row[torch.randperm(vocab, generator=g)[allowed:]] = float("-inf")
    return x


@pytest.mark.parametrize("vocab,allowed", [(5, 1), (5, 5), (27, 2), (27, 27), (300, 63), (64, 64), (65, 65),
                                           (300, 300), (4096, 4096), (5000, 4097), (9000, 9000)])
def test_the_cpu_threshold_searches_agree_with_the_reference(vocab, allowed):
    """White box: the C++ truncation threshold (truncation_threshold_cpu, the test op of the
    search sample_categorical runs) is the reference's tau exactly, on rows of at most 64
    allowed logits (sorted on the stack), of 65-4096 (top-k by selection, top-p by four
    rounds of radix selection) and of more (a heap or three rounds of radix selection), at
    every k from off to all, top-p from a sliver to all but an ulp, with min-p, ties and
    +inf logits."""
    from ddpd.ops._dispatch import cpu_ops
    from ddpd.ops.sample_categorical import truncation_threshold

    x = threshold_rows(vocab, allowed, seed=vocab + allowed)
    n = x.shape[0]
    ks = sorted({0, 1, 2, allowed // 3, allowed - 1, allowed, allowed + 1})
    for k in ks:
        for p, t, min_p in [(1.0, 1.0, 0.0), (0.9, 0.8, 0.0), (0.3, 1.0, 0.05), (1 - 2**-24, 1e-3, 0.0),
                            (1e-6, 3.0, 0.0), (0.75, 0.7, 0.5)]:
            controls = (torch.full((n,), t), torch.full((n,), k, dtype=torch.long), torch.full((n,), p),
                        torch.full((n,), math.log(min_p) if min_p else -math.inf))
            want = truncation_threshold(x, *controls)
            got = cpu_ops().truncation_threshold_cpu(x, *controls)
            assert torch.equal(got, want), (k, p, t, min_p, got, want)


@pytest.mark.parametrize("rows,vocab", [(4096, 27), (2048, 5), (512, 300)])
def test_short_and_middling_rows_draw_the_reference_tokens(rows, vocab):
    """Many short rows (text8's and DNA's alphabets, where each row's threshold search is
    the cost) and rows of a few hundred, with per-row top-k and top-p: the C++ draws are
    the reference's token for token."""
    g = torch.Generator().manual_seed(rows + vocab)
    logits = 3 * torch.randn(rows, vocab, generator=g)
    top_k = torch.randint(0, vocab + 1, (rows,), generator=g)
    top_p = torch.rand(rows, generator=g).clamp(min=0.05)
    for kw in (dict(top_k=top_k), dict(top_p=top_p), dict(top_k=top_k, top_p=top_p, min_p=0.02)):
        kw.update(temperature=0.8, seed=5, offset=1, return_logprob=True)
        assert_same(sample_categorical(logits, **kw), sample_categorical_reference(logits, **kw))


@triton.jit
def _runner_up_kernel(stats_ptr, n_tiles, out_ptr, BLOCK_T: tl.constexpr):
    _, second, _ = row_summary(0, n_tiles, 9.0, 1.0, stats_ptr, True, False, BLOCK_T, RECORD)
    tl.store(out_ptr, second)


def test_the_runner_up_is_merged_across_chunks_of_tile_records():
    """White box: a row of more than BLOCK_T tiles (1024 tiles of 256 in the ops: vocabularies
    above 262,144) merges its two largest values a chunk of tile records at a time. The runner-up
    may be a later chunk's maximum below an earlier chunk's (here 8 < 9, chunks of 4 tiles),
    which a merge keeping max(second, rest) lost: the margin confidence read 1 instead of 8."""
    for maxima, want in [([9, 1, 0, 0, 8, 2, 0, 0], 8.0), ([3, 1, 0, 0, 8, 2, 9, 0], 8.0),
                         ([9, 1, 0, 0, 2, 0, 0, 0], 2.0), ([9, 9, 0, 0, 2, 0, 0, 0], 9.0)]:
        records = torch.full((len(maxima), RECORD.value), -30.0)
        records[:, TILE_MAX.value] = torch.tensor(maxima, dtype=torch.float32)
        records[:, TILE_MASS.value] = 0.0
        out = torch.empty(1)
        _runner_up_kernel[(1,)](records, len(maxima), out, BLOCK_T=4)
        assert float(out) == want, (maxima, float(out))


@triton.jit
def _greedy_race_kernel(stats_ptr, n_tiles, out_ptr, BLOCK_T: tl.constexpr):
    tile, _ = race(0, n_tiles, 0, 1.0, True, stats_ptr, None, 0, 0, 0, 0, 0, BLOCK_T, RECORD)
    tl.store(out_ptr, tile)


def test_the_greedy_race_gives_tied_tiles_to_the_first_chunk():
    """White box: a greedy row of more than BLOCK_T tiles races its tile maxima a chunk of
    records at a time; a later chunk's maximum tied with an earlier one's loses, so the
    greedy token is the first argmax of the row (as inside a chunk and on the other paths)."""
    for maxima, want in [([1, 9, 0, 0, 2, 9, 0, 0], 1), ([0, 0, 0, 0, 0, 0, 9, 9], 6), ([5, 5, 5, 5, 5, 5, 5, 5], 0)]:
        records = torch.zeros(len(maxima), RECORD.value)
        records[:, TILE_MAX.value] = torch.tensor(maxima, dtype=torch.float32)
        out = torch.full((1,), -1, dtype=torch.int32)
        _greedy_race_kernel[(1,)](records, len(maxima), out, BLOCK_T=4)
        assert int(out) == want, (maxima, int(out))


@pytest.mark.parametrize("arg,value,match", [
    (0, torch.zeros(2, 5, dtype=torch.float64), "x must be a contiguous float32"),
    (0, torch.zeros(5, 2).t(), "x must be a contiguous float32"),
    (1, torch.ones(3), "t must be a contiguous"),
    (1, torch.ones(2, dtype=torch.float64), "t must be a contiguous"),
    (2, torch.zeros(2, dtype=torch.int32), "top_k must be a contiguous"),
    (2, torch.zeros(1, dtype=torch.long), "top_k must be a contiguous"),
    (3, torch.ones(2, 1), "top_p must be a contiguous"),
    (4, torch.zeros(2, dtype=torch.float64), "log_min_p must be a contiguous"),
])
def test_the_cpu_threshold_op_refuses_controls_it_cannot_read_per_row(arg, value, match):
    """White box: truncation_threshold_cpu reads each control as a contiguous [N] array of one dtype."""
    from ddpd.ops._dispatch import cpu_ops

    args = [torch.zeros(2, 5), torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2),
            torch.full((2,), -math.inf)]
    assert torch.equal(cpu_ops().truncation_threshold_cpu(*args), torch.full((2,), -math.inf))
    args[arg] = value
    with pytest.raises(RuntimeError, match=match):
        cpu_ops().truncation_threshold_cpu(*args)


def test_per_row_controls_at_the_ends_of_their_ranges_draw_what_the_numbers_draw():
    """The ends of each range are accepted per row as they are as numbers (temperature 0 and
    1e36, top_p 1, min_p 0 and 1, top_k 0), and each row draws what its number draws."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    rows = torch.arange(3)
    cases = [("temperature", [0.0, 1e36, 1.0]), ("top_p", [1.0, 1e-6, 0.5]), ("min_p", [0.0, 1.0, 0.5]),
             ("top_k", [0, 1, 2**62])]
    for op in (sample_categorical, sample_categorical_reference):
        for name, values in cases:
            dtype = torch.int64 if name == "top_k" else torch.float64  # 1e36 exactly, not its float32 below
            per_row = op(logits, seed=2, row_ids=rows, **{name: torch.tensor(values, dtype=dtype)})
            for r, value in enumerate(values):
                assert per_row.tokens[r] == op(logits, seed=2, row_ids=rows, **{name: value}).tokens[r]
