"""ddpd.ops.planner_mask and planner_select_mask: C++ CPU path, Triton kernels
(interpreter) and torch references agree; z follows Bernoulli(sigmoid(logits)) with
the chosen positions always masked (prop:draw_with_maskD)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy import stats

from ddpd.ops import rng
from ddpd.ops.planner_mask import planner_mask, planner_mask_reference, planner_mask_triton, positions_block
from ddpd.ops.planner_select import (
    MAX_TRITON_WIDTH,
    draw_mask,
    planner_select,
    planner_select_mask,
    planner_select_mask_reference,
    planner_select_triton,
    resolve_pair,
)
from ddpd.ops.rng import philox_uniform
from oracles.devices import MISMATCHES, fake_tensors, moved

CHI2_MIN_P = 1e-3  # a distribution test fails when its chi-square p-value is below this
MASK_ID = 27


def inputs(rows, length, seed, k=1):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, length, generator=g)
    if length > 3:
        logits[0, 2] = float("nan")
        logits[-1, 3] = float("inf")
    x = torch.randint(0, MASK_ID, (rows, length), generator=g)
    positions = torch.stack([torch.randperm(length, generator=g)[:k] for _ in range(rows)])
    return logits, x, positions


def triton_mask(logits, x, positions, seed=None, offset=0, row_ids=None, noise=None):
    counters = rng.resolve_stream(noise, tuple(logits.shape), logits, seed, offset, None, row_ids, "logits")
    return planner_mask_triton(logits, x, positions, MASK_ID, noise, counters, row_ids)


def triton_select_mask(logits, x, k, mode="sigmoid", seed=None, offset=0, row_ids=None, noise=None,
                       mask_noise=None, mask_offset=None):
    counters, mask_counter = resolve_pair(noise, mask_noise, logits, seed, offset, mask_offset, None, row_ids)
    return planner_select_triton(logits, k, mode == "softmax", 1.0, 0.01, noise, counters, row_ids,
                                 mask=(x, MASK_ID, mask_noise, mask_counter))


def assert_all_equal(out, ref):
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        if a.dtype == torch.float32:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("length,k", [(1, 1), (7, 0), (7, 2), (257, 1), (257, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_planner_mask_paths_agree(length, k, dtype):
    logits, x, positions = inputs(3, length, length + k, max(k, 1))
    logits = logits.to(dtype)
    positions = positions[:, :k]
    noise = torch.rand(3, length, generator=torch.Generator().manual_seed(length))
    for kw in (dict(noise=noise), dict(seed=2**63 + 1, offset=2**64 - 1, row_ids=torch.tensor([9, 0, 2**36]))):
        ref = planner_mask_reference(logits, x, positions, MASK_ID, **kw)
        assert_all_equal(planner_mask(logits, x, positions, MASK_ID, **kw), ref)
        assert_all_equal(triton_mask(logits, x, positions, **kw), ref)
    no_positions = planner_mask_reference(logits, x, None, MASK_ID, noise=noise)
    assert_all_equal(planner_mask(logits, x, None, MASK_ID, noise=noise), no_positions)
    assert_all_equal(triton_mask(logits, x, None, noise=noise), no_positions)


def test_reference_positions_outside_the_row_force_nothing():
    """What the kernels do with positions that reach them unchecked (CUDA tensors): a position
    outside [0, D) forces nothing; -1 is not the last position, and D is no index error."""
    p = torch.zeros(2, 4)
    x = torch.arange(8).reshape(2, 4)
    masked, z, count = draw_mask(p, torch.full((2, 4), 0.5), torch.tensor([[-1, 1], [4, 9]]), x, MASK_ID)
    assert torch.equal(z, torch.tensor([[False, True, False, False], [False] * 4]))
    assert torch.equal(masked, torch.tensor([[0, MASK_ID, 2, 3], [4, 5, 6, 7]])) and count.tolist() == [1, 0]


@pytest.mark.parametrize("bad", [-1, 5])
@pytest.mark.parametrize("op", [planner_mask, planner_mask_reference])
def test_cpu_positions_just_outside_the_row_are_refused(op, bad):
    """A CPU position of -1 or D is refused by the op and by its reference alike (on CPU the
    range is checked; only unchecked CUDA positions force nothing)."""
    logits, x, positions = inputs(4, 5, 0)
    positions[2, 0] = bad
    with pytest.raises(ValueError, match=r"positions must be in \[0, 5\)"):
        op(logits, x, positions, MASK_ID, seed=1)


@pytest.mark.parametrize("bad", [-1, 5])
@pytest.mark.parametrize("op", [planner_mask, planner_mask_reference])
def test_a_bad_position_in_the_last_rows_last_column_is_refused(op, bad):
    """With k = 2 positions per row, the range check covers all B x k of them, up to the
    last one of the last row, not just the first B."""
    logits, x, positions = inputs(4, 5, 0, k=2)
    assert positions.shape == (4, 2)
    positions[3, 1] = bad
    with pytest.raises(ValueError, match=r"positions must be in \[0, 5\)"):
        op(logits, x, positions, MASK_ID, seed=1)


@pytest.mark.parametrize("counter", ["seed", "offset"])
def test_tensor_seed_and_offset_draw_the_mask_of_their_values(counter):
    """A seed or offset given as a one-element tensor draws the same mask as the int it holds:
    the CPU kernel reads the counter from the tensor, not the placeholder int beside it."""
    logits, x, positions = inputs(3, 40, 0, k=2)
    values = {"seed": 2**33 + 5, "offset": 2**40 + 3}
    expected = planner_mask_reference(logits, x, positions, MASK_ID, **values)
    got = planner_mask(logits, x, positions, MASK_ID, **{**values, counter: torch.tensor(values[counter])})
    assert torch.equal(got.z, expected.z) and torch.equal(got.masked, expected.masked)
    assert not torch.equal(got.z, planner_mask_reference(logits, x, positions, MASK_ID, seed=5, offset=3).z)


@pytest.mark.parametrize("op", [planner_mask, planner_mask_reference])
def test_explicit_uniforms_outside_the_unit_interval_are_refused(op):
    """An explicit uniform of 0 is refused by the op and by its reference alike."""
    logits, x, positions = inputs(4, 5, 0)
    noise = torch.full((4, 5), 0.5)
    noise[1, 2] = 0.0
    with pytest.raises(ValueError, match=r"noise values must be uniforms in \(0, 1\]"):
        op(logits, x, positions, MASK_ID, noise=noise)


def test_triton_mask_takes_more_positions_than_one_block_compares():
    """D x k beyond Triton's largest block (2**20 values): the positions in chunks, not one
    [D, k] comparison that fails to compile."""
    logits, x, positions = inputs(1, 2048, 3, k=1024)
    ref = planner_mask_reference(logits, x, positions, MASK_ID, seed=5)
    assert_all_equal(triton_mask(logits, x, positions, seed=5), ref)


def test_triton_mask_reads_only_a_rows_own_positions():
    """k = 3 positions a row, compared in a block of 4: the block's last lane lies past the
    row's positions (at the next row's first) and forces nothing. p is about 0 and every
    uniform 0.5, so z is exactly the forced positions."""
    logits = torch.full((2, 8), -30.0)
    x = torch.zeros(2, 8, dtype=torch.int64)
    positions = torch.tensor([[0, 1, 2], [5, 6, 7]])
    noise = torch.full((2, 8), 0.5)
    ref = planner_mask_reference(logits, x, positions, MASK_ID, noise=noise)
    assert ref[1].nonzero().tolist() == [[0, 0], [0, 1], [0, 2], [1, 5], [1, 6], [1, 7]]
    assert_all_equal(triton_mask(logits, x, positions, noise=noise), ref)


def test_triton_mask_draws_from_each_word_of_the_offset_in_its_own_place():
    """An offset whose low and high 32-bit words differ (the paths-agree offset has equal
    words): the seeded Triton mask is the reference's, low word for low word. At p = 1/2
    the 64 positions of each row show any other stream."""
    logits, x, positions = torch.zeros(2, 64), torch.zeros(2, 64, dtype=torch.int64), torch.tensor([[0], [1]])
    for offset in (2**32 + 3, 3 * 2**32 + 1):
        ref = planner_mask_reference(logits, x, positions, MASK_ID, seed=11, offset=offset)
        assert_all_equal(triton_mask(logits, x, positions, seed=11, offset=offset), ref)


@pytest.mark.parametrize("length,k", [(1, 1), (7, 3), (257, 2)])
@pytest.mark.parametrize("mode", ["sigmoid", "softmax"])
def test_planner_select_mask_paths_agree(length, k, mode):
    logits, x, _ = inputs(3, length, 5 * length + k)
    g = torch.Generator().manual_seed(k)
    noise, mask_noise = torch.rand(3, length, generator=g), torch.rand(3, length, generator=g)
    # seeded: the mask stream at offset + 1 (2**64 wraps to 0), and at offsets whose two words differ
    for kw in (dict(noise=noise, mask_noise=mask_noise), dict(seed=17, offset=2**64 - 1), dict(seed=17, offset=5),
               dict(seed=17, offset=3, mask_offset=2**33 + 7)):
        ref = planner_select_mask_reference(logits, x, MASK_ID, k, mode, **kw)
        assert_all_equal(planner_select_mask(logits, x, MASK_ID, k, mode, **kw), ref)
        assert_all_equal(triton_select_mask(logits, x, k, mode, **kw), ref)


def test_fused_equals_select_then_mask_at_next_offset():
    logits, x, _ = inputs(6, 40, 1)
    rows = torch.tensor([5, 4, 3, 2, 1, 0])
    fused = planner_select_mask(logits, x, MASK_ID, 2, seed=3, offset=10, row_ids=rows)
    positions, sum_p, stop = planner_select(logits, 2, seed=3, offset=10, row_ids=rows)
    masked, z, count = planner_mask(logits, x, positions, MASK_ID, seed=3, offset=11, row_ids=rows)
    assert_all_equal(fused, (positions, sum_p, stop, masked, z, count))
    explicit = planner_mask(logits, x, positions, MASK_ID, noise=philox_uniform(3, 11, rows, 40))
    assert_all_equal(explicit, (masked, z, count))


@pytest.mark.parametrize("mode", ["sigmoid", "softmax"])
def test_picks_of_weight_zero_are_not_forced_into_the_mask(mode):
    """k beyond the positions of weight > 0 (a prompt's fixed positions reach the op as -inf
    logits): the extra picks are not denoised, so they stay unmasked; they used to be masked,
    hiding the prompt from the mask denoiser."""
    logits = torch.full((4, 6), float("-inf"))
    logits[:, 4:] = 0.0
    logits[1, 0] = float("nan")  # NaN counts as -inf
    x = torch.randint(0, MASK_ID, (4, 6), generator=torch.Generator().manual_seed(0))
    for kw in (dict(seed=5), dict(noise=torch.rand(4, 6), mask_noise=torch.ones(4, 6) - 1e-7)):
        ref = planner_select_mask_reference(logits, x, MASK_ID, 6, mode, **kw)
        positions, _, _, masked, z, count = ref
        assert torch.equal(positions[:, 2:].sort(1).values, torch.arange(4).expand(4, 4))  # the -inf picks last
        assert not z[:, :4].any() and torch.equal(masked[:, :4], x[:, :4])
        if "mask_noise" in kw:  # no Bernoulli mask: exactly the two positions of weight > 0 are forced
            assert bool(z[:, 4:].all()) and torch.equal(count, torch.full((4,), 2))
        assert_all_equal(planner_select_mask(logits, x, MASK_ID, 6, mode, **kw), ref)
        assert_all_equal(triton_select_mask(logits, x, 6, mode, **kw), ref)


def test_mask_structure():
    logits, x, positions = inputs(64, 33, 2, k=3)
    few = torch.tensor([0, 1, 63])  # the Triton interpreter gets the first and last rows
    for rows, (masked, z, count) in ((torch.arange(64), planner_mask(logits, x, positions, MASK_ID, seed=1)),
                                     (few, triton_mask(logits[few], x[few], positions[few], seed=1))):
        assert bool(z.gather(1, positions[rows]).all())  # chosen positions are always masked
        assert torch.equal(masked, torch.where(z, MASK_ID, x[rows]))
        assert torch.equal(count, z.sum(1))
        assert not z[0, 2] or bool((positions[0] == 2).any())  # NaN logit: p = 0, masked only if chosen
        assert bool(z[-1, 3])  # +inf logit: p = 1


def test_a_uniform_equal_to_the_planner_probability_leaves_the_position_clean():
    """z = u < sigmoid(l), strictly: logit 0 gives p = 0.5 exactly, and u = 0.5 masks nothing,
    on the C++ path, in the reference and in both Triton kernels (the fused one forces its pick)."""
    logits, x = torch.zeros(2, 5), torch.arange(10).reshape(2, 5)
    for noise, masked in ((torch.full((2, 5), 0.5), False), (torch.full((2, 5), 0.5).nextafter(torch.zeros(())), True)):
        want = torch.full((2, 5), masked)
        for draw in (planner_mask, planner_mask_reference):
            assert torch.equal(draw(logits, x, None, MASK_ID, noise=noise).z, want)
        assert torch.equal(triton_mask(logits, x, None, noise=noise)[1], want)
        positions, _, _, _, z, _ = triton_select_mask(logits, x, 1, noise=torch.rand(2, 5), mask_noise=noise)
        assert torch.equal(z, want | (torch.arange(5) == positions))


def test_a_planner_sure_of_noise_masks_where_the_uniform_is_1():
    """z = min(u, BELOW_ONE) < p, as ddpd.ops.bernoulli: a logit of 30 (p = 1.0 in float32)
    masks even where u is 1.0, the top grid value (one uniform in 2**24), on the C++ path,
    in the reference and in both Triton kernels; a plain u < p left the noise showing."""
    logits, x = torch.full((2, 5), 30.0), torch.arange(10).reshape(2, 5)
    noise, want = torch.ones(2, 5), torch.ones(2, 5, dtype=torch.bool)
    for draw in (planner_mask, planner_mask_reference):
        assert torch.equal(draw(logits, x, None, MASK_ID, noise=noise).z, want)
    assert torch.equal(triton_mask(logits, x, None, noise=noise)[1], want)
    assert torch.equal(triton_select_mask(logits, x, 1, noise=torch.rand(2, 5), mask_noise=noise)[4], want)
    for select_mask in (planner_select_mask, planner_select_mask_reference):
        assert torch.equal(select_mask(logits, x, MASK_ID, 1, noise=torch.rand(2, 5), mask_noise=noise).z, want)


def test_bernoulli_frequencies_match_sigmoid():
    n = 100_000
    logits = torch.tensor([-4.0, -1.0, -0.2, 0.0, 0.7, 2.0, 5.0])
    x = torch.zeros(n, 7, dtype=torch.long)
    _, z, _ = planner_mask(logits.expand(n, -1), x, None, MASK_ID, seed=44)
    p = torch.sigmoid(logits).double()
    counts = z.sum(0).double()
    # Independent Bernoulli columns: sum of squared z-scores ~ chi-square with 7 dof.
    statistic = float((((counts - n * p) ** 2) / (n * p * (1 - p))).sum())
    assert stats.chi2.sf(statistic, df=7) > CHI2_MIN_P


@settings(max_examples=30, deadline=None, derandomize=True)
@given(rows=st.integers(1, 4), length=st.integers(1, 200), data=st.data(), seed=st.integers(0, 2**64 - 1),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_fuzz_cpu_matches_reference(rows, length, data, seed, dtype):
    k = data.draw(st.integers(1, length))
    logits, x, _ = inputs(rows, length, seed % 2**63)
    logits = logits.to(dtype)
    assert_all_equal(planner_select_mask(logits, x, MASK_ID, k, seed=seed),
                     planner_select_mask_reference(logits, x, MASK_ID, k, seed=seed))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda lg, x, p: planner_mask(lg, x.int(), p, MASK_ID, seed=1), TypeError, "x must have dtype"),
        (lambda lg, x, p: planner_mask(lg, x[:, :3], p, MASK_ID, seed=1), ValueError, "x must have shape"),
        (lambda lg, x, p: planner_mask(lg, x, p[:2], MASK_ID, seed=1), ValueError, "positions must have 4 rows"),
        (lambda lg, x, p: planner_mask(lg, x, p + 5, MASK_ID, seed=1), ValueError, r"positions must be in \[0, 5\)"),
        (lambda lg, x, p: planner_mask(lg, x, p, -1, seed=1), ValueError, "mask_id must be in"),
        (lambda lg, x, p: planner_mask_reference(lg[:, :0], x[:, :0], None, MASK_ID, seed=1), ValueError,
         r"D \(logits.shape\[1\]\) must be in \[1, "),
        (lambda lg, x, p: planner_mask(lg[:, :0], x[:, :0], None, MASK_ID, seed=1), ValueError,
         r"D \(logits.shape\[1\]\) must be in \[1, "),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, noise=torch.rand(4, 5)), ValueError,
         "both noise and mask_noise"),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, noise=torch.rand(4, 5), mask_noise=torch.rand(4, 4)),
         ValueError, r"mask_noise must have shape \(4, 5\)"),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, k=9, seed=1), ValueError, r"k must be in \[1, 5\]"),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, mask_noise=torch.rand(4, 5)), ValueError,
         "both noise and mask_noise"),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, noise=torch.rand(4, 5), mask_noise=torch.rand(4, 5),
                                              mask_offset=3), ValueError, "either mask_noise or mask_offset"),
        (lambda lg, x, p: planner_select_mask(lg, x, MASK_ID, noise=torch.rand(4, 5),
                                              mask_noise=torch.rand(4, 5).double()), TypeError,
         "mask_noise must have dtype"),
        (lambda lg, x, p: planner_mask(lg, x, p, 2**62 + 1, seed=1), ValueError, "mask_id must be in"),
        (lambda lg, x, p: planner_mask(lg, x, p.int(), MASK_ID, seed=1), TypeError, "positions must have dtype"),
        (lambda lg, x, p: planner_select_mask(lg, x, 2**62 + 1, seed=1), ValueError, "mask_id must be in"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error, match):
    logits, x, positions = inputs(4, 5, 0)
    with pytest.raises(error, match=match):
        call(logits, x, positions)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name, call", [
    ("positions", lambda lg, x, t: planner_mask(lg, x, t(torch.zeros(2, 1, dtype=torch.long)), MASK_ID, seed=1)),
    ("positions", lambda lg, x, t: planner_mask_reference(lg, x, t(torch.zeros(2, 1, dtype=torch.long)), MASK_ID,
                                                          seed=1)),
    ("x", lambda lg, x, t: planner_mask(lg, t(x), None, MASK_ID, seed=1)),
    ("x", lambda lg, x, t: planner_select_mask(lg, t(x), MASK_ID, seed=1)),
    ("mask_noise", lambda lg, x, t: planner_select_mask(lg, x, MASK_ID, noise=torch.rand(2, 3),
                                                        mask_noise=t(torch.rand(2, 3)))),
    ("mask_noise", lambda lg, x, t: planner_select_mask_reference(lg, x, MASK_ID, noise=torch.rand(2, 3),
                                                                  mask_noise=t(torch.rand(2, 3)))),
    ("mask_offset", lambda lg, x, t: planner_select_mask(lg, x, MASK_ID, seed=1,
                                                         mask_offset=t(torch.zeros((), dtype=torch.long)))),
    ("mask_offset", lambda lg, x, t: planner_select_mask_reference(lg, x, MASK_ID, seed=1,
                                                                   mask_offset=t(torch.zeros((), dtype=torch.long)))),
])
def test_tensors_on_another_device_than_the_logits_are_refused(name, call, like, other):
    """positions, x, mask_noise or mask_offset on another device than logits: the op's own
    ValueError, naming the argument, logits and both devices (mask_offset said "the input").
    Fake tensors give a CUDA tensor without a GPU (a meta tensor is refused earlier, as on
    neither cpu nor cuda)."""
    with fake_tensors(like):
        logits, x = torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long)
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of logits \({like}\), got {other}$"):
            call(logits, x, lambda t: moved(t, other))


def test_traces_with_fake_tensors_and_passes_opcheck():
    logits, x, positions = inputs(3, 20, 6, k=2)

    def step(logits, tokens):
        positions, sum_p, stop, masked, z, count = planner_select_mask(logits, tokens, MASK_ID, 2, seed=2, offset=8)
        return positions, masked, count + stop.long()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(logits, x), step(logits, x)):
        assert torch.equal(a, b)
    torch.library.opcheck(torch.ops.ddpd.planner_mask.default,
                          (logits, x, positions, MASK_ID, None, 2, 8, None, None, None))
    torch.library.opcheck(torch.ops.ddpd.planner_select_mask.default,
                          (logits, x, MASK_ID, 2, False, 1.0, 0.01, None, None, 2, 8, 9, None, None, None, None))


def test_the_cpu_kernel_refuses_logits_and_x_it_cannot_read():
    logits, x, positions = inputs(4, 5, 0)
    kernel = torch.ops.ddpd.planner_mask_cpu
    for lg, xx, match in [(logits[0], x[0], "logits must be a contiguous"), (logits.t(), x.t(), "logits must be a"),
                          (logits, x.int(), "x must be a contiguous Long"), (logits, x[:, :4], "x must be a"),
                          (logits, x.t().contiguous().t(), "x must be a contiguous Long")]:
        with pytest.raises(RuntimeError, match=match):
            kernel(lg, xx, None, MASK_ID, None, 1, 0, None, None, None)


def test_strided_positions_force_the_positions_they_show():
    """Positions that are a strided view (every other column) force the positions the view
    holds, not the neighbours stored beside them."""
    logits, x = torch.zeros(3, 8), torch.arange(24).reshape(3, 8)
    positions = torch.tensor([[0, 5, 1, 6], [2, 7, 3, 4], [7, 0, 6, 1]])[:, ::2]
    assert not positions.is_contiguous()
    noise = torch.full((3, 8), 0.9)  # p = 0.5: only the forced positions are masked
    for draw in (planner_mask, planner_mask_reference):
        z = draw(logits, x, positions, MASK_ID, noise=noise).z
        assert z.nonzero().tolist() == [[0, 0], [0, 1], [1, 2], [1, 3], [2, 6], [2, 7]]


def test_planner_mask_compiles_fullgraph_and_matches_eager():
    logits, x, positions = inputs(3, 20, 7, k=2)

    def step(logits, tokens, positions):
        return planner_mask(logits, tokens, positions, MASK_ID, seed=2, offset=8)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert_all_equal(compiled(logits, x, positions), step(logits, x, positions))


def test_vmap_is_refused_with_a_clear_error():
    """Under vmap every slice would be row 0 of its own batch and draw the same stream."""
    logits, x, positions = inputs(6, 5, 0)
    with pytest.raises(ValueError, match="ddpd.ops.planner_mask does not run under torch.func transforms"):
        torch.vmap(lambda lg: planner_mask(lg[None], x[:1], positions[:1], MASK_ID, seed=1).z)(logits)


def test_one_dimensional_positions_are_refused():
    logits, x, positions = inputs(4, 5, 0)
    for op in (planner_mask, planner_mask_reference):
        with pytest.raises(ValueError, match=r"positions must be 2-D, got shape \(4,\)"):
            op(logits, x, positions[:, 0], MASK_ID, seed=1)


def test_triton_mask_refuses_rows_wider_than_one_block():
    length = MAX_TRITON_WIDTH + 1
    logits, x = torch.zeros(1, length), torch.zeros(1, length, dtype=torch.int64)
    match = rf"^D must be <= {MAX_TRITON_WIDTH} on CUDA \(one block per row\), got {length}$"
    with pytest.raises(ValueError, match=match):
        triton_mask(logits, x, None, seed=1)


def test_positions_block_covers_k_to_a_power_of_two_within_the_largest_block():
    """BLOCK_K: every position a row has in one comparison (k to a power of two),
    unless [BLOCK_D, BLOCK_K] would pass 2**20 values."""
    assert [positions_block(k, 8) for k in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, 8]
    assert positions_block(1024, 2048) == 2**20 // 2048
    assert positions_block(5, 2**20) == 1


def test_triton_mask_forces_the_positions_a_strided_view_shows():
    """The Triton launch reads positions as a dense [B, k] block: a strided view (every other
    column) forces the positions it holds, as the reference does, not the ones stored beside them."""
    logits, x = torch.zeros(3, 8), torch.arange(24).reshape(3, 8)
    positions = torch.tensor([[0, 5, 1, 6], [2, 7, 3, 4], [7, 0, 6, 1]])[:, ::2]
    assert not positions.is_contiguous()
    noise = torch.full((3, 8), 0.9)  # p = 0.5: only the forced positions are masked
    out = triton_mask(logits, x, positions, noise=noise)
    assert out[1].nonzero().tolist() == [[0, 0], [0, 1], [1, 2], [1, 3], [2, 6], [2, 7]]
    assert_all_equal(out, planner_mask_reference(logits, x, positions, MASK_ID, noise=noise))


def test_strided_noise_and_row_ids_draw_what_their_values_say():
    """Explicit uniforms and row ids that are strided views: the mask is the one their values
    give, as from contiguous copies."""
    logits, x, positions = inputs(3, 9, 4)
    noise = torch.rand(9, 3, generator=torch.Generator().manual_seed(1)).clamp_min(1e-6).T
    row_ids = torch.tensor([4, 0, 9, 0, 2, 0])[::2]
    assert not noise.is_contiguous() and not row_ids.is_contiguous()
    for draw in (planner_mask, planner_mask_reference):
        assert_all_equal(draw(logits, x, positions, MASK_ID, noise=noise),
                         planner_mask_reference(logits, x, positions, MASK_ID, noise=noise.contiguous()))
        assert_all_equal(draw(logits, x, positions, MASK_ID, seed=3, row_ids=row_ids),
                         planner_mask_reference(logits, x, positions, MASK_ID, seed=3, row_ids=row_ids.contiguous()))


def test_triton_mask_reads_strided_logits_and_sequences_by_their_values():
    """Logits and sequences that are column slices of wider tensors: the Triton mask is the
    reference's on contiguous copies."""
    wide_logits, wide_x, _ = inputs(3, 20, 6)
    logits, x = wide_logits[:, 3:13], wide_x[:, ::2]
    positions = torch.tensor([[0], [4], [9]])
    assert not logits.is_contiguous() and not x.is_contiguous()
    ref = planner_mask_reference(logits.contiguous(), x.contiguous(), positions, MASK_ID, seed=7)
    assert_all_equal(triton_mask(logits, x, positions, seed=7), ref)
