"""The mask of prop:draw_with_maskD, and its fusion with the plan step.

To denoise position d' with a mask-diffusion denoiser, prop:draw_with_maskD draws
z ~ p(z | x_t, z^{d'} = N), approximated by prod_{d != d'} p(z^d | x_t): each
z^d ~ Bernoulli(p^d), p^d = sigmoid(planner logit), and z^{d'} = 1 for the
positions being denoised. The mask denoiser then sees x_t with mask_id wherever
z = 1 (the paper's listing writes torch.where(mask, samples, mask_token_id),
which masks the other positions; this follows the proposition).

- planner_mask(logits, x, positions, mask_id) -> (masked Long[B, D], z Bool[B, D],
  count Long[B]); z^d = u^d < p^d with uniform d at column d.
- planner_select_mask(logits, x, mask_id, k, ..., offset=o, mask_offset=m) =
  planner_select(offset=o) followed by planner_mask(offset=m) at the chosen positions,
  draw for draw, in one pass over the logits. mask_offset defaults to offset + 1
  (mod 2**64): a caller that uses offsets o and o + 1 for other draws must pass
  mask_offset.

CPU tensors run the C++ kernels (csrc/cpu/planner_mask.cpp,
csrc/cpu/planner_select.cpp), CUDA tensors the Triton kernels
ddpd.kernels.planner_mask and ddpd.kernels.planner_select. On CUDA, positions
outside [0, D) are not checked (that would need a device sync) and force nothing;
the C++ kernel rejects them. Eager calls go straight to the kernels; traced calls
(torch.compile, make_fx, fake tensors) go through the registered custom ops.
"""
from __future__ import annotations

from typing import Optional

import torch

from ddpd.ops import _sampling_args as args
from ddpd.ops.planner_select import (
    check_select_args,
    check_triton_width,
    gumbel_top_k,
    planner_logits,
    planner_prob,
    planner_select_triton,
    selection_log_weights,
)

# ----------------------------------------------------------------------------- checks


def check_mask_args(logits, x, mask_id) -> None:
    args.check_tensor("x", x, (torch.int64,), 2)
    args.check_shape("x", x, tuple(logits.shape))
    args.check_same_device("x", x, logits, "logits")
    args.check_int("mask_id", mask_id, 0, 2**62)


def check_positions(positions, logits) -> None:
    args.check_tensor("positions", positions, (torch.int64,), 2)
    if positions.shape[0] != logits.shape[0]:
        raise ValueError(f"positions must have {logits.shape[0]} rows, got shape {tuple(positions.shape)}")
    args.check_same_device("positions", positions, logits, "logits")


def check_position_values(positions: Optional[torch.Tensor], length: int) -> None:
    """Range check of positions; CPU only, where it costs no device sync."""
    if positions is None or positions.device.type != "cpu" or positions.numel() == 0:
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= length:
        raise ValueError(f"positions must be in [0, {length}), got range [{low}, {high}]")


def resolve_mask_offset(mask_offset, counters: tuple, like: torch.Tensor) -> tuple:
    """(int64 bits, tensor or None) of the mask's offset: as given, or by default the
    selection's offset + 1 mod 2**64 (for a tensor offset, a tensor computed on its device:
    int64 addition wraps, as uint64 addition does)."""
    if mask_offset is not None:
        return args.check_counter("mask_offset", mask_offset, like)
    _, offset, _, offset_t = counters
    if offset_t is not None:
        return 0, offset_t + 1
    return args.as_int64((offset + 1) & (2**64 - 1)), None


# ------------------------------------------------------------------------- reference


def draw_mask(p, noise, positions, x, mask_id):
    """z = (u < p) with the positions forced to 1; returns (masked, z, count)."""
    z = noise < p
    if positions is not None:
        z = z.scatter(1, positions, True)
    return torch.where(z, torch.full_like(x, mask_id), x), z, z.sum(dim=1)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch version of planner_mask (same arguments, same outputs)."""
    args.check_tensor("logits", logits, args.FLOAT_DTYPES, 2)
    check_mask_args(logits, x, mask_id)
    if positions is not None:
        check_positions(positions, logits)
        check_position_values(positions, logits.shape[1])
    rows, length = logits.shape
    counters = args.resolve_stream(noise, (rows, length), logits, seed, offset, generator, row_ids)
    if noise is None:
        noise = args.stream_noise(counters, row_ids, rows, length, logits.device)
    return draw_mask(planner_prob(planner_logits(logits)), noise, positions, x, mask_id)


def planner_select_mask_reference(
    logits: torch.Tensor,
    x: torch.Tensor,
    mask_id: int,
    k: int = 1,
    mode: str = "sigmoid",
    tau: float = 1.0,
    eps: float = 0.01,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
    mask_noise: Optional[torch.Tensor] = None,
    mask_offset=None,
):
    """Plain torch version of planner_select_mask (same arguments, same outputs)."""
    softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    check_mask_args(logits, x, mask_id)
    counters, (mask_offset, mask_offset_t) = _resolve_pair(noise, mask_noise, logits, seed, offset, mask_offset,
                                                            generator, row_ids)
    rows, length = logits.shape
    if noise is None:
        seed, _, seed_t, _ = counters
        noise = args.stream_noise(counters, row_ids, rows, length, logits.device)
        mask_noise = args.stream_noise((seed, mask_offset, seed_t, mask_offset_t), row_ids, rows, length,
                                       logits.device)
    l = planner_logits(logits)
    p = planner_prob(l)
    positions = gumbel_top_k(selection_log_weights(l, softmax, tau), noise, k)
    return (positions, p.sum(dim=1), (p < eps).all(dim=1)) + draw_mask(p, mask_noise, positions, x, mask_id)


def _resolve_pair(noise, mask_noise, logits, seed, offset, mask_offset, generator, row_ids) -> tuple:
    """resolve_stream for the two draws of planner_select_mask (both noises or neither):
    the selection's counters and the mask's offset (int64 bits, tensor or None)."""
    if (noise is None) != (mask_noise is None):
        raise ValueError("pass both noise and mask_noise (explicit uniforms) or neither")
    shape = tuple(logits.shape)
    if mask_noise is not None:
        if mask_offset is not None:
            raise ValueError("pass either mask_noise or mask_offset, not both")
        args.check_tensor("mask_noise", mask_noise, (torch.float32,), 2)
        args.check_shape("mask_noise", mask_noise, shape)
        args.check_same_device("mask_noise", mask_noise, logits, "logits")
    counters = args.resolve_stream(noise, shape, logits, seed, offset, generator, row_ids)
    return counters, (resolve_mask_offset(mask_offset, counters, logits) if noise is None else (0, None))


# ------------------------------------------------------------------------ fused ops


def planner_mask_triton(logits, x, positions, mask_id, noise, counters, row_ids):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1)."""
    from ddpd.kernels.planner_mask import planner_mask_kernel

    check_triton_width(logits.shape[1])
    logits, x = logits.contiguous(), x.contiguous()
    rows, length = logits.shape
    k = positions.shape[1] if positions is not None else 0
    masked = torch.empty_like(x)
    z = torch.empty(rows, length, dtype=torch.bool, device=x.device)
    count = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows > 0:
        seed, offset, seed_t, offset_t = counters
        planner_mask_kernel[(rows,)](
            logits, x, positions.contiguous() if k > 0 else x, length, k, mask_id,
            noise, row_ids, *args.split32(seed), *args.split32(offset), seed_t, offset_t, masked, z, count,
            BLOCK_D=1 << (length - 1).bit_length(), BLOCK_K=max(1, 1 << (k - 1).bit_length()),
        )
    return masked, z, count


def _planner_mask_impl(logits, x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU,
    which also range-checks the positions."""
    if logits.device.type == "cuda":
        return planner_mask_triton(logits, x, positions, mask_id, noise, (seed, offset, seed_t, offset_t), row_ids)
    if positions is not None:
        positions = positions.contiguous()
    return args.cpu_ops().planner_mask_cpu(logits.contiguous(), x.contiguous(), positions, mask_id, noise, seed,
                                           offset, row_ids, seed_t, offset_t)


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


def _planner_select_mask_impl(logits, x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset,
                              mask_offset, row_ids, seed_t, offset_t, mask_offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU."""
    if logits.device.type == "cuda":
        return planner_select_triton(logits, k, softmax, tau, eps, noise, (seed, offset, seed_t, offset_t), row_ids,
                                     mask=(x, mask_id, mask_noise, (mask_offset, mask_offset_t)))
    return args.cpu_ops().planner_select_mask_cpu(logits.contiguous(), x.contiguous(), mask_id, k, softmax, tau,
                                                  eps, noise, mask_noise, seed, offset, mask_offset, row_ids, seed_t,
                                                  offset_t, mask_offset_t)


@torch.library.custom_op("ddpd::planner_select_mask", mutates_args=())
def _planner_select_mask_op(
    logits: torch.Tensor,
    x: torch.Tensor,
    mask_id: int,
    k: int,
    softmax: bool,
    tau: float,
    eps: float,
    noise: Optional[torch.Tensor],
    mask_noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    mask_offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
    mask_offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _planner_select_mask_impl(logits, x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset,
                                     mask_offset, row_ids, seed_t, offset_t, mask_offset_t)


@_planner_select_mask_op.register_fake
def _(logits, x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset, mask_offset, row_ids, seed_t,
      offset_t, mask_offset_t):
    rows = logits.shape[0]
    return (logits.new_empty(rows, k, dtype=torch.int64), logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.bool), torch.empty_like(x), torch.empty_like(x, dtype=torch.bool),
            x.new_empty(rows))


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw z ~ Bernoulli(sigmoid(logits)) [B, D], forced to 1 at `positions`
    (Long[B, k], or None), and mask x (Long[B, D]) with mask_id where z = 1.

    Randomness as planner_select (explicit `noise` Float[B, D]).
    Returns (masked Long[B, D], z Bool[B, D], count Long[B] = z.sum(1)).
    """
    args.check_tensor("logits", logits, args.FLOAT_DTYPES, 2)
    args.check_width("D (logits.shape[1])", logits.shape[1])
    check_mask_args(logits, x, mask_id)
    if positions is not None:
        check_positions(positions, logits)
    seed, offset, seed_t, offset_t = args.resolve_stream(noise, tuple(logits.shape), logits, seed, offset, generator,
                                                         row_ids)
    noise, row_ids = args.contiguous(noise, row_ids)
    eager = args.eager(logits, x, positions, noise, row_ids, seed_t, offset_t)
    call = _planner_mask_impl if eager else _planner_mask_op
    return call(logits.detach(), x, positions, mask_id, noise, seed, offset, row_ids, seed_t, offset_t)


def planner_select_mask(
    logits: torch.Tensor,
    x: torch.Tensor,
    mask_id: int,
    k: int = 1,
    mode: str = "sigmoid",
    tau: float = 1.0,
    eps: float = 0.01,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
    mask_noise: Optional[torch.Tensor] = None,
    mask_offset=None,
):
    """planner_select then planner_mask at the chosen positions, in one pass.

    Seeded: the selection reads (seed, offset), the mask (seed, mask_offset);
    mask_offset defaults to offset + 1 (mod 2**64). Each may be an int or an int64
    tensor of one element (see planner_select).
    Explicit: `noise` and `mask_noise`, both Float[B, D].
    Returns (positions Long[B, k], sum_p Float[B], stop Bool[B],
    masked Long[B, D], z Bool[B, D], count Long[B]).
    """
    softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    check_mask_args(logits, x, mask_id)
    (seed, offset, seed_t, offset_t), (mask_offset, mask_offset_t) = _resolve_pair(
        noise, mask_noise, logits, seed, offset, mask_offset, generator, row_ids)
    noise, mask_noise, row_ids = args.contiguous(noise, mask_noise, row_ids)
    eager = args.eager(logits, x, noise, mask_noise, row_ids, seed_t, offset_t, mask_offset_t)
    call = _planner_select_mask_impl if eager else _planner_select_mask_op
    return call(logits.detach(), x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset, mask_offset,
                row_ids, seed_t, offset_t, mask_offset_t)
