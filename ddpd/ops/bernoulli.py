"""One coin per element, z = u < p, from the counter-based streams every ddpd op draws from:
a user's own coins (a remasking sampler's unmask decisions) are keyed by (seed, offset, row id,
column) like the ops' draws, so a row keeps its coins whatever the batch.
CPU tensors run csrc/cpu/bernoulli.cpp, CUDA tensors ddpd.kernels.bernoulli.
The law and its grid of probabilities: docs/ops/bernoulli.md.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ddpd.ops import _dispatch, rng
from ddpd.validation import check_tensor

P_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
BLOCK = 1024  # columns per Triton program


def check_p(p) -> torch.Tensor:
    """Validate the probabilities of bernoulli.

    Args:
        p: the op's `p`.

    Returns:
        `p`, unchanged.

    Raises:
        TypeError: p is not a tensor of one of P_DTYPES.
        ValueError: p is 0-d, or not a dense tensor on a cpu or cuda device.
    """
    check_tensor("p", p, P_DTYPES)
    if p.dim() == 0:
        raise ValueError("p must have shape [..., D] (rows of probabilities), got a 0-d tensor")
    return p


def bernoulli_reference(p: torch.Tensor, *, seed=None, offset=0, generator: Optional[torch.Generator] = None,
                        row_ids: Optional[torch.Tensor] = None, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Plain torch version of bernoulli, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.bernoulli.

    Returns:
        What ddpd.ops.bernoulli returns (Bool tensor of the coins).

    Raises:
        What ddpd.ops.bernoulli raises.
    """
    p2, noise, counters, row_ids = _prepare(p, seed, offset, generator, row_ids, noise)
    rng.check_noise_values(noise)
    if noise is None:
        noise = rng.stream_noise(counters, row_ids, p2.shape[0], p2.shape[1], p2.device)
    u = noise.clamp(max=rng.BELOW_ONE)
    z = u.double() < p2 if p2.dtype == torch.float64 else u < p2.float()
    return z.reshape(p.shape)


def bernoulli_grid(rows: int, width: int) -> tuple:
    """One program per BLOCK columns of a row, on one grid axis (2**31 - 1 programs; a second
    axis is capped at 65535).

    Args:
        rows: rows of the flattened input.
        width: columns a row (D).

    Returns:
        The 1-d launch grid, a tuple.

    Raises:
        ValueError: more programs than that axis takes.
    """
    return _dispatch.flat_grid("p", rows, width, BLOCK)


def bernoulli_triton(p, noise, seed, offset, row_ids, seed_t, offset_t):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        p: Float[N, D] probabilities, validated.
        noise: Float[N, D] explicit uniforms, or None to draw from the stream.
        seed: the stream's seed, an int64 bit pattern (read when seed_t is None).
        offset: the stream's offset, likewise (read when offset_t is None).
        row_ids: Long[N] stream ids of the rows, or None for 0..N-1.
        seed_t: an int64 tensor holding the seed, or None.
        offset_t: an int64 tensor holding the offset, or None.

    Returns:
        Bool[N, D] the coins.
    """
    bernoulli_kernel = _dispatch.kernels("bernoulli").bernoulli_kernel

    p = p.contiguous()
    rows, width = p.shape
    z = torch.empty(rows, width, dtype=torch.bool, device=p.device)
    if rows and width:
        _dispatch.launch(bernoulli_kernel, bernoulli_grid(rows, width), p, width, noise, row_ids, *rng.split32(seed),
                         *rng.split32(offset), seed_t, offset_t, z, BLOCK=BLOCK, FLOAT64=p.dtype == torch.float64)
    return z


def _bernoulli_impl(p, noise, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU."""
    if p.is_cuda:
        return bernoulli_triton(p, noise, seed, offset, row_ids, seed_t, offset_t)
    return _dispatch.cpu_kernel("bernoulli_cpu")(p.contiguous(), noise, seed, offset, row_ids, seed_t, offset_t)


@torch.library.custom_op("ddpd::bernoulli", mutates_args=())
def _bernoulli_op(p: torch.Tensor, noise: Optional[torch.Tensor], seed: int, offset: int,
                  row_ids: Optional[torch.Tensor], seed_t: Optional[torch.Tensor],
                  offset_t: Optional[torch.Tensor]) -> torch.Tensor:
    return _bernoulli_impl(p, noise, seed, offset, row_ids, seed_t, offset_t)


@_bernoulli_op.register_fake
def _(p, noise, seed, offset, row_ids, seed_t, offset_t):
    return torch.empty_like(p, dtype=torch.bool)


def _prepare(p, seed, offset, generator, row_ids, noise):
    """(p [N, D], noise [N, D] | None, counters, row_ids [N] | None), validated."""
    _dispatch.refuse_transforms("bernoulli", p, noise, row_ids)
    p = check_p(p)
    lead, width = tuple(p.shape[:-1]), p.shape[-1]
    if width:
        _dispatch.check_width("D (p's last dimension)", width)  # stream columns stay below 2**31
    rows = math.prod(lead)
    if noise is not None:
        check_tensor("noise", noise, (torch.float32,))
        if noise.shape != p.shape:
            raise ValueError(f"noise must have the shape of p {tuple(p.shape)}, got {tuple(noise.shape)}")
        noise = noise.reshape(rows, width)
    row_ids = rng.flat_row_ids(row_ids, lead)
    p2 = p.reshape(rows, width)
    counters = rng.resolve_stream(noise, (rows, width), p2, seed, offset, generator, row_ids, "p")
    noise, row_ids = _dispatch.contiguous(noise, row_ids)
    return p2, noise, counters, row_ids


def bernoulli(p: torch.Tensor, *, seed=None, offset=0, generator: Optional[torch.Generator] = None,
              row_ids: Optional[torch.Tensor] = None, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Coins z = u < p for probabilities p [..., D] (docs/ops/bernoulli.md).

    Column d of row r reads the uniform philox_uniform(seed, offset, row_ids, D)[r, d].

    Args:
        p: float tensor [..., D] of probabilities (<= 0: never, >= 1: always).
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[..., D].

    Returns:
        Bool[..., D] the coins.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape or device mismatch, or a seed out of range.
    """
    p2, noise, (seed, offset, seed_t, offset_t), row_ids = _prepare(p, seed, offset, generator, row_ids, noise)
    p2 = p2.detach()
    eager = _dispatch.eager(p2, noise, row_ids, seed_t, offset_t)
    z = (_bernoulli_impl if eager else _bernoulli_op)(p2, noise, seed, offset, row_ids, seed_t, offset_t)
    return z.reshape(p.shape)
