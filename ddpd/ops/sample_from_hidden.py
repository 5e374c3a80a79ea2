"""The denoiser's output head fused with the categorical draw: one token per row of
softmax((hidden @ weight^T + bias) / temperature), without the [N, V] logits.

In a DDPD step only the positions chosen by the planner are denoised
(Algorithm `alg:sampling`, j^{d'} ~ Cat(p_{1|t}(x_1^{d'} | x_t, z^{d'} = N))), so
the head is needed at N = B * k rows, not B * D. This op takes the final hidden
states of those rows and the head's weight, and draws exactly what
ddpd.ops.sample_categorical draws from the logits, noise for noise: the same
two-level Gumbel-max over tiles of TILE = 256 tokens, the same uniforms (column j
for token j, column V + t for tile t). The logits are computed a chunk of tiles
at a time (CPU: a BLAS matmul into an N x 4096 buffer; CUDA: a GEMM on the tensor
cores per row block and vocabulary split, head_launch) and reduced on the fly to a
few numbers per tile; the CPU computes the winning tile's logits again, the CUDA
kernels keep every tile's candidate token instead (the weight is read once).

CPU tensors run the C++ kernel of ddpd._C (csrc/cpu/sample_from_hidden.cpp),
CUDA tensors the Triton kernels ddpd.kernels.sample_from_hidden.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from ddpd.ops import _dispatch, rng
from ddpd.validation import check_float, check_same_device, check_shape, check_tensor
from ddpd.ops.sample_categorical import (
    TILE,
    check_exclude_values,
    check_exclusions,
    categorical_reference,
    n_tiles,
    noise_width,
    masked_logits,
)



def _prepare(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids,
             noise):
    check_tensor("hidden", hidden, _dispatch.FLOAT_DTYPES, 2)
    check_tensor("weight", weight, _dispatch.FLOAT_DTYPES, 2)
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must have shape [V, {hidden.shape[1]}] (H of hidden), got {tuple(weight.shape)}")
    check_same_device("weight", weight, hidden, "hidden")
    vocab = weight.shape[0]
    _dispatch.check_width("V (weight.shape[0])", vocab)
    if bias is not None:
        check_tensor("bias", bias, _dispatch.FLOAT_DTYPES, 1)
        check_shape("bias", bias, (vocab,))
        check_same_device("bias", bias, hidden, "hidden")
    temperature = check_float("temperature", temperature, 0.0, float("inf"), open_min=True, open_max=True)
    ids = check_exclusions(exclude_ids, exclude_per_row, hidden, vocab)
    counters = rng.resolve_stream(noise, (hidden.shape[0], noise_width(vocab)), hidden, seed, offset, generator,
                                   row_ids)
    return temperature, ids, counters


# ------------------------------------------------------------------------- reference


def sample_from_hidden_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    exclude_ids: Optional[Sequence[int]] = None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain torch version: the full float32 logits, then sample_categorical_reference."""
    temperature, ids, counters = _prepare(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed,
                                          offset, generator, row_ids, noise)
    vocab = weight.shape[0]
    check_exclude_values(exclude_per_row, vocab)
    if noise is None:
        noise = rng.stream_noise(counters, row_ids, hidden.shape[0], noise_width(vocab), hidden.device)
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    return categorical_reference(masked_logits(logits, ids, exclude_per_row), temperature, noise)


# ------------------------------------------------------------------------- fused op


@dataclasses.dataclass(frozen=True)
class HeadLaunch:
    """Grids and block shapes of the Triton kernels for one call
    (ddpd.kernels.sample_from_hidden).

    tiles_grid (row blocks, splits): the GEMM with its epilogue, BLOCK_N rows and
    tiles_per_split tiles of TILE tokens per program, H in slices of block_h;
    finish_grid (rows,): the tile race over the stored statistics, None for a single
    tile (the GEMM's epilogue then writes the tokens)."""
    block_n: int
    block_h: int
    tiles_per_split: int
    tiles_grid: tuple
    finish_grid: Optional[tuple]
    num_warps: int = 8
    num_stages: int = 3


def head_launch(rows: int, width: int, vocab: int, element_size: int, multiprocessors: int) -> HeadLaunch:
    """Rows in blocks of 32, or 16 where 32 would leave multiprocessors idle (the dot's
    N: the tile's 256 tokens are its M), the
    vocabulary split so that there are about PROGRAMS_PER_SM programs per
    multiprocessor; a W tile is read by every row block, which run side by side so
    the repeats hit L2. H slices of 64 (16-bit) or 32 (float32) elements: 36 KB of
    operands per pipeline stage, three stages within any recent GPU's shared memory."""
    tiles = n_tiles(vocab)
    # 32 rows per block unless that leaves multiprocessors idle (few rows, or few tiles)
    block_n = 16 if rows <= 16 or -(-rows // 32) * tiles < multiprocessors else 32
    row_blocks = -(-rows // block_n)
    splits = max(1, min(tiles, -(-_dispatch.PROGRAMS_PER_SM * multiprocessors // row_blocks)))
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    block_h = min(64 if element_size <= 2 else 32, max(16, 1 << (width - 1).bit_length()))
    return HeadLaunch(block_n, block_h, per_split, (row_blocks, splits), (rows,) if tiles > 1 else None)


def sample_from_hidden_triton(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, counters,
                              row_ids):
    """Launch the Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1)."""
    from ddpd.kernels.sample_from_hidden import finish_kernel, head_tiles_kernel

    hidden, weight = hidden.contiguous(), weight.contiguous()
    rows, width = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    valid = torch.empty(rows, dtype=torch.bool, device=device)
    if rows == 0:
        return tokens, valid
    launch = head_launch(rows, width, vocab, weight.element_size(), _dispatch.multiprocessors(device))
    tiles = n_tiles(vocab)
    # One allocation for the per-tile statistics: maxima and keys (float32), candidates.
    stats = torch.empty(3, rows, tiles, dtype=torch.int32, device=device) if launch.finish_grid else None
    tile_max, tile_key, candidate = ((stats[0].view(torch.float32), stats[1].view(torch.float32), stats[2])
                                     if launch.finish_grid else (None, None, None))
    interpreted = device.type != "cuda"
    head_tiles_kernel[launch.tiles_grid](
        hidden, weight, None if bias is None else bias.contiguous(), rows, vocab, width, tiles, launch.tiles_per_split,
        temperature, _dispatch.device_ids(tuple(exclude_ids), device), len(exclude_ids), exclude_per_row,
        noise, row_ids, *rng.split32(counters[0]), *rng.split32(counters[1]), counters[2], counters[3], tile_max, tile_key, candidate, tokens, valid,
        TILE=TILE, BLOCK_N=launch.block_n, BLOCK_H=launch.block_h,
        DOT_F32=interpreted or weight.dtype == torch.float32 or hidden.dtype != weight.dtype,
        SINGLE_TILE=launch.finish_grid is None, num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    if launch.finish_grid:
        finish_kernel[launch.finish_grid](tiles, temperature, tile_max, tile_key, candidate, tokens, valid,
                                          BLOCK_T=min(1024, 1 << (tiles - 1).bit_length()))
    return tokens, valid


def _sample_from_hidden_impl(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed, offset,
                             row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU,
    which also range-checks exclude_per_row."""
    if hidden.device.type == "cuda":
        return sample_from_hidden_triton(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise,
                                         (seed, offset, seed_t, offset_t), row_ids)
    return _dispatch.cpu_ops().sample_from_hidden_cpu(hidden, weight, bias, temperature, exclude_ids, exclude_per_row,
                                                 noise, seed, offset, row_ids, seed_t, offset_t)


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
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return _sample_from_hidden_impl(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed,
                                    offset, row_ids, seed_t, offset_t)


@_sample_from_hidden_op.register_fake
def _(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids, seed_t,
      offset_t):
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
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of hidden [N, H] through the head weight [V, H] (+ bias [V]).

    Same draw, arguments and outputs as sample_categorical(hidden @ weight.T + bias,
    ...) (explicit `noise` Float[N, noise_width(V)]), without the [N, V] logits.
    Returns (tokens Long[N] in [0, V), valid Bool[N]).
    """
    temperature, ids, (seed, offset, seed_t, offset_t) = _prepare(
        hidden, weight, bias, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise)
    # A draw has no gradient; detaching lets callers pass a live nn.Linear's
    # parameters (requires_grad) outside torch.no_grad().
    bias = None if bias is None else bias.detach()
    exclude_per_row, noise, row_ids = _dispatch.contiguous(exclude_per_row, noise, row_ids)
    eager = _dispatch.eager(hidden, weight, bias, exclude_per_row, noise, row_ids, seed_t, offset_t)
    call = _sample_from_hidden_impl if eager else _sample_from_hidden_op
    return call(hidden.detach(), weight.detach(), bias, temperature, ids, exclude_per_row, noise, seed, offset, row_ids,
                seed_t, offset_t)
