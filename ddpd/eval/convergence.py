"""Convergence of DDPD sampling along the steps (the paper's figure 'Convergence of
sampling', appendix sec:convergence_experiment).

Per step, from the planner's p(z^d = N | x): the noise left, the fraction of predicted
states that changed, and the fraction of samples meeting the stop criterion for each
eps; from a run with the stop criterion on, the fraction stopped by each step.
`PlannerRecorder` wraps the planner to record them (it needs a batch that keeps its
size: stop='budget').

docs/evaluation.md ("Convergence along the steps") has the details."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.eval.checks import check_callable, check_int
from ddpd.eval.report import MissingDependency, pyplot, save_figure, write_csv
from ddpd.validation import float_text

DEFAULT_EPS = (0.05, 0.01)


class PlannerRecorder:
    """planner wrapper recording convergence statistics per call (= per sampling step).

    Call `start_run(batch_size)` before each sampler run; statistics are summed over
    runs (batches) step by step, so several batches give one set of curves.
    """

    def __init__(self, planner: Callable, eps: Sequence[float] = DEFAULT_EPS):
        self.planner = check_callable("planner", planner)
        self.eps = tuple(float(e) for e in eps)
        if not self.eps or any(not 0.0 < e < 1.0 for e in self.eps):
            raise ValueError(f"eps must be thresholds in (0, 1), got {tuple(eps)}")
        self.sums: list[Tensor] = []  # per step: [noise left, z changes, met eps_1, ...] summed over samples
        self.counts: list[int] = []
        self._batch: Optional[int] = None

    def start_run(self, batch_size: int) -> None:
        """Begin recording a sampler run of `batch_size` samples (its records add to the runs' before).

        Args:
            batch_size: the samples of the run.
        """
        self._batch = check_int("batch_size", batch_size, 1)
        self._step = 0
        self._previous: Optional[Tensor] = None

    def __call__(self, x: Tensor, *args) -> Tensor:
        logits = self.planner(x, *args)
        if self._batch is None:
            raise RuntimeError("PlannerRecorder: call start_run(batch_size) before sampling")
        if x.shape[0] != self._batch:
            raise RuntimeError(f"PlannerRecorder: the planner saw {x.shape[0]} sequences at step {self._step}, "
                               f"expected all {self._batch}; record with stop='budget' so no sample leaves the batch")
        self._record(torch.sigmoid(logits.detach().float()))
        return logits

    def _record(self, p: Tensor) -> None:
        noisy = p > 0.5
        changed = (noisy != self._previous).float().mean(-1) if self._previous is not None \
            else torch.full((p.shape[0],), float("nan"), device=p.device)
        stats = [p.mean(-1), changed] + [(p < e).all(-1).float() for e in self.eps]
        sums = torch.stack(stats).sum(-1).cpu()
        if self._step == len(self.sums):
            self.sums.append(torch.zeros_like(sums))
            self.counts.append(0)
        self.sums[self._step] += sums
        self.counts[self._step] += p.shape[0]
        self._previous = noisy
        self._step += 1

    def rows(self) -> list[dict]:
        """One dict per step: step, noise_left, z_changed and met_eps_<eps> (means over samples).

        Returns:
            The rows, one a step.
        """
        names = ["noise_left", "z_changed"] + [f"met_eps_{float_text(e)}" for e in self.eps]
        return [{"step": i, **{n: float(v) / count for n, v in zip(names, total)}}
                for i, (total, count) in enumerate(zip(self.sums, self.counts))]


def stopped_fraction(stop_step: Tensor, steps: int) -> Tensor:
    """Float[steps]: the fraction of samples stopped (by the eps criterion) at or before
    each step; a sample that used the whole budget has stop_step == steps.

    Args:
        stop_step: Long[N], each sample's stop step.
        steps: the step budget.

    Returns:
        Float[steps].

    Raises:
        TypeError: stop_step not of an integer dtype.
        ValueError: stop_step not 1-D, empty, negative somewhere or past the budget.
    """
    steps = check_int("steps", steps, 1)
    if not isinstance(stop_step, Tensor) or stop_step.dim() != 1:
        raise ValueError(f"stop_step must be a 1-D tensor, got {getattr(stop_step, 'shape', type(stop_step).__name__)}")
    if stop_step.is_floating_point() or stop_step.is_complex() or stop_step.dtype == torch.bool:
        raise TypeError(f"stop_step must be a tensor of step numbers (an integer dtype), got {stop_step.dtype}")
    if stop_step.numel() == 0:  # the fractions would be 0 / 0
        raise ValueError("stop_step must hold at least one sample's stop step, got none")
    low = int(stop_step.min())
    if low < 0:  # torch.bincount's own error named no argument
        raise ValueError(f"stop_step must be >= 0, got minimum {low}")
    high = int(stop_step.max())
    if high > steps:  # a run of another budget: it would count as using this one whole
        raise ValueError(f"stop_step must be <= steps ({steps}), got maximum {high}")
    stopped = stop_step[stop_step < steps].cpu()
    counts = torch.bincount(stopped, minlength=steps)[:steps].cumsum(0)
    return counts.float() / stop_step.numel()


def convergence_rows(recorded: list[dict], stopped: Optional[Tensor] = None, eps: float = 0.01) -> list[dict]:
    """The recorder's rows with 'stopped_eps_<eps>' (`stopped_fraction` of a run that
    stopped at eps) added per step.

    Args:
        recorded: PlannerRecorder.rows().
        stopped: stopped_fraction of an option-A run, or None.
        eps: the eps of that run.

    Returns:
        The rows.
    """
    rows = [dict(r) for r in recorded]
    name = f"stopped_eps_{float_text(float(eps))}"  # as PlannerRecorder names met_eps (a numpy eps too)
    if stopped is not None:
        for i, row in enumerate(rows):
            row[name] = float(stopped[i]) if i < stopped.numel() else float("nan")
    return rows


def plot_convergence(rows: list[dict], path: str) -> None:
    """The paper's panels: noise left and z changes above, below one panel a tracked eps
    (samples meeting it, and stopped under option A). Raises MissingDependency without
    matplotlib.

    Args:
        rows: convergence_rows.
        path: the image file to write.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    plt = pyplot()
    steps = [r["step"] for r in rows]
    met = [k for k in rows[0] if k.startswith("met_eps_")] if rows else []
    columns = max(2, len(met))
    fig, axes = plt.subplots(2, columns, figsize=(4.5 * columns, 6))
    panels = [("noise_left", "noise left: sum_d p(z=N) / D"), ("z_changed", "fraction of z flips vs previous step")]
    for ax, (key, title) in zip(axes[0], panels):
        ax.plot(steps, [r[key] for r in rows])
        ax.set_title(title, fontsize=9)
    for ax in axes[0][len(panels):]:
        ax.axis("off")
    for ax, key in zip(axes[1], met):
        eps = key[len("met_eps_"):]
        ax.plot(steps, [r[key] for r in rows], label="criterion met (budget run)")
        if f"stopped_eps_{eps}" in rows[0]:
            ax.plot(steps, [r[f"stopped_eps_{eps}"] for r in rows], label="stopped (eps run)", linestyle="--")
        ax.set_title(f"samples with p(z=N) < {eps} everywhere", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes.flat:
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=150)


def write_convergence(rows: list[dict], out_dir: str) -> dict[str, Optional[str]]:
    """convergence.csv and convergence.png (None, with 'plot_skipped', without matplotlib).

    Args:
        rows: convergence_rows.
        out_dir: the directory to write.

    Returns:
        {"csv", "plot"} -> path ("plot" None, with "plot_skipped", without matplotlib).
    """
    paths: dict[str, Optional[str]] = {"csv": os.path.join(out_dir, "convergence.csv"),
                                       "plot": os.path.join(out_dir, "convergence.png")}
    write_csv(rows, paths["csv"])
    try:
        plot_convergence(rows, paths["plot"])
    except MissingDependency as err:
        paths["plot"], paths["plot_skipped"] = None, str(err)
    return paths
