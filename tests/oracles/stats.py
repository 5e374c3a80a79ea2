"""Comparing samples with a law: total variation and its sampling noise floor."""
from __future__ import annotations

import numpy as np
import torch

FLOOR_QUANTILE = 0.99
FLOOR_REPEATS = 300
MARGIN = 0.005


def empirical(index: torch.Tensor, n_states: int) -> torch.Tensor:
    """Empirical distribution (float64 [n_states]) of state indices."""
    return torch.bincount(index, minlength=n_states).double() / index.numel()


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p.double() - q.double()).abs().sum())


def noise_floor(p: torch.Tensor, n: int, seed: int = 0) -> float:
    """The FLOOR_QUANTILE quantile of TV(p, empirical of n draws from p) over FLOOR_REPEATS repeats."""
    p = p.double().clamp_min(0.0)
    p = (p / p.sum()).numpy()
    counts = np.random.default_rng(seed).multinomial(n, p, size=FLOOR_REPEATS)
    tvs = 0.5 * np.abs(counts / n - p).sum(-1)
    return float(np.quantile(tvs, FLOOR_QUANTILE))


def threshold(p: torch.Tensor, n: int) -> float:
    """What TV(p, n samples) stays under when the samples come from p: floor + MARGIN."""
    return noise_floor(p, n) + MARGIN


class TVTable:
    """Rows of (sampler/option, TV to its own law, TV to p_data, threshold), printed as a table."""

    def __init__(self, title: str):
        self.title = title
        self.rows: list = []

    def add(self, name: str, tv_law: float | None, tv_data: float, limit: float | None, states: int) -> None:
        """A row; tv_law None: not compared; limit None: an exact law, no samples (no noise floor)."""
        self.rows.append((name, tv_law, tv_data, limit, states))
        law = "      -" if tv_law is None else f"{tv_law:7.4f}"
        bound = "      -" if limit is None else f"{limit:7.4f}"
        print(f"[TV] {name:44s} law {law}  p_data {tv_data:7.4f}  threshold {bound}  states {states}")

    def render(self) -> str:
        header = f"{'sampler / option':46s} {'TV(own law)':>11s} {'TV(p_data)':>10s} {'threshold':>9s} {'states':>6s}"
        lines = [self.title, header]
        for name, tv_law, tv_data, limit, states in self.rows:
            law = "-" if tv_law is None else f"{tv_law:.4f}"
            bound = "-" if limit is None else f"{limit:.4f}"
            lines.append(f"{name:46s} {law:>11s} {tv_data:10.4f} {bound:>9s} {states:6d}")
        return "\n".join(lines)
