"""k indices per row from non-negative weights, with or without replacement (multinomial,
multinomial_from_logits), and categorical_from_weights, its single draw with a given uniform:
the batched `torch.multinomial` of the paper's sampling listings, with counter-based
randomness so a row's draws depend only on (seed, offset, row id).
The law is an inverse CDF over chunks of CHUNK weights summed in float64, defined exactly so
that the C++/CUDA kernels (csrc/multinomial.h) and the reference return the same index.
CPU and CUDA tensors run the kernels of ddpd._C.
The law, the uniforms and the validity of a row: docs/ops/multinomial.md.
"""
from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.nn.functional as F

from ddpd.ops import _dispatch, _ext, rng
from ddpd.ops.results import Draw
from ddpd.ops.rng import philox_words
from ddpd.ops.sample_categorical import MAX_TEMPERATURE
from ddpd.validation import check_bool, check_int, check_same_device, readable, value_range, values_checkable

CHUNK = 64  # equals kChunk in csrc/multinomial.h
WEIGHT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# ----------------------------------------------------------------------------- checks


def check_weights(weights) -> torch.Tensor:
    """Validate Float[B, N] weights; half precision is widened to float32 (exactly).

    Args:
        weights: the op's `weights`.

    Returns:
        The weights, float32 or float64.

    Raises:
        TypeError: not a tensor, or not of a float dtype of WEIGHT_DTYPES.
        ValueError: not [B, N] with N >= 1, or not on a cpu or cuda device.
    """
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor, got {type(weights).__name__}")
    if weights.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"weights must be a float32/float64/float16/bfloat16 tensor, got {weights.dtype}")
    if weights.dim() != 2 or weights.shape[1] == 0:
        raise ValueError(f"weights must have shape [B, N] with N >= 1, got {tuple(weights.shape)}")
    if weights.device.type not in ("cpu", "cuda"):
        raise ValueError(f"weights must be on a cpu or cuda device, got {weights.device}")
    return weights.float() if weights.dtype in (torch.float16, torch.bfloat16) else weights


def check_uniforms(name: str, uniforms, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """Validate uniforms in [0, 1) of the given shape on like's device.

    The range is checked on CPU tensors outside tracing only, where it costs no device
    synchronisation; elsewhere a uniform outside [0, 1) still draws an entry of positive
    weight (inverse_cdf says which).

    Args:
        name: the argument's name, for the message.
        uniforms: the value given.
        shape: the shape they must have.
        like: the weights, whose device they must be on.

    Returns:
        The uniforms as float64.

    Raises:
        TypeError: not a float32 or float64 tensor.
        ValueError: a shape or device mismatch, or a CPU value outside [0, 1).
    """
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(uniforms.shape)}")
    check_same_device(name, uniforms, like, "weights")
    if values_checkable(uniforms):
        low, high = value_range(uniforms)
        if not (0.0 <= low and high < 1.0):
            raise ValueError(f"{name} must lie in [0, 1), got values in [{low}, {high}]")
    return uniforms.double()


def finish(index: torch.Tensor, valid: torch.Tensor, check_valid: bool, need: str, argument: str = "weights"
           ) -> Draw:
    """The Draw of (index, valid), after raising on invalid rows when check_valid.

    Args:
        index: Long[B, k] the draws.
        valid: Bool[B] which rows are valid distributions.
        check_valid: raise on invalid rows rather than return their flags.
        need: what the invalid rows are, for the message (_need, _logits_need).
        argument: the argument those rows belong to, for the message.

    Returns:
        Draw(index, valid).

    Raises:
        TypeError: check_valid is not a bool (a string such as "no" would read as True).
        ValueError: check_valid and a row is invalid, or check_valid while tracing.
    """
    if not check_bool("check_valid", check_valid):
        return Draw(index, valid)
    if not readable(valid):
        raise ValueError("check_valid=True raises on invalid rows, which needs their flags on the host; under "
                         "torch.compile (or other tracing) pass check_valid=False")
    if not bool(valid.all()):
        bad = (~valid).nonzero().flatten()[:8].tolist()
        raise ValueError(
            f"{argument}: rows {bad} (first 8 shown) {need}. Pass check_valid=False to get the flags instead."
        )
    return Draw(index, valid)


def _check_k(k, replacement, n: int) -> int:
    k = check_int("k", k, 1)
    if not isinstance(replacement, bool):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    if not replacement and k > n:
        raise ValueError(f"k must be >= 1 and <= N = {n} without replacement, got {k}")
    if k >= _dispatch.MAX_WIDTH:  # draw j reads columns 2j and 2j + 1, which stay below 2**31
        raise ValueError(f"k must be < {_dispatch.MAX_WIDTH}, got {k}")
    return k


def _resolve_stream(weights, k, seed, offset, generator, row_ids, noise):
    """Validate the randomness arguments: (noise as float64 | None, counters, row_ids),
    counters as rng.resolve_seed returns them."""
    rows = weights.shape[0]
    if noise is not None:
        rng.check_noise_alone(seed, offset, generator, row_ids)
        return check_uniforms("noise", noise, (rows, k), weights), (0, 0, None, None), None
    counters = rng.resolve_seed(seed, offset, generator, row_ids, rows, weights, "weights")
    if row_ids is None:
        row_ids = torch.arange(rows, device=weights.device)
    return None, counters, row_ids


def _need(k: int, replacement: bool) -> str:
    enough = "a positive total" if replacement or k == 1 else f"at least k = {k} positive weights"
    return f"are not valid distributions; each row needs finite, non-negative weights with {enough}"


# How far below its row's maximum a logit keeps a positive softmax weight (exp underflows
# past the smallest subnormal), in units of the temperature.
SOFTMAX_REACH = {torch.float32: 103, torch.float64: 745}


def _logits_need(logits: torch.Tensor, k: int, replacement: bool) -> str:
    bad = "hold NaN or +inf, or are all -inf"
    if replacement or k == 1:
        return bad
    if logits.dtype == torch.float64:
        reach = f"within about {SOFTMAX_REACH[torch.float64]} * temperature of the row's maximum"
    else:
        reach = (f"logits within about {SOFTMAX_REACH[torch.float32]} * temperature of the row's maximum; float64 "
                 f"logits reach about {SOFTMAX_REACH[torch.float64]} * temperature")
    dtype = "float64" if logits.dtype == torch.float64 else "float32"
    return f"{bad}, or have fewer than k = {k} tokens with a positive {dtype} softmax weight ({reach})"


# ------------------------------------------------------------------------- reference


def cumulative_weights(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two-level cumulative sums of the law above (chunks of CHUNK, then their prefix).

    Args:
        weights: Float[B, N] weights.

    Returns:
        (c Float64[B, N], total Float64[B]).
    """
    rows, n = weights.shape
    chunks = -(-n // CHUNK)
    padded = F.pad(weights.double(), (0, chunks * CHUNK - n))  # zeros add nothing
    running = padded.view(rows, chunks, CHUNK).cumsum(-1)  # torch.cumsum adds in order
    prefix = running[..., -1].cumsum(-1)
    before = F.pad(prefix[:, :-1], (1, 0))  # P_{j-1}, zero before the first chunk
    c = (before[..., None] + running).reshape(rows, chunks * CHUNK)[:, :n]
    return c, prefix[:, -1]


def row_validity(weights: torch.Tensor, min_positive: int) -> torch.Tensor:
    """Which rows are distributions: finite non-negative weights, finite total, at least
    min_positive positive.

    Args:
        weights: Float[B, N] weights.
        min_positive: weights a row needs above zero.

    Returns:
        Bool[B].
    """
    _, total = cumulative_weights(weights)
    return (
        (weights >= 0).all(-1)
        & torch.isfinite(total)
        & (total > 0)
        & ((weights > 0).sum(-1) >= min_positive)
    )


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Smallest i with c_i > u * total, for rows with positive finite total. The
    threshold is kept in [0, below total]: with a subnormal total, u * total can round up
    to it, and an unchecked u outside [0, 1) draws as the kernels draw it (below 0 as 0,
    NaN and >= 1 as just below 1), never an entry of zero weight.

    Args:
        weights: Float[B, N] weights.
        u: Float[B] uniforms in [0, 1).

    Returns:
        Long[B] the indices.
    """
    c, total = cumulative_weights(weights)
    t, below = u.double() * total, torch.nextafter(total, torch.zeros_like(total))
    high = torch.where(t < below, t, below)  # NaN fails the test: below, as in csrc/multinomial.h
    threshold = torch.where(high > 0, high, 0.0)
    return (c <= threshold[:, None]).sum(-1)


def draw_uniforms(seed, offset, row_ids: torch.Tensor, k: int) -> torch.Tensor:
    """The 48-bit uniform of each draw from the Philox stream (docs/ops/multinomial.md).

    Built from the Philox words themselves: a float32 uniform of ddpd.ops.rng rounds
    (w >> 8) + 1/2 to 24 bits, which would lose the lowest bit of a.

    Args:
        seed: an int (uint64 or int64 bit pattern) or an int64 0-d tensor holding the bits.
        offset: like seed.
        row_ids: Long[B] stream ids of the rows.
        k: draws a row.

    Returns:
        Float64[B, k].
    """
    cols = torch.arange(2 * k, dtype=torch.int64, device=row_ids.device)
    seed, offset = (v.reshape(()).to(row_ids.device) if isinstance(v, torch.Tensor) else v & (2**64 - 1)
                    for v in (seed, offset))
    word = philox_words(seed, offset, row_ids.to(torch.int64), cols)
    top = (word >> 8).double()  # 24 bits each
    return (top[:, 0::2] * 2.0**24 + top[:, 1::2] + 0.5) * 2.0**-48


def categorical_from_weights_reference(weights, uniforms, *, check_valid: bool = True) -> Draw:
    """Plain torch version of categorical_from_weights, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.categorical_from_weights.

    Returns:
        What ddpd.ops.categorical_from_weights returns (Draw).

    Raises:
        What ddpd.ops.categorical_from_weights raises.
    """
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    valid = row_validity(weights, 1)
    safe = torch.where(valid[:, None], weights.double(), 1.0)
    index = torch.where(valid, inverse_cdf(safe, uniforms), 0)
    return finish(index, valid, check_valid, _need(1, True))


def multinomial_reference(
    weights,
    k: int,
    replacement: bool = False,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
    check_valid: bool = True,
) -> Draw:
    """Plain torch version of multinomial, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.multinomial.

    Returns:
        What ddpd.ops.multinomial returns (Draw).

    Raises:
        What ddpd.ops.multinomial raises.
    """
    weights = check_weights(weights)
    k = _check_k(k, replacement, weights.shape[1])
    u, counters, row_ids = _resolve_stream(weights, k, seed, offset, generator, row_ids, noise)
    if u is None:
        u = draw_uniforms(rng.counter_value(counters[0], counters[2]), rng.counter_value(counters[1], counters[3]),
                          row_ids, k)
    valid = row_validity(weights, 1 if replacement else k)
    w = torch.where(valid[:, None], weights.double(), 1.0)
    draws = []
    for j in range(k):
        index = inverse_cdf(w, u[:, j])
        draws.append(index)
        if not replacement:
            w = w.scatter(1, index[:, None], 0.0)
    index = torch.where(valid[:, None], torch.stack(draws, 1), 0)
    return finish(index, valid, check_valid, _need(k, replacement))


# ------------------------------------------------------------------------- fused ops


def _multinomial_impl(weights, k, replacement, uniforms, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): ddpd._C on CPU and CUDA; the torch
    reference where the extension has no kernels for the device."""
    ops = _ext.ops_for(weights.device)
    if ops is None:
        if uniforms is None:
            uniforms = draw_uniforms(rng.counter_value(seed, seed_t), rng.counter_value(offset, offset_t), row_ids, k)
        return multinomial_reference(weights, k, replacement, noise=uniforms, check_valid=False)[:2]
    return ops.multinomial_kernel(weights, k, replacement, uniforms, seed, offset, row_ids, seed_t, offset_t)


@torch.library.custom_op("ddpd::multinomial", mutates_args=())
def _multinomial_op(
    weights: torch.Tensor,
    k: int,
    replacement: bool,
    uniforms: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    return _multinomial_impl(weights, k, replacement, uniforms, seed, offset, row_ids, seed_t, offset_t)


@_multinomial_op.register_fake
def _(weights, k, replacement, uniforms, seed, offset, row_ids, seed_t, offset_t):
    rows = weights.shape[0]
    return weights.new_empty(rows, k, dtype=torch.int64), weights.new_empty(rows, dtype=torch.bool)


def _run(weights, k, replacement, uniforms, counters, row_ids):
    """The op for a validated call: its kernel directly when nothing traces the call."""
    seed, offset, seed_t, offset_t = counters
    eager = _dispatch.eager(weights, uniforms, row_ids, seed_t, offset_t)
    return (_multinomial_impl if eager else _multinomial_op)(weights, k, replacement, uniforms, seed, offset, row_ids,
                                                             seed_t, offset_t)


def categorical_from_weights(weights, uniforms, *, check_valid: bool = True) -> Draw:
    """Draw one index per row of weights Float[B, N] with the row's given uniform.

    index[b] is the smallest i whose two-level cumulative weight exceeds uniforms[b] * total[b]:
    multinomial's first draw with these uniforms.

    Args:
        weights: float32/float64/float16/bfloat16 [B, N], non-negative.
        uniforms: float32/float64 [B] in [0, 1).
        check_valid: raise on an invalid row (pass False under torch.compile).

    Returns:
        Draw(tokens Long[B], valid Bool[B], None, None).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a bad shape or value, or (check_valid) an invalid row.
    """
    _dispatch.refuse_transforms("categorical_from_weights", weights, uniforms)
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    index, valid = _run(weights, 1, True, uniforms[:, None].contiguous(), (0, 0, None, None), None)
    return finish(index[:, 0], valid, check_valid, _need(1, True))


def multinomial(
    weights,
    k: int,
    replacement: bool = False,
    *,
    seed=None,
    offset=0,
    generator: Optional[torch.Generator] = None,
    row_ids: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
    check_valid: bool = True,
) -> Draw:
    """Draw k indices into each row of weights Float[B, N] (docs/ops/multinomial.md).

    Args:
        weights: float32/float64/float16/bfloat16 [B, N], non-negative, need not sum to one.
        k: draws per row, >= 1 (<= N without replacement).
        replacement: draw with replacement, or successively without.
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms [B, k] in [0, 1) instead of a stream.
        check_valid: raise on an invalid row (needs the flags on the host: pass False under
            torch.compile and read `valid`).

    Returns:
        Draw(tokens Long[B, k] the indices (0 in invalid rows), valid Bool[B], None, None).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a bad shape or value, or (check_valid) an invalid row.
    """
    _dispatch.refuse_transforms("multinomial", weights, noise, row_ids)
    weights = check_weights(weights)
    k = _check_k(k, replacement, weights.shape[1])
    u, counters, row_ids = _resolve_stream(weights, k, seed, offset, generator, row_ids, noise)
    index, valid = _run(weights, k, replacement, u, counters, row_ids)
    return finish(index, valid, check_valid, _need(k, replacement))


def logit_weights(logits, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) over the last dim, in float32 (float64 stays float64).

    Args:
        logits: float [B, N], N >= 1.
        temperature: a float in (0, 1e36].

    Returns:
        Float32[B, N] (float64 for float64 logits) the weights.

    Raises:
        TypeError: logits not a float tensor, or temperature not a float.
        ValueError: logits not [B, N] with N >= 1, or temperature not in (0, 1e36].
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if logits.dim() != 2 or logits.shape[1] == 0:  # no row maximum to take: torch's IndexError
        raise ValueError(f"logits must have shape [B, N] with N >= 1, got {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):  # numpy's floats too
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not (0.0 < temperature <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be a float in (0, {MAX_TEMPERATURE:g}], got {temperature!r}")
    x = logits if logits.dtype == torch.float64 else logits.float()
    # the row maximum first: x / T overflowed at a small T and left a valid row invalid; the
    # maxima at 0 where T rounds to 0 (a row with +inf, all -inf or NaN stays invalid: NaN)
    d = x - x.amax(-1, keepdim=True)
    return torch.softmax(torch.where(d == 0, 0.0, d / float(temperature)), dim=-1)


def multinomial_from_logits_reference(logits, k: int, temperature: float = 1.0, replacement: bool = False,
                                      **stream) -> Draw:
    """Plain torch version of multinomial_from_logits, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.multinomial_from_logits.

    Returns:
        What ddpd.ops.multinomial_from_logits returns (Draw).

    Raises:
        What ddpd.ops.multinomial_from_logits raises.
    """
    return _from_logits(multinomial_reference, logits, k, temperature, replacement, stream)


STREAM_KEYWORDS = ("seed", "offset", "generator", "row_ids", "noise", "check_valid")


def _from_logits(draw, logits, k, temperature, replacement, stream) -> Draw:
    """draw (multinomial or its reference) of logit_weights, its invalid rows named as logits."""
    # **stream passes on to multinomial, whose own refusal would name it, not this op
    unknown = [name for name in stream if name not in STREAM_KEYWORDS]
    if unknown:
        raise TypeError(f"multinomial_from_logits() got an unexpected keyword argument {unknown[0]!r} "
                        f"(it takes k, temperature, replacement and {', '.join(STREAM_KEYWORDS)})")
    check_valid = stream.pop("check_valid", True)
    weights = logit_weights(logits, temperature)
    for name in ("noise", "row_ids", "seed", "offset"):  # multinomial's own check would name weights
        if isinstance(stream.get(name), torch.Tensor):
            check_same_device(name, stream[name], logits, "logits")
    out = draw(weights, k, replacement, check_valid=False, **stream)
    return finish(out.tokens, out.valid, check_valid, _logits_need(logits, k, replacement), "logits")


def multinomial_from_logits(logits, k: int, temperature: float = 1.0, replacement: bool = False,
                            **stream) -> Draw:
    """multinomial of softmax(logits / temperature).

    The softmax is torch's (the reference calls the same), so both agree token for token; rows
    whose logits are all -inf, or hold NaN or +inf, are invalid. Without replacement a row
    needs k tokens of positive weight: in float32 a logit more than about 103 * temperature
    below its row's maximum has weight 0 (float64 logits: about 745 * temperature), so such a
    row with fewer than k tokens within that reach is invalid too.

    Args:
        logits: floating [B, N], N >= 1.
        k, replacement: as multinomial.
        temperature: a float in (0, 1e36].
        **stream: multinomial's keyword arguments (seed, offset, generator, row_ids, noise,
            check_valid).

    Returns:
        Draw(tokens Long[B, k], valid Bool[B], None, None).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a bad shape or value, a stream tensor on another device than logits, or
            (check_valid) an invalid row, named as logits.
    """
    return _from_logits(multinomial, logits, k, temperature, replacement, stream)
