"""The mask of prop:draw_with_maskD alone (planner_select_mask draws it with the plan step):
z^d ~ Bernoulli(sigmoid(l^d)) for every position, forced to 1 at the positions being denoised,
and x with mask_id wherever z = 1, for a mask-diffusion denoiser.
CPU tensors run csrc/cpu/planner_mask.cpp, CUDA tensors ddpd.kernels.planner_mask.
The law and why it follows the proposition rather than the paper's listing: docs/ops/planner_mask.md.
"""
from __future__ import annotations

from typing import Optional

import torch

from ddpd.ops import _dispatch, rng
from ddpd.ops.planner_select import check_mask_args, check_triton_width, draw_mask, planner_logits, planner_prob
from ddpd.ops.results import Mask
from ddpd.validation import check_same_device, check_tensor

MAX_BLOCK_NUMEL = 2**20  # the most values a Triton block holds (TRITON_MAX_TENSOR_NUMEL)

# ----------------------------------------------------------------------------- checks


def check_positions(positions, logits) -> None:
    """Validate the shape, dtype and device of planner_mask's `positions`.

    Args:
        positions: the op's `positions`.
        logits: the op's `logits`, whose rows and device positions must match.

    Raises:
        TypeError: positions is not an int64 tensor.
        ValueError: positions is not 2-d, has another number of rows, or sits on another device.
    """
    check_tensor("positions", positions, (torch.int64,), 2)
    if positions.shape[0] != logits.shape[0]:
        raise ValueError(f"positions must have {logits.shape[0]} rows, got shape {tuple(positions.shape)}")
    check_same_device("positions", positions, logits, "logits")


def check_position_values(positions: Optional[torch.Tensor], length: int) -> None:
    """Range check of positions; CPU only, where it costs no device sync.

    Args:
        positions: Long[B, k] positions, or None.
        length: D, the positions a row has.

    Raises:
        ValueError: a CPU position outside [0, length).
    """
    if positions is None or not positions.is_cpu or positions.numel() == 0:
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= length:
        raise ValueError(f"positions must be in [0, {length}), got range [{low}, {high}]")


# ------------------------------------------------------------------------- reference


def planner_mask_reference(
    logits: torch.Tensor,
    x: torch.Tensor,
    positions: Optional[torch.Tensor],
    mask_id: int,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Mask:
    """Plain torch version of planner_mask, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.planner_mask.

    Returns:
        What ddpd.ops.planner_mask returns (Mask).

    Raises:
        What ddpd.ops.planner_mask raises.
    """
    check_tensor("logits", logits, _dispatch.FLOAT_DTYPES, 2)
    _dispatch.check_width("D (logits.shape[1])", logits.shape[1])
    mask_id = check_mask_args(logits, x, mask_id)
    if positions is not None:
        check_positions(positions, logits)
        check_position_values(positions, logits.shape[1])
    rows, length = logits.shape
    counters = rng.resolve_stream(noise, (rows, length), logits, seed, offset, generator, row_ids, "logits")
    rng.check_noise_values(noise)
    if noise is None:
        noise = rng.stream_noise(counters, row_ids, rows, length, logits.device)
    return Mask(*draw_mask(planner_prob(planner_logits(logits)), noise, positions, x, mask_id))


# ------------------------------------------------------------------------- fused op


def positions_block(k: int, block_d: int) -> int:
    """The positions the Triton kernel compares with a row at a time: all k (to a power of two)
    where the [block_d, BLOCK_K] comparison fits in MAX_BLOCK_NUMEL values, else as many as fit.

    Args:
        k: positions a row.
        block_d: the kernel's block of a row (D to a power of two, at most MAX_TRITON_WIDTH).

    Returns:
        BLOCK_K, a power of two >= 1.
    """
    return max(1, min(1 << (k - 1).bit_length(), MAX_BLOCK_NUMEL // block_d))


def planner_mask_triton(logits, x, positions, mask_id, noise, counters, row_ids):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        logits: float [B, D] planner logits, validated.
        x: Long[B, D] the current sequences.
        positions: Long[B, k] positions forced into the mask, or None.
        mask_id: the token written where z = 1.
        noise: Float[B, D] explicit uniforms, or None to draw from the stream.
        counters: (seed, offset, seed_tensor, offset_tensor) as rng.resolve_stream returns them.
        row_ids: Long[B] stream ids of the rows, or None for 0..B-1.

    Returns:
        (masked Long[B, D], z Bool[B, D], count Long[B]), the fields of Mask.

    Raises:
        ValueError: D too wide for the Triton kernel.
    """
    planner_mask_kernel = _dispatch.kernels("planner_mask").planner_mask_kernel

    check_triton_width(logits.shape[1])
    logits, x = logits.contiguous(), x.contiguous()
    rows, length = logits.shape
    k = positions.shape[1] if positions is not None else 0
    masked = torch.empty_like(x)
    z = torch.empty(rows, length, dtype=torch.bool, device=x.device)
    count = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows > 0:
        seed, offset, seed_t, offset_t = counters
        block_d = 1 << (length - 1).bit_length()
        _dispatch.launch(
            planner_mask_kernel, (rows,), logits, x, positions.contiguous() if k > 0 else x, length, k, mask_id,
            noise, row_ids, *rng.split32(seed), *rng.split32(offset), seed_t, offset_t, masked, z, count,
            BLOCK_D=block_d, BLOCK_K=positions_block(k, block_d),
        )
    return masked, z, count


def _planner_mask_impl(logits, x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU,
    which also range-checks the positions."""
    if logits.is_cuda:
        return planner_mask_triton(logits, x, positions, mask_id, noise, (seed, offset, seed_t, offset_t), row_ids)
    if positions is not None:
        positions = positions.contiguous()
    kernel = _dispatch.cpu_kernel("planner_mask_cpu")
    return kernel(logits.contiguous(), x.contiguous(), positions, mask_id, noise, seed, offset, row_ids, seed_t,
                  offset_t)


@torch.library.custom_op("ddpd::planner_mask", mutates_args=())
def _planner_mask_op(
    logits: torch.Tensor,
    x: torch.Tensor,
    positions: Optional[torch.Tensor],
    mask_id: int,
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _planner_mask_impl(logits, x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t)


@_planner_mask_op.register_fake
def _(logits, x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t):
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool), x.new_empty(x.shape[0])


def planner_mask(
    logits: torch.Tensor,
    x: torch.Tensor,
    positions: Optional[torch.Tensor],
    mask_id: int,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Mask:
    """Draw z ~ Bernoulli(sigmoid(logits)) forced to 1 at `positions`, and mask x where z = 1.

    Args:
        logits: float32/bfloat16/float16 [B, D] planner logits (NaN: probability 0).
        x: Long[B, D] the current sequences.
        positions: Long[B, k] positions forced into the mask, or None.
        mask_id: the token written where z = 1.
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[B, D].

    Returns:
        Mask(masked Long[B, D], z Bool[B, D], count Long[B] = z.sum(1)).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape, device or value out of range (positions on CPU).
    """
    _dispatch.refuse_transforms("planner_mask", logits, x, positions, noise, row_ids)
    check_tensor("logits", logits, _dispatch.FLOAT_DTYPES, 2)
    _dispatch.check_width("D (logits.shape[1])", logits.shape[1])
    mask_id = check_mask_args(logits, x, mask_id)
    if positions is not None:
        check_positions(positions, logits)
    seed, offset, seed_t, offset_t = rng.resolve_stream(noise, tuple(logits.shape), logits, seed, offset, generator,
                                                        row_ids, "logits")
    noise, row_ids = _dispatch.contiguous(noise, row_ids)
    eager = _dispatch.eager(logits, x, positions, noise, row_ids, seed_t, offset_t)
    call = _planner_mask_impl if eager else _planner_mask_op
    return Mask(*call(logits.detach(), x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t))
