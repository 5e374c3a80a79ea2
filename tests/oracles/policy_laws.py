"""Exact laws of the commit policies (ddpd.sampling.policies) on a ToyProblem.

Built from first principles like laws.py: the planner's ordered picks as Plackett-Luce
draws, the mask z of prop:draw_with_maskD, independent tempered token draws, and the
policy's rule applied to every outcome. None of it calls the samplers' code.
"""
from __future__ import annotations

import itertools
import math

import torch

from oracles.laws import fill_remask_kernel, selection_weights, tempered
from oracles.toy import ToyProblem


def ordered_picks(w: torch.Tensor, k: int):
    """(order tuple, probability [B]) of every ordered draw of k positions without replacement,
    P proportional to w (successive sampling: the law of Gumbel-top-k)."""
    total = w.sum(-1)
    for order in itertools.permutations(range(w.shape[-1]), k):
        prob = torch.ones_like(total)
        left = total.clone()
        for r, d in enumerate(order):
            # once no weight is left the rest follow in position order (Gumbel keys all -inf tie)
            lowest = float(d == min(set(range(w.shape[-1])) - set(order[:r])))
            prob = prob * torch.where(left > 0, w[:, d] / left.clamp_min(1e-300), torch.full_like(left, lowest))
            left = left - w[:, d]
        yield order, prob


def budget_commits(risk: torch.Tensor, eligible: torch.Tensor, bound: float, order: str, minimum=None,
                   tau: float = 0.0, pin: bool = True, first=()) -> list:
    """Per row, [(kept columns, probability)]: ErrorBudget's rule, written plainly: the first pick,
    then the eligible others in their order (ascending risk for 'risk'; with tau > 0 a
    Plackett-Luce order by (1 - r)^(1 / tau); the planner's for 'planner') while the summed risk
    stays <= bound (stopping at the first that does not fit); with minimum (Long[B]), at least
    that many in all where enough are eligible. pin False (known_noise): the first pick is ranked
    with the others, and at least one is committed. `first` (columns, every row): ranked ahead
    of the others, in column order, and all committed (the last step's unwritten candidates)."""
    risk, eligible = risk.tolist(), eligible.tolist()  # Python floats: the same float64 values, fast
    minimum = None if minimum is None else minimum.tolist()
    out = []
    for b, (row_risk, row_eligible) in enumerate(zip(risk, eligible)):
        others = [j for j in range(1 if pin else 0, len(row_risk)) if row_eligible[j] and j not in first]
        if order == "risk" and tau == 0.0:
            others.sort(key=lambda j: (row_risk[j], j))
        orders = [(others, 1.0)] if tau == 0.0 or order != "risk" else \
            list(_plackett_luce(others, [(1.0 - row_risk[j]) ** (1.0 / tau) for j in others]))
        row = []
        for ranked, prob in orders:
            kept, total = [0] if pin else [], 0.0
            for j in [j for j in first if row_eligible[j]] + ranked:
                total += row_risk[j]
                if total > bound and kept and (minimum is None or len(kept) >= minimum[b]) and j not in first:
                    break
                kept.append(j)
            row.append((kept, prob))
        out.append(row)
    return out


def _plackett_luce(items: list, weights: list):
    """(ordering, probability) of every ordering of items drawn without replacement in proportion
    to weights (all zero: the given order)."""
    if not items:
        yield [], 1.0
        return
    total = sum(weights)
    for i, item in enumerate(items):
        first = weights[i] / total if total > 0 else float(i == 0)
        if first == 0.0:
            continue
        for rest, prob in _plackett_luce(items[:i] + items[i + 1:], weights[:i] + weights[i + 1:]):
            yield [item] + rest, first * prob


def error_budget_kernel(toy: ToyProblem, p: torch.Tensor, alpha: torch.Tensor, selection: str, temperature: float,
                        denoiser_type: str, bound: float, max_k: int, order: str, minimum=None,
                        touched: int | None = None, tau: float = 0.0, last: bool = False) -> torch.Tensor:
    """One ErrorBudget step from every state: K[x, y] (minimum: the spread's fewest commits per
    state). With `touched` (a bit mask of the positions written so far, known_noise): the
    untouched positions' p is 1, and K[x, y * 2^D + touched'] holds where the step goes, touched'
    adding the positions it commits; `last` (the budget's last step under a spread): the untouched
    positions take the candidates' places of the written picks ranked last and are committed."""
    states = toy.states.tolist()
    powers = [toy.S ** (toy.D - 1 - d) for d in range(toy.D)]
    index = [sum(v * w for v, w in zip(x, powers)) for x in states]
    k = min(max_k, toy.D)
    if touched is not None:
        known = torch.tensor([bool(touched >> (toy.D - 1 - d) & 1) for d in range(toy.D)])
        p = torch.where(known, p, torch.ones_like(p))
    w = selection_weights(p, selection)
    width = toy.N if touched is None else toy.N * 2**toy.D
    kernel = [0.0] * (toy.N * width)  # a flat list: element updates on a tensor cost microseconds each
    values = list(itertools.product(range(toy.S), repeat=k))
    for planned, prob in ordered_picks(w, k):
        picks, first = _candidates(planned, touched, toy.D) if last and touched is not None else (planned, ())
        for z, pz, q in _denoiser_views(toy, p, alpha, planned, temperature, denoiser_type):
            eligible = torch.tensor([[j == 0 or z[picks[j]] for j in range(k)]] * toy.N)
            for tokens in values:
                c = torch.stack([q[:, picks[j], tokens[j]] for j in range(k)], 1)  # [N, k]
                weight = prob * pz * c.prod(1)
                if not bool((weight > 0).any()):
                    continue
                risk = 1.0 - p[:, list(picks)] * c
                outcomes_per_row = budget_commits(risk, eligible, bound, order, minimum, tau, pin=touched is None,
                                                  first=first)
                for b, (outcomes, weight_b) in enumerate(zip(outcomes_per_row, weight.tolist())):
                    for kept, chance in outcomes:
                        target = index[b] + sum((tokens[j] - states[b][picks[j]]) * powers[picks[j]] for j in kept)
                        if touched is not None:
                            target = target * 2**toy.D + (touched | sum(1 << (toy.D - 1 - picks[j]) for j in kept))
                        kernel[b * width + target] += weight_b * chance
    kernel = torch.tensor(kernel, dtype=torch.float64).view(toy.N, width)
    # a state where no position has weight (every written position judged clean) draws nothing
    for b in (w.sum(-1) == 0).nonzero().flatten().tolist():
        kernel[b] = 0.0
        kernel[b, b if touched is None else b * 2**toy.D + touched] = 1.0
    return kernel


def _candidates(planned: tuple, touched: int, length: int):
    """(candidates, their unwritten columns) of the budget's last step: the positions not in
    `touched` and not planned, in position order, in place of the written picks from the last."""
    unwritten = [d for d in range(length) if not touched >> (length - 1 - d) & 1]
    picks = list(planned)
    written_from_last = [j for j in reversed(range(len(picks))) if picks[j] not in unwritten]
    for j, d in zip(written_from_last, [d for d in unwritten if d not in planned]):
        picks[j] = d
    return tuple(picks), tuple(j for j in range(len(picks)) if picks[j] in unwritten)


def _denoiser_views(toy: ToyProblem, p: torch.Tensor, alpha: torch.Tensor, picks, temperature: float,
                    denoiser_type: str):
    """(z, P(z) [B], q [B, D, S]) over what the denoiser can be shown: the sequence itself (uniform
    denoiser, z all ones), or every mask z with the first pick masked and the others of
    probability p (prop:draw_with_maskD)."""
    if denoiser_type == "uniform":
        q = tempered(toy.uniform_denoiser(toy.index(toy.states), alpha), temperature)
        yield (1,) * toy.D, torch.ones(toy.N, dtype=torch.float64), q
        return
    for z in itertools.product((0, 1), repeat=toy.D):
        if not z[picks[0]]:
            continue
        pz = torch.ones(toy.N, dtype=torch.float64)
        for e in range(toy.D):
            if e != picks[0]:
                pz = pz * (p[:, e] if z[e] else 1.0 - p[:, e])
        masked = torch.where(torch.tensor(z, dtype=torch.bool), torch.full_like(toy.states, toy.S), toy.states)
        q = tempered(toy.mask_denoiser(toy.mask_index(masked)), temperature)
        yield z, pz, q


def _minimum(spread: str, sum_p: torch.Tensor, i: int, steps: int, n0: int):
    """The spread's fewest commits at step i: the expected noise over the steps left (linear), or
    down to floor(n0 cos(pi/2 (i + 1) / T)) (cosine, at least 1)."""
    if spread == "none":
        return None
    if spread == "linear":
        return torch.ceil(sum_p / (steps - i)).long()
    left = math.floor(n0 * math.cos(math.pi / 2 * (i + 1) / steps))
    return torch.ceil(sum_p - left).long().clamp(min=1)


def error_budget_law(toy: ToyProblem, steps: int, bound: float, max_k: int, order: str = "risk",
                     denoiser_type: str = "uniform", selection: str = "sigmoid", temperature: float = 1.0,
                     stop: str = "budget", eps: float = 0.01, spread: str = "none") -> torch.Tensor:
    """Law of ddpd_sample(clock='planner', policy=ErrorBudget(bound, max_k, order, spread)) with the
    time-free oracle planner, from uniform noise."""
    p = toy.planner_free
    alpha = toy.schedule.alpha(toy.schedule.inverse(1.0 - p.mean(-1)))
    pi = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    for i in range(steps):
        minimum = _minimum(spread, p.sum(-1), i, steps, toy.D)
        if i == 0 or spread != "none":  # the kernel changes with the step only through the spread's minimum
            kernel = error_budget_kernel(toy, p, alpha, selection, temperature, denoiser_type, bound, max_k, order,
                                         minimum)
            if stop == "eps":
                stopped = (p < eps).all(-1)
                kernel[stopped] = torch.eye(toy.N, dtype=torch.float64)[stopped]
        pi = pi @ kernel
    return pi


def known_noise_law(toy: ToyProblem, steps: int, bound: float, max_k: int, denoiser_type: str = "mask",
                    spread: str = "none", choice_temperature: float = 0.0, revise_above=None) -> torch.Tensor:
    """Law of ddpd_sample(policy=ErrorBudget(bound, max_k, spread=spread, known_noise=True)): the
    chain on (x, the positions written so far), from uniform noise with none written."""
    p = toy.planner_free
    masks = 2**toy.D
    pi = torch.zeros(toy.N, masks, dtype=torch.float64)
    pi[:, 0] = 1.0 / toy.N
    for i in range(steps):
        nxt = torch.zeros(toy.N * masks, dtype=torch.float64)
        for touched in range(masks):
            if not bool((pi[:, touched] > 0).any()):
                continue
            known = torch.tensor([bool(touched >> (toy.D - 1 - d) & 1) for d in range(toy.D)])
            judged = p if revise_above is None else (p > revise_above).double()  # redrawn for certain, or kept
            p_now = torch.where(known, judged, torch.ones_like(p))
            minimum = _minimum(spread, p_now.sum(-1), i, steps, toy.D)
            alpha = toy.schedule.alpha(toy.schedule.inverse(1.0 - p_now.mean(-1)))  # the estimate counts them as noise
            kernel = error_budget_kernel(toy, judged, alpha, "sigmoid", 1.0, denoiser_type, bound, max_k, "risk",
                                         minimum, touched, choice_temperature * (1.0 - (i + 1) / steps),
                                         last=i == steps - 1 and spread != "none")
            nxt += pi[:, touched] @ kernel
        pi = nxt.view(toy.N, masks)
    return pi.sum(1)


# ----------------------------------------------------------------------------- the mask loop's baselines


def threshold_rule(threshold: float):
    """Fast-dLLM's threshold: every position whose drawn token has probability > threshold,
    else the most confident (the first on ties)."""
    def rule(conf: list, entropy: list) -> set:
        above = {j for j, c in enumerate(conf) if c > threshold}
        return above or {max(range(len(conf)), key=lambda j: (conf[j], -j))}
    return rule


def factor_rule(factor: float):
    """Fast-dLLM's factor rule: the n most confident for the largest n with
    (n + 1)(1 - c_(n)) < factor, at least one."""
    def rule(conf: list, entropy: list) -> set:
        ranked = sorted(range(len(conf)), key=lambda j: (-conf[j], j))
        n = max([n for n in range(1, len(conf) + 1) if (n + 1) * (1.0 - conf[ranked[n - 1]]) < factor], default=1)
        return set(ranked[:n])
    return rule


def entropy_bound_rule(gamma: float):
    """EB-sampler: lowest entropy first, the largest prefix U with sum_U H - max_U H <= gamma."""
    def rule(conf: list, entropy: list) -> set:
        ranked = sorted(range(len(entropy)), key=lambda j: (entropy[j], j))
        n = max(n for n in range(1, len(ranked) + 1)
                if sum(entropy[j] for j in ranked[:n]) - max(entropy[j] for j in ranked[:n]) <= gamma)
        return set(ranked[:n])
    return rule


def confidence_rule_law(toy: ToyProblem, steps: int, rule, temperature: float = 1.0) -> torch.Tensor:
    """Law of mask_sample under a deterministic confidence rule (threshold_rule, factor_rule,
    entropy_bound_rule): each step draws a token at every mask from the tempered mask denoiser,
    and rule(confidences, entropies) of the untempered law names the masks to fill; the last
    step fills them all."""
    S, D, M = toy.S, toy.D, toy.mask_states
    pi = (M == S).all(-1).double()
    for i in range(steps):
        K = torch.zeros(M.shape[0], M.shape[0], dtype=torch.float64)
        for row in range(M.shape[0]):
            masked = [d for d in range(D) if M[row, d] == S]
            if not masked:
                K[row, row] = 1.0
                continue
            q = toy.mask_table[row, masked]  # [m, S]
            qt = tempered(q, temperature)
            entropy = [float(-(q[r] * torch.log(q[r].clamp_min(1e-300))).sum()) for r in range(len(masked))]
            for tokens in itertools.product(range(S), repeat=len(masked)):
                conf = [float(q[r, tok]) for r, tok in enumerate(tokens)]
                chosen = range(len(masked)) if i == steps - 1 else rule(conf, entropy)
                target = M[row].clone()
                for r in chosen:
                    target[masked[r]] = tokens[r]
                K[row, toy.mask_index(target[None])[0]] += math.prod(float(qt[r, tok]) for r, tok in enumerate(tokens))
        pi = pi @ K
    clean = ~(M == S).any(-1)
    assert float(pi[~clean].sum()) < 1e-12
    return pi[clean]


def remdm_law(toy: ToyProblem, steps: int, schedule: str, eta: float, t_on: float = 0.45, t_off: float = 0.95,
              alpha_on: float = 0.9, temperature: float = 1.0) -> torch.Tensor:
    """Law of mask_sample under ReMDM (Wang et al. 2025, eqs. 6-7): per position and step, a
    mask takes its drawn token with probability (a_s - (1 - sigma) a_t) / (1 - a_t), a token
    is masked again with probability sigma; the last step fills every mask and masks none.
    alpha is the toy's schedule on the step grid ('loop': scaled to reach alpha_on at t_on,
    held there until t_off with sigma = eta, then linear to 1)."""
    def alpha(u: float) -> float:
        if schedule != "loop":
            return float(toy.schedule.alpha(torch.tensor(u, dtype=torch.float64)))
        if u <= t_on:
            return alpha_on * float(toy.schedule.alpha(torch.tensor(u / t_on, dtype=torch.float64)))
        return alpha_on if u <= t_off else alpha_on + (1.0 - alpha_on) * (u - t_off) / (1.0 - t_off)

    masked = toy.mask_states == toy.S
    pi = masked.all(-1).double()
    q = tempered(toy.mask_table, temperature)
    for i in range(steps):
        t, s = i / steps, (i + 1) / steps
        a_t, a_s = alpha(t), alpha(s)
        if schedule == "loop":
            sigma = eta if t_on <= t and s <= t_off else 0.0
        else:
            most = min(1.0, (1.0 - a_s) / a_t) if a_t > 0 else 1.0
            sigma = min(eta, most) if schedule == "cap" else eta * most
        if i == steps - 1:
            fill, sigma = 1.0, 0.0
        else:
            fill = 1.0 if a_t >= 1.0 else min(1.0, max(0.0, (a_s - (1.0 - sigma) * a_t) / (1.0 - a_t)))
        pi = pi @ fill_remask_kernel(toy, q, fill, sigma)
    clean = ~masked.any(-1)
    assert float(pi[~clean].sum()) < 1e-12
    return pi[clean]
