"""One token per row from logits [N, V], without writing a softmax.

This is the denoising draw j ~ Cat(p_{1|t}(x_1^d = j | x_t, z_t^d = N)) of the DDPD
sampler (Algorithm `alg:sampling`, `prop:self-loop-jumps`), with the logits
divided by a temperature (> 0; the argmax is not a temperature here) and some
tokens excluded (special tokens, the current value x_t^d, ...).

Method: two-level exact Gumbel-max, every comparison made relative to a maximum so
that no scale of logits or temperature loses the noise. The vocabulary is cut into
tiles of TILE = 256 tokens. With l the logits (NaN and excluded tokens read as -inf),
m_t the maximum of tile t, M = max_t m_t, T the temperature in float32, and
shift(a, b) = (a - b) / T for a <= b (exactly 0 where a == b, -inf where a = -inf):
  y_j = shift(l_j, m_t)                    tempered logit relative to its tile maximum
  s_t = log sum_{j in t} exp(y_j)          in [0, log TILE]
  tile  = argmax_t  shift(m_t, M) + (s_t + G_t)     (G_t from column V + t)
  token = argmax_{j in tile}  y_j + G_j             (G_j from column j)
shift(m_t, M) + s_t = log sum_{j in t} exp((l_j - M) / T), so P(j) = P(tile of j)
P(j | tile) = softmax(l / T)_j exactly, whatever the scale: logits [1e30, 1e30] draw
each token half the time, [5, 5, 1] at T = 1e-6 the first two half the time each.
Subtracting before dividing cannot overflow; a temperature below float32's range
(1e-300) rounds to 0 and leaves only the maxima drawable. Ties at +inf: every +inf
logit has y = 0 and every other -inf, so the draw is uniform among the +inf entries.
The logits are read once plus one tile again; a row needs n_tiles + TILE uniforms
instead of V; no [N, V] probability tensor is ever written.
`categorical_reference` is this law in plain torch, for any V, from explicit noise:
every path (C++, Triton, the samplers' reference code) is tested against it.

Uniforms: column j < V drives token j, column V + t drives tile t, either of
explicit `noise` Float[N, V + n_tiles] or of the Philox stream of
(seed, offset, row id) (ddpd.ops.rng.philox_uniform).

Rows with no drawable token (every allowed logit -inf or NaN) return token 0 and
valid = False; NaN logits are never drawn. Tokens are always in [0, V).
exclude_per_row values are range-checked on CPU only, inside the C++ kernel (a
check on CUDA would sync); on CUDA a value outside [0, V) excludes nothing.
Eager calls go straight to the kernels; under tracing (torch.compile, make_fx,
fake tensors) the call goes through the registered custom op ddpd::sample_categorical.
CPU tensors run the C++ kernel of ddpd._C (csrc/cpu/sample_categorical.cpp),
CUDA tensors the Triton kernels ddpd.kernels.sample_categorical (each row's tiles
split over several programs, then one small program per row: categorical_launch).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from ddpd.ops import _dispatch, rng
from ddpd.validation import check_float, check_int, check_same_device, check_shape, check_tensor

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
        # list / tuple first: the typing.Sequence check costs microseconds a call
        if not isinstance(exclude_ids, (list, tuple)) and (
                isinstance(exclude_ids, (torch.Tensor, str)) or not isinstance(exclude_ids, Sequence)):
            raise TypeError(f"exclude_ids must be a sequence of ints, got {type(exclude_ids).__name__}")
        ids = [check_int("exclude_ids[]", i, 0, vocab_size - 1) for i in exclude_ids]
    if exclude_per_row is not None:
        check_tensor("exclude_per_row", exclude_per_row, (torch.int64,), 1)
        check_shape("exclude_per_row", exclude_per_row, (like.shape[0],))
        check_same_device("exclude_per_row", exclude_per_row, like, "logits")
    return ids


def check_exclude_values(exclude_per_row: Optional[torch.Tensor], vocab_size: int) -> None:
    """Range check of exclude_per_row; CPU only, where it costs no device sync."""
    if exclude_per_row is None or exclude_per_row.device.type != "cpu" or exclude_per_row.numel() == 0:
        return
    low, high = int(exclude_per_row.min()), int(exclude_per_row.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"exclude_per_row values must be in [0, {vocab_size}), got range [{low}, {high}]")


def _prepare(logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise):
    check_tensor("logits", logits, _dispatch.FLOAT_DTYPES, 2)
    rows, vocab = logits.shape
    _dispatch.check_width("V (logits.shape[1])", vocab)
    temperature = check_float("temperature", temperature, 0.0, float("inf"), open_min=True, open_max=True)
    ids = check_exclusions(exclude_ids, exclude_per_row, logits, vocab)
    counters = rng.resolve_stream(noise, (rows, noise_width(vocab)), logits, seed, offset, generator, row_ids)
    return temperature, ids, counters


# ------------------------------------------------------------------------- reference


def masked_logits(logits, exclude_ids, exclude_per_row) -> torch.Tensor:
    """float32 logits with NaN and excluded tokens set to -inf (no temperature yet)."""
    x = logits.float()
    x = x.masked_fill(torch.isnan(x), float("-inf"))
    if exclude_ids:
        x[:, list(exclude_ids)] = float("-inf")
    if exclude_per_row is not None:
        x = x.scatter(1, exclude_per_row[:, None], float("-inf"))
    return x


def shifted(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """(a - b) / temperature for a <= b (b a maximum over a's entries), in float32:
    exactly 0 where a == b (so +inf == +inf gives 0, not NaN) and -inf where a is
    -inf. Subtracting before dividing cannot overflow, and a temperature below the
    float32 range (0 after rounding) leaves only the maxima finite."""
    t = torch.tensor(temperature, dtype=torch.float32, device=a.device)  # not a CPU scalar: CUDA
    # would multiply by its reciprocal, which rounds differently from the kernels' division
    d = torch.where(a == b, torch.zeros((), device=a.device), (a - b) / t)
    return d.masked_fill(a == float("-inf"), float("-inf"))


def categorical_reference(logits: torch.Tensor, temperature: float,
                          noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The categorical draw of every ddpd path, in plain torch: one token per row of
    softmax(logits / temperature) by the two-level Gumbel-max of the module docstring.

    logits [N, V] (any float dtype; NaN reads as -inf; excluded tokens already -inf);
    temperature > 0; noise [N, noise_width(V)] uniforms (column j for token j, column
    V + t for tile t), or [N, V] when V <= TILE (a single tile needs no tile uniform).
    Returns (tokens Long[N], valid Bool[N]): token 0 and valid False where every logit
    is -inf or NaN.
    """
    x = logits.float().masked_fill(torch.isnan(logits), float("-inf"))
    rows, vocab = x.shape
    tiles = n_tiles(vocab)
    padded = x.new_full((rows, tiles * TILE), float("-inf"))
    padded[:, :vocab] = x
    padded = padded.view(rows, tiles, TILE)
    tile_max = padded.amax(dim=2)  # m_t
    y = shifted(padded, tile_max[:, :, None], temperature)  # tempered, relative to the tile maximum
    row_max = tile_max.amax(dim=1, keepdim=True)  # M
    if tiles == 1:
        tile = torch.zeros(rows, dtype=torch.int64, device=x.device)
    else:
        lse = torch.log(torch.exp(y).sum(dim=2))  # s_t, in [0, log TILE] or -inf
        keys = shifted(tile_max, row_max, temperature) + (lse + rng.gumbel(noise[:, vocab:vocab + tiles]))
        tile = keys.argmax(dim=1)  # first maximum on ties
    valid = row_max.squeeze(1) > float("-inf")
    in_tile = y.gather(1, tile[:, None, None].expand(-1, 1, TILE)).squeeze(1)
    columns = tile[:, None] * TILE + torch.arange(TILE, device=x.device)
    u = noise.gather(1, columns.clamp(max=vocab - 1))
    keys = torch.where(columns < vocab, in_tile + rng.gumbel(u), float("-inf"))
    token = torch.where(valid, columns.gather(1, keys.argmax(dim=1, keepdim=True)).squeeze(1), 0)
    return token, valid


def draw_from_logits(x: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """categorical_reference(x, 1.0, noise) on logits x [N, V] already divided by the
    temperature. The ops divide after subtracting the maximum, so their draws from the
    raw logits equal categorical_reference(logits, temperature, noise) bit for bit,
    and this one's up to rounding."""
    return categorical_reference(x, 1.0, noise)


def sample_categorical_reference(
    logits: torch.Tensor,
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
    """Plain torch version of sample_categorical (same arguments, same tokens)."""
    temperature, ids, counters = _prepare(
        logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise
    )
    check_exclude_values(exclude_per_row, logits.shape[1])
    if noise is None:
        rows, vocab = logits.shape
        noise = rng.stream_noise(counters, row_ids, rows, noise_width(vocab), logits.device)
    return categorical_reference(masked_logits(logits, ids, exclude_per_row), temperature, noise)


# ------------------------------------------------------------------------ fused op


@dataclasses.dataclass(frozen=True)
class CategoricalLaunch:
    """Grids of the Triton kernels for one call (ddpd.kernels.sample_categorical).

    stats_grid (rows, splits): tile statistics, each program a run of tiles_per_split
    tiles, tiles_per_chunk at a time; None for a single tile. finish_grid (rows,):
    the tile race and the token draw, a few hundred values per row."""
    splits: int
    tiles_per_split: int
    tiles_per_chunk: int
    stats_grid: Optional[tuple]
    finish_grid: tuple


def categorical_launch(rows: int, vocab: int, multiprocessors: int) -> CategoricalLaunch:
    """Split each row's tiles over enough programs for PROGRAMS_PER_SM per multiprocessor
    (a single row of GPT-2's vocabulary: one tile per program), whole rows when the
    rows alone fill the device."""
    tiles = n_tiles(vocab)
    if tiles == 1:
        return CategoricalLaunch(1, 1, 1, None, (rows,))
    splits = max(1, min(tiles, -(-_dispatch.PROGRAMS_PER_SM * multiprocessors // max(rows, 1))))
    per_split = -(-tiles // splits)
    splits = -(-tiles // per_split)
    return CategoricalLaunch(splits, per_split, min(4, 1 << (per_split - 1).bit_length()), (rows, splits), (rows,))


def sample_categorical_triton(logits, temperature, exclude_ids, exclude_per_row, noise, counters, row_ids):
    """Launch the Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1)."""
    from ddpd.kernels.sample_categorical import finish_kernel, tile_stats_kernel

    logits = logits.contiguous()
    rows, vocab = logits.shape
    device = logits.device
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    valid = torch.empty(rows, dtype=torch.bool, device=device)
    if rows == 0:
        return tokens, valid
    launch = categorical_launch(rows, vocab, _dispatch.multiprocessors(device))
    tiles = n_tiles(vocab)
    seed, offset, seed_t, offset_t = counters
    stream = (noise, row_ids, *rng.split32(seed), *rng.split32(offset), seed_t, offset_t)
    excl = (_dispatch.device_ids(tuple(exclude_ids), device), len(exclude_ids), exclude_per_row)
    stats = torch.empty(2, rows, tiles, dtype=torch.float32, device=device) if launch.stats_grid else None
    tile_max, tile_key = (stats[0], stats[1]) if launch.stats_grid else (None, None)
    if launch.stats_grid:
        tile_stats_kernel[launch.stats_grid](
            logits, vocab, tiles, launch.tiles_per_split, temperature, *excl, *stream, tile_max, tile_key,
            TILE=TILE, TILES_PER_CHUNK=launch.tiles_per_chunk,
        )
    finish_kernel[launch.finish_grid](
        logits, vocab, tiles, temperature, *excl, *stream, tile_max, tile_key, tokens, valid,
        TILE=TILE, BLOCK_J=TILE if tiles > 1 else 1 << (vocab - 1).bit_length(),
        BLOCK_T=min(1024, 1 << (tiles - 1).bit_length()), SINGLE_TILE=tiles == 1,
    )
    return tokens, valid


def _sample_categorical_impl(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids,
                             seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU,
    which also range-checks exclude_per_row."""
    if logits.device.type == "cuda":
        return sample_categorical_triton(logits, temperature, exclude_ids, exclude_per_row, noise,
                                         (seed, offset, seed_t, offset_t), row_ids)
    return _dispatch.cpu_ops().sample_categorical_cpu(
        logits.contiguous(), temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids, seed_t, offset_t
    )


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
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return _sample_categorical_impl(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids,
                                    seed_t, offset_t)


@_sample_categorical_op.register_fake
def _(logits, temperature, exclude_ids, exclude_per_row, noise, seed, offset, row_ids, seed_t, offset_t):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.bool)


def sample_categorical(
    logits: torch.Tensor,
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
    """Draw one token per row of `logits` [N, V] (float32/bfloat16/float16).

    P(token j) is softmax(logits / temperature)_j over the tokens not excluded.
    exclude_ids: tokens no row may draw; exclude_per_row: Long[N], one more per row.
    Randomness: `seed`/`offset` (ints in [0, 2**64), or int64 tensors of one element on
    the device of logits, read by the kernels: advancing such a tensor in place gives
    fresh draws on each replay of a captured CUDA graph), or both drawn from
    `generator`; `row_ids` Long[N] names each row's stream (default 0..N-1); or
    explicit uniforms `noise` Float[N, noise_width(V)].
    Returns (tokens Long[N] in [0, V), valid Bool[N]); valid is False where no
    token was drawable, and the token there is 0.
    """
    temperature, ids, (seed, offset, seed_t, offset_t) = _prepare(
        logits, temperature, exclude_ids, exclude_per_row, seed, offset, generator, row_ids, noise
    )
    exclude_per_row, noise, row_ids = _dispatch.contiguous(exclude_per_row, noise, row_ids)
    eager = _dispatch.eager(logits, exclude_per_row, noise, row_ids, seed_t, offset_t)
    call = _sample_categorical_impl if eager else _sample_categorical_op
    return call(logits.detach(), temperature, ids, exclude_per_row, noise, seed, offset, row_ids, seed_t, offset_t)
