"""Enumerable toy distributions and their exact DDPD models.

A ToyProblem holds p_data over all S^D sequences and computes, by summing over every
clean sequence, the exact quantities of the uniform-noise forward process (eq.
corruption_flow): the single uniform model, the time-conditioned and time-free planners,
the uniform denoiser and the mask denoiser. Each joint probability is a polynomial of
degree D in beta = 1 - alpha, stored by its coefficients; the time-free planner's time
average is exact Gauss-Legendre quadrature. The models are callables with the
package's interfaces, returning float32 logits. docs/oracles.md has the derivation."""
from __future__ import annotations

import itertools

import numpy as np
import torch
from numpy.polynomial import polynomial as P

from ddpd.process import LinearSchedule, Schedule

BETA_MIN = 1e-7  # times are clamped to t <= 1 - 1e-7 where a posterior would be 0 / 0
LOGIT_CLAMP = 1e-12


def dirichlet_p_data(S: int, D: int, concentration: float = 0.3, seed: int = 0) -> torch.Tensor:
    """p_data ~ Dirichlet(concentration) over the S^D sequences (float64)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.dirichlet(np.full(S**D, concentration)))


def sparse_p_data(S: int, D: int, support: int, seed: int = 0) -> torch.Tensor:
    """p_data uniform-random weights on `support` random sequences, zero elsewhere."""
    rng = np.random.default_rng(seed)
    p = np.zeros(S**D)
    chosen = rng.choice(S**D, size=support, replace=False)
    p[chosen] = rng.uniform(0.5, 1.5, size=support)
    return torch.from_numpy(p / p.sum())


def markov_p_data(D: int, stay: float = 0.9) -> torch.Tensor:
    """p_data of a two-state Markov chain: x^1 uniform on {0, 1}, x^{d+1} = x^d with probability stay."""
    states = torch.tensor(list(itertools.product(range(2), repeat=D)), dtype=torch.long).view(-1, D)
    same = (states[:, 1:] == states[:, :-1]).double().sum(-1)
    p = 0.5 * stay**same * (1.0 - stay) ** (D - 1 - same)
    return p / p.sum()


class ToyProblem:
    """p_data over S^D sequences (index = sum_d x^d S^(D-1-d)) and its exact models."""

    def __init__(self, p_data: torch.Tensor, S: int, D: int, schedule: Schedule = LinearSchedule(),
                 quadrature_nodes: int | None = None):
        if p_data.numel() != S**D or abs(float(p_data.sum()) - 1.0) > 1e-9 or bool((p_data < 0).any()):
            raise ValueError("p_data must be a probability vector over S**D states")
        self.S, self.D, self.N = S, D, S**D
        self.p_data = p_data.double()
        self.schedule = schedule
        self.states = torch.tensor(list(itertools.product(range(S), repeat=D)), dtype=torch.long).view(-1, D)
        self.powers = S ** torch.arange(D - 1, -1, -1)
        self._build_polynomials()
        self.planner_free = self._time_free_planner(quadrature_nodes or D + 1)
        self.mask_states = torch.tensor(list(itertools.product(range(S + 1), repeat=D)), dtype=torch.long)
        self.mask_powers = (S + 1) ** torch.arange(D - 1, -1, -1)
        self.mask_table = self._mask_denoiser_table()

    # ---------------------------------------------------------------- indexing
    def index(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.powers.to(x.device)).sum(-1)

    def mask_index(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.mask_powers.to(x.device)).sum(-1)

    # ---------------------------------------------------------------- polynomials in beta
    def _build_polynomials(self) -> None:
        S, D = self.S, self.D
        a = np.array([1.0, -(1.0 - 1.0 / S)])  # alpha + (1 - alpha)/S in beta
        b = np.array([0.0, 1.0 / S])  # (1 - alpha)/S in beta
        C = np.zeros((D + 1, D + 1))
        for m in range(D + 1):
            c = P.polymul(P.polypow(a, m), P.polypow(b, D - m))
            C[m, : len(c)] = c
        C = torch.from_numpy(C)
        agree = self.states[:, None, :] == self.states[None, :, :]  # [x, x1, d]
        m_all = agree.sum(-1)
        m_excl = m_all[:, :, None] - agree.long()  # agreements off position d
        onehot = torch.nn.functional.one_hot(self.states, S).double()  # [x1, d, j]
        p = self.p_data
        self.c_xt = torch.einsum("y,xyk->xk", p, C[m_all])
        self.c_x1 = torch.einsum("y,ydj,xyk->xdjk", p, onehot, C[m_all])
        c_excl = C[m_excl]  # [x, x1, d, k]
        self.c_noise = torch.einsum("y,xydk->xdk", p, c_excl)
        self.c_noise_x1 = torch.einsum("y,ydj,xydk->xdjk", p, onehot, c_excl)

    @staticmethod
    def _horner(coeffs: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """Evaluate polynomials coeffs[..., k] beta^k, beta broadcast over the leading axis."""
        shape = (-1,) + (1,) * (coeffs.dim() - 2)
        beta = beta.view(shape)
        out = torch.zeros_like(coeffs[..., 0])
        for k in range(coeffs.shape[-1] - 1, -1, -1):
            out = out * beta + coeffs[..., k]
        return out

    @classmethod
    def _horner_at(cls, table: torch.Tensor, idx: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        """_horner(table[idx], beta) bit for bit (the same products and sums per element), without
        gathering table[idx] whole: with one beta for every row, the N states' values gathered."""
        flat = beta.reshape(-1)
        if flat.numel() and bool((flat == flat[0]).all()):
            return cls._horner(table, flat[0].expand(table.shape[0]))[idx]
        shape = (-1,) + (1,) * (table.dim() - 2)
        beta = beta.reshape(shape)
        out = torch.zeros(tuple(idx.shape) + tuple(table.shape[1:-1]), dtype=table.dtype)
        for k in range(table.shape[-1] - 1, -1, -1):
            out = out * beta + table[..., k][idx]
        return out

    def _beta(self, alpha) -> torch.Tensor:
        return (1.0 - torch.as_tensor(alpha, dtype=torch.float64)).clamp(BETA_MIN, 1.0)

    def _time_free_planner(self, nodes: int) -> torch.Tensor:
        z, w = np.polynomial.legendre.leggauss(nodes)
        t = torch.from_numpy((z + 1.0) / 2.0)
        w = torch.from_numpy(w / 2.0)
        beta = (1.0 - self.schedule.alpha(t).double()).clamp(BETA_MIN, 1.0)
        num = sum(w[i] * self._horner(self.c_noise, beta[i].expand(self.N)) for i in range(nodes))
        den = sum(w[i] * self._horner(self.c_xt, beta[i].expand(self.N)) for i in range(nodes))
        return num / den[:, None]

    # ---------------------------------------------------------------- exact quantities (float64)
    def p_x1(self, idx: torch.Tensor, alpha) -> torch.Tensor:
        """p_t(x_1^d = j | x_t) [B, D, S] for state indices idx [B] at alpha [B]."""
        beta = self._beta(alpha).expand(idx.shape)
        return self._horner_at(self.c_x1, idx, beta) / self._horner_at(self.c_xt, idx, beta)[:, None, None]

    def planner_t(self, idx: torch.Tensor, alpha) -> torch.Tensor:
        """p_t(z^d = N | x_t) [B, D]."""
        beta = self._beta(alpha).expand(idx.shape)
        return self._horner_at(self.c_noise, idx, beta) / self._horner_at(self.c_xt, idx, beta)[:, None]

    def p_change(self, idx: torch.Tensor, alpha) -> torch.Tensor:
        """p_t(x_1^d != x_t^d | x_t) [B, D]: the planner of the appendix's first listing."""
        p_x1 = self.p_x1(idx, alpha)
        return 1.0 - p_x1.gather(-1, self.states[idx][..., None]).squeeze(-1)

    def jump_denoiser(self, idx: torch.Tensor, alpha) -> torch.Tensor:
        """p_t(x_1^d = j | x_t) renormalised over j != x_t^d [B, D, S] (the listing's denoiser);
        where p_t(x_1^d = x_t^d | x_t) = 1 there is no jump: the token stays."""
        here = torch.nn.functional.one_hot(self.states[idx], self.S).bool()
        others = self.p_x1(idx, alpha).masked_fill(here, 0.0)
        total = others.sum(-1, keepdim=True)
        return torch.where(total > 0, others / total.clamp_min(1e-300), here.double())

    def uniform_denoiser(self, idx: torch.Tensor, alpha) -> torch.Tensor:
        """p_t(x_1^d = j | x_t, z^d = N) [B, D, S]."""
        beta = self._beta(alpha).expand(idx.shape)
        return self._horner_at(self.c_noise_x1, idx, beta) / self._horner_at(self.c_noise, idx, beta)[..., None]

    def _mask_denoiser_table(self) -> torch.Tensor:
        """p(x_1^d = j | x~) for every masked sequence x~ (mask id S); uniform where the
        unmasked positions are impossible under p_data (the proposition's independent
        mask can produce such inputs when p_data is sparse)."""
        x, y = self.mask_states, self.states
        consistent = ((x[:, None, :] == y[None, :, :]) | (x[:, None, :] == self.S)).all(-1)  # [Nm, N]
        onehot = torch.nn.functional.one_hot(y, self.S).double()
        mass = torch.einsum("my,y,ydj->mdj", consistent.double(), self.p_data, onehot)
        total = mass.sum(-1, keepdim=True)
        return torch.where(total > 0, mass / total.clamp_min(1e-300), torch.full_like(mass, 1.0 / self.S))

    def mask_denoiser(self, masked_idx: torch.Tensor) -> torch.Tensor:
        return self.mask_table[masked_idx]

    # ---------------------------------------------------------------- models (float32 logits)
    def models(self) -> ToyModels:
        return ToyModels(self)


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(LOGIT_CLAMP, 1.0 - LOGIT_CLAMP)
    return (torch.log(p) - torch.log1p(-p)).float()


def _log(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p.clamp_min(1e-30)).float()


class ToyModels:
    """The exact models of a ToyProblem as callables with the sampler interfaces."""

    def __init__(self, toy: ToyProblem):
        self.toy = toy

    def _alpha(self, t) -> torch.Tensor:
        return self.toy.schedule.alpha(torch.as_tensor(t, dtype=torch.float64))

    def planner(self, x: torch.Tensor) -> torch.Tensor:
        """Time-free planner logits [B, D]."""
        return _logit(self.toy.planner_free[self.toy.index(x)])

    def planner_t(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Time-conditioned planner logits [B, D]."""
        return _logit(self.toy.planner_t(self.toy.index(x), self._alpha(t)))

    def uniform_denoiser(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return _log(self.toy.uniform_denoiser(self.toy.index(x), self._alpha(t)))

    def mask_denoiser(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return _log(self.toy.mask_denoiser(self.toy.mask_index(x)))

    def uniform_model(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return _log(self.toy.p_x1(self.toy.index(x), self._alpha(t)))


def tempered(model, power: float):
    """A deliberately wrong model: probabilities raised to `power` and renormalised."""
    return lambda x, t: model(x, t) * power


def token_zeroed(model, token: int):
    """A deliberately wrong model: one token never predicted."""
    def wrong(x, t):
        logits = model(x, t).clone()
        logits[..., token] = float("-inf")
        return logits
    return wrong


class Conditioned:
    """A prompt on a ToyProblem: the positions `frozen` hold `values` and are never corrupted.

    The forward process conditioned on them corrupts the free positions only, so it is the
    ToyProblem `sub` on the free positions with p_data(x_free | x_frozen = values). Its exact
    networks, `models`, take and return full-length sequences (the sampler's interfaces):
    they read the free positions and answer with sub's exact quantities there (a frozen
    position: planner logit -inf, denoiser one-hot on its value). A sampler run with a
    prompt therefore has the law of the same sampler run on `sub`.
    """

    def __init__(self, toy: ToyProblem, frozen: list, values: list):
        self.toy, self.frozen, self.values = toy, list(frozen), list(values)
        self.free = [d for d in range(toy.D) if d not in self.frozen]
        keep = (toy.states[:, self.frozen] == torch.tensor(self.values)).all(-1)
        p = toy.p_data[keep]
        self.sub = ToyProblem(p / p.sum(), toy.S, len(self.free), toy.schedule)
        self.models = _ConditionedModels(self)

    def prompt(self, batch: int) -> tuple:
        """(x_init, frozen) of `batch` rows with this prompt."""
        x_init = torch.full((batch, self.toy.D), -1, dtype=torch.long)
        x_init[:, self.frozen] = torch.tensor(self.values)
        return x_init, x_init >= 0

    def sub_index(self, x: torch.Tensor) -> torch.Tensor:
        """Index in `sub` of full-length clean sequences."""
        return self.sub.index(x[:, self.free])


class _ConditionedModels:
    def __init__(self, cond: Conditioned):
        self.cond, self.inner = cond, cond.sub.models()
        self.inner_full = cond.toy.models()

    def _full(self, sub_out: torch.Tensor, fill) -> torch.Tensor:
        shape = (sub_out.shape[0], self.cond.toy.D) + tuple(sub_out.shape[2:])
        out = torch.full(shape, float("-inf"), dtype=sub_out.dtype)
        out[:, self.cond.free] = sub_out
        for d, v in zip(self.cond.frozen, self.cond.values):
            out[:, d] = fill(v)
        return out

    def _denoiser(self, sub_out: torch.Tensor) -> torch.Tensor:
        S = self.cond.toy.S
        return self._full(sub_out, lambda v: torch.where(torch.arange(S) == v, 0.0, float("-inf")))

    def planner(self, x):
        return self._full(self.inner.planner(x[:, self.cond.free]), lambda v: float("-inf"))

    def planner_t(self, x, t):
        return self._full(self.inner.planner_t(x[:, self.cond.free], t), lambda v: float("-inf"))

    def uniform_denoiser(self, x, t):
        return self._denoiser(self.inner.uniform_denoiser(x[:, self.cond.free], t))

    def uniform_model(self, x, t):
        return self._denoiser(self.inner.uniform_model(x[:, self.cond.free], t))

    def mask_denoiser(self, x, t):
        """The full toy's own mask denoiser: p_data(x^d | unmasked positions) already conditions
        on the prompt's values, so an unconditional exact mask denoiser is the conditional one."""
        return self.inner_full.mask_denoiser(x, t)


class Labelled:
    """A class-conditional toy: p(x, c) = prior[c] p_c(x), one ToyProblem per class and the
    mixture p(x) = sum_c prior[c] p_c(x). Its exact networks take labels=Long[B] (None:
    unconditional, the mixture's networks), as class-conditional ddpd networks do."""

    def __init__(self, problems: list, prior: list):
        self.problems, self.prior = problems, torch.tensor(prior, dtype=torch.float64)
        first = problems[0]
        mixture = sum(w * p.p_data for w, p in zip(prior, problems))
        self.mixture = ToyProblem(mixture, first.S, first.D, first.schedule)
        self.models = _LabelledModels(self)


class _LabelledModels:
    def __init__(self, labelled: Labelled):
        self.per_class = [p.models() for p in labelled.problems]
        self.mixture = labelled.mixture.models()

    def _call(self, name: str, x, *args, labels=None):
        if labels is None:
            return getattr(self.mixture, name)(x, *args)
        out = None
        for c, models in enumerate(self.per_class):
            rows = labels == c
            if bool(rows.any()):
                part = getattr(models, name)(x[rows], *(a[rows] if torch.is_tensor(a) and a.dim() else a for a in args))
                if out is None:
                    out = torch.empty((x.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype)
                out[rows] = part
        return out

    def planner_t(self, x, t, labels=None):
        return self._call("planner_t", x, t, labels=labels)

    def uniform_denoiser(self, x, t, labels=None):
        return self._call("uniform_denoiser", x, t, labels=labels)

    def planner(self, x, labels=None):
        return self._call("planner", x, labels=labels)


class Guided:
    """The ToyProblem `conditional` with its uniform denoiser replaced by the classifier-free
    guided one, softmax(log q_u + w (log q_c - log q_u)): the toy whose exact law a guided
    sampler follows (the law functions read only these attributes)."""

    def __init__(self, conditional: ToyProblem, unconditional: ToyProblem, scale: float):
        self.conditional, self.unconditional, self.scale = conditional, unconditional, scale

    def __getattr__(self, name):
        return getattr(self.conditional, name)

    def uniform_denoiser(self, idx, alpha):
        log_u = torch.log(self.unconditional.uniform_denoiser(idx, alpha).clamp_min(1e-300))
        log_c = torch.log(self.conditional.uniform_denoiser(idx, alpha).clamp_min(1e-300))
        return torch.softmax(log_u + self.scale * (log_c - log_u), -1)
