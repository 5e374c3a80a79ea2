"""The Triton Philox helper (ddpd.kernels.rng) and philox_uniform's kernel are bit-identical
to the torch reference ddpd.ops.rng.philox_uniform_reference, run in the Triton interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from ddpd.kernels.rng import gumbel, philox_uniform
from ddpd.ops.rng import PHILOX_BLOCK, philox_uniform_reference, philox_uniform_triton


@triton.jit
def _uniforms_kernel(out_ptr, rows_ptr, cols_ptr, n_cols, seed_lo, seed_hi, offset_lo, offset_hi,
                     BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    cols = tl.load(cols_ptr + c, mask=c < n_cols, other=0)
    u = philox_uniform(seed_lo, seed_hi, offset_lo, offset_hi, tl.load(rows_ptr + r), cols)
    tl.store(out_ptr + r * n_cols + c, u, mask=c < n_cols)


@triton.jit
def _gumbel_kernel(u_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, gumbel(tl.load(u_ptr + i, mask=i < n, other=0.5)), mask=i < n)


@pytest.mark.parametrize("seed,offset", [(0, 0), (1, 1), (2**32 - 1, 2**32), (2**64 - 1, 2**64 - 1),
                                         (0x123456789ABCDEF0, 0x0FEDCBA987654321)])
def test_bit_identical_to_torch_reference(seed, offset):
    rows = torch.tensor([0, 1, 7, 2**31, 2**32 - 1, 2**40 + 3])
    cols = torch.tensor([0, 1, 2, 255, 256, 50256, 2**30, 2**31 + 5, 2**32 - 1])
    out = torch.empty(len(rows), len(cols))
    _uniforms_kernel[(len(rows),)](out, rows, cols, len(cols), seed & 0xFFFFFFFF, seed >> 32,
                                   offset & 0xFFFFFFFF, offset >> 32, BLOCK=16)
    assert torch.equal(out, philox_uniform_reference(seed, offset, rows, cols))
    assert bool(((out > 0) & (out <= 1)).all())


def _bits(value: int) -> torch.Tensor:
    return torch.tensor(value - 2**64 if value >= 2**63 else value)  # the uint64 as int64 bits


@pytest.mark.parametrize("seed,offset", [(0, 0), (2**64 - 1, 2**64 - 1), (0x123456789ABCDEF0, 0x0FEDCBA987654321)])
def test_philox_uniform_kernel_is_bit_identical_to_torch(seed, offset):
    rows = torch.tensor([0, 1, 2**31, 2**32 - 1, 2**40 + 3, -1, -2**63])  # negative: ids >= 2**63
    cols = torch.tensor([0, 255, 50256, 2**31 + 5, 2**32 - 1, 2**33 + 7])  # columns wrap at 2**32
    expected = philox_uniform_reference(seed, offset, rows, cols)
    assert torch.equal(philox_uniform_triton(seed, offset, rows, cols), expected)
    assert torch.equal(philox_uniform_triton(_bits(seed), _bits(offset), rows, cols), expected)  # counters read
    wide = torch.arange(2500) + 7  # three blocks of a row, the last one partial
    assert torch.equal(philox_uniform_triton(seed, offset, rows, wide), philox_uniform_reference(seed, offset, rows,
                                                                                                   wide))
    assert philox_uniform_triton(seed, offset, rows[:0], wide).shape == (0, 2500)
    assert philox_uniform_triton(seed, offset, rows, wide[:0]).shape == (len(rows), 0)


def test_philox_uniform_kernel_fills_rows_of_whole_blocks_to_the_last_column():
    """Widths that are exact multiples of the block: every block starts BLOCK columns after the
    previous one, so the last columns of the row are drawn too (none is left unwritten)."""
    rows = torch.tensor([3, 2**33 + 1])
    for width in (PHILOX_BLOCK, 2 * PHILOX_BLOCK):
        cols = torch.arange(width) * 3 + 1
        out = philox_uniform_triton(5, 2**32 + 2, rows, cols)
        assert torch.equal(out, philox_uniform_reference(5, 2**32 + 2, rows, cols))


def test_row_ids_whose_high_word_is_one_draw_under_their_derived_key():
    """Row ids in [2**32, 2**33) (high word 1, the first past the seed's own key) draw under
    the key derived from the seed and that high word, as the reference does, and not as the
    row with their low word."""
    rows = torch.tensor([5, 2**32, 2**32 + 5, 2**33 - 1])
    cols = torch.tensor([0, 1, 2, 255])
    out = torch.empty(len(rows), len(cols))
    _uniforms_kernel[(len(rows),)](out, rows, cols, len(cols), 7, 0, 3, 0, BLOCK=4)
    assert torch.equal(out, philox_uniform_reference(7, 3, rows, cols))
    assert not torch.equal(out[0], out[2])


def test_gumbel_is_finite_at_the_top_uniform():
    u = torch.tensor([1.0, 1.0 - 2.0**-24, 2.0**-25, 0.5])
    out = torch.empty(4)
    _gumbel_kernel[(1,)](u, out, 4, BLOCK=4)
    assert bool(torch.isfinite(out).all())
    assert out[0] == out[1]  # 1.0 (float32 rounding of the top Philox uniform) is clamped below 1


def test_gumbel_clamps_only_the_uniform_of_one():
    """The clamp is the largest float32 below 1 itself: the uniforms just below 1 keep their
    own noise, ordered as the uniforms are, and only 1.0 takes the value of 1 - 2**-24."""
    u = torch.tensor([1.0 - 2.0**-23, 1.0 - 2.0**-24, 1.0])
    out = torch.empty(3)
    _gumbel_kernel[(1,)](u, out, 3, BLOCK=4)
    assert out[0] < out[1] == out[2]
    assert torch.isclose(out[1], -torch.log(-torch.log(u[1])), rtol=1e-6)
