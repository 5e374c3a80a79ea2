"""The exact output law of every sampler on a ToyProblem, by propagating its Markov chain.

Each function builds the sampler's transition kernel from the exact oracle
quantities (float64, from first principles: selection weights, Plackett-Luce draws
without replacement, Bernoulli masks, tempered categoricals) and propagates the
distribution over all states for the same budget and options. None of it calls the
samplers' code, so a sampler that disagrees with its law has a bug (or the law does).

States: clean sequences are indexed as in ToyProblem (base S); sequences with masks
(mask id S) as ToyProblem.mask_states (base S + 1).
"""
from __future__ import annotations

import itertools
import math

import torch

from ddpd.sampling.options import DDPDOptions, Temperature
from oracles.toy import LOGIT_CLAMP, ToyProblem

# ----------------------------------------------------------------------------- pieces


def tempered(q: torch.Tensor, temperature) -> torch.Tensor:
    """softmax(log q / T) over the last axis; T a number, or a tensor [B] of one per row of q."""
    if torch.is_tensor(temperature):
        temperature = temperature.view((-1,) + (1,) * (q.dim() - 1))
    w = q.clamp_min(0.0) ** (1.0 / temperature)
    return w / w.sum(-1, keepdim=True).clamp_min(1e-300)


def selection_weights(p: torch.Tensor, selection: str) -> torch.Tensor:
    """Unnormalised weights with which a position is chosen: p (sigmoid) or p / (1 - p) (softmax)."""
    if selection == "sigmoid":
        return p
    p = p.clamp(LOGIT_CLAMP, 1.0 - LOGIT_CLAMP)
    return p / (1.0 - p)


def set_probabilities(w: torch.Tensor, k: int) -> dict:
    """{positions tuple (sorted): probability [B]} of k draws without replacement, P proportional to w.

    Successive sampling: an ordered draw (d1..dk) has probability
    prod_r w[d_r] / (sum w - w[d_1] - ... - w[d_(r-1)]); a set sums its orderings.
    At least k weights of each row must be positive.
    """
    total = w.sum(-1)
    out: dict = {}
    for order in itertools.permutations(range(w.shape[-1]), k):
        prob = torch.ones_like(total)
        left = total.clone()
        for d in order:
            prob = prob * torch.where(left > 0, w[:, d] / left.clamp_min(1e-300), torch.zeros_like(left))
            left = left - w[:, d]
        key = tuple(sorted(order))
        out[key] = out.get(key, 0.0) + prob
    return out


def replace_index(states: torch.Tensor, positions, values, base: int) -> torch.Tensor:
    """Indices of `states` with states[:, positions] = values (values: [A, len(positions)])."""
    D = states.shape[1]
    powers = base ** torch.arange(D - 1, -1, -1)
    idx = (states * powers).sum(-1)  # [B]
    delta = torch.zeros(values.shape[0], states.shape[0], dtype=torch.long)
    for r, d in enumerate(positions):
        delta += (values[:, r][:, None] - states[:, d][None, :]) * powers[d]
    return idx[None, :] + delta  # [A, B]


def scatter_draws(K: torch.Tensor, states: torch.Tensor, base: int, positions, weight: torch.Tensor,
                  q: torch.Tensor) -> None:
    """K[x, y] += weight[x] * prod_r q[x, r, y_{positions[r]}] for y = x with `positions` redrawn.

    q: [B, len(positions), S] independent draws at the positions.
    """
    S = q.shape[-1]
    values = torch.tensor(list(itertools.product(range(S), repeat=len(positions))), dtype=torch.long)
    targets = replace_index(states, positions, values, base)  # [A, B]
    prob = weight[None, :].expand(values.shape[0], -1).clone()
    for r in range(len(positions)):
        prob = prob * q[:, r, :].T[values[:, r]]  # [A, B]
    rows = torch.arange(states.shape[0]).expand_as(targets)
    K.index_put_((rows.reshape(-1), targets.reshape(-1)), prob.reshape(-1), accumulate=True)


def mask_patterns(D: int, forced) -> list:
    """All z in {0,1}^D with z = 1 at the forced positions."""
    return [z for z in itertools.product((0, 1), repeat=D) if all(z[d] for d in forced)]


def mask_draws(toy: ToyProblem, K: torch.Tensor, p: torch.Tensor, positions, weight: torch.Tensor,
               temperature: float, states: torch.Tensor | None = None) -> None:
    """prop:draw_with_maskD: z^e ~ Bernoulli(p^e) off `positions`, masked on them; the
    positions redrawn from the mask denoiser given x masked by z (clean states)."""
    states = toy.states if states is None else states
    for z in mask_patterns(toy.D, positions):
        zt = torch.tensor(z, dtype=torch.bool)
        pz = torch.ones(states.shape[0], dtype=torch.float64)
        for e in range(toy.D):
            if e not in positions:
                pz = pz * (p[:, e] if z[e] else 1.0 - p[:, e])
        masked = torch.where(zt, torch.full_like(states, toy.S), states)
        q = tempered(toy.mask_denoiser(toy.mask_index(masked)), temperature)[:, list(positions)]
        scatter_draws(K, states, toy.S, positions, weight * pz, q)


# ----------------------------------------------------------------------------- DDPD


def ddpd_kernel(toy: ToyProblem, p: torch.Tensor, alpha: torch.Tensor, selection: str, k: int, temperature: float,
                denoiser_type: str, states: torch.Tensor | None = None) -> torch.Tensor:
    """One plan-and-denoise step from every state: K[x, y] (rows: `states`, default all).

    p: planner probabilities [B, D]; alpha: the uniform denoiser's alpha per state [B];
    denoiser_type "jump": the uniform model's jump law (toy.jump_denoiser) in its place.
    """
    states = toy.states if states is None else states
    w = selection_weights(p, selection)
    if denoiser_type in ("uniform", "jump"):
        exact = toy.uniform_denoiser if denoiser_type == "uniform" else toy.jump_denoiser
        q_uniform = tempered(exact(toy.index(states), alpha), temperature)
        if k == 1:
            return _single_position_kernel(toy, states, w / w.sum(-1, keepdim=True), q_uniform)
    K = torch.zeros(states.shape[0], toy.N, dtype=torch.float64)
    for positions, prob in set_probabilities(w, k).items():
        if denoiser_type in ("uniform", "jump"):
            scatter_draws(K, states, toy.S, positions, prob, q_uniform[:, list(positions)])
        else:
            mask_draws(toy, K, p, positions, prob, temperature, states)
    return K


def _single_position_kernel(toy: ToyProblem, states: torch.Tensor, select: torch.Tensor,
                            q: torch.Tensor) -> torch.Tensor:
    """K[x, y] = sum_d select[x, d] q[x, d, y_d] over the y that differ from x at d only (or not at all)."""
    values = torch.arange(toy.S)
    targets = torch.stack([replace_index(states, [d], values[:, None], toy.S).T for d in range(toy.D)], 1)  # [B, D, S]
    K = torch.zeros(states.shape[0], toy.N, dtype=torch.float64)
    rows = torch.arange(states.shape[0])[:, None, None].expand_as(targets)
    return K.index_put_((rows.reshape(-1), targets.reshape(-1)), (select[..., None] * q).reshape(-1), accumulate=True)


def ddpd_planner_clock_law(toy: ToyProblem, steps: int, ddpd: DDPDOptions = DDPDOptions(),
                           denoiser_type: str = "uniform", temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of ddpd_sample(clock='planner') with the time-free oracle planner; under the eps stop a
    temperature schedule follows the time estimate (`_over_time`), under the budget the steps."""
    selection, stop, eps, k, parallel_steps = ddpd.selection, ddpd.stop, ddpd.eps, ddpd.k, ddpd.parallel_steps
    temperature, temperature_end = _start_end(temperature)
    p = toy.planner_free
    t = toy.schedule.inverse(1.0 - p.mean(-1))
    alpha = toy.schedule.alpha(t)
    stopped = (p < eps).all(-1) if stop == "eps" else torch.zeros(toy.N, dtype=torch.bool)
    pi = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    for i in range(steps):
        T = _over_time(t, _eps_stop_time(toy, eps), temperature, temperature_end) if stop == "eps" else \
            _temperature(i, steps, temperature, temperature_end)
        K = ddpd_kernel(toy, p, alpha, selection, k if i < parallel_steps else 1, T, denoiser_type)
        K[stopped] = torch.eye(toy.N, dtype=torch.float64)[stopped]
        pi = pi @ K
    return pi


def ddpd_uniform_model_law(toy: ToyProblem, steps: int, ddpd: DDPDOptions = DDPDOptions(),
                           temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of ddpd_sample_uniform(clock='planner') with the exact uniform model.

    The plan of step i is the probability of a change at the time estimated at step i - 1
    (0 at the first); the new estimate t = alpha^{-1}(1 - mean_d p) is the denoiser's time,
    the jump law its draw (with ddpd.one_pass the planning time's). The chain's state is
    (x, t_prev, stopped): the law is a weighted list of such triples, merged where equal.
    """
    selection, stop, eps, k, parallel_steps = ddpd.selection, ddpd.stop, ddpd.eps, ddpd.k, ddpd.parallel_steps
    temperature, temperature_end = _start_end(temperature)
    state = toy.states.clone()
    t_prev = torch.zeros(toy.N, dtype=torch.float64)
    prob = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    stopped = torch.zeros(toy.N, dtype=torch.bool)
    for i in range(steps):
        idx = toy.index(state)
        p = toy.p_change(idx, toy.schedule.alpha(t_prev))
        if stop == "eps":
            stopped = stopped | (p < eps).all(-1)
        t_new = toy.schedule.inverse(1.0 - p.mean(-1))
        T = _over_time(t_new, _eps_stop_time(toy, eps), temperature, temperature_end) if stop == "eps" else \
            _temperature(i, steps, temperature, temperature_end)
        t_draw = t_prev if ddpd.one_pass else t_new
        K = ddpd_kernel(toy, p, toy.schedule.alpha(t_draw), selection, k if i < parallel_steps else 1, T, "jump",
                        state)
        K[stopped] = 0.0
        K[stopped, idx[stopped]] = 1.0
        src, dst = K.nonzero(as_tuple=True)
        new_t = torch.where(stopped[src], t_prev[src], t_new[src])
        state, t_prev, prob, stopped = _merge(toy.states[dst], new_t, prob[src] * K[src, dst], stopped[src])
    out = torch.zeros(toy.N, dtype=torch.float64)
    return out.index_add_(0, toy.index(state), prob)


def _merge(state, t, prob, stopped):
    key = torch.cat([state.double(), t[:, None], stopped[:, None].double()], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    merged = torch.zeros(uniq.shape[0], dtype=torch.float64).index_add_(0, inverse, prob)
    keep = merged > 0
    return uniq[keep, : state.shape[1]].long(), uniq[keep, -2], merged[keep], uniq[keep, -1].bool()


def ddpd_exact_clock_law(toy: ToyProblem, t_end: float, time_conditioned_planner: bool = True,
                         ddpd: DDPDOptions | None = None, denoiser_type: str = "uniform",
                         temperature: float | Temperature = 1.0, ds: float = 0.05,
                         prompt: tuple | None = None) -> torch.Tensor:
    """Law at t_end of the self-loop CTMC that ddpd_sample(clock='exact') simulates (a temperature
    schedule follows the clock's t, `_over_time`).

    prompt (frozen positions, their values): the run starts from uniform noise at the other
    positions, and the planner's p is 0 at the frozen ones, as the sampler sets it; the networks
    are toy's own (unconditional) ones, so the law is that of a prompt given to networks trained
    without prompts.

    In s = -log(1 - alpha_t) the generator is Q = diag(r) (J - I), with r(x) = sum_d p
    the event rate and J the one-step plan-and-denoise kernel at time t(s); the
    master equation dpi/ds = pi Q is integrated with classical Runge-Kutta (step ds). ddpd: the
    sampler's options (clock='exact', the same t_end), for its selection.
    """
    assert ddpd is None or (ddpd.clock == "exact" and ddpd.t_end == t_end)
    selection = "sigmoid" if ddpd is None else ddpd.selection
    temperature, temperature_end = _start_end(temperature)
    s_end = -math.log1p(-float(toy.schedule.alpha(torch.tensor(t_end, dtype=torch.float64))))
    n = max(1, math.ceil(s_end / ds))
    h = s_end / n
    idx = torch.arange(toy.N)

    def generator(s: float) -> torch.Tensor:
        alpha = torch.tensor(-math.expm1(-s), dtype=torch.float64)
        p = toy.planner_t(idx, alpha.expand(toy.N)) if time_conditioned_planner else toy.planner_free
        if prompt is not None:
            p = p.clone()
            p[:, list(prompt[0])] = 0.0
        T = _over_time(toy.schedule.inverse(alpha), t_end, temperature, temperature_end)
        J = ddpd_kernel(toy, p, alpha.expand(toy.N), selection, 1, T, denoiser_type)
        return p.sum(-1)[:, None] * (J - torch.eye(toy.N, dtype=torch.float64))

    pi = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    if prompt is not None:
        pi = (toy.states[:, list(prompt[0])] == torch.tensor(prompt[1])).all(-1).double()
        pi = pi / pi.sum()
    fixed = temperature_end is None or temperature_end == temperature
    if not time_conditioned_planner and denoiser_type == "mask" and fixed:  # nothing depends on s: Q is constant
        return pi @ torch.linalg.matrix_exp(generator(0.0) * s_end)
    q1 = generator(0.0)
    for i in range(n):
        s = i * h
        q0, qm, q1 = q1, generator(s + h / 2), generator(s + h)
        k1 = pi @ q0
        k2 = (pi + h / 2 * k1) @ qm
        k3 = (pi + h / 2 * k2) @ qm
        k4 = (pi + h * k3) @ q1
        pi = pi + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return pi


# ----------------------------------------------------------------------------- tau-leaping


def _product_kernel(per_position: torch.Tensor) -> torch.Tensor:
    """K[x, y] = prod_d k_d(x)[y_d] from per_position [B, D, V] (y indexed base V)."""
    K = per_position[:, 0, :]
    for d in range(1, per_position.shape[1]):
        K = (K[:, :, None] * per_position[:, d, None, :]).reshape(K.shape[0], -1)
    return K


def fill_remask_kernel(toy: ToyProblem, q: torch.Tensor, fill: float, remask: float) -> torch.Tensor:
    """K over mask states of one step in which, independently per position, a mask takes a
    token drawn from q [Nm, D, S] with probability fill and a token is masked again with
    probability remask."""
    S, M = toy.S, toy.mask_states
    from_mask = torch.cat([fill * q, torch.full_like(q[..., :1], 1.0 - fill)], -1)
    from_token = torch.nn.functional.one_hot(M.clamp(max=S - 1), S + 1).double() * (1.0 - remask)
    from_token[..., S] = remask
    return _product_kernel(torch.where((M == S)[..., None], from_mask, from_token))


def _jump_probability(toy: ToyProblem, i: int, steps: int, eta: float = 0.0) -> float:
    if i == steps - 1:
        return 1.0
    t = torch.tensor(i / steps, dtype=torch.float64)
    a = toy.schedule.alpha(t)
    return min(1.0, float((toy.schedule.alpha_dot(t) + eta * a) / (1.0 - a)) / steps)


def tau_leaping_mask_law(toy: ToyProblem, steps: int, eta: float = 0.0,
                         temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of tau_leaping_mask over clean states (masked states carry no mass at the end)."""
    temperature, temperature_end = _start_end(temperature)
    S, M = toy.S, toy.mask_states
    masked = M == S
    q = toy.mask_table  # [Nm, D, S]
    pi = (masked.all(-1)).double()
    for i in range(steps):
        last = i == steps - 1
        pu = _jump_probability(toy, i, steps, eta)
        pr = 0.0 if last else min(1.0, eta / steps)
        pi = pi @ fill_remask_kernel(toy, tempered(q, _temperature(i, steps, temperature, temperature_end)), pu, pr)
    clean = ~masked.any(-1)
    assert float(pi[~clean].sum()) < 1e-12
    return pi[clean]


def tau_leaping_uniform_law(toy: ToyProblem, steps: int, temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of tau_leaping_uniform with the exact uniform model."""
    temperature, temperature_end = _start_end(temperature)
    idx = torch.arange(toy.N)
    own = torch.nn.functional.one_hot(toy.states, toy.S).double()
    pi = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    for i in range(steps):
        alpha = toy.schedule.alpha(torch.tensor(i / steps, dtype=torch.float64)).expand(toy.N)
        p1 = toy.p_x1(idx, alpha)
        jump = _jump_probability(toy, i, steps) * (1.0 - (p1 * own).sum(-1))
        q = tempered(p1 * (1.0 - own), _temperature(i, steps, temperature, temperature_end))
        k = jump[..., None] * q + (1.0 - jump[..., None]) * own
        pi = pi @ _product_kernel(k)
    return pi


def tau_leaping_planned_law(toy: ToyProblem, steps: int, denoiser_type: str = "uniform",
                            time_conditioned_planner: bool = False,
                            temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of tau_leaping_planned with the oracle planner and uniform or mask denoiser."""
    temperature, temperature_end = _start_end(temperature)
    idx = torch.arange(toy.N)
    own = torch.nn.functional.one_hot(toy.states, toy.S).double()
    pi = torch.full((toy.N,), 1.0 / toy.N, dtype=torch.float64)
    for i in range(steps):
        alpha = toy.schedule.alpha(torch.tensor(i / steps, dtype=torch.float64)).expand(toy.N)
        p = toy.planner_t(idx, alpha) if time_conditioned_planner else toy.planner_free
        event = _jump_probability(toy, i, steps) * p
        T = _temperature(i, steps, temperature, temperature_end)
        if denoiser_type == "uniform":
            q = tempered(toy.uniform_denoiser(idx, alpha), T)
            K = _product_kernel(event[..., None] * q + (1.0 - event[..., None]) * own)
        else:
            K = torch.zeros(toy.N, toy.N, dtype=torch.float64)
            for events in itertools.product((0, 1), repeat=toy.D):
                positions = [d for d in range(toy.D) if events[d]]
                pe = torch.ones(toy.N, dtype=torch.float64)
                for d in range(toy.D):
                    pe = pe * (event[:, d] if events[d] else 1.0 - event[:, d])
                if positions:
                    mask_draws(toy, K, p, positions, pe, T)
                else:
                    K[idx, idx] += pe
        pi = pi @ K
    return pi


# ----------------------------------------------------------------------------- MaskGIT


def maskgit_law(toy: ToyProblem, steps: int, choice_temperature: float,
                temperature: float | Temperature = 1.0) -> torch.Tensor:
    """Law of maskgit_sample (choice_temperature > 0).

    The least-confident ranking under Gumbel noise of scale tau is a Plackett-Luce
    draw: the unmasked set is the first m - n picks without replacement with weights
    exp(confidence / tau) = p(token)^(1 / tau) over the masked positions.
    """
    temperature, temperature_end = _start_end(temperature)
    S, D, M = toy.S, toy.D, toy.mask_states
    pi = (M == S).all(-1).double()
    for i in range(steps):
        T = _temperature(i, steps, temperature, temperature_end)
        tau = choice_temperature * (1.0 - (i + 1) / steps)
        K = torch.zeros(M.shape[0], M.shape[0], dtype=torch.float64)
        for pattern in itertools.product((0, 1), repeat=D):
            masked = [d for d in range(D) if pattern[d]]
            rows = ((M == S) == torch.tensor(pattern, dtype=torch.bool)).all(-1).nonzero()[:, 0]
            if not masked:
                K[rows, rows] = 1.0
                continue
            m = len(masked)
            n = 0 if i == steps - 1 else max(1, min(m - 1, math.floor(D * math.cos(0.5 * math.pi * (i + 1) / steps))))
            q = toy.mask_table[rows][:, masked]  # [R, m, S]
            qt = tempered(q, T)
            for tokens in itertools.product(range(S), repeat=m):
                tok = torch.tensor(tokens)
                p_tok = qt[:, torch.arange(m), tok].prod(-1)  # [R]
                conf = q[:, torch.arange(m), tok]  # untempered p(token)
                for unmasked, p_set in _first_picks(conf, m - n, tau).items():
                    target = M[rows].clone()
                    for r in unmasked:
                        target[:, masked[r]] = tokens[r]
                    K.index_put_((rows, toy.mask_index(target)), p_tok * p_set, accumulate=True)
        pi = pi @ K
    clean = ~(M == S).any(-1)
    assert float(pi[~clean].sum()) < 1e-12
    return pi[clean]


def _first_picks(conf: torch.Tensor, n_picks: int, tau: float) -> dict:
    """{set of the first n_picks Plackett-Luce picks: probability [R]} with weights conf^(1/tau)."""
    m = conf.shape[1]
    if n_picks == m:
        return {tuple(range(m)): torch.ones(conf.shape[0], dtype=torch.float64)}
    if n_picks == 0:
        return {(): torch.ones(conf.shape[0], dtype=torch.float64)}
    log_w = torch.log(conf.clamp_min(1e-300)) / tau
    w = torch.exp(log_w - log_w.max(-1, keepdim=True).values)
    return set_probabilities(w, n_picks)


def _start_end(temperature: float | Temperature) -> tuple:
    """(start, end) of a sampler's temperature argument; end None when fixed."""
    if isinstance(temperature, Temperature):
        return temperature.start, temperature.end
    return temperature, None


def _temperature(i: int, steps: int, start: float, end: float | None) -> float:
    if end is None or steps <= 1:
        return start
    return start + (end - start) * i / (steps - 1)


def _over_time(t: torch.Tensor, t_final: float, start: float, end: float | None):
    """A temperature annealed over a run's time: start at t = 0, linearly to end at t_final and
    after (one per entry of t), or the number itself when fixed."""
    if end is None or end == start:
        return start
    t = torch.as_tensor(t, dtype=torch.float64)
    return torch.where(t >= t_final, end, start + (end - start) * (t / t_final).clamp(0.0, 1.0))


def _eps_stop_time(toy: ToyProblem, eps: float) -> float:
    """alpha^{-1}(1 - eps): the time estimate past which every row that stops under the eps rule is."""
    return float(toy.schedule.inverse(torch.tensor(1.0 - eps, dtype=torch.float64)))
