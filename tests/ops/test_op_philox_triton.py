"""The Triton Philox helper (ddpd.kernels.rng) is bit-identical to the torch
reference ddpd.ops.rng.philox_uniform, run in the Triton interpreter."""
import pytest
import torch
import triton
import triton.language as tl

from ddpd.kernels.rng import gumbel, philox_uniform
from ddpd.ops.rng import philox_uniform as philox_uniform_reference


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


def test_gumbel_is_finite_at_the_top_uniform():
    u = torch.tensor([1.0, 1.0 - 2.0**-24, 2.0**-25, 0.5])
    out = torch.empty(4)
    _gumbel_kernel[(1,)](u, out, 4, BLOCK=4)
    assert bool(torch.isfinite(out).all())
    assert out[0] == out[1]  # 1.0 (float32 rounding of the top Philox uniform) is clamped below 1
