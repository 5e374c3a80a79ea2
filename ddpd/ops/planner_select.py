"""The plan step of the DDPD sampler in one pass over the planner logits l [B, D]: k positions
to denoise, drawn without replacement with probability proportional to sigmoid(l^d)
(prop:self-loop-jumps) or softmax(l / tau) (Gumbel-top-k, exact at any logit scale); sum_p, the
sum of sigmoid(l^d) for the planner's time estimate; and stop, every sigmoid(l^d) < eps
(Algorithm `alg:sampling`). planner_select_mask also draws the mask of prop:draw_with_maskD from
the same pass (as ddpd.ops.planner_mask does).
Uniforms: column d drives position d (explicit `noise` or the Philox stream); the mask reads
`mask_noise` or the stream at mask_offset (default offset + 1).
CPU tensors run csrc/cpu/planner_select.cpp, CUDA tensors ddpd.kernels.planner_select.
The law, NaN and +inf logits, and the method: docs/ops/planner_select.md.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ddpd.ops import _dispatch, rng
from ddpd.ops.results import Plan, Selection
from ddpd.ops.sample_categorical import MAX_TEMPERATURE, float32, shifted
from ddpd.validation import check_float, check_int, check_same_device, check_shape, check_tensor

MODES = ("sigmoid", "softmax")
MAX_TRITON_WIDTH = 2**17  # the Triton kernel holds a row in one block
SUM_P_RTOL = 1e-6  # sum_p of two paths: float64 sums of sigmoids whose exp rounds differently
# Keys of positions more than this below the top log-weight are rebased (gumbel_rounds): at 64
# the float32 spacing, 2^-17, is far below the Gumbel noise's scale of 1.
REBASE_GAP = 64.0


# ----------------------------------------------------------------------------- checks


def check_select_args(logits, k, mode, tau, eps) -> tuple[int, bool, float, float]:
    """Validate the selection arguments of planner_select and planner_select_mask.

    Args:
        logits, k, mode, tau, eps: the op's arguments of these names.

    Returns:
        (k, softmax, tau, eps): k as an int, whether mode is "softmax", tau as a float, and eps
        raised to the smallest float32 at least eps (float32_at_least).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape or value out of range, or an unknown mode.
    """
    check_tensor("logits", logits, _dispatch.FLOAT_DTYPES, 2)
    _dispatch.check_width("D (logits.shape[1])", logits.shape[1])
    k = check_int("k", k, 1, logits.shape[1])
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    tau = check_float("tau", tau, 0.0, MAX_TEMPERATURE, open_min=True)
    eps = check_float("eps", eps, 0.0, 1.0, open_min=True, open_max=True)
    return k, mode == "softmax", tau, float32_at_least(eps)


def float32_at_least(value: float) -> float:
    """The smallest float32 >= value (value > 0): every path compares float32
    probabilities with eps in float32, and p < eps holds for a float32 p exactly when
    p < float32_at_least(eps) (rounding to nearest would make eps = 1e-50 zero, so that
    a probability 0 would not count as below it).

    Args:
        value: a positive float.

    Returns:
        The float32 value, as a Python float.
    """
    nearest = float32(value)
    if nearest >= value:
        return nearest
    exponent = math.frexp(nearest)[1] if nearest else -125  # 0 and subnormals: spacing 2**-149
    unit = math.ldexp(1.0, max(exponent, -125) - 24)  # the float32 spacing above nearest
    return float32(nearest + unit)  # exact in float64; above the largest float32: inf


def check_mask_args(logits, x, mask_id) -> int:
    """Validate the mask arguments of planner_mask and planner_select_mask.

    Args:
        logits: the op's `logits` [B, D].
        x: the op's `x`, Long[B, D] on logits' device.
        mask_id: the op's `mask_id`, in [0, 2**62].

    Returns:
        mask_id as an int.

    Raises:
        TypeError: x is not an int64 tensor, or mask_id not an int.
        ValueError: a shape or device mismatch, or mask_id out of range.
    """
    check_tensor("x", x, (torch.int64,), 2)
    check_shape("x", x, tuple(logits.shape))
    check_same_device("x", x, logits, "logits")
    return check_int("mask_id", mask_id, 0, 2**62)


def check_triton_width(length: int) -> None:
    """Refuse rows wider than the Triton kernels hold in one block.

    Args:
        length: D, the positions a row has.

    Raises:
        ValueError: length > MAX_TRITON_WIDTH.
    """
    if length > MAX_TRITON_WIDTH:
        raise ValueError(f"D must be <= {MAX_TRITON_WIDTH} on CUDA (one block per row), got {length}")


def resolve_mask_offset(mask_offset, counters: tuple, like: torch.Tensor) -> tuple:
    """The offset of the mask's stream: as given, or by default the selection's offset + 1
    mod 2**64 (for a tensor offset, a tensor computed on its device: int64 addition wraps,
    as uint64 addition does).

    Args:
        mask_offset: the op's `mask_offset`, or None.
        counters: (seed, offset, seed_tensor, offset_tensor) of the selection's stream.
        like: a tensor on the device a tensor offset must be on.

    Returns:
        (int64 bits, tensor or None) of the mask's offset.

    Raises:
        TypeError, ValueError: a mask_offset as rng.check_counter refuses it.
    """
    if mask_offset is not None:
        return rng.check_counter("mask_offset", mask_offset, like, "logits")
    _, offset, _, offset_t = counters
    if offset_t is not None:
        return 0, offset_t + 1
    return rng.as_int64((offset + 1) & (2**64 - 1)), None


def resolve_pair(noise, mask_noise, logits, seed, offset, mask_offset, generator, row_ids) -> tuple:
    """resolve_stream for the two draws of planner_select_mask (both noises or neither).

    Args:
        noise: explicit uniforms of the selection, or None.
        mask_noise: explicit uniforms of the mask, or None.
        logits, seed, offset, mask_offset, generator, row_ids: the op's arguments of these names.

    Returns:
        (counters, (mask_offset, mask_offset_tensor)): the selection's counters as
        rng.resolve_stream returns them and the mask's offset (int64 bits, tensor or None).

    Raises:
        ValueError: only one of noise and mask_noise, mask_noise beside mask_offset, or a
            shape or device mismatch.
        TypeError: a noise or counter of the wrong type.
    """
    if (noise is None) != (mask_noise is None):
        raise ValueError("pass both noise and mask_noise (explicit uniforms) or neither")
    shape = tuple(logits.shape)
    if mask_noise is not None:
        if mask_offset is not None:
            raise ValueError("pass either mask_noise or mask_offset, not both")
        check_tensor("mask_noise", mask_noise, (torch.float32,), 2)
        check_shape("mask_noise", mask_noise, shape)
        check_same_device("mask_noise", mask_noise, logits, "logits")
    counters = rng.resolve_stream(noise, shape, logits, seed, offset, generator, row_ids, "logits")
    return counters, (resolve_mask_offset(mask_offset, counters, logits) if noise is None else (0, None))


# ------------------------------------------------------------------------- reference


def planner_logits(logits: torch.Tensor) -> torch.Tensor:
    """float32 planner logits, NaN read as -inf.

    Args:
        logits: float [B, D] planner logits.

    Returns:
        Float32[B, D].
    """
    l = logits.float()
    return l.masked_fill(torch.isnan(l), float("-inf"))


def planner_prob(l: torch.Tensor) -> torch.Tensor:
    """p(z^d = N | x_t) = sigmoid(l), written as the kernels compute it.

    Args:
        l: Float32[B, D] planner logits (planner_logits).

    Returns:
        Float32[B, D] the probabilities.
    """
    return 1.0 / (1.0 + torch.exp(-l))


def sum_p(p: torch.Tensor) -> torch.Tensor:
    """sum_d p^d per row, summed in float64 and rounded once to float32 (as the kernels).

    Args:
        p: Float32[B, D] probabilities.

    Returns:
        Float32[B].
    """
    return p.double().sum(dim=1).float()


def selection_bases(l: torch.Tensor, softmax: bool) -> torch.Tensor:
    """The log-weight of each position before its shift: log sigmoid(l) = min(l, 0) -
    log(1 + exp(-|l|)) (option A, finite where sigmoid(l) underflows), or l (option C).

    Args:
        l: Float32[B, D] planner logits.
        softmax: option C (softmax(l / tau)) rather than option A (sigmoid).

    Returns:
        Float32[B, D] the log-weights.
    """
    if softmax:
        return l
    return torch.clamp(l, max=0.0) - torch.log(1.0 + torch.exp(-l.abs()))


def gumbel_top_k(base: torch.Tensor, tau: float, noise: torch.Tensor, k: int) -> torch.Tensor:
    """k positions without replacement, P proportional to exp(base / tau): the k largest
    shifted(base, top) + Gumbel, ties to the lower position (stable sort), `top` the row's
    largest base: huge logits keep their noise (log sigmoid(-1e8) is -1e8, whose float32
    spacing of 8 would absorb the Gumbel variables) and +inf logits tie at 0 and are drawn
    uniformly among themselves. Where fewer than k positions lie within REBASE_GAP of the
    largest and a position of weight > 0 lies beyond it, see gumbel_rounds.

    Args:
        base: Float32[B, D] log-weights (selection_bases).
        tau: the temperature of the weights.
        noise: Float32[B, D] uniforms, column d for position d.
        k: positions a row.

    Returns:
        Long[B, k] the positions, in the order drawn.
    """
    gumbel = rng.gumbel(noise)
    top = base.amax(dim=1, keepdim=True)
    log_weights = shifted(base, top, tau)
    keys = log_weights + gumbel
    positions = torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :k]
    beyond = (log_weights < -REBASE_GAP) & (base > float("-inf"))  # rounds rebase only to reach these
    far = ((log_weights >= -REBASE_GAP).sum(dim=1) < k) & beyond.any(dim=1)
    if bool(far.any()):
        positions[far] = gumbel_rounds(base[far], top[far], tau, gumbel[far], k)
    return positions


def gumbel_rounds(base: torch.Tensor, top: torch.Tensor, tau: float, gumbel: torch.Tensor, k: int) -> torch.Tensor:
    """Gumbel-top-k as k rounds of argmax (the lower free position on ties), the keys of a
    round taken relative to the largest free base once that lies more than REBASE_GAP below
    the current `top` (and is not -inf): a shift of every key, so the same order in exact
    arithmetic, but the free positions' keys keep their noise in float32 (keys relative to a
    top 1e8 above them, or +inf, would all round to one value and go in position order).
    Where every chosen position lies within REBASE_GAP of the top no round rebases and the
    choices are those of the sort in gumbel_top_k, which the kernels rely on.

    Args:
        base: Float32[R, D] log-weights of the rows concerned.
        top: Float32[R, 1] each row's largest base.
        tau: the temperature of the weights.
        gumbel: Float32[R, D] the rows' Gumbel variables.
        k: positions a row.

    Returns:
        Long[R, k] the positions, in the order drawn.
    """
    neg_inf = float("-inf")
    taken = torch.zeros_like(base, dtype=torch.bool)
    columns = torch.arange(base.shape[1], device=base.device)
    positions = []
    for _ in range(k):
        free_top = base.masked_fill(taken, neg_inf).amax(dim=1, keepdim=True)
        far = shifted(free_top, top, tau) < -REBASE_GAP
        top = torch.where(far & (free_top > neg_inf), free_top, top)
        keys = (shifted(base, top, tau) + gumbel).masked_fill(taken, neg_inf)
        best = keys.amax(dim=1, keepdim=True)
        pick = torch.where(~taken & (keys == best), columns, base.shape[1]).amin(dim=1)
        positions.append(pick)
        taken[torch.arange(base.shape[0], device=base.device), pick] = True
    return torch.stack(positions, dim=1)


def draw_mask(p, noise, positions, x, mask_id, forced=None):
    """z = min(u, BELOW_ONE) < p (ddpd.ops.rng.happens) with the positions forced to 1 (those
    where `forced` holds, when given). A position outside [0, D) forces nothing, as in the
    kernels that read unchecked positions (CUDA tensors); an index would wrap -1 to the last
    position, or fail.

    Args:
        p: Float32[B, D] probabilities.
        noise: Float32[B, D] uniforms.
        positions: Long[B, k] positions to force, or None.
        x: Long[B, D] the current sequences.
        mask_id: the token written where z = 1.
        forced: Bool like positions, which of them to force, or None for all.

    Returns:
        (masked Long[B, D], z Bool[B, D], count Long[B]).
    """
    z = rng.happens(noise, p)
    if positions is not None:
        length = z.shape[1]
        force = (positions >= 0) & (positions < length) & (True if forced is None else forced)
        # the positions not forced land in a column past the row, dropped
        hits = z.new_zeros(z.shape[0], length + 1).scatter(1, torch.where(force, positions, length), True)
        z = z | hits[:, :length]
    return torch.where(z, torch.full_like(x, mask_id), x), z, z.sum(dim=1)


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
) -> Selection:
    """Plain torch version of planner_select, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.planner_select.

    Returns:
        What ddpd.ops.planner_select returns (Selection).

    Raises:
        What ddpd.ops.planner_select raises.
    """
    k, softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    rows, length = logits.shape
    counters = rng.resolve_stream(noise, (rows, length), logits, seed, offset, generator, row_ids, "logits")
    rng.check_noise_values(noise)
    if noise is None:
        noise = rng.stream_noise(counters, row_ids, rows, length, logits.device)
    l = planner_logits(logits)
    p = planner_prob(l)
    positions = gumbel_top_k(selection_bases(l, softmax), tau if softmax else 1.0, noise, k)
    return Selection(positions, sum_p(p), (p < eps).all(dim=1))


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
) -> Plan:
    """Plain torch version of planner_select_mask, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.planner_select_mask.

    Returns:
        What ddpd.ops.planner_select_mask returns (Plan).

    Raises:
        What ddpd.ops.planner_select_mask raises.
    """
    k, softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    mask_id = check_mask_args(logits, x, mask_id)
    counters, (mask_offset, mask_offset_t) = resolve_pair(noise, mask_noise, logits, seed, offset, mask_offset,
                                                           generator, row_ids)
    rows, length = logits.shape
    rng.check_noise_values(noise)
    rng.check_noise_values(mask_noise, "mask_noise")
    if noise is None:
        seed, _, seed_t, _ = counters
        noise = rng.stream_noise(counters, row_ids, rows, length, logits.device)
        mask_noise = rng.stream_noise((seed, mask_offset, seed_t, mask_offset_t), row_ids, rows, length,
                                      logits.device)
    l = planner_logits(logits)
    p = planner_prob(l)
    positions = gumbel_top_k(selection_bases(l, softmax), tau if softmax else 1.0, noise, k)
    weighted = l.gather(1, positions) > float("-inf")  # a pick of weight 0 is not denoised: not forced
    return Plan(positions, sum_p(p), (p < eps).all(dim=1), *draw_mask(p, mask_noise, positions, x, mask_id, weighted))


# ------------------------------------------------------------------------ fused ops


def planner_select_triton(logits, k, softmax, tau, eps, noise, counters, row_ids, mask=None):
    """Launch the Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1).

    Args:
        logits: float [B, D] planner logits, validated.
        k: positions a row.
        softmax: option C (softmax(l / tau)) rather than sigmoid weights.
        tau: the softmax temperature.
        eps: the stop threshold, as check_select_args returns it.
        noise: Float[B, D] explicit uniforms, or None to draw from the stream.
        counters: (seed, offset, seed_tensor, offset_tensor) of rng.resolve_stream.
        row_ids: Long[B] stream ids of the rows, or None for 0..B-1.
        mask: None, or (x, mask_id, mask_noise, (mask_offset, mask_offset_tensor)) to draw
            the mask of planner_select_mask too.

    Returns:
        (positions, sum_p, stop), and (masked, z, count) after them with the mask.

    Raises:
        ValueError: D too wide for the Triton kernel.
    """
    planner_select_kernel = _dispatch.kernels("planner_select").planner_select_kernel

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
        _dispatch.launch(
            planner_select_kernel, (rows,), logits, length, k, tau, eps,
            noise, mask_noise, row_ids, *rng.split32(seed), *rng.split32(offset), *rng.split32(mask_offset),
            seed_t, offset_t, mask_offset_t, x, mask_id, positions, sum_p, stop, masked, z, count,
            SOFTMAX=softmax, WITH_MASK=mask is not None, BLOCK_D=1 << (length - 1).bit_length(),
        )
    if mask is None:
        return positions, sum_p, stop
    return positions, sum_p, stop, masked, z, count


def _planner_select_impl(logits, k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU."""
    if logits.is_cuda:
        return planner_select_triton(logits, k, softmax, tau, eps, noise, (seed, offset, seed_t, offset_t), row_ids)
    kernel = _dispatch.cpu_kernel("planner_select_cpu")
    return kernel(logits.contiguous(), k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t)


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


def _planner_select_mask_impl(logits, x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset,
                              mask_offset, row_ids, seed_t, offset_t, mask_offset_t):
    """The kernels behind the op (arguments validated): Triton on CUDA, C++ on CPU."""
    if logits.is_cuda:
        return planner_select_triton(logits, k, softmax, tau, eps, noise, (seed, offset, seed_t, offset_t), row_ids,
                                     mask=(x, mask_id, mask_noise, (mask_offset, mask_offset_t)))
    kernel = _dispatch.cpu_kernel("planner_select_mask_cpu")
    return kernel(logits.contiguous(), x.contiguous(), mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset,
                  mask_offset, row_ids, seed_t, offset_t, mask_offset_t)


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
) -> Selection:
    """Choose k positions per row of planner logits [B, D] to denoise (docs/ops/planner_select.md).

    Args:
        logits: float32/bfloat16/float16 [B, D], logits of "position d is noise".
        k: positions per row, 1 <= k <= D.
        mode: 'sigmoid' (P proportional to sigmoid(logits), options A/B) or 'softmax'
            (softmax(logits / tau) over positions, option C).
        tau: the softmax temperature, in (0, 1e36].
        eps: the stop threshold, in (0, 1).
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[B, D].

    Returns:
        Selection(positions Long[B, k] in draw order, sum_p Float[B], stop Bool[B]).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape, device or value out of range.
    """
    _dispatch.refuse_transforms("planner_select", logits, noise, row_ids)
    k, softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    seed, offset, seed_t, offset_t = rng.resolve_stream(noise, tuple(logits.shape), logits, seed, offset, generator,
                                                        row_ids, "logits")
    noise, row_ids = _dispatch.contiguous(noise, row_ids)
    # Draws and the stop statistics carry no gradient (see sample_from_hidden).
    call = _planner_select_impl if _dispatch.eager(logits, noise, row_ids, seed_t, offset_t) else _planner_select_op
    return Selection(*call(logits.detach(), k, softmax, tau, eps, noise, seed, offset, row_ids, seed_t, offset_t))


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
) -> Plan:
    """planner_select, then the mask of prop:draw_with_maskD at the chosen positions, in one pass.

    Args:
        logits: float32/bfloat16/float16 [B, D] planner logits.
        x: Long[B, D] the current sequences.
        mask_id: the token written where z = 1.
        k, mode, tau, eps: as planner_select.
        seed: int in [0, 2**64) or an int64 tensor of one element on the input's device (read by
            the kernels: advancing it in place gives fresh draws on each replay of a CUDA graph);
            None draws seed and offset from `generator`.
        offset: like seed; give calls that share a seed different offsets.
        generator: the torch.Generator seed and offset are drawn from (default: torch's global one).
        row_ids: Long ids naming each row's stream (default 0..N-1 over the flattened rows).
        noise: explicit uniforms in (0, 1] instead of a stream Float[B, D] for the selection.
        mask_noise: explicit uniforms Float[B, D] for the mask (with `noise`).
        mask_offset: the mask's stream offset (default offset + 1 mod 2**64; int or int64 tensor).

    Returns:
        Plan(positions Long[B, k], sum_p Float[B], stop Bool[B], masked Long[B, D],
        z Bool[B, D], count Long[B]).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a shape, device or value out of range.
    """
    _dispatch.refuse_transforms("planner_select_mask", logits, x, noise, mask_noise, row_ids)
    k, softmax, tau, eps = check_select_args(logits, k, mode, tau, eps)
    mask_id = check_mask_args(logits, x, mask_id)
    (seed, offset, seed_t, offset_t), (mask_offset, mask_offset_t) = resolve_pair(
        noise, mask_noise, logits, seed, offset, mask_offset, generator, row_ids)
    noise, mask_noise, row_ids = _dispatch.contiguous(noise, mask_noise, row_ids)
    eager = _dispatch.eager(logits, x, noise, mask_noise, row_ids, seed_t, offset_t, mask_offset_t)
    call = _planner_select_mask_impl if eager else _planner_select_mask_op
    return Plan(*call(logits.detach(), x, mask_id, k, softmax, tau, eps, noise, mask_noise, seed, offset, mask_offset,
                      row_ids, seed_t, offset_t, mask_offset_t))
