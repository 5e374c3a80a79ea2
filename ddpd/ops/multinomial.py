"""multinomial: k indices per row from non-negative weights, with or without replacement,
and categorical_from_weights, its single draw with a given uniform.

The batched draw of `torch.multinomial` in the sampling listings of the paper
(appendix 'Implementation details': the position d to denoise, d ~ p(z^d = N | x_t)
normalised over d (Gillespie option B), the new token x_1^d ~ p(x_1^d | x_t, z^d = N)),
with counter-based randomness so a row's draws depend only on (seed, offset, row id),
never on the batch it sits in. The weights need not sum to one.

The law of one draw, defined exactly so that the C++/CUDA kernels (csrc/multinomial.h)
and the torch reference below return the same index for the same uniform:
- weights are taken in float64 and cut into chunks of CHUNK = 64 consecutive
  entries; the running sum inside a chunk adds one weight at a time;
- P_j = P_{j-1} + (sum of chunk j), in chunk order; the cumulative weight of entry
  i of chunk j is c_i = P_{j-1} + (running sum of chunk j up to i); total = P_last;
- index = the smallest i with c_i > u * total, for the draw's uniform u in [0, 1)
  (u * total taken as the largest float64 below total where it rounds up to total,
  which a subnormal total allows).
Entries of zero weight are never drawn, and P(index = i) = w_i / total up to the
resolution of u. The chunking lets the kernel run one addition chain per chunk in
parallel instead of one chain per row.

k draws:
- with replacement, draw j uses the row's weights as given;
- without replacement, draws are sequential and each drawn weight is set to zero
  before the next draw: P(i_1, ..., i_k) = prod_j w_{i_j} / (total - w_{i_1} - ...
  - w_{i_{j-1}}), the successive-sampling law of torch.multinomial(replacement=False)
  (and of Gumbel-top-k). An index is never repeated, zero weights are never drawn.
A row thus costs one pass over its weights plus about k * (CHUNK + N / CHUNK)
additions, and k uniforms instead of one random number per weight.

Uniforms: explicit `noise` [B, k] in [0, 1) (draw j uses noise[:, j]), or the
Philox stream of ddpd.ops.rng: draw j of row r takes the top 24 bits a, b of the
Philox words of columns 2j and 2j + 1 and uses the 48-bit uniform
u = (a 2^24 + b + 1/2) 2^-48, fine enough for the smallest probabilities of a
50k-token vocabulary. Columns 0 .. 2k - 1 of the stream are read: give calls that
share a seed different offsets.

A row is valid when its weights are finite and non-negative with at least one
positive weight (with replacement) or at least k (without), and their total, summed in
float64, is finite (float64 weights summing past 1.8e308 make an invalid row; float32
and 16-bit weights cannot). Invalid rows return
index 0 everywhere; `return_valid=True` returns the flags, otherwise an invalid row
raises ValueError (on CUDA that check waits for the device).
CPU and CUDA tensors run the kernels of ddpd._C (csrc/cpu/multinomial.cpp,
csrc/cuda/multinomial.cu).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from ddpd.ops import _dispatch, _ext, rng
from ddpd.ops.rng import philox_words

CHUNK = 64  # equals kChunk in csrc/multinomial.h
WEIGHT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

Result = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


# ----------------------------------------------------------------------------- checks

def check_weights(weights) -> torch.Tensor:
    """Validate Float[B, N] weights; half precision is widened to float32 (exactly)."""
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
    """Validate uniforms in [0, 1) of the given shape on like's device; returns them as float64.

    The range is checked on CPU in eager calls only, where it costs no device
    synchronisation; elsewhere a uniform outside [0, 1) still gives an index in range.
    """
    if not isinstance(uniforms, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(uniforms).__name__}")
    if uniforms.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} must be float32 or float64, got {uniforms.dtype}")
    if tuple(uniforms.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(uniforms.shape)}")
    if uniforms.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like the weights, got {uniforms.device}")
    if uniforms.is_cpu and uniforms.numel() > 0 and _dispatch.eager(uniforms):
        low, high = float(uniforms.min()), float(uniforms.max())
        if not (0.0 <= low and high < 1.0):
            raise ValueError(f"{name} must lie in [0, 1), got values in [{low}, {high}]")
    return uniforms.double()


def finish(index: torch.Tensor, valid: torch.Tensor, return_valid: bool, need: str) -> Result:
    """(index, valid) when asked for, else index after raising on invalid rows."""
    if return_valid:
        return index, valid
    if not _dispatch.eager(valid):
        raise ValueError("return_valid=False raises on invalid rows, which needs their flags on the host; under "
                         "torch.compile (or other tracing) pass return_valid=True")
    if not bool(valid.all()):
        bad = (~valid).nonzero().flatten()[:8].tolist()
        raise ValueError(
            f"weights: rows {bad} (first 8 shown) are not valid distributions; each row needs finite, "
            f"non-negative weights with {need}. Pass return_valid=True to get the flags instead."
        )
    return index


def _check_k(k, replacement, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not isinstance(replacement, bool):
        raise TypeError(f"replacement must be a bool, got {type(replacement).__name__}")
    if k < 1 or (not replacement and k > n):
        limit = "" if replacement else f" and <= N = {n} without replacement"
        raise ValueError(f"k must be >= 1{limit}, got {k}")
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
    counters = rng.resolve_seed(seed, offset, generator, row_ids, rows, weights)
    if row_ids is None:
        row_ids = torch.arange(rows, device=weights.device)
    return None, counters, row_ids


def _need(k: int, replacement: bool) -> str:
    return "a positive total" if replacement or k == 1 else f"at least k = {k} positive weights"


# ------------------------------------------------------------------------- reference


def cumulative_weights(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c Float64[B, N], total Float64[B]): the two-level cumulative sums of the law above."""
    rows, n = weights.shape
    chunks = -(-n // CHUNK)
    padded = F.pad(weights.double(), (0, chunks * CHUNK - n))  # zeros add nothing
    running = padded.view(rows, chunks, CHUNK).cumsum(-1)  # torch.cumsum adds in order
    prefix = running[..., -1].cumsum(-1)
    before = F.pad(prefix[:, :-1], (1, 0))  # P_{j-1}, zero before the first chunk
    c = (before[..., None] + running).reshape(rows, chunks * CHUNK)[:, :n]
    return c, prefix[:, -1]


def row_validity(weights: torch.Tensor, min_positive: int) -> torch.Tensor:
    """Bool[B]: finite non-negative weights, finite total, at least min_positive positive."""
    _, total = cumulative_weights(weights)
    return (
        (weights >= 0).all(-1)
        & torch.isfinite(total)
        & (total > 0)
        & ((weights > 0).sum(-1) >= min_positive)
    )


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Long[B]: smallest i with c_i > u * total, for rows with positive finite total. The
    threshold is kept below total: with a subnormal total, u * total can round up to it."""
    c, total = cumulative_weights(weights)
    threshold = torch.minimum(u.double() * total, torch.nextafter(total, torch.zeros_like(total)))
    return (c <= threshold[:, None]).sum(-1)


def draw_uniforms(seed, offset, row_ids: torch.Tensor, k: int) -> torch.Tensor:
    """Float64[B, k]: the 48-bit uniform of each draw from the Philox stream (module docstring).
    seed, offset: ints (uint64 or int64 bit patterns) or int64 0-d tensors holding the bits.

    Built from the Philox words themselves: a float32 uniform of ddpd.ops.rng rounds
    (w >> 8) + 1/2 to 24 bits, which would lose the lowest bit of a.
    """
    cols = torch.arange(2 * k, dtype=torch.int64, device=row_ids.device)
    seed, offset = (v.reshape(()).to(row_ids.device) if isinstance(v, torch.Tensor) else v & (2**64 - 1)
                    for v in (seed, offset))
    word = philox_words(seed, offset, row_ids.to(torch.int64), cols)
    top = (word >> 8).double()  # 24 bits each
    return (top[:, 0::2] * 2.0**24 + top[:, 1::2] + 0.5) * 2.0**-48


def categorical_from_weights_reference(weights, uniforms, *, return_valid: bool = False) -> Result:
    """Plain torch version of categorical_from_weights (same arguments, same results)."""
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    valid = row_validity(weights, 1)
    safe = torch.where(valid[:, None], weights.double(), 1.0)
    index = torch.where(valid, inverse_cdf(safe, uniforms), 0)
    return finish(index, valid, return_valid, "a positive total")


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
    return_valid: bool = False,
) -> Result:
    """Plain torch version of multinomial (same arguments, same results)."""
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
    return finish(index, valid, return_valid, _need(k, replacement))


# ------------------------------------------------------------------------- fused ops


def _multinomial_impl(weights, k, replacement, uniforms, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): ddpd._C on CPU and CUDA; the torch
    reference where the extension has no kernels for the device."""
    ops = _ext.ops_for(weights.device)
    if ops is None:
        if uniforms is None:
            uniforms = draw_uniforms(rng.counter_value(seed, seed_t), rng.counter_value(offset, offset_t), row_ids, k)
        return multinomial_reference(weights, k, replacement, noise=uniforms, return_valid=True)
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


def categorical_from_weights(weights, uniforms, *, return_valid: bool = False) -> Result:
    """Long[B] index per row of weights Float[B, N], drawn with the row's uniform in [0, 1).

    index[b] is the smallest i whose two-level cumulative weight exceeds
    uniforms[b] * total[b] (module docstring): multinomial's first draw with the given
    uniforms. With return_valid=True returns (index, valid Bool[B]); otherwise an
    invalid row raises ValueError.
    """
    _dispatch.refuse_transforms("categorical_from_weights", weights, uniforms)
    weights = check_weights(weights)
    uniforms = check_uniforms("uniforms", uniforms, (weights.shape[0],), weights)
    index, valid = _run(weights, 1, True, uniforms[:, None].contiguous(), (0, 0, None, None), None)
    return finish(index[:, 0], valid, return_valid, "a positive total")


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
    return_valid: bool = False,
) -> Result:
    """Long[B, k] indices into each row of weights Float[B, N] (module docstring for the law).

    Randomness: `noise` [B, k], or (seed, offset) with `row_ids` (default 0..B-1), or
    a (seed, offset) pair drawn from `generator` (default: torch's global generator).
    seed and offset may be int64 tensors of one element on the device of weights (read
    by the kernel, so a captured CUDA graph replays with their current values).
    With return_valid=True returns (index, valid Bool[B]); otherwise an invalid row
    raises ValueError (which needs the flags on the host: under torch.compile pass
    return_valid=True).
    """
    _dispatch.refuse_transforms("multinomial", weights, noise, row_ids)
    weights = check_weights(weights)
    k = _check_k(k, replacement, weights.shape[1])
    u, counters, row_ids = _resolve_stream(weights, k, seed, offset, generator, row_ids, noise)
    index, valid = _run(weights, k, replacement, u, counters, row_ids)
    return finish(index, valid, return_valid, _need(k, replacement))


def logit_weights(logits, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) over the last dim, in float32 (float64 stays float64)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"logits must be a floating tensor, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [B, N], got {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a float, got {type(temperature).__name__}")
    if not (0.0 < temperature < float("inf")):
        raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
    scaled = (logits if logits.dtype == torch.float64 else logits.float()) / float(temperature)
    return torch.softmax(scaled, dim=-1)


def multinomial_from_logits_reference(logits, k: int, temperature: float = 1.0, replacement: bool = False,
                                      **stream) -> Result:
    """Plain torch version of multinomial_from_logits (same arguments, same results)."""
    return multinomial_reference(logit_weights(logits, temperature), k, replacement, **stream)


def multinomial_from_logits(logits, k: int, temperature: float = 1.0, replacement: bool = False,
                            **stream) -> Result:
    """multinomial of softmax(logits / temperature); `stream` takes multinomial's keyword arguments.

    The softmax is torch's (the same call as in the reference, so both agree token for
    token); rows whose logits are all -inf, or contain NaN or +inf, are invalid.
    """
    return multinomial(logit_weights(logits, temperature), k, replacement, **stream)
