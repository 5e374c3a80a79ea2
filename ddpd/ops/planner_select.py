"""Plan step of the DDPD sampler: which positions to denoise, in one pass over
the planner logits.

From planner logits l [B, D] ("position d is noise"), per row:
- positions Long[B, k]: k positions drawn without replacement with probability
  proportional to p(z^d = N | x_t) = sigmoid(l^d) (prop:self-loop-jumps; options
  A/B of the paper's listings), or to softmax(l / tau) over positions (option C);
  by Gumbel-top-k on the log-weights (log sigmoid(l) = -softplus(-l), or
  (l - max_d l) / tau: exact at any logit scale, uniform among +inf logits),
  the first choice being the draw d' ~ Cat(p) of Algorithm `alg:sampling`;
- sum_p Float[B] = sum_d sigmoid(l^d), for the planner's time estimate
  t = alpha^{-1}(1 - sum_p / D) (section 'Adaptive Time Correction');
- stop Bool[B] = every sigmoid(l^d) < eps, the stopping rule of Algorithm 1.

Uniforms: column d drives position d, of explicit `noise` Float[B, D] or of the
Philox stream of (seed, offset, row id). NaN logits count as -inf (probability 0,
chosen only when fewer than k positions have weight, lowest position first).
CPU tensors run the C++ kernel (csrc/cpu/planner_select.cpp), CUDA tensors the
Triton kernel ddpd.kernels.planner_select.
"""
from __future__ import annotations

from typing import Optional

import torch

from ddpd.ops import _sampling_args as args
from ddpd.ops.sample_categorical import shifted

MODES = ("sigmoid", "softmax")
MAX_TRITON_WIDTH = 2**17  # the Triton kernel holds a row in one block


# ----------------------------------------------------------------------------- checks


def check_select_args(logits, k, mode, tau, eps) -> tuple[bool, float, float]:
    """Validate the selection arguments; return (softmax, tau, eps)."""
    args.check_tensor("logits", logits, args.FLOAT_DTYPES, 2)
    args.check_width("D (logits.shape[1])", logits.shape[1])
    args.check_int("k", k, 1, logits.shape[1] + 1)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tau = args.check_positive_float("tau", tau)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")
    return mode == "softmax", tau, float(eps)


def check_triton_width(length: int) -> None:
    if length > MAX_TRITON_WIDTH:
        raise ValueError(f"D must be <= {MAX_TRITON_WIDTH} on CUDA (one block per row), got {length}")


# ------------------------------------------------------------------------- reference


def planner_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 planner logits, NaN read as -inf."""
    l = logits.float()
    return l.masked_fill(torch.isnan(l), float("-inf"))


def planner_prob(l: torch.Tensor) -> torch.Tensor:
    """p(z^d = N | x_t) = sigmoid(l), written as the kernels compute it."""
    return 1.0 / (1.0 + torch.exp(-l))


def selection_log_weights(l: torch.Tensor, softmax: bool, tau: float) -> torch.Tensor:
    """log sigmoid(l) = min(l, 0) - log(1 + exp(-|l|)) (option A), or (l - max l) / tau
    (option C): relative to the row maximum, so huge logits keep their noise and +inf
    logits tie at 0 and are drawn uniformly among themselves (sigmoid mode needs
    neither: log sigmoid is at most 0)."""
    if softmax:
        return shifted(l, l.amax(dim=1, keepdim=True), tau)
    return torch.clamp(l, max=0.0) - torch.log(1.0 + torch.exp(-l.abs()))


def gumbel_top_k(log_weights: torch.Tensor, noise: torch.Tensor, k: int) -> torch.Tensor:
    """k positions without replacement, P proportional to exp(log_weights): the k
    largest log_weights + Gumbel, ties to the lower position (stable sort)."""
    keys = log_weights + args.gumbel(noise)
    return torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :k]


def planner_select_reference(
    logits: torch.Tensor,
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch version of planner_select (same arguments, same outputs)."""
    softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    rows, length = logits.shape
    counters = args.resolve_stream(noise, (rows, length), logits, seed, offset, generator, row_ids)
    if noise is None:
        noise = args.stream_noise(counters, row_ids, rows, length, logits.device)
    l = planner_logits(logits)
    p = planner_prob(l)
    positions = gumbel_top_k(selection_log_weights(l, softmax, tau), noise, k)
    return positions, p.sum(dim=1), (p < eps).all(dim=1)


# ------------------------------------------------------------------------ fused op


def planner_select_triton(logits, k, softmax, tau, eps, noise, counters, row_ids, mask=None):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    counters: (seed, offset, seed_tensor, offset_tensor) of args.resolve_stream.
    mask: None, or (x, mask_id, mask_noise, (mask_offset, mask_offset_tensor)) to draw
    the mask of planner_select_mask too. Returns 3 outputs, or 6 with the mask.
    """
    from ddpd.kernels.planner_select import planner_select_kernel

    check_triton_width(logits.shape[1])
    logits = logits.contiguous()
    rows, length = logits.shape
    device = logits.device
    positions = torch.empty(rows, k, dtype=torch.int64, device=device)
    sum_p = torch.empty(rows, dtype=torch.float32, device=device)
    stop = torch.empty(rows, dtype=torch.bool, device=device)
    x, mask_id, mask_noise, (mask_offset, mask_offset_t) = mask if mask is not None else (None, 0, None, (0, None))
    x = x.contiguous() if x is not None else None  # masked below is written row-major
    masked = torch.empty_like(x) if mask is not None else None
    z = torch.empty(rows, length, dtype=torch.bool, device=device) if mask is not None else None
    count = torch.empty(rows, dtype=torch.int64, device=device) if mask is not None else None
    if rows > 0:
        seed, offset, seed_t, offset_t = counters
        planner_select_kernel[(rows,)](
            logits, length, k, tau, eps,
            noise, mask_noise, row_ids, *args.split32(seed), *args.split32(offset), *args.split32(mask_offset),
            seed_t, offset_t, mask_offset_t, x, mask_id, positions, sum_p, stop, masked, z, count,
            SOFTMAX=softmax, WITH_MASK=mask is not None, BLOCK_D=1 << (length - 1).bit_length(),
        )
    if mask is None:
        return positions, sum_p, stop
    return positions, sum_p, stop, masked, z, count


def _planner_select_impl(logits, k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU."""
    if logits.device.type == "cuda":
        return planner_select_triton(logits, k, softmax, tau, eps, noise, (seed, offset, seed_t, offset_t), row_ids)
    return args.cpu_ops().planner_select_cpu(logits.contiguous(), k, softmax, tau, eps, noise, seed, offset, row_ids,
                                             seed_t, offset_t)


@torch.library.custom_op("ddpd::planner_select", mutates_args=())
def _planner_select_op(
    logits: torch.Tensor,
    k: int,
    softmax: bool,
    tau: float,
    eps: float,
    noise: Optional[torch.Tensor],
    seed: int,
    offset: int,
    row_ids: Optional[torch.Tensor],
    seed_t: Optional[torch.Tensor],
    offset_t: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _planner_select_impl(logits, k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t)


@_planner_select_op.register_fake
def _(logits, k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t):
    rows = logits.shape[0]
    return (logits.new_empty(rows, k, dtype=torch.int64), logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.bool))


def planner_select(
    logits: torch.Tensor,
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose k positions per row of planner logits [B, D] to denoise.

    mode 'sigmoid': P proportional to sigmoid(logits) (options A/B); 'softmax':
    softmax(logits / tau) over positions (option C). eps in (0, 1): stop threshold.
    Randomness: `seed`/`offset` (ints in [0, 2**64), or int64 tensors of one element on
    the device of logits, read by the kernel: advancing such a tensor in place gives
    fresh draws on each replay of a captured CUDA graph), or both drawn from
    `generator`; `row_ids` Long[B] names each row's stream; or explicit uniforms
    `noise` Float[B, D].
    Returns (positions Long[B, k] in draw order, sum_p Float[B], stop Bool[B]).
    """
    softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    seed, offset, seed_t, offset_t = args.resolve_stream(noise, tuple(logits.shape), logits, seed, offset, generator,
                                                         row_ids)
    noise, row_ids = args.contiguous(noise, row_ids)
    # Draws and the stop statistics carry no gradient (see sample_from_hidden).
    call = _planner_select_impl if args.eager(logits, noise, row_ids, seed_t, offset_t) else _planner_select_op
    return call(logits.detach(), k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t)
