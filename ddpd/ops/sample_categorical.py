"""One token per row from logits [N, V], without writing a softmax.

This is the denoising draw j ~ Cat(p_{1|t}(x_1^d = j | x_t, z_t^d = N)) of the DDPD
sampler (Algorithm `alg:sampling`, `prop:self-loop-jumps`), with the logits
divided by a temperature (> 0; the argmax is not a temperature here) and some
tokens excluded (special tokens, the current value x_t^d, ...).

Method: two-level exact Gumbel-max. The vocabulary is cut into tiles of
TILE = 256 tokens. Tile t wins the race argmax_t (lse_t + G_t) with
lse_t = log sum_{j in t} exp(l_j), then token j wins argmax_{j in t} (l_j + G_j)
inside the winning tile. P(j) = P(tile of j) P(j | tile) = softmax(l)_j exactly.
The logits are read once plus one tile again; a row needs n_tiles + TILE uniforms
instead of V; no [N, V] probability tensor is ever written.

Uniforms: column j < V drives token j, column V + t drives tile t, either of
explicit `noise` Float[N, V + n_tiles] or of the Philox stream of
(seed, offset, row id) (ddpd.ops.rng.philox_uniform).

Rows with no drawable token (every allowed logit -inf or NaN) return token 0 and
valid = False; NaN logits are never drawn. Tokens are always in [0, V).
exclude_per_row values are range-checked on CPU only (a check on CUDA would
sync); on CUDA a value outside [0, V) excludes nothing.
CPU tensors run the C++ kernel of ddpd._C (csrc/cpu/sample_categorical.cpp),
CUDA tensors the Triton kernel ddpd.kernels.sample_categorical.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ddpd.ops import _sampling_args as args

TILE = 256


def n_tiles(vocab_size: int) -> int:
    return -(-vocab_size // TILE)


def noise_width(vocab_size: int) -> int:
    """Uniforms per row that explicit `noise` must hold: V token + n_tiles tile uniforms."""
    return vocab_size + n_tiles(vocab_size)


# ----------------------------------------------------------------------------- checks


def check_exclusions(exclude_ids, exclude_per_row, like: torch.Tensor, vocab_size: int) -> list[int]:
    """Validate the exclusion arguments of a categorical draw; return the ids as a list."""
    ids: list[int] = []
    if exclude_ids is not None:
        if isinstance(exclude_ids, (torch.Tensor, str)) or not isinstance(exclude_ids, Sequence):
            raise TypeError(f"exclude_ids must be a sequence of ints, got {type(exclude_ids).__name__}")
        ids = [args.check_int("exclude_ids[]", i, 0, vocab_size) for i in exclude_ids]
    if exclude_per_row is not None:
        args.check_tensor("exclude_per_row", exclude_per_row, (torch.int64,), 1)
        args.check_shape("exclude_per_row", exclude_per_row, (like.shape[0],))
        args.check_same_device("exclude_per_row", exclude_per_row, like, "logits")
    return ids


def check_exclude_values(exclude_per_row: Optional[torch.Tensor], vocab_size: int) -> None:
    """Range check of exclude_per_row; CPU only, where it costs no device sync."""
    if exclude_per_row is None or exclude_per_row.device.type != "cpu" or exclude_per_row.numel() == 0:
        return
    low, high = int(exclude_per_row.min()), int(exclude_per_row.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"exclude_per_row values must be in [0, {vocab_size}), got range [{low}, {high}]")


def _prepare(logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise):
    args.check_tensor("logits", logits, args.FLOAT_DTYPES, 2)
    rows, vocab = logits.shape
    args.check_width("V (logits.shape[1])", vocab)
    temperature = args.check_positive_float("temperature", temperature)
    ids = check_exclusions(exclude_ids, exclude_per_row, logits, vocab)
    seed, offset = args.resolve_stream(noise, (rows, noise_width(vocab)), logits, seed, offset, generator, row_ids)
    return temperature, ids, seed, offset


# ------------------------------------------------------------------------- reference


def tempered_logits(logits, temperature, exclude_ids, exclude_per_row) -> torch.Tensor:
    """float32 logits / temperature, with NaN and excluded tokens set to -inf."""
    x = logits.float() / temperature
    x = x.masked_fill(torch.isnan(x), float("-inf"))
    if exclude_ids:
        x[:, list(exclude_ids)] = float("-inf")
    if exclude_per_row is not None:
        x = x.scatter(1, exclude_per_row[:, None], float("-inf"))
    return x


def tile_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """[N, n_tiles] log-sum-exp of each TILE-wide slice of x [N, V] (-inf padded)."""
    rows, vocab = x.shape
    padded = x.new_full((rows, n_tiles(vocab) * TILE), float("-inf"))
    padded[:, :vocab] = x
    tiles = padded.view(rows, -1, TILE)
    m = tiles.amax(dim=2, keepdim=True)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # no inf - inf
    return (shift + torch.log(torch.exp(tiles - shift).sum(dim=2, keepdim=True))).squeeze(2)


def draw_from_logits(x: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-level Gumbel-max on prepared logits x [N, V] with noise [N, V + n_tiles]."""
    rows, vocab = x.shape
    tile_keys = tile_logsumexp(x) + args.gumbel(noise[:, vocab:])
    best_key, tile = tile_keys.max(dim=1)  # first maximum on ties
    token_keys = x + args.gumbel(noise[:, :vocab])
    columns = torch.arange(vocab, device=x.device)
    in_tile = (columns[None, :] // TILE) == tile[:, None]
    # An invalid row has tile 0 and only -inf keys: argmax (first maximum) gives 0.
    token = token_keys.masked_fill(~in_tile, float("-inf")).argmax(dim=1)
    return token, best_key > float("-inf")


def sample_categorical_reference(
    logits: torch.Tensor,
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
    """Plain torch version of sample_categorical (same arguments, same tokens)."""
    temperature, ids, seed, offset = _prepare(
        logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise
    )
    check_exclude_values(exclude_per_row, logits.shape[1])
    if noise is None:
        rows, vocab = logits.shape
        noise = args.stream_noise(seed, offset, row_ids, rows, noise_width(vocab), logits.device)
    x = tempered_logits(logits, temperature, ids, exclude_per_row)
    return draw_from_logits(x, noise)


# ------------------------------------------------------------------------ fused op


def sample_categorical_triton(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1)."""
    from ddpd.kernels.sample_categorical import sample_categorical_kernel

    logits = logits.contiguous()
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    valid = torch.empty(rows, dtype=torch.bool, device=logits.device)
    if rows == 0:
        return tokens, valid
    tiles = n_tiles(vocab)
    tiles_per_chunk = min(16, 1 << (tiles - 1).bit_length())
    seed_lo, seed_hi = args.split32(seed)
    offset_lo, offset_hi = args.split32(offset)
    sample_categorical_kernel[(rows,)](
        logits, vocab, tiles, temperature,
        args.device_ids(tuple(exclude_ids), logits.device), len(exclude_ids), exclude_per_row,
        noise, row_ids, seed_lo, seed_hi, offset_lo, offset_hi, tokens, valid,
        TILE=TILE,
        BLOCK_J=TILE if tiles > 1 else 1 << (vocab - 1).bit_length(),
        TILES_PER_CHUNK=tiles_per_chunk,
    )
    return tokens, valid


@torch.library.custom_op("ddpd::sample_categorical", mutates_args=())
def _sample_categorical_op(
    logits: torch.Tensor,
    temperature: float,
    exclude_ids: list[int],
    exclude_per_row: Optional[torch.Tensor],
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.device.type == "cuda":
        return sample_categorical_triton(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset,
                                         row_ids)
    check_exclude_values(exclude_per_row, logits.shape[1])
    return args.cpu_ops().sample_categorical_cpu(
        logits.contiguous(), temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids
    )


@_sample_categorical_op.register_fake
def _(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.bool)


def sample_categorical(
    logits: torch.Tensor,
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
    """Draw one token per row of `logits` [N, V] (float32/bfloat16/float16).

    P(token j) is softmax(logits / temperature)_j over the tokens not excluded.
    exclude_ids: tokens no row may draw; exclude_per_row: Long[N], one more per row.
    Randomness: `seed`/`offset` (ints in [0, 2**64)), or both drawn from
    `generator`; `row_ids` Long[N] names each row's stream (default 0..N-1); or
    explicit uniforms `noise` Float[N, noise_width(V)].
    Returns (tokens Long[N] in [0, V), valid Bool[N]); valid is False where no
    token was drawable, and the token there is 0.
    """
    temperature, ids, seed, offset = _prepare(
        logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise
    )
    exclude_per_row, noise, row_ids = args.contiguous(exclude_per_row, noise, row_ids)
    return _sample_categorical_op(logits.detach(), temperature, ids, exclude_per_row, noise, seed, offset, row_ids)
