"""Counter-based random numbers shared by every ddpd op (torch reference).

Each uniform is a pure function of (seed, offset, row, column): Philox4x32-10
with key (seed_lo, seed_hi) and counter (column, row_lo, offset_lo, offset_hi), the
first 32-bit output word w mapped to u = ((w >> 8) + 0.5) * 2**-24 in float32.
Row ids are 64-bit: a row whose high word row_hi = row >> 32 is not zero draws with
the key (k0, k1) = the first two output words of Philox4x32-10 with key (seed_lo,
seed_hi) and counter (row_hi, 2**32 - 1, 2**32 - 1, 2**32 - 1), so rows r and
r + 2**32 draw independently while every row below 2**32 keeps the stream it always
had. (The counter of that extra evaluation is the one of column row_hi, row
2**32 - 1, offset 2**64 - 1; a caller that reads that last offset sees a key word's
top bits, nothing worse.)
Float32 rounds the half-step above 0.5, and the top value (probability 2**-25)
rounds to exactly 1.0, so u lies in (0, 1]: every consumer that takes a logarithm
of 1 - u (Gumbel, exponential) clamps u to the largest float below one first. Because the row enters the
counter as an id rather than a position in the batch, a row keeps its stream
whatever the batch composition (compaction, sharding, different batch sizes).

The C++ (csrc/philox.h) and Triton (ddpd.kernels) paths reproduce these bits
exactly, so a kernel and this reference can be compared token for token.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

_MASK32 = 0xFFFFFFFF
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
_ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for a 32-bit constant a and uint32 values
    held in int64. b is split in 16-bit halves so no product overflows int64."""
    b_lo = b & 0xFFFF
    b_hi = b >> 16
    p_lo = a * b_lo  # < 2**48
    p_hi = a * b_hi  # < 2**48
    mid = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    lo = mid & _MASK32
    hi = (p_hi >> 16) + (mid >> 32)
    return hi & _MASK32, lo


def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on int64 tensors holding uint32 values (broadcasting); the key
    words k0, k1 are ints or such tensors."""
    for _ in range(_ROUNDS):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def row_key(seed, rows: torch.Tensor) -> tuple:
    """Philox key words (k0, k1) of each row id (int64 tensor holding uint64 bits):
    the seed's words below 2**32, the derived key of the module docstring above.
    seed: an int, or an int64 0-d tensor holding its bits."""
    seed_lo, seed_hi = seed & _MASK32, (seed >> 32) & _MASK32
    row_hi = (rows >> 32) & _MASK32
    # One extra evaluation per row (not per column). Skipped where no row needs it,
    # when that costs no host sync (CPU tensors): most callers have small row ids.
    if rows.device.type == "cpu" and not bool(row_hi.any()):
        return seed_lo, seed_hi
    ones = torch.full_like(row_hi, _MASK32)
    d0, d1, _, _ = philox4x32(row_hi, ones, ones, ones, seed_lo, seed_hi)
    return torch.where(row_hi != 0, d0, seed_lo), torch.where(row_hi != 0, d1, seed_hi)


def philox_words(seed, offset, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """First Philox output word (uint32 in int64) for row ids rows [N] x columns cols [M].
    seed, offset: ints, or int64 0-d tensors on the rows' device holding their bits."""
    rows = rows[:, None]
    k0, k1 = row_key(seed, rows)
    c0 = (cols & _MASK32)[None, :]
    c1 = rows & _MASK32
    zero = torch.zeros_like(c1)
    c2 = zero + (offset & _MASK32)
    c3 = zero + ((offset >> 32) & _MASK32)
    w, _, _, _ = philox4x32(c0, c1, c2, c3, k0, k1)
    return w.expand(rows.shape[0], cols.numel())


def check_seed(seed, offset) -> None:
    """seed and offset: ints in [0, 2**64), or int64 tensors of one element (their bits)."""
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.int64 or value.numel() != 1:
                raise ValueError(f"{name} must be an int in [0, 2**64) or an int64 tensor of one element, got "
                                 f"{value.dtype} of shape {tuple(value.shape)}")
        elif not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise ValueError(f"{name} must be an int in [0, 2**64), got {value!r}")


def philox_uniform(
    seed,
    offset,
    rows: Union[torch.Tensor, Sequence[int]],
    cols: Union[torch.Tensor, int],
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Uniforms in (0, 1], float32 [len(rows), n_cols], from (seed, offset, row id, column).

    seed, offset: ints in [0, 2**64), or int64 tensors of one element holding their bits
    (read on the device, so a CUDA graph replays with whatever value they hold).
    rows: row ids (Long[N], 64-bit: negative values stand for ids >= 2**63); cols: number
    of columns M (columns 0..M-1) or Long[M].
    """
    check_seed(seed, offset)
    rows = torch.as_tensor(rows, dtype=torch.int64, device=device)
    if isinstance(cols, int):
        cols = torch.arange(cols, dtype=torch.int64, device=rows.device)
    cols = torch.as_tensor(cols, dtype=torch.int64, device=rows.device)
    if rows.dim() != 1 or cols.dim() != 1:
        raise ValueError(f"rows and cols must be 1-D, got shapes {tuple(rows.shape)} and {tuple(cols.shape)}")
    seed, offset = (v.reshape(()).to(rows.device) if isinstance(v, torch.Tensor) else v for v in (seed, offset))
    w = philox_words(seed, offset, rows, cols)
    return ((w >> 8).to(torch.float32) + 0.5) * (2.0**-24)


def seed_from_generator(generator: Optional[torch.Generator]) -> tuple[int, int]:
    """Draw a (seed, offset) pair from a torch.Generator (or the global one)."""
    draws = torch.randint(0, 2**62, (2,), generator=generator, dtype=torch.int64)
    return int(draws[0]), int(draws[1])
