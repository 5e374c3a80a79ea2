"""The denoiser's output head fused with the categorical draw: one token per row of
softmax((hidden @ weight^T + bias) / temperature), without the [N, V] logits.

A DDPD step denoises only the positions the planner chose (Algorithm `alg:sampling`), so the
head is needed at B * k rows, not B * D. The op draws exactly what sample_categorical draws
from the logits, noise for noise, with the same controls and results; the logits are computed
a chunk of tiles at a time and reduced on the fly. A truncation (top_k, top_p, min_p) needs a
whole row: those calls compute the float32 logits (head_logits) and draw them with
sample_categorical's kernels.
CPU tensors run csrc/cpu/sample_from_hidden.cpp, CUDA tensors ddpd.kernels.sample_from_hidden.
The method and its precision: docs/ops/sample_from_hidden.md.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch
import torch.nn.functional as F

from ddpd.ops import _dispatch, rng
from ddpd.ops.controls import DrawControls
from ddpd.ops.results import Draw
from ddpd.ops.sample_categorical import (
    TILE,
    Call,
    _sample_categorical_impl,
    _sample_categorical_op,
    check_id_values,
    draw,
    empty_outputs,
    masked_logits,
    n_tiles,
    noise_width,
    prepare,
)
from ddpd.validation import check_same_device, check_shape, check_tensor

HEAD_CHUNK = 4096  # vocabulary rows of the weight cast to float32 at a time (CPU head_logits)
HEAD_DTYPES = _dispatch.FLOAT_DTYPES  # of hidden, weight and bias


def prepare_hidden(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p,
                   min_p, return_logprob, confidence, seed, offset, generator, row_ids, noise, controls=None) -> Call:
    """Validate the arguments of sample_from_hidden (the head's own checks, then prepare).

    Args:
        hidden, weight, bias, temperature, exclude_ids, exclude_per_row, allowed, top_k, top_p, min_p, return_logprob,
            confidence, seed, offset, generator, row_ids, noise, controls: the op's arguments of these names.

    Returns:
        The validated Call.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: 0-d hidden, or a shape, device or value out of range.
    """
    check_tensor("hidden", hidden, HEAD_DTYPES)
    if hidden.dim() == 0:
        raise ValueError("hidden must have shape [..., H], got a 0-d tensor")
    check_tensor("weight", weight, HEAD_DTYPES, 2)
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must have shape [V, {hidden.shape[-1]}] (H of hidden), got {tuple(weight.shape)}")
    check_same_device("weight", weight, hidden, "hidden")
    vocab = weight.shape[0]
    if bias is not None:
        check_tensor("bias", bias, HEAD_DTYPES, 1)
        check_shape("bias", bias, (vocab,))
        check_same_device("bias", bias, hidden, "hidden")
    return prepare("sample_from_hidden", "weight.shape[0]", hidden, vocab, temperature, exclude_ids,
                   exclude_per_row, allowed, top_k, top_p, min_p, return_logprob, confidence, seed, offset, generator,
                   row_ids, noise, controls, inputs_name="hidden")


# ------------------------------------------------------------------------- reference


def sample_from_hidden_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    temperature=1.0,
    exclude_ids=None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    top_k=None,
    top_p=None,
    min_p=None,
    allowed: Optional[torch.Tensor] = None,
    controls: Optional[DrawControls] = None,
    return_logprob: bool = False,
    confidence: Optional[str] = None,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Draw:
    """Plain torch version of sample_from_hidden: the full float32 logits, then sample_categorical's law.

    Args:
        The arguments of ddpd.ops.sample_from_hidden.

    Returns:
        What ddpd.ops.sample_from_hidden returns (Draw).

    Raises:
        What ddpd.ops.sample_from_hidden raises.
    """
    call = prepare_hidden(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, allowed, top_k,
                          top_p, min_p, return_logprob, confidence, seed, offset, generator, row_ids, noise, controls)
    vocab = weight.shape[0]
    h = call.rows(hidden)
    check_id_values("exclude_ids", call.exclude_ids, vocab)
    check_id_values("exclude_per_row", call.exclude_per_row, vocab)
    rng.check_noise_values(call.noise)
    noise = call.noise
    if noise is None:
        noise = rng.stream_noise(call.counters, call.row_ids, h.shape[0], noise_width(vocab), h.device)
    logits = h.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    masked = masked_logits(logits, call.exclude_ids, call.exclude_per_row, call.allowed)
    return call.finish(*draw(masked, call.controls, noise, call.logprob, call.confidence))


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
    num_warps: int
    num_stages: int = 3


def head_logits_grid(launch: HeadLaunch, vocab: int) -> tuple:
    """The logits GEMM's grid: every (row block, tile) pair on one axis (2**31 - 1 programs; a
    second axis is capped at 65535).

    Args:
        launch: the call's HeadLaunch.
        vocab: V.

    Returns:
        The 1-d launch grid, a tuple.
    """
    return (launch.tiles_grid[0] * n_tiles(vocab),)


WIDE_H = 2048  # rows this wide take head_launch's large row blocks even when they are few


@functools.lru_cache(maxsize=256)  # a per-call cost otherwise; a sampler calls it with few shapes
def head_launch(rows: int, width: int, vocab: int, element_size: int, multiprocessors: int) -> HeadLaunch:
    """Blocks of rows (the dot's N: the tile's 256 tokens are its M) and the vocabulary
    split so that there are about PROGRAMS_PER_SM programs per multiprocessor; a W tile is
    read by every row block, which run side by side so the repeats hit L2. H slices of 64
    (16-bit) or 32 (float32) elements, three pipeline stages, four for rows of WIDE_H or
    more 16-bit elements, which keep more of W in flight (160 KB of shared memory at 64
    rows, within sm_90's 227).

    The epilogue keeps only tile statistics (the finish pass draws inside the winning
    tile), which affords wide row blocks, so that fewer blocks read each W tile: 64 rows
    with 8 warps for wide 16-bit rows or a float32 weight (either), else 32 with 4 warps at
    few rows (8 beyond); never wider than the rows (at least 16, the dot's least N) nor so wide that
    fewer (row block, tile) pairs than multiprocessors are left. docs/kernels.md gives the
    registers, docs/performance.md the measurements behind these choices.

    Args:
        rows: N.
        width: H.
        vocab: V.
        element_size: bytes an element of the weight.
        multiprocessors: the device's multiprocessors.

    Returns:
        The HeadLaunch.
    """
    tiles = n_tiles(vocab)
    few_rows = rows <= 64 or -(-rows // 32) * tiles < multiprocessors
    wide = element_size <= 2 and width >= WIDE_H
    block_n, num_warps = (64, 8) if wide or element_size > 2 else (32, 4 if few_rows else 8)
    block_n = min(block_n, max(16, 1 << (rows - 1).bit_length()))  # no block wider than the rows
    while block_n > 16 and -(-rows // block_n) * tiles < multiprocessors:  # nor so wide the device idles
        block_n //= 2
    row_blocks = -(-rows // block_n)
    splits = max(1, min(tiles, -(-_dispatch.PROGRAMS_PER_SM * multiprocessors // row_blocks)))
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    block_h = min(64 if element_size <= 2 else 32, max(16, 1 << (width - 1).bit_length()))
    return HeadLaunch(block_n, block_h, per_split, (row_blocks, splits), (rows,) if tiles > 1 else None, num_warps,
                      4 if wide else 3)


def dot_in_float32(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the head's tl.dot runs on float32 operands: float32 inputs, mixed inputs,
    or the interpreter (no bf16 arithmetic there).

    Args:
        hidden: Float[N, H].
        weight: Float[V, H].

    Returns:
        True for float32 operands.
    """
    return not hidden.is_cuda or weight.dtype == torch.float32 or hidden.dtype != weight.dtype


def sample_from_hidden_triton(hidden, weight, bias, temperature, temperature_t, exclude_ids, exclude_per_row, allowed,
                              noise, seed, offset, row_ids, seed_t, offset_t, logprob, confidence, eager=False):
    """Launch the Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        hidden: float [N, H], validated.
        weight: float [V, H].
        bias: float [V], or None.
        temperature: the scalar temperature (GREEDY for greedy), read when temperature_t is None.
        temperature_t: Float32[N] per-row temperatures, or None.
        exclude_ids: Long[m] excluded tokens, or None.
        exclude_per_row: Long[N] a token excluded per row, or None.
        allowed: Bool[N, V] the drawable tokens, or None.
        noise: Float32[N, noise_width(V)] explicit uniforms, or None to draw from the stream.
        seed: the stream's seed, an int64 bit pattern (read when seed_t is None).
        offset: the stream's offset, likewise.
        row_ids: Long[N] stream ids of the rows, or None for 0..N-1.
        seed_t: an int64 tensor holding the seed, or None.
        offset_t: an int64 tensor holding the offset, or None.
        logprob: whether the log-probability is asked for.
        confidence: the confidence's code (0: none).
        eager: a call that does not go through the registered op (see empty_outputs).

    Returns:
        (tokens, valid, logprob, confidence) as empty_outputs makes them, written.
    """
    kernels = _dispatch.kernels("sample_from_hidden")
    hidden, weight = hidden.contiguous(), weight.contiguous()
    rows, width = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    outputs = empty_outputs(rows, device, logprob, confidence, eager)
    if rows == 0:
        return outputs
    launch = head_launch(rows, width, vocab, weight.element_size(), _dispatch.multiprocessors(device))
    dot_f32 = dot_in_float32(hidden, weight)
    bias = None if bias is None else bias.contiguous()
    tiles = n_tiles(vocab)
    # The per-tile statistics, one record per tile (ddpd.kernels.sample_from_hidden.RECORD)
    stats = (torch.empty(rows, tiles, kernels.RECORD.value, dtype=torch.float32, device=device) if launch.finish_grid
             else None)
    ids = exclude_ids if exclude_ids is not None else _dispatch.device_ids((), device)
    masks = (ids, 0 if exclude_ids is None else exclude_ids.numel(), exclude_per_row, allowed)
    stream = (noise, row_ids, *rng.split32(seed), *rng.split32(offset), seed_t, offset_t)
    _dispatch.launch(
        kernels.head_tiles_kernel, launch.tiles_grid,
        hidden, weight, bias, rows, vocab, width, tiles, launch.tiles_per_split,
        temperature, temperature_t, *masks, *stream, stats, *outputs,
        TILE=TILE, BLOCK_N=launch.block_n, BLOCK_H=launch.block_h, DOT_F32=dot_f32,
        SINGLE_TILE=launch.finish_grid is None, LOGPROB=logprob, CONFIDENCE=confidence,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
        UNIT=temperature_t is None and temperature == 1.0,
    )
    if launch.finish_grid:
        _dispatch.launch(kernels.finish_kernel, launch.finish_grid, hidden, weight, bias, width, *masks, tiles, vocab,
                         temperature, temperature_t, *stream, stats, *outputs,
                         BLOCK_T=min(1024, 1 << (tiles - 1).bit_length()), LOGPROB=logprob, CONFIDENCE=confidence,
                         TILE=TILE, BLOCK_N=16, BLOCK_H=launch.block_h, DOT_F32=dot_f32)
    return outputs


def _sample_from_hidden_impl(hidden, weight, *args, eager=False):
    """The kernels behind the op (arguments validated; the op's schema): Triton on CUDA,
    C++ on CPU, which also range-checks the ids and the explicit noise. eager: a call that
    does not go through the op (see empty_outputs)."""
    if hidden.is_cuda:
        return sample_from_hidden_triton(hidden, weight, *args, eager=eager)
    return _dispatch.cpu_kernel("sample_from_hidden_cpu")(hidden, weight, *args)


@torch.library.custom_op("ddpd::sample_from_hidden", mutates_args=())
def _sample_from_hidden_op(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    temperature: float,
    temperature_t: Optional[torch.Tensor],
    exclude_ids: Optional[torch.Tensor],
    exclude_per_row: Optional[torch.Tensor],
    allowed: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
    logprob: bool,
    confidence: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _sample_from_hidden_impl(hidden, weight, bias, temperature, temperature_t, exclude_ids, exclude_per_row,
                                    allowed, noise, seed, offset, row_ids, seed_t, offset_t, logprob, confidence)


@_sample_from_hidden_op.register_fake
def _(hidden, weight, *args):
    logprob, confidence = args[-2:]
    return empty_outputs(hidden.shape[0], hidden.device, logprob, confidence)


def head_logits_triton(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 logits [N, V] = hidden @ weight^T + bias by head_logits_kernel (CUDA tensors; CPU
    tensors under TRITON_INTERPRET=1).

    Args:
        hidden: float [N, H].
        weight: float [V, H].
        bias: float [V], or None.

    Returns:
        Float32[N, V].
    """
    head_logits_kernel = _dispatch.kernels("sample_from_hidden").head_logits_kernel

    hidden, weight = hidden.contiguous(), weight.contiguous()
    rows, width = hidden.shape
    vocab = weight.shape[0]
    out = torch.empty(rows, vocab, dtype=torch.float32, device=hidden.device)
    if rows == 0:  # no launch (and no launch configuration: it divides by the row blocks)
        return out
    launch = head_launch(rows, width, vocab, weight.element_size(), _dispatch.multiprocessors(hidden.device))
    _dispatch.launch(
        head_logits_kernel, head_logits_grid(launch, vocab),
        hidden, weight, None if bias is None else bias.contiguous(), rows, vocab, width, out, TILE=TILE,
        BLOCK_N=launch.block_n, BLOCK_H=launch.block_h, DOT_F32=dot_in_float32(hidden, weight),
        num_warps=launch.num_warps, num_stages=launch.num_stages)
    return out


def _head_logits_impl(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 logits [N, V] = hidden @ weight^T + bias: on CUDA the GEMM of the fused
    kernel (head_logits_kernel), on CPU float32 matmuls over HEAD_CHUNK rows of the
    weight at a time (a 16-bit weight is never copied whole)."""
    if hidden.is_cuda:
        return head_logits_triton(hidden, weight, bias)
    vocab = weight.shape[0]
    out = torch.empty(hidden.shape[0], vocab, dtype=torch.float32, device=hidden.device)
    h = hidden.float()
    for first in range(0, vocab, HEAD_CHUNK):
        last = min(vocab, first + HEAD_CHUNK)
        b = None if bias is None else bias[first:last].float()
        out[:, first:last] = F.linear(h, weight[first:last].float(), b)
    return out


@torch.library.custom_op("ddpd::head_logits", mutates_args=())
def _head_logits_op(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _head_logits_impl(hidden, weight, bias)


@_head_logits_op.register_fake
def _(hidden, weight, bias):
    return hidden.new_empty(hidden.shape[0], weight.shape[0], dtype=torch.float32)


def sample_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    temperature=1.0,
    exclude_ids=None,
    exclude_per_row: Optional[torch.Tensor] = None,
    *,
    top_k=None,
    top_p=None,
    min_p=None,
    allowed: Optional[torch.Tensor] = None,
    controls: Optional[DrawControls] = None,
    return_logprob: bool = False,
    confidence: Optional[str] = None,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
) -> Draw:
    """Draw one token per row of hidden [..., H] through the head weight [V, H] (+ bias [V]).

    The same draw, controls and results as sample_categorical(hidden @ weight.T + bias, ...),
    noise for noise, without the [N, V] logits unless a truncation asks for them
    (docs/ops/sample_from_hidden.md).

    Args:
        hidden: float32/bfloat16/float16 [..., H], the final hidden states of the rows to draw.
        weight: [V, H] the output head's weight.
        bias: [V] or None.
        controls: the draw controls as one DrawControls (temperature, top_k, top_p, min_p,
            exclude_ids, exclude_per_row, allowed); or give them as the flat keywords below,
            not both.
        temperature: a number in [0, 1e36] or a tensor of the leading shape; 0 draws the argmax.
        exclude_ids: tokens no row may draw (ints or an integer tensor).
        exclude_per_row: Long[...] one more excluded token per row.
        top_k, top_p, min_p: truncations, numbers or tensors of the leading shape (None: off).
        allowed: Bool[..., V] the tokens each row may draw.
        return_logprob: also return the drawn token's log-probability under the tempered,
            truncated law.
        confidence: None, or "prob", "margin" or "entropy": also return that confidence.
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[..., noise_width(V)].

    Returns:
        Draw(tokens, valid, logprob or None, confidence or None), each of the leading shape.

    Raises:
        TypeError: an argument of the wrong type, or controls beside a flat control.
        ValueError: a shape, device or value out of range.
    """
    call = prepare_hidden(hidden, weight, bias, temperature, exclude_ids, exclude_per_row, allowed, top_k,
                          top_p, min_p, return_logprob, confidence, seed, offset, generator, row_ids, noise, controls)
    # A draw has no gradient; detaching lets callers pass a live nn.Linear's
    # parameters (requires_grad) outside torch.no_grad().
    h = call.rows(hidden)
    weight = weight.detach() if weight.requires_grad else weight
    bias = bias.detach() if bias is not None and bias.requires_grad else bias
    eager = _dispatch.eager(h, weight, bias, *call.tensors())
    if call.controls.truncates:
        if eager:
            return call.finish(*_sample_categorical_impl(_head_logits_impl(h, weight, bias), *call.args(), eager=True))
        return call.finish(*_sample_categorical_op(_head_logits_op(h, weight, bias), *call.args()))
    c = call.controls
    seed, offset, seed_t, offset_t = call.counters
    args = (c.temperature, c.temperature_t, call.exclude_ids, call.exclude_per_row, call.allowed, call.noise, seed,
            offset, call.row_ids, seed_t, offset_t, call.logprob, call.confidence)
    if eager:
        return call.finish(*_sample_from_hidden_impl(h, weight, bias, *args, eager=True))
    return call.finish(*_sample_from_hidden_op(h, weight, bias, *args))
