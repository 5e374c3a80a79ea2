"""The forward corruption process and the posterior identities of DDPD.

Everything here follows the paper's notation: a schedule alpha_t interpolates from
noise (t = 0) to data (t = 1); z_t^d = N marks a corrupted position.

- Schedules alpha_t with derivative and inverse (eq. corruption_flow).
- `corrupt`: draw (x_t, z_t) ~ p_{t|1}(x_t, z_t | x_1) for uniform or mask noise.
- `planner_prob_from_uniform`, `denoiser_prob_from_uniform` (and their logs): the rate
  decomposition of prop:generative_rate_decomposition (eqs. corruption_prob and
  denoising_prob), turning a single uniform model p(x_1^d | x_t) into a planner and
  a denoiser.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.validation import check_int, check_tensor, value_range, values_checkable

NOISE_KINDS = ("uniform", "mask")


class Schedule:
    """A noise schedule alpha_t on t in [0, 1] with alpha_0 = 0 and alpha_1 = 1."""

    name = "schedule"

    def alpha(self, t: Tensor) -> Tensor:
        """The probability alpha_t that a position is clean at time t.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            alpha_t, a tensor of the shape of `t`.
        """
        raise NotImplementedError

    def alpha_dot(self, t: Tensor) -> Tensor:
        """The time derivative of alpha_t.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            d alpha / dt, a tensor of the shape of `t`.
        """
        raise NotImplementedError

    def inverse(self, a: Tensor) -> Tensor:
        """The t with alpha_t = a (the planner's time estimate uses it).

        Args:
            a: values of alpha in [0, 1].

        Returns:
            The times t, a tensor of the shape of `a`.
        """
        raise NotImplementedError

    def rate(self, t: Tensor) -> Tensor:
        """Noise-removal rate alpha_dot / (1 - alpha): it diverges at t = 1: inf, or for the
        cosine schedule in float64 a huge finite value (cos(pi / 2) rounds to 6e-17, not 0).

        Args:
            t: times in [0, 1].

        Returns:
            The rate, a tensor of the shape of `t`.
        """
        return self.alpha_dot(t) / (1.0 - self.alpha(t))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LinearSchedule(Schedule):
    """alpha_t = t, the schedule the paper trains and samples with."""

    name = "linear"

    def alpha(self, t: Tensor) -> Tensor:
        """alpha_t = t.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            alpha_t, a tensor of the shape of `t`.
        """
        return torch.as_tensor(t) * 1.0

    def alpha_dot(self, t: Tensor) -> Tensor:
        """d alpha / dt = 1.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            d alpha / dt, a tensor of the shape of `t`.
        """
        t = torch.as_tensor(t)
        return torch.ones_like(t if t.is_floating_point() else t.float())

    def inverse(self, a: Tensor) -> Tensor:
        """t = a.

        Args:
            a: values of alpha in [0, 1].

        Returns:
            The times t, a tensor of the shape of `a`.
        """
        return torch.as_tensor(a) * 1.0


class CosineSchedule(Schedule):
    """alpha_t = 1 - cos(pi t / 2)."""

    name = "cosine"

    def alpha(self, t: Tensor) -> Tensor:
        """alpha_t = 1 - cos(pi t / 2).

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            alpha_t, a tensor of the shape of `t`.
        """
        return 1.0 - torch.cos(0.5 * math.pi * torch.as_tensor(t))

    def alpha_dot(self, t: Tensor) -> Tensor:
        """d alpha / dt = (pi / 2) sin(pi t / 2).

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            d alpha / dt, a tensor of the shape of `t`.
        """
        return 0.5 * math.pi * torch.sin(0.5 * math.pi * torch.as_tensor(t))

    def inverse(self, a: Tensor) -> Tensor:
        """t = (2 / pi) acos(1 - a).

        Args:
            a: values of alpha in [0, 1].

        Returns:
            The times t, a tensor of the shape of `a`.
        """
        return torch.acos(1.0 - torch.as_tensor(a).clamp(0.0, 1.0)) * (2.0 / math.pi)


class CustomSchedule(Schedule):
    """A user-supplied schedule from three callables on tensors.

    Args:
        alpha: t -> alpha_t, with alpha_0 = 0 and alpha_1 = 1.
        alpha_dot: t -> d alpha / dt.
        inverse: alpha -> t, with inverse(0) = 0 and inverse(1) = 1.

    Raises:
        TypeError: an argument that is not callable.
        ValueError: alpha or inverse off its endpoints by more than 1e-6, or alpha falling (or
            alpha_dot negative, or either not finite) somewhere on a grid of 1025 times.
    """

    name = "custom"

    def __init__(self, alpha: Callable, alpha_dot: Callable, inverse: Callable):
        for arg, fn in (("alpha", alpha), ("alpha_dot", alpha_dot), ("inverse", inverse)):
            if not callable(fn):
                raise TypeError(f"{arg} must be callable, got {type(fn).__name__}")
        ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
        # corrupt and the samplers take t = 0 as all noise and t = 1 as all data
        _check_endpoints("alpha", "t", alpha(ends))
        _check_endpoints("inverse", "alpha", inverse(ends))
        _check_rising(alpha, alpha_dot)
        self._alpha, self._alpha_dot, self._inverse = alpha, alpha_dot, inverse

    def __repr__(self) -> str:
        return f"CustomSchedule(alpha={self._alpha!r}, alpha_dot={self._alpha_dot!r}, inverse={self._inverse!r})"

    def alpha(self, t: Tensor) -> Tensor:
        """alpha_t from the user's `alpha` callable.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            alpha_t, a tensor of the shape of `t`.
        """
        return self._alpha(torch.as_tensor(t))

    def alpha_dot(self, t: Tensor) -> Tensor:
        """d alpha / dt from the user's `alpha_dot` callable.

        Args:
            t: times in [0, 1], a tensor or a number.

        Returns:
            d alpha / dt, a tensor of the shape of `t`.
        """
        return self._alpha_dot(torch.as_tensor(t))

    def inverse(self, a: Tensor) -> Tensor:
        """t from the user's `inverse` callable.

        Args:
            a: values of alpha in [0, 1].

        Returns:
            The times t, a tensor of the shape of `a`.
        """
        return self._inverse(torch.as_tensor(a))


def _check_endpoints(name: str, of: str, values) -> None:
    """ValueError naming `name` unless its values at `of` = 0 and 1 are 0 and 1 (within 1e-6)."""
    low, high = (float(v) for v in torch.as_tensor(values, dtype=torch.float64).flatten()[:2])
    if not (abs(low) <= 1e-6 and abs(high - 1.0) <= 1e-6):  # NaN fails too
        raise ValueError(f"{name} must map {of} = 0 to 0 and {of} = 1 to 1, got {low} and {high}")


def _check_rising(alpha: Callable, alpha_dot: Callable) -> None:
    """ValueError unless alpha never falls and alpha_dot >= 0 on a grid of [0, 1]: a falling
    alpha makes negative rates, which the samplers would read as probabilities."""
    grid = torch.linspace(0.0, 1.0, 1025, dtype=torch.float64)
    values = {name: torch.as_tensor(fn(grid), dtype=torch.float64).expand(grid.shape)
              for name, fn in (("alpha", alpha), ("alpha_dot", alpha_dot))}
    for name, v in values.items():
        if not bool(v.isfinite().all()):
            k = int((~v.isfinite()).nonzero()[0])
            raise ValueError(f"{name} must be finite on [0, 1], got {float(v[k])} at t = {float(grid[k]):.6g}")
    a, slope = values["alpha"], values["alpha_dot"]
    if bool((a[1:] < a[:-1]).any()):
        k = int((a[1:] < a[:-1]).nonzero()[0])
        raise ValueError(f"alpha must not fall on [0, 1] (alpha_t rises from noise at t = 0 to data at t = 1), "
                         f"got alpha({float(grid[k]):.6g}) = {float(a[k]):.6g} > "
                         f"alpha({float(grid[k + 1]):.6g}) = {float(a[k + 1]):.6g}")
    if bool((slope < 0).any()):
        k = int((slope < 0).nonzero()[0])
        raise ValueError(f"alpha_dot must be >= 0 on [0, 1] (alpha never falls), got {float(slope[k]):.6g} "
                         f"at t = {float(grid[k]):.6g}")


_SCHEDULES = {"linear": LinearSchedule, "cosine": CosineSchedule}
SCHEDULES = tuple(_SCHEDULES)  # the names get_schedule takes


def get_schedule(schedule: Union[str, Schedule]) -> Schedule:
    """A schedule by name ('linear', 'cosine') or the Schedule itself.

    Args:
        schedule: "linear", "cosine" or a Schedule.

    Returns:
        The Schedule.

    Raises:
        TypeError: neither a string nor a Schedule (the class rather than an instance included).
        ValueError: an unknown name.
    """
    if isinstance(schedule, Schedule):
        return schedule
    if not isinstance(schedule, str):
        got = f"the class {schedule.__name__}" if isinstance(schedule, type) else type(schedule).__name__
        raise TypeError(f"schedule must be a schedule's name or a Schedule, got {got}")
    if schedule in _SCHEDULES:
        return _SCHEDULES[schedule]()
    raise ValueError(f"schedule must be one of {sorted(_SCHEDULES)} or a Schedule, got {schedule!r}")


def corrupt(
    x1: Tensor,
    t: Tensor,
    schedule: Union[str, Schedule],
    noise: str,
    vocab_size: int,
    mask_id: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> tuple[Tensor, Tensor]:
    """Draw (x_t, z_t) from the forward process p_{t|1} (eq. corruption_flow).

    Each position is kept (z = D) with probability alpha_t and corrupted (z = N)
    otherwise; a corrupted position becomes a uniform draw over the vocabulary
    (uniform noise: it may land on the clean value, and z stays N) or the mask
    token (mask noise, mask_id defaults to vocab_size).

    The ranges of x1 and t are checked for CPU tensors and numbers only (on CUDA it would
    cost a host sync per call), and not while traced (torch.compile, make_fx, vmap).

    Args:
        x1: Long[B, D] clean tokens in [0, vocab_size).
        t: Float[B] times in [0, 1], or a number or a 0-d tensor for every row.
        schedule: "linear", "cosine" or a Schedule.
        noise: "uniform" or "mask".
        vocab_size: V.
        mask_id: the mask token of mask noise, >= vocab_size (below, a mask would read as a
            token); None: vocab_size.
        generator: the torch.Generator to draw from; None: torch's global one.

    Returns:
        (x_t, z_t): x_t Long[B, D], z_t Bool[B, D], True where the position is noise.

    Raises:
        TypeError: x1 not a Long tensor, t neither a number nor a tensor, or vocab_size or
            mask_id not an int.
        ValueError: an unknown noise or schedule, x1 not [B, D] or an id out of range,
            t of another shape or outside [0, 1], vocab_size < 1, or mask_id < vocab_size.
    """
    if noise not in NOISE_KINDS:
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    check_tensor("x1", x1, (torch.long,), 2)
    vocab_size = check_int("vocab_size", vocab_size, 1)
    mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    _check_ids("x1", x1, vocab_size)
    t = _check_times(t, x1.shape[0]).to(x1.device).expand(x1.shape[0])
    alpha = get_schedule(schedule).alpha(t)[:, None]
    u = torch.rand(x1.shape, generator=generator, device=x1.device)
    z_t = u >= alpha  # P(z = N) = 1 - alpha_t
    if noise == "mask":
        x_t = torch.where(z_t, torch.full_like(x1, mask_id), x1)
    else:
        draws = torch.randint(0, vocab_size, x1.shape, generator=generator, device=x1.device)
        x_t = torch.where(z_t, draws, x1)
    return x_t, z_t


def _check_ids(name: str, x: Tensor, vocab_size: int) -> None:
    """ValueError naming x unless its ids lie in [0, vocab_size), where values_checkable."""
    if values_checkable(x):
        low, high = value_range(x)
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must hold ids in [0, {vocab_size}), got range [{low}, {high}]")


def _check_times(t, batch: int) -> Tensor:
    """t as Float32, a 0-d tensor or [batch] on t's device; ValueError for another shape, or
    for a time outside [0, 1] (NaN included) where values_checkable; TypeError for neither a
    number nor a tensor (as_tensor's own message does not name t)."""
    if isinstance(t, bool) or not isinstance(t, (numbers.Real, Tensor)):
        raise TypeError(f"t must be a number or a tensor, got {type(t).__name__}")
    t = torch.as_tensor(t, dtype=torch.float32)
    if t.dim() != 0 and tuple(t.shape) != (batch,):
        raise ValueError(f"t must be a number, a 0-d tensor or of shape [{batch}] (one time per row of x1), "
                         f"got shape {tuple(t.shape)}")
    if values_checkable(t):
        low, high = value_range(t)  # NaN where any time is
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"t must be in [0, 1], got range [{low}, {high}]")
    return t


_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# The largest vocabulary a uniform token is drawn over from one float32 uniform: the Philox
# uniforms ((w >> 8) + 0.5) 2**-24 lie 2**-23 apart on [0.5, 1), so beyond 2**23 tokens some
# tokens could never be drawn.
MAX_UNIFORM_VOCAB = 2**23


def uniform_token(u: Tensor, vocab_size: int) -> Tensor:
    """Long: floor(u V), a token uniform over [0, V) from uniforms u (V <= MAX_UNIFORM_VOCAB); u = 1,
    the float32 rounding of the largest Philox uniform, is the last token.

    Exact, in float64 (a float32 u times V < 2**29 fits its 53 bits): in float32 the product
    rounds again, and some tokens came out 0.35% (V = 50257) to 7% (V = 10**6) more likely
    than others beyond what the uniforms' own grid gives. On the Philox grid each token's
    probability is within 2**-23 of 1/V.

    Args:
        u: uniforms in [0, 1].
        vocab_size: V, at most MAX_UNIFORM_VOCAB.

    Returns:
        Long tokens of the shape of `u`.

    Raises:
        TypeError: u not a floating tensor, or vocab_size not an int.
        ValueError: vocab_size below 1 (a token -1 came out) or above MAX_UNIFORM_VOCAB.
    """
    check_tensor("u", u, _FLOATS)
    vocab_size = check_int("vocab_size", vocab_size, 1)
    if vocab_size > MAX_UNIFORM_VOCAB:
        raise ValueError(f"vocab_size must be <= {MAX_UNIFORM_VOCAB} for tokens drawn uniformly (x_0, uniform "
                         f"noise): beyond it some tokens could never be drawn from a float32 uniform, got {vocab_size}")
    return (u.double() * vocab_size).long().clamp_(max=vocab_size - 1)


def _alpha_like(alpha, ref: Tensor) -> Tensor:
    """alpha (a number, a 0-d tensor or [B]) as a tensor broadcastable against ref [B, D];
    TypeError or ValueError naming alpha otherwise (a [B'] alpha would broadcast to B' rows), or
    for a value outside [0, 1] where values_checkable (the self-loop weight turns negative)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (numbers.Real, Tensor)):
        raise TypeError(f"alpha must be a number or a tensor, got {type(alpha).__name__}")
    alpha = alpha if isinstance(alpha, Tensor) else torch.as_tensor(alpha, dtype=torch.float64)
    if values_checkable(alpha):  # before the move to ref's device: a number costs no host sync
        low, high = value_range(alpha)  # NaN where any alpha is
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got range [{low}, {high}]")
    alpha = alpha.to(dtype=ref.dtype, device=ref.device)
    if alpha.dim() == 0:
        return alpha
    if tuple(alpha.shape) != (ref.shape[0],):
        raise ValueError(f"alpha must be a number, a 0-d tensor or of shape [{ref.shape[0]}] (one value per row "
                         f"of x_t), got shape {tuple(alpha.shape)}")
    return alpha[:, None]


def _check_tokens(name: str, p_x1: Tensor, x_t: Tensor) -> None:
    """p_x1 (named `name`) a float [B, D, S] tensor and x_t a Long [B, D] tensor of ids in [0, S),
    its values checked where values_checkable: gather's own errors name no argument (a masked x_t
    holds the id S; an x_t of another shape met 'Index tensor must have the same number of dimensions')."""
    check_tensor(name, p_x1, _FLOATS, 3)
    check_tensor("x_t", x_t, (torch.long,))
    if tuple(x_t.shape) != tuple(p_x1.shape[:-1]):
        raise ValueError(f"x_t must have shape {tuple(p_x1.shape[:-1])} ([B, D] of {name} [B, D, S]), "
                         f"got {tuple(x_t.shape)}")
    _check_ids("x_t", x_t, p_x1.shape[-1])


def _self_loop_weight(alpha: Tensor, vocab_size: int) -> Tensor:
    """p(z = N | x_t, x_1 = x_t) = ((1 - alpha) / S) / (alpha + (1 - alpha) / S), as
    (1 - alpha) / (1 + (S - 1) alpha): as 1 - alpha / (alpha + (1 - alpha) / S) it rounds to 0 in
    float32 once (1 - alpha) / S is under half a step of alpha (S = 50257: alpha > 0.9985)."""
    return (1.0 - alpha) / (1.0 + (vocab_size - 1) * alpha)


def planner_prob_from_uniform(p_x1: Tensor, x_t: Tensor, alpha) -> Tensor:
    """p(z_t^d = N | x_t) from a uniform model's p(x_1^d | x_t) (eq. corruption_prob).

    Args:
        p_x1: Float[B, D, S] probabilities p(x_1^d | x_t) of a uniform model.
        x_t: Long[B, D] noisy tokens.
        alpha: alpha_t, a number, a 0-d tensor or [B].

    Returns:
        Float[B, D], p(z_t^d = N | x_t).

    Raises:
        TypeError: p_x1 not a floating tensor, x_t not a Long tensor, or alpha neither a number nor a
            tensor.
        ValueError: p_x1 not 3-D, x_t not of shape [B, D] of p_x1, an id of x_t outside [0, S), or
            alpha of another shape than a 0-d tensor or [B] or outside [0, 1] (values checked on CPU
            tensors and numbers).
    """
    _check_tokens("p_x1", p_x1, x_t)
    p_same = p_x1.gather(-1, x_t[..., None]).squeeze(-1)
    return (1.0 - p_same) + p_same * _self_loop_weight(_alpha_like(alpha, p_same), p_x1.shape[-1])


def denoiser_prob_from_uniform(p_x1: Tensor, x_t: Tensor, alpha) -> Tensor:
    """p(x_1^d = j | x_t, z_t^d = N) for every j (eq. denoising_prob): the exp of
    `denoiser_log_prob_from_uniform` of log p_x1.

    Args:
        p_x1: Float[B, D, S] probabilities p(x_1^d | x_t) of a uniform model.
        x_t: Long[B, D] noisy tokens.
        alpha: alpha_t, a number, a 0-d tensor or [B].

    Returns:
        Float[B, D, S] probabilities.

    Raises:
        TypeError, ValueError: as planner_prob_from_uniform, for the same arguments.
    """
    _check_tokens("p_x1", p_x1, x_t)
    return denoiser_log_prob_from_uniform(torch.log(p_x1), x_t, alpha).exp()


def denoiser_log_prob_from_uniform(log_p_x1: Tensor, x_t: Tensor, alpha) -> Tensor:
    """log p(x_1^d = j | x_t, z_t^d = N) for every j (eq. denoising_prob), from log p(x_1^d | x_t).

    For j != x_t^d it is log p(x_1^d = j | x_t) - log p(z_t^d = N | x_t). The value at
    j = x_t^d is the probability that a corrupted position was redrawn onto its own
    clean value; with it the row sums to one, which is the self-loop of
    prop:self-loop-jumps. Rows with p(z = N) = 0 are -inf throughout (no jump). In logs, so
    that a probability below float32's smallest (a logit gap over ~103 nats) stays finite,
    and p(z = N) = (1 - p(x_1^d = x_t^d)) + p(x_1^d = x_t^d) w, w = ((1 - alpha) / S) / (alpha +
    (1 - alpha) / S) the self-loop weight (kept from rounding to 0 near alpha = 1), with its first term
    summed over the other tokens: 1 - p(x_1^d = x_t^d) rounds to 0 once the other tokens
    hold less than 2**-24 (a model 25 nats sure of x_t^d), where the jump law is still defined.

    Args:
        log_p_x1: Float[B, D, S] log-probabilities log p(x_1^d | x_t), normalised.
        x_t: Long[B, D] noisy tokens.
        alpha: alpha_t, a number, a 0-d tensor or [B].

    Returns:
        Float[B, D, S] log-probabilities.

    Raises:
        TypeError: log_p_x1 not a floating tensor, x_t not a Long tensor, or alpha neither a number nor a
            tensor.
        ValueError: log_p_x1 not 3-D, x_t not of shape [B, D] of log_p_x1, an id of x_t outside [0, S), or
            alpha of another shape than a 0-d tensor or [B] or outside [0, 1] (values checked on CPU
            tensors and numbers).
    """
    log_self_loop, log_noise = _log_noise(log_p_x1, x_t, alpha)
    log_joint = log_p_x1.scatter(-1, x_t[..., None], log_self_loop[..., None])
    jumps = (log_noise > float("-inf"))[..., None]
    return torch.where(jumps, log_joint - torch.where(jumps, log_noise[..., None], 0.0), float("-inf"))


def planner_log_prob_from_uniform(log_p_x1: Tensor, x_t: Tensor, alpha) -> Tensor:
    """log p(z_t^d = N | x_t) from a uniform model's log p(x_1^d | x_t) (eq. corruption_prob), the
    normaliser of `denoiser_log_prob_from_uniform`.

    Args:
        log_p_x1: Float[B, D, S] log-probabilities log p(x_1^d | x_t), normalised.
        x_t: Long[B, D] noisy tokens.
        alpha: alpha_t, a number, a 0-d tensor or [B].

    Returns:
        Float[B, D], log p(z_t^d = N | x_t).

    Raises:
        TypeError: log_p_x1 not a floating tensor, x_t not a Long tensor, or alpha neither a number nor a
            tensor.
        ValueError: log_p_x1 not 3-D, x_t not of shape [B, D] of log_p_x1, an id of x_t outside [0, S), or
            alpha of another shape than a 0-d tensor or [B] or outside [0, 1] (values checked on CPU
            tensors and numbers).
    """
    return _log_noise(log_p_x1, x_t, alpha)[1]


def _log_noise(log_p_x1: Tensor, x_t: Tensor, alpha) -> tuple[Tensor, Tensor]:
    """(log p(x_1^d = x_t^d, z_t^d = N | x_t), log p(z_t^d = N | x_t)): the self-loop, and it plus
    the other tokens' probability (summed, not 1 - p(x_1^d = x_t^d), which rounds to 0)."""
    _check_tokens("log_p_x1", log_p_x1, x_t)
    here = x_t[..., None]
    log_same = log_p_x1.gather(-1, here).squeeze(-1)
    log_self_loop = log_same + torch.log(_self_loop_weight(_alpha_like(alpha, log_same), log_p_x1.shape[-1]))
    others = log_p_x1.scatter(-1, here, float("-inf"))
    if not torch.is_grad_enabled():  # no backward (the samplers): the pass over `others` below is not needed
        return log_self_loop, torch.logaddexp(torch.logsumexp(others, -1), log_self_loop)
    # A row sure of x_t: logsumexp and logaddexp of -inf alone have NaN gradients, so they see 0
    # there and the row takes the values they give, -inf and log_self_loop (a double where).
    sure = (others == float("-inf")).all(-1)
    log_change = torch.logsumexp(others.masked_fill(sure[..., None], 0.0), -1)
    return log_self_loop, torch.where(sure, log_self_loop, torch.logaddexp(log_change, log_self_loop))
