"""categorical_from_weights, multinomial and multinomial_from_logits: the C++ kernels
against their torch references (exactly, same uniforms -> same index), the sampling
law (chi-square over >= 1e5 draws), and the handling of invalid rows and arguments."""
import importlib
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ddpd.ops.multinomial import (
    categorical_from_weights,
    categorical_from_weights_reference,
    check_weights,
    cumulative_weights,
    draw_uniforms,
    multinomial,
    multinomial_from_logits,
    multinomial_from_logits_reference,
    multinomial_reference,
)
from oracles.devices import MISMATCHES, fake_tensors

# A correct sampler fails a chi-square test at this level with probability 1e-4
# (the seeds are fixed, so a pass is reproducible).
P_MIN = 1e-4


def peaked_weights(rows: int, n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Weights spread over many orders of magnitude, with exact zeros, like a softmax."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, n, generator=g, dtype=torch.float64) * 6
    w = torch.exp(z - z.amax(-1, keepdim=True)).to(dtype)  # at most 1: no overflow in float16
    w[torch.rand(rows, n, generator=g) < 0.2] = 0
    w[:, 0] = 1  # every row keeps a positive weight
    return w


# ----------------------------------------------------------------------------- the law


def test_cumulative_weights_follow_the_two_level_definition():
    w = peaked_weights(3, 200, 0, torch.float64)
    c, total = cumulative_weights(w)
    for b in range(3):
        row = w[b].tolist()
        expected, before, running = [], 0.0, 0.0
        for i, x in enumerate(row):
            if i % 64 == 0 and i > 0:
                before, running = before + running, 0.0
            running += x
            expected.append(before + running)
        assert c[b].tolist() == expected
        assert total[b].item() == expected[-1]


def test_ties_go_to_the_next_index_and_zero_weights_are_never_drawn():
    # c = [0, 1, 2, 2, 4]: u * total = 1 equals c_1, so the draw is the next index
    # whose cumulative weight exceeds it, skipping the zero weight at 3.
    w = torch.tensor([[0.0, 1.0, 1.0, 0.0, 2.0]] * 4)
    u = torch.tensor([0.0, 0.25, 0.5, 0.75 - 2**-40], dtype=torch.float64)
    for fn in (categorical_from_weights, categorical_from_weights_reference):
        assert fn(w, u).tokens.tolist() == [1, 2, 4, 4]


@pytest.mark.parametrize("n", [1, 5, 63, 64, 65, 257, 1000, 50257])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_categorical_matches_reference_exactly(n, dtype):
    rows = 64 if n < 50257 else 8
    w = peaked_weights(rows, n, n, dtype)
    u = torch.rand(rows, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    assert torch.equal(categorical_from_weights(w, u).tokens, categorical_from_weights_reference(w, u).tokens)


def test_categorical_accepts_float32_uniforms_and_noncontiguous_weights():
    w = peaked_weights(40, 300, 1).t().contiguous().t()[:, ::2]  # strided
    u = torch.rand(40, generator=torch.Generator().manual_seed(1))
    assert not w.is_contiguous()
    want = categorical_from_weights_reference(w.contiguous(), u).tokens
    assert torch.equal(categorical_from_weights(w, u).tokens, want)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 7), (27, 16), (64, 64), (64, 3), (130, 16), (3000, 16), (50257, 16)])
def test_multinomial_matches_reference_with_seed(n, k, replacement):
    rows = 32 if n < 3000 else 4
    w = peaked_weights(rows, n, 7 * n + k)
    if not replacement:
        w[:, :k] = 1  # at least k positive weights per row
    for seed, offset in [(0, 0), (2**64 - 1, 2**63 + 12345)]:
        fast = multinomial(w, k, replacement, seed=seed, offset=offset).tokens
        assert torch.equal(fast, multinomial_reference(w, k, replacement, seed=seed, offset=offset).tokens)


@pytest.mark.parametrize("replacement", [True, False])
def test_multinomial_matches_reference_with_noise(replacement):
    w = peaked_weights(50, 500, 3, torch.float64)
    w[:, :10] = 1
    noise = torch.rand(50, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    noise[0] = 0.0  # the edges of [0, 1)
    noise[1] = 1.0 - 2**-53
    fast = multinomial(w, 10, replacement, noise=noise).tokens
    assert torch.equal(fast, multinomial_reference(w, 10, replacement, noise=noise).tokens)
    assert torch.equal(fast[:, 0], categorical_from_weights(w, noise[:, 0]).tokens)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "best"])
@pytest.mark.parametrize("replacement", [True, False])
def test_every_lanes_path_draws_rows_of_one_chunk_as_the_reference(isa, replacement):
    """Rows of at most 64 weights are drawn a few rows at a time in vector lanes, each draw's
    walk and the sum rebuilt after its removal in one pass over every weight: each path this
    CPU has finds the reference's indices, for row counts that leave some rows to the scalar
    code, invalid rows among valid ones, zero weights, ties and the edges of [0, 1)."""
    from ddpd.ops._dispatch import cpu_ops

    for n, k in [(1, 1), (2, 2), (3, 1), (10, 2), (27, 16), (63, 5), (64, 64)]:
        w = peaked_weights(37, n, n + k)
        if not replacement:
            w[:, :k] = 1
        w[3, :] = w[3, 0]  # every weight equal
        w[5, n // 2] = -1e-3  # invalid rows: a negative weight, a NaN
        w[8, 0] = float("nan")
        noise = torch.rand(37, k, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        noise[0] = 0.0
        noise[1] = 1.0 - 2**-53
        try:
            index, valid = cpu_ops().multinomial_lanes_cpu(w, k, replacement, noise, isa)
        except ValueError as error:
            assert f"no path '{isa}'" in str(error)
            pytest.skip(f"this CPU has no {isa} path")
        want, want_valid, _, _ = multinomial_reference(w, k, replacement, noise=noise, check_valid=False)
        assert torch.equal(valid, want_valid) and not valid[5] and not valid[8], (n, k)
        assert torch.equal(index, want), (n, k, (index != want).nonzero()[:3])


def test_philox_uniforms_feed_the_same_draws_as_explicit_noise():
    w = peaked_weights(20, 300, 4)
    ids = torch.arange(100, 120)
    u = draw_uniforms(99, 5, ids, 6)
    assert u.dtype == torch.float64 and bool((u > 0).all() and (u < 1).all())
    assert bool(((u * 2**48) % 1 == 0.5).all())  # (a 2**24 + b + 1/2) 2**-48: the kernels' uniforms
    seeded = multinomial(w, 6, True, seed=99, offset=5, row_ids=ids).tokens
    assert torch.equal(seeded, multinomial(w, 6, True, noise=u).tokens)
    assert torch.equal(seeded[:, 0], categorical_from_weights(w, u[:, 0]).tokens)


@pytest.mark.parametrize("replacement", [False, True])
def test_a_device_without_kernels_draws_what_the_kernels_draw(monkeypatch, replacement):
    """Where ddpd._C has no kernels for the device (CUDA tensors of a build without the CUDA
    toolkit) the op runs its reference on the same uniforms: the same indices, seeded (int or
    tensor counters) or from noise, with or without replacement."""
    from ddpd.ops import _ext

    w = peaked_weights(6, 150, 7)
    noise = torch.rand(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    calls = [dict(seed=5, offset=2), dict(seed=torch.tensor(5), offset=torch.tensor(2)), dict(noise=noise)]
    expected = [multinomial(w, 3, replacement, **call) for call in calls]
    monkeypatch.setattr(_ext, "ops_for", lambda device: None)
    for call, want in zip(calls, expected):
        got = multinomial(w, 3, replacement, **call)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.valid, want.valid)


def test_a_row_keeps_its_draws_whatever_the_batch():
    w = peaked_weights(30, 400, 5)
    full = multinomial(w, 4, False, seed=11, offset=3).tokens
    for r in (0, 17, 29):
        alone = multinomial(w[r : r + 1], 4, False, seed=11, offset=3, row_ids=torch.tensor([r])).tokens
        assert torch.equal(alone[0], full[r])
    keep = torch.tensor([2, 9, 25])
    assert torch.equal(multinomial(w[keep], 4, False, seed=11, offset=3, row_ids=keep).tokens, full[keep])


def test_seed_generator_and_offsets():
    w = peaked_weights(16, 100, 6)
    assert torch.equal(multinomial(w, 3, seed=5).tokens, multinomial(w, 3, seed=5).tokens)
    assert not torch.equal(multinomial(w, 3, seed=5).tokens, multinomial(w, 3, seed=5, offset=1).tokens)
    a = multinomial(w, 3, generator=torch.Generator().manual_seed(8)).tokens
    b = multinomial(w, 3, generator=torch.Generator().manual_seed(8)).tokens
    assert torch.equal(a, b)
    torch.manual_seed(1)
    c = multinomial(w, 3).tokens
    torch.manual_seed(1)
    assert torch.equal(c, multinomial(w, 3).tokens)


def test_without_replacement_never_repeats_and_skips_zero_weights():
    g = torch.Generator().manual_seed(9)
    w = torch.rand(400, 70, generator=g)
    w[w < 0.3] = 0
    w[:, :20] += 0.01  # >= 20 positive weights per row
    for k in (2, 20):
        index = multinomial(w, k, False, seed=k).tokens
        assert all(len(set(row)) == k for row in index.tolist())
        assert bool((w.gather(1, index) > 0).all())
    # k = number of positive weights: every positive index exactly once
    w2 = torch.zeros(50, 200)
    w2[:, 50:80] = torch.rand(50, 30, generator=g) + 1e-3
    index = multinomial(w2, 30, False, seed=1).tokens
    assert torch.equal(index.sort(1).values, torch.arange(50, 80).expand(50, 30))


# ----------------------------------------------------------------------------- distributions


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    probs = probs.double()
    expected = probs / probs.sum() * counts.sum()  # renormalised: only float rounding differs
    return stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue


def test_with_replacement_frequencies_match_the_weights():
    w = torch.tensor([0.5, 3.0, 0.0, 1.0, 2.5, 0.25, 4.0, 0.75])
    draws = multinomial(w.expand(10_000, -1), 12, True, seed=2024).tokens  # 1.2e5 draws
    counts = torch.bincount(draws.flatten(), minlength=8)
    assert counts[2] == 0
    keep = w > 0
    assert chi_square_p(counts[keep], w[keep] / w.sum()) > P_MIN


def test_small_probabilities_are_drawn_at_their_rate():
    # A 48-bit uniform resolves probabilities far below 2^-24: 1e5 draws of a weight
    # of relative size 1e-3 inside a large flat tail.
    n = 5000
    w = torch.full((n,), 1e-9)
    w[0], w[1] = 1.0, 1e-3
    probs = w.double() / w.double().sum()
    draws = multinomial(w.expand(100_000, -1), 1, True, seed=77).tokens.flatten()
    counts = torch.stack([(draws == 0).sum(), (draws == 1).sum(), (draws >= 2).sum()])
    expected = torch.stack([probs[0], probs[1], probs[2:].sum()])
    assert chi_square_p(counts, expected) > P_MIN


def test_ordered_pairs_follow_the_sequential_sampling_law():
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    draws = multinomial(w.expand(200_000, -1), 2, False, seed=31).tokens
    pair = draws[:, 0] * 4 + draws[:, 1]
    counts = torch.bincount(pair, minlength=16)
    total = w.sum()
    law = torch.tensor([[0.0 if i == j else (w[i] / total * w[j] / (total - w[i])).item() for j in range(4)]
                        for i in range(4)])
    diagonal = torch.arange(4) * 5
    assert counts[diagonal].sum() == 0
    off = torch.ones(16, dtype=torch.bool)
    off[diagonal] = False
    assert chi_square_p(counts[off], law.flatten()[off]) > P_MIN


def test_multinomial_from_logits_frequencies_match_softmax():
    logits = torch.tensor([0.0, 1.0, -2.0, 2.0, float("-inf"), 0.5])
    draws = multinomial_from_logits(logits.expand(25_000, -1), 4, temperature=0.7, replacement=True, seed=3).tokens
    counts = torch.bincount(draws.flatten(), minlength=6)
    assert counts[4] == 0
    probs = torch.softmax(logits / 0.7, -1)
    keep = probs > 0
    assert chi_square_p(counts[keep], probs[keep]) > P_MIN


def test_multinomial_from_logits_matches_reference():
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 3
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = logits.to(dtype)
        assert torch.equal(
            multinomial_from_logits(x, 5, 1.3, seed=6).tokens,
            multinomial_from_logits_reference(x, 5, 1.3, seed=6).tokens,
        )


# ----------------------------------------------------------------------------- invalid rows


def bad_rows() -> torch.Tensor:
    """Rows 1-5 invalid, rows 0 and 6 valid; row 0 is a fresh random draw at each call."""
    w = torch.rand(7, 10) + 0.1
    w[1] = 0  # all zero
    w[2, 3] = -1e-3  # negative
    w[3, 5] = float("nan")
    w[4, 2] = float("inf")
    w[5, 0] = float("-inf")
    w[6, :8] = 0  # two positive weights: fine with replacement, not for k = 3 without
    return w


@pytest.mark.parametrize("fn", [multinomial, multinomial_reference])
def test_invalid_rows_are_flagged_with_index_zero(fn):
    w = bad_rows()
    index, valid, _, _ = fn(w, 3, True, seed=1, check_valid=False)
    assert valid.tolist() == [True, False, False, False, False, False, True]
    assert bool((index[~valid] == 0).all()) and bool(((index >= 0) & (index < 10)).all())
    index, valid, _, _ = fn(w, 3, False, seed=1, check_valid=False)
    assert valid.tolist() == [True, False, False, False, False, False, False]
    assert bool((index[~valid] == 0).all())
    with pytest.raises(ValueError, match=r"rows \[1, 2, 3, 4, 5\]"):
        fn(w, 3, True, seed=1)


def test_the_error_names_the_first_eight_invalid_rows():
    """A batch of many invalid rows names the first 8 only, as the message says."""
    w = torch.zeros(10, 3)
    w[9] = 1
    for fn in (multinomial, multinomial_reference):
        with pytest.raises(ValueError, match=r"weights: rows \[0, 1, 2, 3, 4, 5, 6, 7\] \(first 8 shown\)"):
            fn(w, 1, seed=0)


def test_the_error_says_what_a_row_needs_for_its_k():
    """Without replacement a row needs k positive weights where k > 1, else a positive total;
    the logits' message speaks of the softmax reach only where k > 1 without replacement."""
    for fn in (multinomial, multinomial_reference):
        with pytest.raises(ValueError, match="with at least k = 2 positive weights"):
            fn(torch.tensor([[1.0, 0.0, 0.0]]), 2, seed=0)
        with pytest.raises(ValueError, match="with a positive total"):
            fn(torch.zeros(1, 3), 1, seed=0)
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"or are all -inf\. Pass check_valid=False"):
            draw(torch.full((1, 3), float("-inf")), 1, seed=0)


def test_categorical_invalid_rows():
    w = bad_rows()
    u = torch.full((7,), 0.5, dtype=torch.float64)
    for fn in (categorical_from_weights, categorical_from_weights_reference):
        index, valid, _, _ = fn(w, u, check_valid=False)
        assert valid.tolist() == [True, False, False, False, False, False, True]
        assert bool((index[~valid] == 0).all())
        with pytest.raises(ValueError, match="not valid distributions"):
            fn(w, u)


class _Logging(TorchDispatchMode):
    """Runs every op as it is: a logger's dispatch mode, which traces nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", [lambda: FlopCounterMode(display=False), _Logging])
def test_calls_under_a_mode_that_traces_nothing_read_their_flags_and_uniforms(mode):
    """Under a flop counter or a logging mode the flags and uniforms are real: check_valid=True
    draws as without the mode and raises on an invalid row (it once refused every call as
    traced), and uniforms outside [0, 1) are refused."""
    w, u = bad_rows(), torch.full((7,), 0.5, dtype=torch.float64)
    good = w[[0, 6]]
    expected = [fn(good, 2, True, seed=1).tokens for fn in (multinomial, multinomial_reference)]
    with mode():
        for fn, want in zip((multinomial, multinomial_reference), expected):
            assert torch.equal(fn(good, 2, True, seed=1).tokens, want)
            with pytest.raises(ValueError, match=r"rows \[1, 2, 3, 4, 5\]"):
                fn(w, 3, True, seed=1)
            with pytest.raises(ValueError, match=r"noise must lie in \[0, 1\)"):
                fn(good, 2, True, noise=torch.full((2, 2), 1.5))
        for fn in (categorical_from_weights, categorical_from_weights_reference):
            assert fn(good, u[:2]).tokens.shape == (2,)
            with pytest.raises(ValueError, match="not valid distributions"):
                fn(w, u)
        with pytest.raises(ValueError, match="hold NaN"):
            multinomial_from_logits(torch.full((2, 3), float("nan")), 1, seed=0)


def test_vmap_is_refused_with_a_clear_error():
    """Under vmap every slice would be row 0 of its own batch and draw the same stream; a
    batched weights, noise, row_ids or uniforms tensor is refused, as sample_categorical does."""
    w, u = torch.rand(6, 1, 5), torch.rand(6, 1, dtype=torch.float64)
    calls = [
        lambda x: multinomial(x, 1, seed=1).tokens,
        lambda x: multinomial_from_logits(x, 1, seed=1).tokens,
        lambda x: multinomial(w[0], 1, noise=x[:, :1].double()).tokens,
        lambda x: multinomial(w[0], 1, seed=1, row_ids=x[:, 0].long()).tokens,
        lambda x: categorical_from_weights(x, u[0]).tokens,
    ]
    for call in calls:
        with pytest.raises(ValueError, match="does not run under torch.func transforms"):
            torch.vmap(call)(w)
    with pytest.raises(ValueError, match="ddpd.ops.categorical_from_weights does not run under torch.func"):
        torch.vmap(lambda v: categorical_from_weights(w[0], v).tokens)(u)


class _Seen(torch.Tensor):
    """A tensor subclass that records the functions called on it."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(str(func))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_sees_the_registered_op():
    """A subclassed tensor goes through the custom op ddpd::multinomial (its schema and fake
    kernel), never straight to the C++ kernel behind it: the same draws either way."""
    w = torch.rand(3, 5, generator=torch.Generator().manual_seed(2))
    _Seen.seen.clear()
    tokens = multinomial(w.as_subclass(_Seen), 2, seed=0, check_valid=False).tokens
    assert [f for f in _Seen.seen if "ddpd" in f] == ["ddpd.multinomial.default"]
    assert torch.equal(tokens.as_subclass(torch.Tensor), multinomial(w, 2, seed=0).tokens)


@pytest.mark.parametrize("position", [5, 64 + 9, 2 * 64 + 63, 3 * 64, 4 * 64 + 1, 5 * 64 + 6])
@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf")])
def test_a_bad_weight_in_any_chunk_of_a_long_row_makes_it_invalid(position, bad):
    """Rows of more than one chunk sum four chunks at a time, then the rest one at a time: a
    bad weight in any of those chunks flags the row."""
    w = torch.ones(3, 5 * 64 + 7)
    w[1, position] = bad
    for replacement in (True, False):
        index, valid, _, _ = multinomial(w, 2, replacement, seed=4, check_valid=False)
        assert valid.tolist() == [True, False, True], (position, bad, replacement)
        assert index[1].tolist() == [0, 0]


def test_a_long_row_with_exactly_k_positive_weights_draws_them_all_without_replacement():
    w = torch.zeros(2, 200)
    positive = [3, 70, 130, 199]
    w[:, positive] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    index, valid, _, _ = multinomial(w, 4, False, seed=8, check_valid=False)
    assert valid.tolist() == [True, True]
    assert [sorted(row) for row in index.tolist()] == [positive, positive]
    assert multinomial(w, 5, False, seed=8, check_valid=False).valid.tolist() == [False, False]
    one = torch.zeros(2, 200)
    one[:, 150] = 1
    assert multinomial(one, 1, False, seed=8, check_valid=False).tokens.tolist() == [[150], [150]]
    assert multinomial(one, 2, False, seed=8, check_valid=False).valid.tolist() == [False, False]


def test_a_long_row_of_zeros_is_invalid_with_or_without_replacement():
    w = torch.ones(3, 130)
    w[1] = 0
    for replacement in (True, False):
        index, valid, _, _ = multinomial(w, 1, replacement, seed=0, check_valid=False)
        assert valid.tolist() == [True, False, True] and index[1].tolist() == [0]


@pytest.mark.parametrize("n", [10, 130])
def test_draws_past_the_first_sixty_four_of_a_row_read_on_in_its_stream(n):
    """The stream's words are computed 64 draws at a time: draws 64 onwards come from the next
    run of the row's stream, as in the reference."""
    w = peaked_weights(9, n, n)
    for k in (65, 150):
        fast = multinomial(w, k, True, seed=2**64 - 7, offset=3, row_ids=torch.arange(40, 49)).tokens
        want = multinomial_reference(w, k, True, seed=2**64 - 7, offset=3, row_ids=torch.arange(40, 49)).tokens
        assert torch.equal(fast, want), (n, k)


def test_float64_total_overflow_is_invalid():
    w = torch.full((2, 3), 1e308, dtype=torch.float64)
    w[1] = 1.0
    for fn in (multinomial, multinomial_reference):
        assert fn(w, 1, seed=0, check_valid=False).valid.tolist() == [False, True]


def test_empty_batch():
    for fn in (multinomial, multinomial_reference):
        assert fn(torch.zeros(0, 5), 2, seed=0).tokens.shape == (0, 2)


def test_subnormal_totals_draw_positive_weights_without_repeats():
    """With a subnormal float64 total, u * total can round up to the total itself, which no
    cumulative weight exceeds: the reference returned index N (out of range, or a crash
    without replacement) and the kernel its last index (a zero weight, or a repeat)."""
    w = torch.tensor([[5e-324, 5e-324, 0.0]], dtype=torch.float64)
    for fn in (categorical_from_weights, categorical_from_weights_reference):
        assert fn(w, torch.tensor([0.9], dtype=torch.float64), check_valid=False).tokens.tolist() == [1]
    w = torch.full((1, 3), 5e-324, dtype=torch.float64)
    noise = torch.tensor([[0.99, 0.9, 0.5]], dtype=torch.float64)
    for fn in (multinomial, multinomial_reference):
        assert sorted(fn(w, 3, False, noise=noise).tokens[0].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("n", [5, 64, 300])  # one chunk (lanes and scalar) and several
def test_uniforms_outside_the_unit_interval_draw_as_the_reference_and_never_a_zero_weight(n, replacement,
                                                                                           monkeypatch):
    """NaN, negative and >= 1 uniforms (unchecked under tracing, or on CUDA) draw the same index
    on every path: below 0 as 0, NaN and >= 1 as just below 1, so never an entry of zero weight."""
    from ddpd.ops._dispatch import cpu_ops

    multinomial_module = importlib.import_module("ddpd.ops.multinomial")  # ddpd.ops.multinomial is the op

    rows, k = 17, 4
    w = peaked_weights(rows, n, n)
    w[:, 0] = 0.0  # zero weights at both ends and in between
    w[:, -1] = 0.0
    w[:, 1:5] = 1.0  # at least k positive weights
    bad = [float("nan"), -0.5, -float("inf"), 1.0, 1.5, float("inf")]
    noise = torch.rand(rows, k, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    for r, u in enumerate(bad):
        noise[r] = u
        noise[len(bad) + r, r % k] = u
    monkeypatch.setattr(multinomial_module, "values_checkable", lambda x: False)  # as under tracing: values unread
    fast = multinomial(w, k, replacement, noise=noise, check_valid=False).tokens
    want = multinomial_reference(w, k, replacement, noise=noise, check_valid=False).tokens
    single = categorical_from_weights(w, noise[:, 0], check_valid=False).tokens
    single_want = categorical_from_weights_reference(w, noise[:, 0], check_valid=False).tokens
    assert torch.equal(fast, want), (fast != want).nonzero()[:3]
    assert torch.equal(single, single_want) and torch.equal(single, fast[:, 0])
    assert bool((w.gather(1, fast) > 0).all())
    if n <= 64:
        assert torch.equal(cpu_ops().multinomial_lanes_cpu(w, k, replacement, noise, "best")[0], want)


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(weights=[[1.0]]), TypeError, "weights must be a torch.Tensor"),
        (dict(weights=torch.ones(3, 4, dtype=torch.int64)), TypeError, "weights must be a float32"),
        (dict(weights=torch.ones(4)), ValueError, r"weights must have shape \[B, N\]"),
        (dict(weights=torch.ones(2, 0)), ValueError, "N >= 1"),
        (dict(weights=torch.ones(2, 3, 4)), ValueError, r"weights must have shape \[B, N\]"),
        (dict(weights=torch.ones(3, 4, device="meta")), ValueError, "weights must be on a cpu or cuda device"),
        (dict(k=0), ValueError, "k must be >= 1"),
        (dict(k=5, replacement=False), ValueError, "<= N = 4"),
        (dict(k=2**30, replacement=True), ValueError, r"k must be < 1073741824"),  # stream columns 2j, 2j + 1
        (dict(k=2.0), TypeError, "k must be an int"),
        (dict(k=True), TypeError, "k must be an int, got bool"),
        (dict(replacement=1), TypeError, "replacement must be a bool"),
        (dict(check_valid="no"), TypeError, "check_valid must be a bool"),
        (dict(seed=-1), ValueError, "seed must be an int"),
        (dict(seed=2**64), ValueError, "seed must be an int"),
        (dict(offset=3), ValueError, "offset needs an explicit seed"),
        (dict(seed=1, generator=torch.Generator()), ValueError, "either seed or generator"),
        (dict(generator=3), TypeError, "generator must be a torch.Generator"),
        (dict(seed=1, row_ids=torch.arange(2)), ValueError, r"row_ids must have shape \(3,\), got \(2,\)"),
        (dict(seed=1, row_ids=torch.arange(3.0)), TypeError, r"row_ids must have dtype in \(torch.int64\)"),
        (dict(seed=1, row_ids=[0, 1, 2]), TypeError, "row_ids must be a torch.Tensor"),
        (dict(noise=torch.rand(3, 2), seed=1), ValueError, "either noise or seed"),
        (dict(noise=torch.rand(3, 3)), ValueError, r"noise must have shape \(3, 2\)"),
        (dict(noise=torch.ones(3, 2)), ValueError, r"noise must lie in \[0, 1\)"),
        (dict(noise=torch.rand(3, 2, device="meta")), ValueError,
         r"^noise must be on the device of weights \(cpu\), got meta$"),
        (dict(noise=torch.ones(3, 2, dtype=torch.float16)), TypeError, "noise must be float32 or float64"),
    ],
)
def test_multinomial_argument_errors(kwargs, error, match):
    call = dict(weights=torch.ones(3, 4), k=2, replacement=True)
    call.update(kwargs)
    for fn in (multinomial, multinomial_reference):
        with pytest.raises(error, match=match):
            fn(**call)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_check_weights_widens_half_precision_to_float32_only(dtype):
    """Half-precision weights become float32 (exactly: every half value is a float32); float32
    and float64 weights come back as given."""
    w = peaked_weights(2, 70, 3, dtype)
    checked = check_weights(w)
    assert checked.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert torch.equal(checked.double(), w.double())
    if dtype in (torch.float32, torch.float64):
        assert checked is w


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("op", [categorical_from_weights, categorical_from_weights_reference])
def test_uniforms_on_another_device_than_the_weights_are_refused(op, like, other):
    """uniforms on another device than weights: the op's own ValueError, naming uniforms,
    weights and both devices, in the ops' one wording (it said "must be on cpu like the
    weights"). Fake tensors stand in for a GPU."""
    with fake_tensors(like):
        with pytest.raises(ValueError, match=rf"^uniforms must be on the device of weights \({like}\), "
                                             rf"got {other}$"):
            op(torch.ones(3, 4), torch.rand(3, device=other))


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["noise", "row_ids", "seed", "offset"])
@pytest.mark.parametrize("op", [multinomial_from_logits, multinomial_from_logits_reference])
def test_from_logits_names_logits_for_a_stream_argument_on_another_device(op, name, like, other):
    """noise, row_ids or a seed or offset tensor on another device than logits: the error names
    logits, the argument the op takes (it said "the device of weights", which it has none of)."""
    with fake_tensors(like):
        counter = torch.zeros((), dtype=torch.int64, device=other)
        given = {"noise": dict(noise=torch.rand(2, 2, device=other)),
                 "row_ids": dict(seed=1, row_ids=torch.arange(2, device=other)),
                 "seed": dict(seed=counter), "offset": dict(seed=1, offset=counter)}[name]
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of logits \({like}\), got {other}$"):
            op(torch.randn(2, 4), 2, **given)


def test_categorical_argument_errors():
    w = torch.ones(3, 4)
    with pytest.raises(ValueError, match=r"uniforms must have shape \(3,\)"):
        categorical_from_weights(w, torch.rand(4)).tokens
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        categorical_from_weights(w, -torch.rand(3)).tokens
    with pytest.raises(TypeError, match="uniforms must be a torch.Tensor"):
        categorical_from_weights(w, [0.1, 0.2, 0.3]).tokens
    with pytest.raises(TypeError, match="check_valid must be a bool"):
        categorical_from_weights(w, torch.rand(3), check_valid=0).tokens


@pytest.mark.parametrize("temperature,error",
                         [(0.0, ValueError), (-1.0, ValueError), (math.inf, ValueError), (1e37, ValueError),
                          ("1", TypeError), (True, TypeError)])
def test_multinomial_from_logits_temperature_errors(temperature, error):
    with pytest.raises(error, match="temperature"):
        multinomial_from_logits(torch.zeros(2, 3), 1, temperature, seed=0).tokens


def test_multinomial_from_logits_names_logits_of_another_rank():
    """Logits of 3 dimensions are refused as logits, not as the weights the caller never passed."""
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"logits must have shape \[B, N\] .* got \(2, 1, 3\)"):
            draw(torch.zeros(2, 1, 3), 1, seed=0)


def test_multinomial_from_logits_refuses_integer_logits():
    """Integer logits are refused, not drawn from as if they were floats."""
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(TypeError, match="logits must be a floating tensor, got torch.int64"):
            draw(torch.zeros(2, 3, dtype=torch.int64), 1, seed=0)


@pytest.mark.parametrize("shape", [(2, 0), (0, 0)])
def test_multinomial_from_logits_refuses_rows_of_no_logits(shape):
    """Logits of N = 0 failed in the softmax's row maximum with torch's "amax(): Expected
    reduction dim -1 to have non-zero size" (an IndexError), where multinomial says N >= 1."""
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"logits must have shape \[B, N\] with N >= 1"):
            draw(torch.zeros(shape), 1, seed=0)


@pytest.mark.parametrize("keyword", ["top_k", "seeed"])
def test_multinomial_from_logits_names_itself_for_an_unknown_keyword(keyword):
    """A keyword it does not take (sample_categorical's top_k, a typo) was refused as
    "multinomial() got an unexpected keyword argument" (multinomial_reference() for the
    reference): a function the caller never called."""
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(TypeError, match=rf"^multinomial_from_logits\(\) got an unexpected keyword argument "
                                            rf"'{keyword}' \(it takes k, temperature, replacement and seed, offset, "
                                            rf"generator, row_ids, noise, check_valid\)$"):
            draw(torch.zeros(2, 3), 1, **{keyword: 1})


def test_multinomial_from_logits_takes_numpy_temperatures():
    """A numpy float32 temperature (a value read from an array) was refused with "temperature
    must be a float, got float32", where sample_categorical and planner_select take it."""
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        expected = draw(logits, 2, 0.5, seed=3).tokens
        assert torch.equal(draw(logits, 2, np.float32(0.5), seed=3).tokens, expected)
        with pytest.raises(ValueError, match="temperature"):
            draw(logits, 1, np.float32(0.0), seed=3)


def test_multinomial_from_logits_keeps_a_row_valid_at_extreme_temperatures():
    """logits / T overflowed to inf at T = 1e-37 and the row was refused as invalid weights."""
    logits = torch.tensor([[100.0, 300.0, float("-inf")]])
    for temperature in (1e-37, 1e-300, 1e36):
        for draw in (multinomial_from_logits, multinomial_from_logits_reference):
            tokens, valid, _, _ = draw(logits, 1, temperature, seed=0)
            assert bool(valid.all()) and (temperature > 1 or tokens.tolist() == [[1]])


def test_multinomial_from_logits_invalid_rows():
    logits = torch.zeros(3, 4)
    logits[1] = float("-inf")
    logits[2, 1] = float("nan")
    _, valid, _, _ = multinomial_from_logits(logits, 1, seed=0, check_valid=False)
    assert valid.tolist() == [True, False, False]


def test_multinomial_from_logits_without_replacement_names_the_float32_softmax_limit():
    """softmax in float32 underflows below about -103 * T from the row's maximum: a row with
    fewer than k tokens within that range cannot give k distinct draws. The error spoke of
    weights the caller never passed; it now names the logits and the limit, for the op and
    its reference alike. float64 logits reach further; the flags are unchanged."""
    logits = torch.tensor([[0.0, 0.0, -200.0], [0.0, 1.0, 2.0]])
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"logits: rows \[0\] .* fewer than k = 3 tokens .* 103 \* temperature"):
            draw(logits, 3, seed=0)
        with pytest.raises(ValueError, match=r"logits: rows \[0, 1\] .* 103 \* temperature"):
            draw(torch.tensor([[0.0, 1.0, 2.0]] * 2), 2, 1e-3, seed=0)
        assert draw(logits, 3, seed=0, check_valid=False).valid.tolist() == [False, True]
        assert draw(logits.double(), 3, seed=0).valid.tolist() == [True, True]
    with pytest.raises(ValueError, match=r"logits: rows \[1\] .* NaN"):
        multinomial_from_logits(torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), 1, seed=0)


def test_multinomial_from_logits_names_the_float64_softmax_limit():
    """float64 logits are refused with their own reach (about 745 * temperature) and dtype."""
    logits = torch.tensor([[0.0, 0.0, -1000.0]], dtype=torch.float64)
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"fewer than k = 3 tokens with a positive float64 softmax weight "
                                             r"\(within about 745 \* temperature of the row's maximum\)"):
            draw(logits, 3, seed=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_multinomial_from_logits_names_the_float32_limit_for_half_logits(dtype):
    """Half-precision logits are softmaxed in float32: a row short of k tokens is refused
    with float32's reach (about 103 * temperature) and dtype, not its own."""
    logits = torch.tensor([[0.0, 0.0, -200.0]], dtype=dtype)
    for draw in (multinomial_from_logits, multinomial_from_logits_reference):
        with pytest.raises(ValueError, match=r"fewer than k = 3 tokens with a positive float32 softmax weight "
                                             r"\(logits within about 103 \* temperature of the row's maximum; "
                                             r"float64 logits reach about 745 \* temperature\)"):
            draw(logits, 3, seed=0)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("replacement", [True, False])
def test_cuda_matches_cpu_exactly(replacement):
    w = peaked_weights(64, 50257, 12)
    w[:, :16] = 1
    cpu = multinomial(w, 16, replacement, seed=3, offset=9).tokens
    gpu = multinomial(w.cuda(), 16, replacement, seed=3, offset=9).tokens
    assert torch.equal(gpu.cpu(), cpu)
    u = torch.rand(64, dtype=torch.float64)
    assert torch.equal(categorical_from_weights(w.cuda(), u.cuda()).tokens.cpu(), categorical_from_weights(w, u).tokens)
    short = w[:, 10:37].contiguous()  # rows of one chunk: a thread a row
    assert torch.equal(categorical_from_weights(short.cuda(), u.cuda()).tokens.cpu(),
                       categorical_from_weights(short, u).tokens)
    bad = bad_rows()  # one draw of its random rows for both devices (rows of one chunk)
    index, valid, _, _ = multinomial(bad.cuda(), 2, replacement, seed=1, check_valid=False)
    ref_index, ref_valid, _, _ = multinomial(bad, 2, replacement, seed=1, check_valid=False)
    assert torch.equal(index.cpu(), ref_index) and torch.equal(valid.cpu(), ref_valid)


@pytest.mark.gpu
@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("rows,n,k", [(4096, 27, 16), (64, 1000, 40), (8, 2048, 70), (8, 50257, 33),
                                      (4, 200_000, 40)])
def test_cuda_matches_cpu_at_every_launch(rows, n, k, replacement):
    """The one-launch path (rows of at most 32 chunks), the two-launch path, k > 32 (the draw
    warp computes its uniforms 32 at a time, one a lane), and rows too wide for a draw's
    state in shared memory (over about 130,000 weights: kept in global memory)."""
    w = peaked_weights(rows, n, rows + n + k)
    w[:, :k] = 1  # at least k positive weights per row
    for seed, offset in [(3, 9), (2**64 - 1, 2**63 + 5)]:
        cpu = multinomial(w, k, replacement, seed=seed, offset=offset).tokens
        assert torch.equal(multinomial(w.cuda(), k, replacement, seed=seed, offset=offset).tokens.cpu(), cpu)
    noise = torch.rand(rows, k, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    cpu = multinomial(w, k, replacement, noise=noise).tokens
    assert torch.equal(multinomial(w.cuda(), k, replacement, noise=noise.cuda()).tokens.cpu(), cpu)


@pytest.mark.gpu
def test_cuda_multinomial_does_not_synchronise():
    w = peaked_weights(8, 1000, 13).cuda()
    ids = torch.arange(8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        multinomial(w, 4, False, seed=1, row_ids=ids, check_valid=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_opcheck_and_compile():
    """ddpd::multinomial is a custom op with a fake kernel (categorical_from_weights runs
    through it): opcheck passes, and a compiled call draws what the eager one draws."""
    weights = torch.rand(5, 300, generator=torch.Generator().manual_seed(2))
    op = torch.ops.ddpd.multinomial.default
    rows = torch.arange(5) * 3
    torch.library.opcheck(op, (weights, 4, False, None, 3, 9, rows, None, None))
    torch.library.opcheck(op, (weights.double(), 2, True, torch.rand(5, 2, dtype=torch.float64), 0, 0, None, None,
                               None))
    torch.library.opcheck(op, (weights, 3, False, None, 0, 0, rows, torch.tensor(3), torch.tensor(9)))

    def draw(w, offset):
        index, valid, _, _ = multinomial(w, 4, seed=3, offset=offset, check_valid=False)
        picked = categorical_from_weights(w, torch.full((w.shape[0],), 0.5, dtype=torch.float64),
                                          check_valid=False)[0]
        return index, valid, picked

    compiled = torch.compile(draw, fullgraph=True, backend="aot_eager")
    offset = torch.tensor(9)
    for _ in range(2):
        for a, b in zip(compiled(weights, offset), draw(weights, offset)):
            assert torch.equal(a, b)
        offset += 1
    raising = torch.compile(lambda w: multinomial(w, 2, seed=1).tokens, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception) as refused:
        raising(weights)
    # torch before 2.9 names the ValueError's type, not its message: "Observed exception ... ValueError"
    assert re.search(r"check_valid=False|Observed exception(.|\n)*ValueError", str(refused.value)), refused.value


@pytest.mark.parametrize("op", [multinomial, multinomial_reference])
def test_a_numpy_integer_k_draws_what_the_int_draws(op):
    """A numpy k (a count computed with numpy) was refused as not an int."""
    weights = torch.rand(3, 6, generator=torch.Generator().manual_seed(0))
    got, want = op(weights, np.int64(4), seed=np.uint32(7)), op(weights, 4, seed=7)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.valid, want.valid)
    with pytest.raises(TypeError, match="^k must be an int, got float64"):
        op(weights, np.float64(4), seed=7)


@pytest.mark.parametrize("weights, k, replacement, match", [
    (torch.ones(3), 1, True, r"multinomial: weights must be \[B, N\] with N > 0, got \[3\]"),
    (torch.ones(2, 0), 1, True, r"multinomial: weights must be \[B, N\] with N > 0, got \[2, 0\]"),
    (torch.ones(2, 3), 0, True, "multinomial: k must be >= 1, got 0"),
    (torch.ones(2, 3), 4, False, "multinomial: k must be <= N = 3 without replacement, got 4"),
])
def test_the_cpu_kernel_refuses_weights_and_k_it_cannot_draw_by_itself(weights, k, replacement, match):
    """torch.ops.ddpd.multinomial_kernel checks its own arguments; k = N without replacement
    and k > N with it are drawn."""
    kernel = torch.ops.ddpd.multinomial_kernel
    with pytest.raises(RuntimeError, match=match):
        kernel(weights, k, replacement, None, 1, 0, torch.arange(weights.shape[0]), None, None)
    index, valid = kernel(torch.ones(2, 3), 3, False, None, 1, 0, torch.arange(2), None, None)
    assert sorted(index[0].tolist()) == [0, 1, 2] and bool(valid.all())
    assert kernel(torch.ones(2, 3), 5, True, None, 1, 0, torch.arange(2), None, None)[0].shape == (2, 5)


def test_the_cpu_kernel_refuses_uniforms_and_row_ids_of_another_shape():
    kernel, weights = torch.ops.ddpd.multinomial_kernel, torch.ones(2, 3)
    for uniforms in (torch.rand(2, 2, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64), torch.rand(2, 1)):
        with pytest.raises(RuntimeError, match=r"multinomial: uniforms must be float64 \[2, 1\]"):
            kernel(weights, 1, True, uniforms, 0, 0, None, None, None)
    for rows in (None, torch.arange(3), torch.arange(2).int(), torch.zeros(2, 1, dtype=torch.long)):
        with pytest.raises(RuntimeError, match=r"multinomial: row_ids must be int64 \[B\] with B = 2"):
            kernel(weights, 1, True, None, 1, 0, rows, None, None)
