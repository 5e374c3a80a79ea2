"""The quality-versus-passes frontier of parallel decoding (docs/parallel.md).

Each configuration (a sampler, a commit policy, a step budget, a temperature) draws
samples, which the judge scores (NLL per token, nats) beside their unigram entropy (bits),
against the network passes the samples cost (planner and denoiser, per sample). Rows go to
a CSV after every configuration; a run finds the rows of its CSV already there and skips
them, so an interrupted sweep resumes where it stopped. The plot draws judge NLL against
mean passes, one line per policy family and temperature; the tables say how many passes each
needs to reach a target quality at matched entropy, and how each ddpd policy compares with
each baseline at the same budget and entropy.

The samplers come in as callables (ddpd.cli.frontier wires ddpd.sampling in), so this layer
does not depend on the sampling layer.
"""
from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ddpd._interrupts import signals_held
from ddpd.eval.checks import check_int
from ddpd.eval.quality import COMPARE_COLUMNS, difference_at, matched_entropy, quality_metrics
from ddpd.eval.report import markdown_table, pyplot, save_figure, write_csv

KEY = ("sampler", "policy", "steps", "temperature", "num_samples", "seed")
COLUMNS = (("sampler", "Sampler", ""), ("policy", "Policy", ""), ("steps", "Steps", ""),
           ("temperature", "T", ""), ("judge_nll", "Judge NLL", ".4f"), ("judge_nll_se", "± s.e.", ".4f"),
           ("entropy", "Entropy (bits)", ".3f"), ("passes", "Passes / sample", ".1f"),
           ("planner_passes", "Planner", ".1f"), ("denoiser_passes", "Denoiser", ".1f"),
           ("tokens_per_pass", "Tokens / pass", ".2f"), ("num_samples", "Samples", ""))


@dataclass(frozen=True)
class Config:
    """One point of the frontier: run(n, first_row) -> a SampleResult-like object (tokens,
    planner_passes, denoiser_passes, commits) for samples first_row .. first_row + n - 1,
    at `steps` steps, what a budget of `budget` network passes buys."""

    sampler: str
    policy: str
    steps: int
    temperature: float
    run: Callable[[int, int], Any]
    budget: Optional[int] = None

    def key(self, num_samples: int, seed: int) -> tuple:
        """What identifies the configuration's row in a frontier CSV.

        Args:
            num_samples: samples a point.
            seed: their seed.

        Returns:
            The key tuple.
        """
        return (self.sampler, self.policy, str(self.steps), repr(float(self.temperature)), str(num_samples),
                str(seed))


def _row_key(row: dict) -> tuple:
    # the temperature as the float it reads, exactly (repr round-trips; :g kept 6 digits, so that
    # 1.0000001 took the row of 1.0), whether the cell says 1, 1.0 or 1.00
    return tuple(str(row[k]) if k != "temperature" else repr(float(row[k])) for k in KEY)


def run_frontier(configs: Sequence[Config], *, judge, vocab_size: int, num_samples: int, seed: int,
                 batch_size: int, csv_path: str, progress: bool = False) -> list[dict]:
    """Every configuration's row, the ones already in csv_path taken from it (resumed).

    Args:
        configs: the points to measure.
        judge: anything with log_likelihood(x Long[B, D]) -> Float[B] (nats per sequence).
        vocab_size: for the unigram entropy.
        num_samples, seed, batch_size: samples per point, their seed (recorded), rows per call.
        csv_path: the CSV rewritten (atomically) after each configuration.
        progress: show a progress bar.

    Returns:
        The rows (dicts with the COLUMNS fields), in the order of configs.

    Raises:
        TypeError, ValueError: num_samples or batch_size not an int >= 1.
        ValueError: csv_path is no frontier CSV, or two of its rows measure one configuration.
    """
    num_samples = check_int("num_samples", num_samples, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    earlier = read_frontier(csv_path) if os.path.exists(csv_path) else []
    _check_unique(earlier, csv_path)
    done = {_row_key(row): row for row in earlier}
    rows, keys = [], [config.key(num_samples, seed) for config in configs]
    if _fill_budgets(done, configs, keys):
        with signals_held():
            write_csv(list(done.values()), csv_path)
    # the rows resumed start the bar: counted as configurations measured, they made its rate and time left
    with tqdm(total=len(configs), initial=sum(key in done for key in keys), desc="frontier", unit="config",
              disable=None if progress else True) as bar:
        for config, key in zip(configs, keys):
            if key in done:
                rows.append(done[key])
                continue
            bar.set_postfix_str(f"{config.sampler} {config.policy} T={config.temperature:g} steps={config.steps}")
            row = _measure(config, judge, vocab_size, num_samples, seed, batch_size)
            with signals_held():  # a measured row is kept in the CSV before a signal stops the run
                rows.append(row)
                here = {_row_key(r) for r in rows}
                write_csv(rows + [earlier for k, earlier in done.items() if k not in here], csv_path)
            bar.update()
    return rows


def rows_of(rows: Sequence[dict], configs: Sequence[Config], num_samples: int, seed: int) -> list[dict]:
    """The rows that measure one of `configs` at this sample count and seed: a frontier CSV
    also keeps the rows of earlier sweeps into its directory (other seeds, other points).

    Args:
        rows: rows of a frontier CSV (read_frontier).
        configs: the sweep's configurations.
        num_samples, seed: the sweep's samples a point and their seed.

    Returns:
        Those rows, in their order.
    """
    keys = {config.key(num_samples, seed) for config in configs}
    return [row for row in rows if _row_key(row) in keys]


def _fill_budgets(done: dict, configs: Sequence[Config], keys: list) -> bool:
    """Give each row of `done` written without a budget the budget of its configuration, which
    a ddpd row stopped early does not tell (budget()); whether one was given."""
    filled = False
    for config, key in zip(configs, keys):
        row = done.get(key)
        if row is not None and row.get("budget") in (None, "") and config.budget is not None:
            row["budget"], filled = config.budget, True
    return filled


def read_frontier(path: str) -> list[dict]:
    """The rows of a frontier CSV (measurements as floats; steps, budget, num_samples and seed as
    ints, 16.0 read as 16, as run_frontier measures them; an empty budget stays ""); ValueError
    naming the file and line for one that lacks a column of the key or a measurement, or holds a
    measurement that is no number.

    Args:
        path: a frontier CSV.

    Returns:
        The rows.

    Raises:
        ValueError: the file lacks a column, a cell of a measurement is no number (or of steps,
            budget, num_samples or seed no whole number), or it is not such a CSV.
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    needed = KEY + ("judge_nll", "entropy", "passes")
    for line, row in enumerate(rows, start=2):
        missing = [k for k in needed if not row.get(k)]
        if missing:
            raise ValueError(f"{path} line {line}: not a frontier row (no {', '.join(missing)})")
        for k in ("judge_nll", "judge_nll_se", "entropy", "entropy_se", "passes", "planner_passes",
                  "denoiser_passes", "tokens_per_pass", "temperature", "seconds"):
            if row.get(k):
                try:
                    row[k] = float(row[k])
                except ValueError:
                    raise ValueError(f"{path} line {line}, column {k}: {row[k]!r} is not a number") from None
        for k in ("steps", "budget", "num_samples", "seed"):  # 16.0 (a spreadsheet's) is the key's 16
            if row.get(k):
                row[k] = _whole(row[k], f"{path} line {line}, column {k}")
    return rows


def _check_unique(rows: list[dict], path: str) -> None:
    """ValueError naming two lines of one configuration (two CSVs joined by hand): a resumed run
    kept the later and dropped the other from the file without a word."""
    first = {}
    for line, row in enumerate(rows, start=2):
        key = _row_key(row)
        if key in first:
            raise ValueError(f"{path} lines {first[key]} and {line}: the same configuration measured twice "
                             "(sampler, policy, steps, temperature, num_samples, seed); keep one")
        first[key] = line


def _whole(text: str, where: str) -> int:
    try:  # exact for a seed of 64 bits, which a float would round
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal("NaN")
    if not value.is_finite() or value != value.to_integral_value():
        raise ValueError(f"{where}: {text!r} is not a whole number")
    return int(value)


def budget(row: dict) -> int:
    """The network-pass budget a row was run at: its `budget`, or in a row written without one
    its steps (mask loop: a pass a step) or its mean passes rounded up (ddpd, which spends at
    most its budget: rows that stop early spend less).

    Args:
        row: a frontier row.

    Returns:
        The budget.
    """
    if row.get("budget") not in (None, ""):
        return int(row["budget"])
    # round() filed a row of 31.4 mean passes, stopped early at budget 32, under 31
    return int(row["steps"]) if row["sampler"] != "ddpd" else math.ceil(float(row["passes"]))


def _measure(config: Config, judge, vocab_size: int, num_samples: int, seed: int, batch_size: int) -> dict:
    start = time.perf_counter()
    tokens, planner, denoiser, commits = [], 0, 0, 0
    for first in range(0, num_samples, batch_size):
        result = config.run(min(batch_size, num_samples - first), first)
        tokens.append(result.tokens.cpu())
        planner += int(result.planner_passes.sum())
        denoiser += int(result.denoiser_passes.sum())
        commits += int(result.commits.sum())
    metrics = quality_metrics(torch.cat(tokens), judge, vocab_size)
    passes = (planner + denoiser) / num_samples
    planned = "" if config.budget is None else config.budget
    return {"sampler": config.sampler, "policy": config.policy, "steps": config.steps, "budget": planned,
            "temperature": config.temperature, "judge_nll": metrics["judge_nll"],
            "judge_nll_se": metrics["judge_nll_se"], "entropy": metrics["entropy"],
            "entropy_se": metrics["entropy_se"], "passes": passes, "planner_passes": planner / num_samples,
            "denoiser_passes": denoiser / num_samples, "tokens_per_pass": commits / max(1, planner + denoiser),
            "num_samples": num_samples, "seed": seed, "seconds": time.perf_counter() - start}


def family(row: dict) -> str:
    """A line of the plot: the sampler and its policy (the budget varies along the line).

    Args:
        row: a frontier row.

    Returns:
        "sampler policy".
    """
    return f"{row['sampler']} {row['policy']}"


def _measured(row: dict) -> bool:
    """Whether a row's judge NLL, entropy and passes are finite: a NaN (a judge's, or a cell
    edited) compares false with everything, and one such row of a sweep took its family's best
    NLL and broke its curve, so the reach and comparison tables leave such rows out."""
    return all(math.isfinite(float(row[k])) for k in ("judge_nll", "entropy", "passes"))


def passes_to_reach(rows: list[dict], target_nll: float, target_entropy: float, nll_slack: float = 0.02,
                    entropy_tolerance: float = 0.01, target: Optional[dict] = None,
                    label: Callable[[str], str] = str) -> list[dict]:
    """Per family, the fewest mean passes of a configuration within nll_slack of target_nll
    (or below it) at an entropy within entropy_tolerance (relative) of target_entropy; with none,
    the best NLL it reached at matched entropy. Beside it, read at the target's own entropy (the
    window alone is worth 0.1 nats where a curve rises 3 nats a bit): the fewest passes whose
    temperature sweep passes within nll_slack of the target there (ddpd.eval.quality.difference_at,
    never extrapolated; of equal passes, the smaller difference, then budget), else the smallest
    such difference, with its standard error when
    `target` (the target's row) gives the target's own.

    Args:
        rows: frontier rows (one with a judge NLL, entropy or passes not finite left out).
        target_nll: the target's judge NLL.
        target_entropy: the target's entropy.
        nll_slack: how far above target_nll counts as reaching it.
        entropy_tolerance: the relative entropy tolerance.
        target: the target's row, for its standard errors, or None.
        label: a family's name (family()) -> the name the table shows.

    Returns:
        One dict a family.
    """
    point = dict(target or {}, judge_nll=target_nll, entropy=target_entropy)
    out = []
    rows = [row for row in rows if _measured(row)]
    for name in dict.fromkeys(family(row) for row in rows):
        ours = [r for r in rows if family(r) == name]
        matched = [r for r in ours if abs(float(r["entropy"]) - target_entropy) <= entropy_tolerance * target_entropy]
        good = [r for r in matched if float(r["judge_nll"]) <= target_nll + nll_slack]
        best = min(good, key=lambda r: float(r["passes"])) if good else \
            min(matched, key=lambda r: float(r["judge_nll"]), default=None)
        out.append({"family": label(name), "reached": bool(good),
                    "passes": float(best["passes"]) if best else math.nan,
                    "judge_nll": float(best["judge_nll"]) if best else math.nan,
                    "entropy": float(best["entropy"]) if best else math.nan,
                    "config": f"{best['policy']} steps={best['steps']} T={best['temperature']}" if best else "-",
                    **_at_target_entropy(ours, point, nll_slack)})
    return out


def _at_target_entropy(ours: list[dict], point: dict, nll_slack: float) -> dict:
    """passes_to_reach's reading at the target's entropy: each budget's sweep a curve."""
    readings = []
    for steps in sorted({budget(r) for r in ours}):
        curve = [dict(r, judge_nll=float(r["judge_nll"]), entropy=float(r["entropy"]))
                 for r in ours if budget(r) == steps]
        got = difference_at(curve, point)
        if got is not None:
            readings.append((max(float(r["passes"]) for r in curve), *got))
    reached = [r for r in readings if r[1] <= nll_slack]
    # the fewest passes, then the least difference, then the smaller budget: a tie went on to
    # compare standard errors, where one is None (a row of one sample) and raised
    pick = min(reached, key=lambda r: r[:2], default=None) or min(readings, key=lambda r: r[1], default=None)
    return {"matched_reached": bool(reached) if pick else None, "matched_passes": pick[0] if pick else None,
            "matched_difference": pick[1] if pick else None, "matched_difference_se": pick[2] if pick else None}


def against_baselines(rows: list[dict], label: Callable[[str], str] = str) -> list[dict]:
    """Every ddpd commit policy against every mask-loop policy at each pass budget, at matched
    entropy: each temperature sweep is a curve NLL(entropy), compared by
    ddpd.eval.quality.matched_entropy (interpolated, never extrapolated).

    Args:
        rows: frontier rows (the one-at-a-time rows, and rows with a judge NLL, entropy or passes
            not finite, are left out).
        label: a family's name (family()) -> the name the table shows.

    Returns:
        matched_entropy's dicts ("steps" is the pass budget), budget by budget.
    """
    curves = [dict(r, sampler=family(r), steps=budget(r), judge_nll=float(r["judge_nll"]),
                   entropy=float(r["entropy"])) for r in rows if r["policy"] != "one-at-a-time" and _measured(r)]
    ours = list(dict.fromkeys(c["sampler"] for c in curves if c["sampler"].startswith("ddpd ")))
    theirs = list(dict.fromkeys(c["sampler"] for c in curves if not c["sampler"].startswith("ddpd ")))
    out = []
    for steps in sorted({c["steps"] for c in curves}):
        out += [c for o in ours for t in theirs if (c := matched_entropy(curves, o, t, steps)) is not None]
    return [dict(c, sampler=label(c["sampler"]), baseline=label(c["baseline"])) for c in out]


def frontier_markdown(rows: list[dict], reach: Optional[list[dict]] = None, target: str = "",
                      compared: Optional[list[dict]] = None) -> str:
    """The frontier rows, the passes each family needs to reach the target, and the ddpd
    policies against the baselines at matched entropy, as Markdown.

    Args:
        rows: frontier rows.
        reach: passes_to_reach's dicts, or None.
        target: a line describing the target.
        compared: against_baselines's dicts, or None.

    Returns:
        The Markdown text.
    """
    text = markdown_table(rows, COLUMNS)
    if reach:
        text += (f"\n\nPasses to reach {target} (judge NLL within 0.02, entropy within 1%; then read at the "
                 "target's own entropy along each budget's temperature sweep: its NLL minus the target's, "
                 "never extrapolated):\n\n")
        text += markdown_table(reach, (("family", "Sampler / policy", ""), ("reached", "Reached", ""),
                                       ("passes", "Passes / sample", ".1f"), ("judge_nll", "Judge NLL", ".4f"),
                                       ("entropy", "Entropy", ".3f"), ("config", "Configuration", ""),
                                       ("matched_reached", "At its entropy", ""),
                                       ("matched_passes", "Passes", ".1f"),
                                       ("matched_difference", "NLL - target", "+.3f"),
                                       ("matched_difference_se", "± s.e.", ".3f")))
    if compared:
        text += ("\n\nEach ddpd policy against each baseline at the same pass budget and entropy (a point is "
                 "better when the policy's NLL-entropy curve across temperatures passes below it):\n\n")
        text += markdown_table(compared, (("steps", "Passes", ""),) + COMPARE_COLUMNS[1:])
    return text + "\n"


def plot_frontier(rows: list[dict], path: str, target: Optional[dict[str, float]] = None,
                  label: Callable[[str], str] = str) -> None:
    """Judge NLL against mean passes (log scale), a line per family (a colour) and temperature (a
    line style), each point labelled with its entropy; the target quality as a horizontal line.

    Args:
        rows: frontier rows.
        path: the image file to write.
        target: {"judge_nll", ...} of the target, or None.
        label: a family's name (family()) -> the name the legend shows.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((family(row), float(row["temperature"])), []).append(row)
    names = list(dict.fromkeys(name for name, _ in groups))
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20").colors  # a colour a family
    colours = {name: palette[i % len(palette)] for i, name in enumerate(names)}
    styles = {t: style for t, style in zip(sorted({t for _, t in groups}, key=lambda t: abs(t - 1.0)),
                                           ("-", "--", ":", "-."))}
    for (name, temperature), points in groups.items():
        points = sorted(points, key=lambda r: float(r["passes"]))
        xs, ys = [float(r["passes"]) for r in points], [float(r["judge_nll"]) for r in points]
        line, = ax.plot(xs, ys, marker="o", color=colours[name], linestyle=styles.get(temperature, "-"),
                        label=f"{label(name)} T={temperature:g}")
        for x, y, r in zip(xs, ys, points):
            ax.annotate(f"{float(r['entropy']):.2f}", (x, y), fontsize=6, color=line.get_color(),
                        textcoords="offset points", xytext=(3, 3))
    if target:
        ax.axhline(target["judge_nll"], color="grey", linestyle="--", linewidth=0.8,
                   label=f"target {target['judge_nll']:.3f} (entropy {target['entropy']:.2f})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("network passes per sample (planner + denoiser)")
    ax.set_ylabel("judge NLL (nats per token); labels: unigram entropy (bits)")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, off the lines
    save_figure(fig, path, bbox_inches="tight")
