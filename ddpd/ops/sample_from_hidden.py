"""The denoiser's output head fused with the categorical draw: one token per row of
softmax((hidden @ weight^T + bias) / temperature), without the [N, V] logits.

In a DDPD step only the positions chosen by the planner are denoised
(Algorithm `alg:sampling`, j^{d'} ~ Cat(p_{1|t}(x_1^{d'} | x_t, z^{d'} = N))), so
the head is needed at N = B * k rows, not B * D. This op takes the final hidden
states of those rows and the head's weight, and draws exactly what
ddpd.ops.sample_categorical draws from the logits, noise for noise: the same
two-level Gumbel-max over tiles of TILE = 256 tokens, the same uniforms (column j
for token j, column V + t for tile t). The logits are computed a chunk of tiles
at a time (CPU: a BLAS matmul into an N x 4096 buffer; CUDA: a Triton kernel per
row block and vocabulary split) and reduced on the fly; only the winning tile's
logits are kept or recomputed.

CPU tensors run the C++ kernel of ddpd._C (csrc/cpu/sample_from_hidden.cpp),
CUDA tensors the Triton kernels ddpd.kernels.sample_from_hidden.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from ddpd.ops import _sampling_args as args
from ddpd.ops.sample_categorical import (
    TILE,
    check_exclude_values,
    check_exclusions,
    draw_from_logits,
    n_tiles,
    noise_width,
    tempered_logits,
)

BLOCK_N = 16  # rows per program of the Triton tile race (tl.dot needs >= 16)


def _prepare(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids,
             noise):
    args.check_tensor("hidden", hidden, args.FLOAT_DTYPES, 2)
    args.check_tensor("weight", weight, args.FLOAT_DTYPES, 2)
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must have shape [V, {hidden.shape[1]}] (H of hidden), got {tuple(weight.shape)}")
    args.check_same_device("weight", weight, hidden, "hidden")
    vocab = weight.shape[0]
    args.check_width("V (weight.shape[0])", vocab)
    if bias is not None:
        args.check_tensor("bias", bias, args.FLOAT_DTYPES, 1)
        args.check_shape("bias", bias, (vocab,))
        args.check_same_device("bias", bias, hidden, "hidden")
    temperature = args.check_positive_float("temperature", temperature)
    ids = check_exclusions(exclude_ids, exclude_per_row, hidden, vocab)
    seed, offset = args.resolve_stream(noise, (hidden.shape[0], noise_width(vocab)), hidden, seed, offset,
                                       generator, row_ids)
    return temperature, ids, seed, offset


# ------------------------------------------------------------------------- reference


def sample_from_hidden_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    exclude_ids: Optional[Sequence[int]] = None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    seed: Optional[int] = None,
    offset: int = 0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch version: the full float32 logits, then sample_categorical_reference."""
    temperature, ids, seed, offset = _prepare(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed,
                                              offset, generator, row_ids, noise)
    vocab = weight.shape[0]
    check_exclude_values(exclude_per_row, vocab)
    if noise is None:
        noise = args.stream_noise(seed, offset, row_ids, hidden.shape[0], noise_width(vocab), hidden.device)
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    return draw_from_logits(tempered_logits(logits, temperature, ids, exclude_per_row), noise)


# ------------------------------------------------------------------------- fused op


@functools.lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few splits so the cross-split reduction is exercised
    return torch.cuda.get_device_properties(device).multi_processor_count


def sample_from_hidden_triton(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed, offset,
                              row_ids, splits: Optional[int] = None):
    """Launch the Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    splits: vocabulary splits of the tile race (default: enough programs for about
    four per multiprocessor)."""
    from ddpd.kernels.sample_from_hidden import draw_in_tile_kernel, tile_race_kernel

    hidden, weight = hidden.contiguous(), weight.contiguous()
    rows, width = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    valid = torch.empty(rows, dtype=torch.bool, device=device)
    if rows == 0:
        return tokens, valid
    tiles = n_tiles(vocab)
    row_blocks = -(-rows // BLOCK_N)
    if splits is None:
        splits = max(1, min(tiles, 4 * _multiprocessors(device) // row_blocks))
    tiles_per_split = -(-tiles // splits)
    splits = -(-tiles // tiles_per_split)
    best_key = torch.empty(splits, rows, dtype=torch.float32, device=device)
    best_tile = torch.empty(splits, rows, dtype=torch.int32, device=device)
    seed_lo, seed_hi = args.split32(seed)
    offset_lo, offset_hi = args.split32(offset)
    excl = args.device_ids(tuple(exclude_ids), device)
    # 32 keeps the pipelined fp32 tl.dot operands (16 x 32 and 32 x 256, a few
    # stages) within the shared memory of every recent GPU.
    block_h = min(32, max(16, 1 << (width - 1).bit_length()))
    bias = bias.contiguous() if bias is not None else None
    stream = (noise, row_ids, seed_lo, seed_hi, offset_lo, offset_hi)
    tile_race_kernel[(row_blocks, splits)](
        hidden, weight, bias, rows, vocab, width, tiles, tiles_per_split, temperature,
        excl, len(exclude_ids), exclude_per_row, *stream, best_key, best_tile,
        TILE=TILE, BLOCK_N=BLOCK_N, BLOCK_H=block_h,
    )
    draw_in_tile_kernel[(rows,)](
        hidden, weight, bias, rows, vocab, width, tiles, splits, temperature,
        excl, len(exclude_ids), exclude_per_row, *stream, best_key, best_tile, tokens, valid,
        TILE=TILE, BLOCK_H=block_h,
    )
    return tokens, valid


@torch.library.custom_op("ddpd::sample_from_hidden", mutates_args=())
def _sample_from_hidden_op(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    temperature: float,
    exclude_ids: list[int],
    exclude_per_row: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    if hidden.device.type == "cuda":
        return sample_from_hidden_triton(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed,
                                         offset, row_ids)
    check_exclude_values(exclude_per_row, weight.shape[0])
    return args.cpu_ops().sample_from_hidden_cpu(hidden, weight, bias, temperature, exclude_ids, exclude_per_row,
                                                 noise, seed, offset, row_ids)


@_sample_from_hidden_op.register_fake
def _(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids):
    rows = hidden.shape[0]
    return hidden.new_empty(rows, dtype=torch.int64), hidden.new_empty(rows, dtype=torch.bool)


def sample_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    exclude_ids: Optional[Sequence[int]] = None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    seed: Optional[int] = None,
    offset: int = 0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of hidden [N, H] through the head weight [V, H] (+ bias [V]).

    Same draw, arguments and outputs as sample_categorical(hidden @ weight.T + bias,
    ...) (explicit `noise` Float[N, noise_width(V)]), without the [N, V] logits.
    Returns (tokens Long[N] in [0, V), valid Bool[N]).
    """
    temperature, ids, seed, offset = _prepare(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed,
                                              offset, generator, row_ids, noise)
    # A draw has no gradient; detaching lets callers pass a live nn.Linear's
    # parameters (requires_grad) outside torch.no_grad().
    bias = None if bias is None else bias.detach()
    exclude_per_row, noise, row_ids = args.contiguous(exclude_per_row, noise, row_ids)
    return _sample_from_hidden_op(hidden.detach(), weight.detach(), bias, temperature, ids, exclude_per_row, noise,
                                  seed, offset, row_ids)
