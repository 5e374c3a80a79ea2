"""Commit policies: how many of a step's drawn tokens a sampler keeps (parallel decoding).

A policy is handed to one loop, never a loop of its own, and decides on the device: its
answer is a mask over a fixed shape, so a step stays one CUDA-graph replay whatever it
commits. The cost unit is a network pass; docs/parallel.md has the measured frontier.

- `ErrorBudget` (the DDPD loop, DDPDOptions(policy=...)): the planner's pick of the step
  is always denoised, and up to `max_k - 1` more of the positions the planner orders
  next are committed while their summed risk stays under `bound`.
- The mask loop (ddpd.sampling.maskgit.mask_sample) takes one of `MaskGIT`,
  `ConfidenceThreshold`, `ConfidenceFactor`, `EntropyBound` or `ReMDM`: which masked
  positions take their drawn token this step, and (ReMDM) which committed ones are masked
  again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ddpd.number_text import read_number, refusal
from ddpd.sampling.noise import happens
from ddpd.validation import check_bool, check_choice, check_float, check_int, float_text

ORDERS = ("risk", "planner")
SPREADS = ("none", "linear", "cosine")
REMDM_SCHEDULES = ("cap", "rescale", "loop")


# ---------------------------------------------------------------------------------------------- DDPD


@dataclass(frozen=True)
class ErrorBudget:
    """Commit several planner-chosen positions a step while their summed risk is at most `bound`.

    Each step the planner orders `max_k` positions (Gumbel-top-k of its selection weights, so
    the first is Algorithm 1's one-position pick) and the denoiser draws a token at each. The
    risk of committing candidate j is r_j = 1 - p_j c_j: p_j = p(z^j = N | x_t) from the
    planner, c_j the probability of the drawn token under the law it was drawn from; it is
    the chance that the commit is not a noisy position receiving a likely value. That law is
    the tempered, truncated one (the mask loop's policies read the model's untempered
    probability): at temperature exactly 0 c_j is the truncated law's at temperature 1
    (ddpd.ops.sample_categorical's greedy statistics), while as the temperature falls to 0, or
    with top_k 1, c_j tends to 1 and the bound can admit up to max_k commits at once. The first
    pick is always committed; of the others (with a mask denoiser only those the planner's
    mask z of prop:draw_with_maskD masked), the lowest-risk ones (order='risk'), or the
    next in the planner's order (order='planner', stopping at the first that does not fit),
    are committed while sum r_j <= bound. `spread` sets the fewest a step commits (as many
    as are eligible), so that the planner's expected noise sum_d p_d is spent by the end of
    the step budget T: 'linear' ceil(sum_d p_d / (T - i)) at step i; 'cosine' what brings it
    down to floor(n0 cos(pi/2 (i + 1) / T)), n0 the positions a row starts noisy (not a
    prompt's, frozen or not), MaskGIT's schedule (few commits while the context is empty, more
    once it is not). A committed token the planner later calls noise is drawn again, as in
    Algorithm 1.

    known_noise: a position no draw of the run has written yet is noise for certain (the run
    started it from noise): its planner probability is taken as 1, so it is always masked and
    a candidate, and the planner's judgement counts where a token was committed. The planner's
    first pick, uniform among such positions, then loses its place: every candidate is ranked.
    With a spread too, the budget's last step commits every unwritten position: one the planner
    did not pick takes the place of the written pick it ranks last, and the unwritten candidates
    are ranked first and all committed. Where more than max_k are left, the max_k candidates
    are all unwritten (the planner's picks, then the others in position order) and the rest
    stay noise.
    plan_every m: the planner runs at steps 0, m, 2m, ...; a step in between reads the last
    plan, with the positions committed since it as clean, and costs one network pass. With
    known_noise and no prompt the pass at step 0 is skipped: every position is then unwritten,
    noise for certain, and nothing of that plan would be read. The eps stop reads that held
    plan too, so a row can stop without the planner seeing its last tokens (with known_noise
    and m beyond the budget: once every position is written).
    revise_above q (with known_noise): a written position is masked and redrawn only where the
    planner's probability of noise exceeds q, and then for certain; elsewhere it stays in the
    denoiser's context. Without it (None) the mask of prop:draw_with_maskD draws every written
    position as noise with the planner's probability, which with a hesitant planner hides much
    of the committed text from the denoiser.

    choice_temperature tau (order 'risk'): the candidates are ranked by log(1 - r_j) + tau_i g_j,
    g_j Gumbel, tau_i = tau (1 - (i + 1) / T) at step i of T, MaskGIT's annealed randomness (eq. 3 of
    Chang et al. 2022): a Plackett-Luce order by (1 - r)^(1 / tau_i), less greedy than the
    lowest risk first, which keeps the samples' entropy.

    With bound 0 (no spread) or max_k 1 a step commits one position; with known_noise off
    and plan_every 1 too, exactly Algorithm 1's draws. Bound 0 commits nothing past the first
    pick and the spread's minimum, even where float32 rounds a risk to 0 (a planner and
    denoiser both certain).
    """

    bound: float = 1.0
    max_k: int = 16
    order: str = "risk"
    spread: str = "none"
    known_noise: bool = False
    plan_every: int = 1
    choice_temperature: float = 0.0
    revise_above: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bound", check_float("bound", self.bound, 0.0, float("inf"), open_max=True))
        object.__setattr__(self, "max_k", check_int("max_k", self.max_k, 1))
        check_choice("order", self.order, ORDERS)
        check_choice("spread", self.spread, SPREADS)
        if not isinstance(self.known_noise, bool):
            raise TypeError(f"known_noise must be a bool, got {type(self.known_noise).__name__}")
        object.__setattr__(self, "plan_every", check_int("plan_every", self.plan_every, 1))
        object.__setattr__(self, "choice_temperature", check_float("choice_temperature", self.choice_temperature,
                                                                   0.0, float("inf"), open_max=True))
        if self.revise_above is not None:
            object.__setattr__(self, "revise_above", check_float("revise_above", self.revise_above, 0.0, 1.0,
                                                                 open_min=True, open_max=True))
            if not self.known_noise:
                raise ValueError("revise_above needs known_noise=True (it judges the written positions only)")
        if self.choice_temperature > 0 and self.order != "risk":
            raise ValueError(f"choice_temperature ranks by risk: it needs order='risk', got order={self.order!r}")

    def commits_one_a_step(self) -> bool:
        """Whether a step commits at most one position: max_k 1, or bound 0 without a spread.

        Returns:
            True where a step budget T denoises at most T positions.
        """
        return self.max_k == 1 or (self.bound == 0.0 and self.spread == "none")

    def skips_first_plan(self, prompted: bool) -> bool:
        """Whether a run skips the planner pass of step 0: under known_noise without a prompt every
        position starts unwritten, noise for certain, so nothing of that plan would be read.

        Args:
            prompted: whether the run starts from a prompt.

        Returns:
            True to skip it.
        """
        return self.known_noise and not prompted

    def commit(self, risk: Tensor, eligible: Tensor, minimum: Optional[Tensor] = None,
               noise: Optional[Tensor] = None, first: Optional[Tensor] = None) -> Tensor:
        """The candidates (in the planner's order) to commit. Column 0, Algorithm 1's pick, always;
        with known_noise it is ranked with the others (at least one is committed).

        Args:
            risk: Float[B, K] the candidates' risks (commit_risk).
            eligible: Bool[B, K] which candidates may be committed.
            minimum: Long[B] the fewest to commit (with a spread), or None.
            noise: Float[B, K] tau_i g of the ranking (with a choice temperature), or None.
            first: Bool[B, K] eligible candidates ranked ahead of the others and always committed
                (the unwritten ones at the budget's last step, known_noise with a spread), or None.

        Returns:
            Bool[B, K] the candidates committed.
        """
        pin = 0 if self.known_noise else 1
        rest, ok = risk[:, pin:], eligible[:, pin:]
        if self.order == "planner":
            key = torch.arange(rest.shape[1], device=rest.device).expand_as(rest)
        else:
            key = rest if noise is None else -(torch.log1p(-rest) + noise[:, pin:])  # lowest risk first
        # a risk of 1 keys +inf: kept finite, it cannot tie with (and follow) an ineligible candidate
        big = torch.finfo(torch.float32).max
        key = key.float().nan_to_num(nan=big, posinf=big, neginf=-big)
        if first is not None:  # noise for certain: ahead of every key, and all committed below
            first = first[:, pin:] & ok
            key = key.masked_fill(first, float("-inf"))
        order = key.masked_fill(~ok, float("inf")).argsort(dim=1, stable=True)  # eligible first
        ranked = rest.gather(1, order).masked_fill(~ok.gather(1, order), float("inf"))
        # risks are >= 0, so the sums only grow; at bound 0 a risk float32 rounds to 0 buys no commit
        n = (ranked.cumsum(1) <= self.bound).sum(1) if self.bound > 0 else order.new_zeros(order.shape[0])
        if minimum is not None:
            n = torch.maximum(n, torch.minimum(minimum - pin, ok.sum(1)))
        if first is not None:
            n = torch.maximum(n, first.sum(1))
        n = n.clamp(min=1 - pin)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(rest.shape[1], device=rest.device)
                                                 .expand_as(order))
        chosen = rank < n[:, None]
        return torch.cat([torch.ones_like(eligible[:, :1]), chosen], 1) if pin else chosen


def ddpd_steps(passes: int, policy: Optional[ErrorBudget] = None, one_pass: bool = False) -> int:
    """The most DDPD steps a run without a prompt can take within `passes` network passes: a
    denoiser pass a step and a planner pass on each step that plans (every step, or steps 0, m,
    2m, ... under a policy with plan_every m; not step 0 under known_noise); with one_pass (the
    single uniform model, DDPDOptions.one_pass) a pass a step, whether it plans or not.

    Args:
        passes: the budget of network passes.
        policy: the ErrorBudget, or None.
        one_pass: whether a step's draws read its planning pass.

    Returns:
        The number of steps, at least 1 (a budget below ddpd_passes(1, policy) buys none).

    Raises:
        TypeError: `passes` is not an int (numpy's integers are), `policy` not an ErrorBudget, or
            `one_pass` not a bool.
        ValueError: `passes` is below 1.
    """
    passes = check_int("passes", passes, 1)
    every, unread = _plan_cost(policy)
    if check_bool("one_pass", one_pass):
        return passes
    # s steps cost s + ceil(s / m) - unread passes, = ceil(s (m + 1) / m) - unread
    return max(1, (passes + unread) * every // (every + 1))


def ddpd_passes(steps: int, policy: Optional[ErrorBudget] = None, one_pass: bool = False) -> int:
    """The network passes `steps` DDPD steps cost in a run without a prompt, as ddpd_steps counts
    them: ddpd_steps(ddpd_passes(s, policy, one_pass), policy, one_pass) == s.

    Args:
        steps: the number of steps (>= 1).
        policy: the ErrorBudget, or None.
        one_pass: whether a step's draws read its planning pass (a pass a step).

    Returns:
        The passes.

    Raises:
        TypeError: `steps` is not an int (numpy's integers are), `policy` not an ErrorBudget, or
            `one_pass` not a bool.
        ValueError: `steps` is below 1.
    """
    steps = check_int("steps", steps, 1)
    every, unread = _plan_cost(policy)
    if check_bool("one_pass", one_pass):
        return steps
    return steps + -(-steps // every) - unread


def _plan_cost(policy: Optional[ErrorBudget]) -> tuple[int, int]:
    """(plan_every, 1 if the first step reads no planner pass else 0) of a DDPD run's policy."""
    if policy is not None and not isinstance(policy, ErrorBudget):  # a mask-loop policy has no planner passes
        raise TypeError(f"policy must be an ErrorBudget or None, got {type(policy).__name__}")
    if policy is None:
        return 1, 0
    return policy.plan_every, int(policy.skips_first_plan(prompted=False))


def annealed(choice_temperature: float, step, steps: int):
    """MaskGIT's annealed choice temperature at step `step` of `steps` (Chang et al. 2022, eq. 3):
    tau (1 - (i + 1) / T), 0 at the last step.

    Args:
        choice_temperature: tau.
        step: the step index i, an int or a graph's step tensor.
        steps: T.

    Returns:
        The temperature, a float or a float32 tensor as `step` is.
    """
    if isinstance(step, Tensor):  # in float64 as Python computes it, then rounded as a float scales float32 noise;
        # a device divisor: CUDA divides by a Python number as a multiplication by its reciprocal
        fraction = (step + 1).double() / torch.full((), steps, dtype=torch.float64, device=step.device)
        return (choice_temperature * (1.0 - fraction)).float()
    return choice_temperature * (1.0 - (step + 1) / steps)


# The largest step budget of a step table (MaskGIT's and ErrorBudget's cosines, ReMDM's rows): 10**9
# steps met the allocator's 8 GB error (ReMDM: a host loop of hours), which names no argument.
MAX_TABLE_STEPS = 2**24


def check_table_steps(steps: int, table: str) -> None:
    """ValueError naming `steps` above MAX_TABLE_STEPS, before a table of one row a step is built.

    Args:
        steps: the step budget T.
        table: what builds the table, for the message.

    Raises:
        ValueError: steps above MAX_TABLE_STEPS.
    """
    if steps > MAX_TABLE_STEPS:
        raise ValueError(f"steps must be <= {MAX_TABLE_STEPS} with {table}, whose table holds a row a step, "
                         f"got {steps}")


def cosine_table(steps: int) -> Tensor:
    """The cosine schedule's cos(pi/2 (i + 1) / T) for each step i of T, on the CPU: MaskGIT's
    and ErrorBudget's spread. A run moves it to its device once and a step reads its row there
    (ddpd.sampling.common.row): a step that made a tensor of a number would copy it to the
    device, which a CUDA graph cannot capture.

    Args:
        steps: the step budget T, at most MAX_TABLE_STEPS.

    Returns:
        Float64[T]: the entries of a 0-d op a step, bit for bit (torch's CPU cos runs one vector
        routine on a tensor of any length; the pinned draws floor n0 times them).

    Raises:
        ValueError: steps above MAX_TABLE_STEPS.
    """
    check_table_steps(steps, "the cosine schedule (MaskGIT, ErrorBudget's cosine spread)")
    angles = torch.arange(1, steps + 1, dtype=torch.float64, device="cpu") / steps * (math.pi / 2)
    return torch.cos(angles)


def cosine_left(n0, cos: Tensor) -> Tensor:
    """floor(n0 cos(pi/2 (i + 1) / T)): the positions the cosine schedule leaves noisy after step
    i, of n0 at the start (Chang et al. 2022, sec. 3.2), in float64 (float32 would floor apart
    where n0 cos lands on an integer, e.g. cos(pi/3)).

    Args:
        n0: the positions a row starts noisy, an int or a tensor [B].
        cos: the step's entry of cosine_table(T), a 0-d tensor.

    Returns:
        Float64 (0-d for an int n0, else [B]), integer-valued.
    """
    return torch.floor((n0 if isinstance(n0, int) else n0.double()) * cos)


def spread_minimum(spread: str, sum_p: Tensor, step, steps: int, n0, cos: Optional[Tensor] = None
                   ) -> Optional[Tensor]:
    """The fewest commits of a step under ErrorBudget's `spread`.

    Args:
        spread: "none", "linear" or "cosine".
        sum_p: Float[B] the planner's expected noise.
        step: the step index, an int or a graph's step tensor.
        steps: the step budget.
        n0: the positions a row starts noisy, an int or Float[B].
        cos: with spread "cosine", the step's entry of cosine_table(steps), a 0-d tensor on
            sum_p's device.

    Returns:
        Long[B], or None without a spread.
    """
    if spread == "none":
        return None
    if spread == "linear":  # a device divisor both ways: CUDA multiplies by a Python number's reciprocal
        left = steps - step if isinstance(step, Tensor) else torch.full((), steps - step, device=sum_p.device)
        return torch.ceil(sum_p / left).long()
    return torch.ceil(sum_p - cosine_left(n0, cos).float()).long().clamp(min=1)


def commit_risk(planner_logits: Tensor, positions: Tensor, confidence: Tensor) -> Tensor:
    """r_j = 1 - p_j c_j at the candidates' positions: p = sigmoid of the planner logits (0 at a
    frozen position, logit -inf), c the drawn tokens' probabilities.

    Args:
        planner_logits: Float[B, D].
        positions: Long[B, K] the candidates' positions.
        confidence: Float[B, K] the drawn tokens' probabilities.

    Returns:
        Float[B, K] the risks.
    """
    p = torch.sigmoid(planner_logits.gather(1, positions))
    return 1.0 - p * confidence.clamp(0.0, 1.0)


# ---------------------------------------------------------------------------------------------- mask loop


@dataclass(frozen=True)
class Step:
    """What a mask-loop policy sees at step `index` of `steps` (an int, or a CUDA graph's step
    tensor): masked Bool[B, D] (not frozen), logprob Float[B, D], the model's (untempered)
    log-probability of each position's drawn token, and entropy Float[B, D] of its law, m0
    Long[B] the masks each row started with, whether it is the budget's last step, and the
    policy's row of its step_table (a replayed step reads it from the device, not from Python)."""

    index: Union[int, Tensor]
    steps: int
    masked: Tensor
    logprob: Tensor
    m0: Tensor
    last: bool = False
    entropy: Optional[Tensor] = None  # when the policy needs "entropy"
    uniforms: Optional[Tensor] = None  # Float[B, D] of the step's EVENT stream ("uniforms")
    gumbel: Optional[Tensor] = None  # Float[B, D] Gumbel variables of the CONFIDENCE stream ("gumbel")
    table: Optional[Tensor] = None  # Float64[n], the policy's step_table row of this step

    @property
    def prob(self) -> Tensor:
        return self.logprob.exp()


class _Unmasking:
    """A policy that only unmasks: moves(step) = (unmask(step), None)."""

    needs = ()

    def step_table(self, steps: int, alpha: Callable) -> Optional[Tensor]:
        """What each step takes from its index beyond the noise, one row a step, built on the host
        before the run (a CUDA graph's replay reads the row of its step on the device).

        Args:
            steps: the step budget T.
            alpha: the noise schedule, a function of the time.

        Returns:
            None: these policies read nothing more.
        """
        return None

    def moves(self, step: Step) -> tuple:
        return self.unmask(step), None


@dataclass(frozen=True)
class MaskGIT(_Unmasking):
    """MaskGIT (Chang et al. 2022, sec. 3.2, eq. 3 and the cosine mask schedule): keep the
    n_i = floor(m0 cos(pi/2 (i + 1) / T)) least confident masked positions masked, clamped to
    [1, m - 1]; confidence log p(token) + choice_temperature (1 - (i + 1) / T) Gumbel."""

    choice_temperature: float = 4.5
    needs = ("gumbel",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "choice_temperature", check_float("choice_temperature", self.choice_temperature,
                                                                   0.0, float("inf"), open_max=True))

    def step_table(self, steps: int, alpha: Callable) -> Tensor:
        """The cosine schedule's share of the masks left after each step.

        Args:
            steps: the step budget T.
            alpha: the noise schedule (unused: MaskGIT's schedule is its own).

        Returns:
            Float64[T, 1]: cosine_table(T) as a column.
        """
        return cosine_table(steps)[:, None]

    def unmask(self, step: Step) -> Tensor:
        """The masked positions to unmask at this step (every one at the last step).

        Args:
            step: what the policy sees at the step.

        Returns:
            Bool[B, D].
        """
        m = step.masked.sum(-1)
        if step.last:
            return step.masked
        n = cosine_left(step.m0, step.table[0]).long()
        n = torch.clamp(torch.minimum(m - 1, n), min=1)
        tau = annealed(self.choice_temperature, step.index, step.steps)
        confidence = step.logprob + tau * step.gumbel
        return step.masked & ~least_confident(confidence, step.masked, n)


@dataclass(frozen=True)
class ConfidenceThreshold(_Unmasking):
    """Fast-dLLM's threshold rule (Wu et al. 2025, arXiv:2505.22618, sec. 3.3, Theorem 1): unmask
    every masked position whose drawn token has probability > threshold, and at least the most
    confident one. threshold 1 unmasks one position a step (MaskGIT's greedy order). Fast-dLLM's
    code keeps p >= threshold: the rules differ only at equality, where at threshold 1 its code
    commits every token whose probability rounds to 1."""

    threshold: float = 0.9

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", check_float("threshold", self.threshold, 0.0, 1.0))

    def unmask(self, step: Step) -> Tensor:
        """The masked positions to unmask at this step (every one at the last step).

        Args:
            step: what the policy sees at the step.

        Returns:
            Bool[B, D].
        """
        if step.last or self.threshold == 0:  # 0: every mask, even where p rounds to 0
            return step.masked
        return step.masked & ((step.prob > self.threshold) | _most_confident(step))


@dataclass(frozen=True)
class ConfidenceFactor(_Unmasking):
    """Fast-dLLM's factor rule (arXiv:2505.22618, sec. 3.3, after Theorem 1): with the masked
    positions' probabilities sorted c_(1) >= c_(2) >= ..., unmask the n most confident for
    the largest n with (n + 1)(1 - c_(n)) < factor; at least one. Fast-dLLM's code stops at the
    first c_(n) < 1 - factor / (n + 1), so it also commits where the two sides are equal."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", check_float("factor", self.factor, 0.0, float("inf"), open_min=True,
                                                       open_max=True))

    def unmask(self, step: Step) -> Tensor:
        """The masked positions to unmask at this step (every one at the last step).

        Args:
            step: what the policy sees at the step.

        Returns:
            Bool[B, D].
        """
        if step.last:
            return step.masked
        c = step.prob.masked_fill(~step.masked, -1.0)
        order = c.argsort(dim=1, descending=True, stable=True)
        ranked = c.gather(1, order)
        n = torch.arange(1, c.shape[1] + 1, device=c.device)
        ok = ((n + 1) * (1.0 - ranked) < self.factor) & (ranked >= 0)
        count = (ok.cumprod(1).sum(1)).clamp(min=1)  # the largest prefix where the rule holds
        rank = torch.empty_like(order).scatter_(1, order, n.expand_as(order) - 1)
        return step.masked & (rank < count[:, None])


@dataclass(frozen=True)
class EntropyBound(_Unmasking):
    """EB-sampler (Ben-Hamu et al. 2025, arXiv:2505.24857, sec. 4, eq. 10): order the masked
    positions by the entropy of their law, lowest first, and unmask the largest prefix U with
    sum_{U} H - max_{U} H <= gamma (so at least one)."""

    gamma: float = 0.1
    needs = ("entropy",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gamma", check_float("gamma", self.gamma, 0.0, float("inf"), open_max=True))

    def unmask(self, step: Step) -> Tensor:
        """The masked positions to unmask at this step (every one at the last step).

        Args:
            step: what the policy sees at the step.

        Returns:
            Bool[B, D].
        """
        if step.last:
            return step.masked
        # a NaN entropy (a NaN output) ranks last of the masked, taken only as the one a step needs
        last = torch.finfo(step.entropy.dtype).max
        h = step.entropy.nan_to_num(nan=last).masked_fill(~step.masked, float("inf"))
        order = h.argsort(dim=1, stable=True)
        ranked = h.gather(1, order)
        # sorted ascending, the prefix's maximum is its last entry
        taken = (ranked.cumsum(1) - ranked <= self.gamma) & (ranked < last)
        taken = taken.cumprod(1).bool()
        taken[:, 0] = ranked[:, 0] < float("inf")
        return torch.zeros_like(taken).scatter(1, order, taken)


@dataclass(frozen=True)
class ReMDM:
    """ReMDM (Wang et al. 2025, arXiv:2503.00307, sec. 3, eqs. 6-7 and sec. 4.1's schedules):
    MDLM's ancestral step from alpha_t to alpha_s with remasking probability sigma: a committed
    token is masked again with probability sigma, a mask takes its drawn token with
    probability (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t).
    sigma_max = min(1, (1 - alpha_s) / alpha_t); 'cap': sigma = min(eta, sigma_max),
    'rescale': sigma = eta sigma_max; 'loop' (t_on, t_off in DDPD's time, 0 = noise): MDLM
    (sigma 0) from alpha 0 up to alpha_on at t_on (the run's schedule scaled by alpha_on),
    then alpha held at alpha_on with sigma = eta (at most (1 - alpha_on) / alpha_on, which
    keeps it there) until t_off, then MDLM from alpha_on to 1 (the mask loop maps the step
    grid, mask_sample); cap and rescale refuse t_on, t_off and alpha_on off their defaults,
    which they would ignore. A row runs to the budget while eta > 0: a filled row may be
    masked again, and so may a prompt's positions that are not frozen (committed tokens from
    step 0, where sigma_max is 1); freeze a prompt to keep it."""

    schedule: str = "cap"
    eta: float = 0.02
    t_on: float = 0.45
    t_off: float = 0.95
    alpha_on: float = 0.9
    needs = ("uniforms",)

    @property
    def remasks(self) -> bool:
        """Whether a committed token may be masked again (eta > 0)."""
        return self.eta > 0

    def __post_init__(self) -> None:
        check_choice("schedule", self.schedule, REMDM_SCHEDULES)
        object.__setattr__(self, "eta", check_float("eta", self.eta, 0.0, 1.0))
        object.__setattr__(self, "t_on", check_float("t_on", self.t_on, 0.0, 1.0))
        object.__setattr__(self, "t_off", check_float("t_off", self.t_off, 0.0, 1.0))
        object.__setattr__(self, "alpha_on", check_float("alpha_on", self.alpha_on, 0.0, 1.0))
        if self.schedule == "loop" and not 0.0 < self.t_on < self.t_off < 1.0:
            raise ValueError(f"ReMDM loop needs 0 < t_on < t_off < 1, got t_on={self.t_on}, t_off={self.t_off}")
        if self.schedule != "loop":
            self._refuse_loop_fields()
            return
        if not 0.0 < self.alpha_on < 1.0:
            raise ValueError(f"ReMDM loop needs 0 < alpha_on < 1, got alpha_on={self.alpha_on}")
        most = (1.0 - self.alpha_on) / self.alpha_on
        if self.eta > most:
            raise ValueError(f"ReMDM loop needs eta <= (1 - alpha_on) / alpha_on = {most:.4g} to hold alpha at "
                             f"alpha_on, got eta={self.eta}")

    def _refuse_loop_fields(self) -> None:
        """t_on, t_off and alpha_on set the loop schedule: cap and rescale would ignore them."""
        fields = type(self).__dataclass_fields__
        changed = [name for name in ("t_on", "t_off", "alpha_on") if getattr(self, name) != fields[name].default]
        if changed:
            raise ValueError(f"ReMDM {self.schedule} has no {', '.join(changed)}: fields of schedule='loop'")

    def alphas(self, index: int, steps: int, alpha) -> tuple:
        """The schedule's alpha at the start and end of step `index` on the uniform grid.

        Args:
            index: the step index.
            steps: the step budget.
            alpha: the schedule, a function of the time.

        Returns:
            (alpha_t, alpha_s, looping): looping holds for a step wholly inside the loop phase
            [t_on, t_off] of the 'loop' schedule.
        """
        t, s = index / steps, (index + 1) / steps
        if self.schedule != "loop":
            return alpha(t), alpha(s), False
        a_on = self.alpha_on

        def mapped(u: float) -> float:
            if u <= self.t_on:
                return a_on * alpha(u / self.t_on)
            if u <= self.t_off:
                return a_on
            return a_on + (1.0 - a_on) * (u - self.t_off) / (1.0 - self.t_off)

        return mapped(t), mapped(s), self.t_on <= t and s <= self.t_off

    def sigma(self, alpha_t: float, alpha_s: float, looping: bool) -> float:
        """The remasking probability of a step.

        Args:
            alpha_t: alpha at the step's start.
            alpha_s: alpha at its end.
            looping: whether the step is in the loop phase.

        Returns:
            sigma, a float in [0, 1].
        """
        if self.schedule == "loop":
            return self.eta if looping else 0.0
        sigma_max = min(1.0, (1.0 - alpha_s) / alpha_t) if alpha_t > 0 else 1.0
        return min(self.eta, sigma_max) if self.schedule == "cap" else self.eta * sigma_max

    def step_table(self, steps: int, alpha: Callable) -> Tensor:
        """Each step's remasking probability sigma and the probability that a mask takes its
        drawn token, (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t).

        Args:
            steps: the step budget T.
            alpha: the schedule, a function of the time.

        Returns:
            Float64[T, 2]: (sigma, unmask probability) at row i.

        Raises:
            ValueError: steps above MAX_TABLE_STEPS.
        """
        check_table_steps(steps, "ReMDM")
        rows = []
        for index in range(steps):
            a_t, a_s, looping = self.alphas(index, steps, alpha)
            sigma = self.sigma(a_t, a_s, looping)
            unmask_p = 1.0 if a_t >= 1.0 else max(0.0, min(1.0, (a_s - (1.0 - sigma) * a_t) / (1.0 - a_t)))
            rows.append((sigma, unmask_p))
        return torch.tensor(rows, dtype=torch.float64, device="cpu")

    def moves(self, step: Step) -> tuple:
        """The step's moves from its EVENT uniforms: one uniform a position decides both, a mask
        unmasking and a committed token being masked again.

        Args:
            step: what the policy sees at the step.

        Returns:
            (unmask, remask), each Bool[B, D].
        """
        if step.last:
            return step.masked, torch.zeros_like(step.masked)
        sigma, unmask_p = step.table.unbind()
        return step.masked & happens(step.uniforms, unmask_p), ~step.masked & happens(step.uniforms, sigma)


MaskPolicy = Union[MaskGIT, ConfidenceThreshold, ConfidenceFactor, EntropyBound, ReMDM]


def _most_confident(step: Step) -> Tensor:
    """Bool[B, D]: the masked position of highest drawn-token probability (lowest on ties)."""
    c = step.prob.masked_fill(~step.masked, -1.0)
    return torch.zeros_like(step.masked).scatter(1, c.argmax(dim=1, keepdim=True), True)


def least_confident(confidence: Tensor, masked: Tensor, n: Tensor) -> Tensor:
    """The n masked positions of lowest confidence in each row.

    Unmasked positions never count; ties go to the lower position (stable sort).

    Args:
        confidence: Float[B, D].
        masked: Bool[B, D].
        n: Long[B] positions a row.

    Returns:
        Bool[B, D].
    """
    score = confidence.masked_fill(~masked, float("inf"))
    order = score.argsort(dim=-1, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(score.shape[-1], device=score.device)
                                             .expand_as(order))
    return rank < n[:, None]


# ---------------------------------------------------------------------------------------------- by name

POLICIES = {"error-budget": ErrorBudget, "maskgit": MaskGIT, "threshold": ConfidenceThreshold,
            "factor": ConfidenceFactor, "entropy-bound": EntropyBound, "remdm": ReMDM}
DDPD_POLICIES = ("error-budget",)


def parse_policy(spec: str):
    """The policy of a spec 'NAME' or 'NAME:FIELD=VALUE,...' (the CLI's --policy and ddpd-eval
    frontier), e.g. 'error-budget:bound=0.5,max_k=8', 'threshold:threshold=0.9',
    'remdm:schedule=loop,eta=0.02'. A bare first item sets the first field: 'threshold:0.9';
    any other field, flags included, needs FIELD=VALUE: 'error-budget:max_k=8,known_noise=true'.
    Spaces around items, keys and values are stripped; a number holds no underscore ('max_k=1_6'
    is refused: Python's int() reads it as 16).

    Args:
        spec: the spec.

    Returns:
        The policy (one of POLICIES' classes).

    Raises:
        ValueError: an unknown name or field, a field without its value, a number with an underscore,
            or a value the policy refuses.
        TypeError: `spec` not a str, or a value of the wrong type for the policy.
    """
    if not isinstance(spec, str):
        raise TypeError(f"policy spec must be a str, got {type(spec).__name__} {spec!r}")
    name, colon, rest = spec.partition(":")
    name = name.strip()  # as the fields' keys and values are
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)} (optionally NAME:FIELD=VALUE,...), "
                         f"got {spec!r}")
    kind = POLICIES[name]
    fields = list(kind.__dataclass_fields__)
    kwargs = {}
    for i, item in enumerate(rest.split(",") if colon else ()):
        if not item.strip():
            raise ValueError(f"policy {name} has an empty field in {spec!r}")
        key, eq, value = item.partition("=")
        key, value = (key.strip(), value.strip()) if eq else (fields[0], _bare(kind, name, i, key.strip()))
        if key not in fields:
            raise ValueError(f"policy {name} has no field {key!r}; its fields are {', '.join(fields)}")
        if key in kwargs:
            raise ValueError(f"policy {name} sets {key} twice in {spec!r}")
        kwargs[key] = _value(kind.__dataclass_fields__[key].type, value, key)
    return kind(**kwargs)


def _bare(kind, name: str, i: int, value: str) -> str:
    """A bare value (no FIELD=), which sets the first field only as the first item: a field's
    name alone (a flag such as known_noise) or a later bare value would be read as that field."""
    fields = kind.__dataclass_fields__
    if value in fields:
        example = "true" if str(fields[value].type) == "bool" else "VALUE"
        raise ValueError(f"policy field {value} needs a value: {value}={example}")
    if i > 0:
        raise ValueError(f"policy {name} takes a bare value only as its first item ({next(iter(fields))}); "
                         f"write {value!r} as FIELD=VALUE")
    return value


def _value(annotation, text: str, key: str):
    if str(annotation).startswith("Optional[") and text.lower() == "none":
        return None
    name = str(annotation).split(".")[-1].replace("Optional[", "").rstrip("]")
    kind = {"int": int, "float": float, "str": str, "bool": _bool}.get(name)
    try:
        return read_number(kind, text) if kind in (int, float) else kind(text) if kind is not None else text
    except ValueError as err:
        article = "an" if name[:1] in "aeiou" else "a"
        raise ValueError(f"policy field {key} must be {article} {name}, got {text!r}{refusal(err)}") from None


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
    return text.lower() in ("true", "1")


def policy_spec(policy, defaults: bool = True) -> str:
    """The spec parse_policy reads back into `policy`.

    Args:
        policy: one of POLICIES' classes.
        defaults: False leaves out the fields after the first that are at their defaults
            (a short name for a legend).

    Returns:
        The spec 'NAME:FIELD=VALUE,...'.
    """
    name = next(key for key, kind in POLICIES.items() if isinstance(policy, kind))
    fields = [(key, value) for i, (key, value) in enumerate(vars(policy).items()) if value is not None
              and (defaults or i == 0 or value != type(policy).__dataclass_fields__[key].default)]
    return name + ":" + ",".join(f"{key}={float_text(value)}" for key, value in fields)
