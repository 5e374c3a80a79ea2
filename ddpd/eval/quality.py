"""Sample quality: the judge's negative log-likelihood and the unigram entropy of samples,
and sweeps over samplers, step budgets and temperatures (the paper's text8 figures of
NLL versus entropy).

`judge_nll` and `unigram_entropy` score samples; `run_sweep` runs every sampler x steps
x temperature (samplers given as `SamplerSpec`s, so this layer does not import
ddpd.sampling); `write_sweep`, `read_sweep` and `merge_sweeps` write and read its CSV,
table and plot; `matched_entropy` compares two samplers at the same entropy.

docs/evaluation.md ("Sample quality") has the details."""
from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ddpd.eval.checks import check_callable, check_float, check_int, check_tokens
from ddpd.eval.report import MissingDependency, markdown_table, mean_and_se, pyplot, save_figure, write_csv, write_text

REFERENCE = "held-out text"
JUDGE = "judge"  # the column naming the judge of a sweep's rows (merge_sweeps refuses two)
SWEEP_COLUMNS = (("sampler", "Sampler", ""), ("steps", "Steps", ""), ("temperature", "Temperature", ""),
                 ("judge_nll", "Judge NLL (nats/token)", ".4f"), ("judge_nll_se", "± s.e.", ".4f"),
                 ("entropy", "Unigram entropy (bits)", ".3f"), ("entropy_se", "± s.e.", ".3f"),
                 ("mean_steps", "Steps taken", ".1f"), ("nfe", "Forward passes / sample", ".1f"),
                 ("num_samples", "Samples", ""))


@torch.no_grad()
def judge_nll(judge, x: Tensor, batch_size: int = 64) -> Tensor:
    """Float[N]: -log p_judge(x_n) / D in nats per token. judge: an ARModel (anything
    with log_likelihood(x Long[B, D]) -> Float[B] nats per sequence).

    Args:
        judge: the judge.
        x: Long[N, D] samples.
        batch_size: sequences a judge call.

    Returns:
        Float[N] nats per token.

    Raises:
        TypeError: a judge without log_likelihood, or x not an int64 tensor.
        ValueError: x not [N, D] with N, D >= 1, or batch_size < 1.
    """
    if not callable(getattr(judge, "log_likelihood", None)):
        raise TypeError(f"judge must have a log_likelihood(x) method (an ARModel), got {type(judge).__name__}")
    batch_size = check_int("batch_size", batch_size, 1)
    check_tokens("x", x, None)  # the ids' range is the judge's to check
    # score where the judge lives (samples may have been gathered on the CPU)
    device = next((p.device for p in judge.parameters()), x.device) if isinstance(judge, torch.nn.Module) \
        else x.device
    parts = [judge.log_likelihood(x[i:i + batch_size].to(device)).float().cpu()
             for i in range(0, x.shape[0], batch_size)]
    return -torch.cat(parts) / x.shape[1]


def unigram_entropy(x: Tensor, vocab_size: int) -> Tensor:
    """Float[N]: entropy in bits of the empirical token distribution of each row of x.

    Args:
        x: Long[N, D] samples.
        vocab_size: V.

    Returns:
        Float[N] bits.
    """
    check_tokens("x", x, check_int("vocab_size", vocab_size, 1))
    ones = torch.ones_like(x, dtype=torch.float)
    counts = torch.zeros(x.shape[0], vocab_size, device=x.device).scatter_add_(1, x, ones)
    p = counts / x.shape[1]
    return -torch.where(p > 0, p * torch.log2(p), torch.zeros_like(p)).sum(-1)


def quality_metrics(tokens: Tensor, judge, vocab_size: int, batch_size: int = 64) -> dict[str, float]:
    """Mean and standard error of the judge NLL and of the unigram entropy of `tokens`.

    Args:
        tokens: Long[N, D] samples.
        judge: the judge (see judge_nll).
        vocab_size: V.
        batch_size: sequences a judge call.

    Returns:
        {"judge_nll", "judge_nll_se", "judge_ppl", "entropy", "entropy_se", "num_samples",
        "length"} -> number.

    Raises:
        TypeError: tokens not an int64 tensor.
        ValueError: tokens not [N, D] with N, D >= 1 or (on CPU) an id outside [0, V).
    """
    check_tokens("tokens", tokens, check_int("vocab_size", vocab_size, 1))
    nll, nll_se = mean_and_se(judge_nll(judge, tokens, batch_size))
    entropy, entropy_se = mean_and_se(unigram_entropy(tokens, vocab_size))
    return {"judge_nll": nll, "judge_nll_se": nll_se, "judge_ppl": math.exp(nll), "entropy": entropy,
            "entropy_se": entropy_se, "num_samples": tokens.shape[0], "length": tokens.shape[1]}


@dataclass
class SamplerSpec:
    """A named sampler: run(batch_size, steps, temperature, seed, first_row) -> result.

    The result has `tokens` (Long[B, D]) and optionally `stop_step` (Long[B]),
    `planner_calls`, `denoiser_calls`, `planner_rows`, `denoiser_rows` (as
    ddpd.sampling.SampleResult). first_row: the id of the batch's first sample, so that
    a sampler with per-row random streams gives the same samples whatever the batching (up to
    the last bits of a network's float32 output, which can change with its batch size).
    """

    name: str
    run: Callable[[int, int, float, int, int], Any]


def _sample(spec: SamplerSpec, num_samples: int, steps: int, temperature: float, seed: int,
            batch_size: int) -> tuple:
    """(tokens Long[N, D], mean steps taken or None, forward passes per sample or None)."""
    tokens, stops, passes = [], [], 0.0
    counted = True
    for first in range(0, num_samples, batch_size):
        n = min(batch_size, num_samples - first)
        result = spec.run(n, steps, temperature, seed, first)
        out = getattr(result, "tokens", None)
        if not isinstance(out, Tensor) or out.dim() != 2 or out.shape[0] != n:
            raise ValueError(f"sampler {spec.name!r} must return .tokens of shape [{n}, D], "
                             f"got {getattr(out, 'shape', type(out).__name__)}")
        tokens.append(out.cpu())
        stop = getattr(result, "stop_step", None)
        if stop is not None:
            stops.append(stop.float().cpu())
        rows = [getattr(result, name, None) for name in ("planner_rows", "denoiser_rows")]
        counted = counted and all(r is not None for r in rows)
        passes += sum(r for r in rows if r is not None)
    mean_steps = float(torch.cat(stops).mean()) if stops else None
    return torch.cat(tokens), mean_steps, (passes / num_samples if counted else None)


def run_sweep(samplers: Sequence[SamplerSpec], *, steps: Sequence[int], temperatures: Sequence[float],
              num_samples: int, judge, vocab_size: int, seed: int = 0, batch_size: int = 64,
              reference: Optional[Tensor] = None, progress: bool = False,
              on_row: Optional[Callable[[list[dict]], None]] = None, judge_id: Optional[str] = None) -> list[dict]:
    """One row per (sampler, steps, temperature) with its quality metrics, the number of
    steps the samples took and the forward passes (planner + denoiser sequences
    evaluated) per sample; plus a row for the `reference` sequences (held-out text).
    Every configuration uses the same seed (the same initial noise). on_row(rows so
    far) is called after each row, so a caller can save the sweep as it goes.

    Args:
        samplers: the samplers to run.
        steps: the step budgets.
        temperatures: the temperatures.
        num_samples: samples a configuration.
        judge: the judge (see judge_nll).
        vocab_size: V.
        seed: the seed of every configuration.
        batch_size: samples a sampler call.
        reference: Long[N, D] held-out sequences, or None.
        progress: draw a progress bar on a terminal.
        on_row: called with the rows so far after each row.
        judge_id: what names the judge (a digest of its weights), recorded in every row's
            JUDGE column so that merge_sweeps refuses parts judged by others; None: no column.

    Returns:
        The rows, dicts of SWEEP_COLUMNS (and JUDGE).

    Raises:
        TypeError: a sampler that is not a SamplerSpec or whose run is not callable, or a
            step budget, temperature or count of the wrong type.
        ValueError: no samplers, no step budgets or temperatures, or a value out of range.
    """
    if not samplers:
        raise ValueError("samplers: expected at least one SamplerSpec, got none")
    for spec in samplers:
        if not isinstance(spec, SamplerSpec):
            raise TypeError(f"samplers must be SamplerSpec, got {type(spec).__name__}")
        check_callable(f"sampler {spec.name!r} run", spec.run)
    steps = [check_int("steps", s, 1) for s in steps]
    temperatures = [check_float("temperatures", t, 0.0) for t in temperatures]  # NaN refused too
    if not steps or not temperatures:
        raise ValueError(f"steps and temperatures must be non-empty, got {steps}, {temperatures}")
    num_samples = check_int("num_samples", num_samples, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    rows = []
    judged = {} if judge_id is None else {JUDGE: judge_id}
    if reference is not None:
        rows.append({"sampler": REFERENCE, "steps": "", "temperature": "", **judged,
                     **quality_metrics(reference, judge, vocab_size, batch_size)})
        if on_row is not None:
            on_row(rows)
    configs = [(spec, s, t) for spec in samplers for s in steps for t in temperatures]
    for spec, s, t in tqdm(configs, desc="sweep", unit="config", disable=None if progress else True):
        start = time.perf_counter()
        tokens, mean_steps, nfe = _sample(spec, num_samples, s, t, seed, batch_size)
        seconds = time.perf_counter() - start
        # the judge ahead of the columns the reference row lacks: one column order with it or without
        rows.append({"sampler": spec.name, "steps": s, "temperature": t, **judged,
                     **quality_metrics(tokens, judge, vocab_size, batch_size),
                     "mean_steps": mean_steps, "nfe": nfe, "sampling_seconds": seconds})
        if on_row is not None:
            on_row(rows)
    return rows


def sweep_markdown(rows: list[dict]) -> str:
    """The sweep as a Markdown table.

    Args:
        rows: rows of run_sweep or read_sweep.

    Returns:
        The table.
    """
    return markdown_table(rows, SWEEP_COLUMNS)


def plot_quality(rows: list[dict], path: str) -> None:
    """Judge NLL versus unigram entropy, one panel per step budget (the comparison at a
    matched budget): in each, one line per sampler through its temperatures (labelled),
    the reference as a star, like the paper's text8 figure. Raises MissingDependency
    without matplotlib.

    Args:
        rows: rows of run_sweep or read_sweep.
        path: the image file to write.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    plt = pyplot()
    reference = [r for r in rows if r["sampler"] == REFERENCE]
    runs = [r for r in rows if r["sampler"] != REFERENCE]
    budgets = sorted({r["steps"] for r in runs})
    names = list(dict.fromkeys(r["sampler"] for r in runs))
    columns = min(len(budgets), 2) or 1
    lines = -(-max(len(budgets), 1) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(6 * columns, 4.5 * lines), squeeze=False)
    colors = plt.get_cmap("tab20")
    for ax, budget in zip(axes.flat, budgets):
        for name in names:
            points = sorted((r for r in runs if r["sampler"] == name and r["steps"] == budget),
                            key=lambda r: r["temperature"])
            if not points:
                continue
            ax.plot([p["entropy"] for p in points], [p["judge_nll"] for p in points], marker=_marker(name),
                    markersize=4, color=colors(names.index(name) % 20), label=name)
            for p in points:
                ax.annotate(f"{p['temperature']:g}", (p["entropy"], p["judge_nll"]), fontsize=5, alpha=0.6)
        for row in reference:
            ax.scatter([row["entropy"]], [row["judge_nll"]], marker="*", s=150, color="black", label=REFERENCE,
                       zorder=3)
        ax.set_title(f"{budget} steps", fontsize=9)
        ax.set_xlabel("unigram entropy per sample (bits)", fontsize=8)
        ax.set_ylabel("judge NLL (nats per token)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(budgets):]:
        ax.axis("off")
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * ((len(handles) + 3) // 4), 1, 1))
    save_figure(fig, path, dpi=150)


def _marker(sampler: str) -> str:
    """One marker per family: DDPD Gillespie, planned tau-leaping, DFM tau-leaping, MaskGIT."""
    for prefix, marker in (("ddpd-", "o"), ("tau-planned", "s"), ("dfm", "^"), ("maskgit", "D")):
        if sampler.startswith(prefix):
            return marker
    return "."


def write_sweep(rows: list[dict], out_dir: str) -> dict[str, Optional[str]]:
    """Write sweep.csv, sweep.md and sweep.png under out_dir; returns their paths
    ('plot' is None when matplotlib is missing, with the reason under 'plot_skipped').

    Args:
        rows: rows of run_sweep or read_sweep.
        out_dir: the directory to write.

    Returns:
        {"csv", "markdown", "plot"} -> path ("plot" None, with "plot_skipped", without
        matplotlib).

    Raises:
        OutputError: the files cannot be written.
    """
    paths: dict[str, Optional[str]] = {"csv": os.path.join(out_dir, "sweep.csv"),
                                       "markdown": os.path.join(out_dir, "sweep.md")}
    write_csv(rows, paths["csv"])
    write_text(sweep_markdown(rows), paths["markdown"])
    paths["plot"] = os.path.join(out_dir, "sweep.png")
    try:
        plot_quality(rows, paths["plot"])
    except MissingDependency as err:
        paths["plot"], paths["plot_skipped"] = None, str(err)
    return paths


def _parse_cell(text: str):
    """A CSV cell back to what write_csv wrote: int, float, None (an empty cell) or str."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# What a configuration row of a sweep must hold (the reference row has no steps or
# temperature): read_sweep refuses anything else rather than compare or merge it wrongly.
_MEASURED = ("judge_nll", "entropy")
_NUMBERS = {key for key, _, _ in SWEEP_COLUMNS} - {"sampler"}  # columns of one's own may hold text


def read_sweep(path: str) -> list[dict]:
    """The rows of a sweep.csv written by write_sweep, checked: ValueError naming the file
    (and line) for text that is not UTF-8 or not CSV, a missing column, a row whose cells
    do not match the header, a sampler's steps that are not an int >= 1, a temperature or
    a measurement that is not a finite number (the other columns of SWEEP_COLUMNS: numbers
    or empty; columns of one's own are kept as they are), a
    configuration (sampler, steps, temperature) that appears twice, or no row at all.

    Args:
        path: a sweep.csv.

    Returns:
        The rows.

    Raises:
        ValueError: the file is not such a sweep.
    """
    rows, lines = [], []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a spreadsheet's byte-order mark
            reader = csv.DictReader(f)
            for row in reader:
                rows.append(row)
                lines.append(reader.line_num)
            header = reader.fieldnames or []
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except csv.Error as err:
        raise ValueError(f"{path} line {reader.line_num + 1}: not CSV ({err})") from None  # the line being read
    missing = [c for c in ("sampler", "steps", "temperature", *_MEASURED) if c not in header]
    if missing:
        raise ValueError(f"{path}: not a sweep CSV (no {', '.join(missing)} column; write one with ddpd-eval quality)")
    if {"policy", "passes"} <= set(header):  # a frontier's rows share sampler, steps and temperature across policies
        raise ValueError(f"{path}: a frontier CSV (ddpd-eval frontier), not a sweep CSV; its frontier.md compares "
                         "its policies")
    if not rows:
        raise ValueError(f"{path}: holds no row")
    seen: dict[tuple, int] = {}
    for row, line in zip(rows, lines):
        key = _check_sweep_row(row, f"{path} line {line}", len(header))
        if key in seen:
            raise ValueError(f"{path} line {line}: configuration {key} already appears on line {seen[key]}")
        seen[key] = line
    return rows


def _check_sweep_row(row: dict, where: str, columns: int) -> tuple:
    """Parse one row of a sweep in place; returns its (sampler, steps, temperature)."""
    if None in row:  # csv.DictReader keeps extra cells under None, and gives None for missing ones
        raise ValueError(f"{where}: more cells than the {columns} of the header")
    if None in row.values():
        raise ValueError(f"{where}: fewer cells than the {columns} of the header")
    for key, text in row.items():
        if key not in ("sampler", JUDGE):  # a digest of digits alone is still text
            row[key] = _parse_cell(text)
            if key in _NUMBERS and isinstance(row[key], str):
                raise ValueError(f"{where}: {key} must be a number, got {text[:40]!r}")
    if not row["sampler"]:
        raise ValueError(f"{where}: the sampler is empty")
    reference = row["sampler"] == REFERENCE
    finite = _MEASURED if reference else ("temperature", *_MEASURED)
    for key in finite:
        if not isinstance(row[key], (int, float)) or not math.isfinite(row[key]):
            raise ValueError(f"{where}: {key} must be a finite number, got {row[key]!r}")
    if isinstance(row["steps"], float) and row["steps"].is_integer():
        row["steps"] = int(row["steps"])  # 8.0, as a spreadsheet may write 8
    if reference:
        row["steps"] = row["temperature"] = ""
    elif not isinstance(row["steps"], int) or row["steps"] < 1:
        raise ValueError(f"{where}: steps must be an int >= 1, got {row['steps']!r}")
    return row["sampler"], row["steps"], row["temperature"]


def merge_sweeps(parts: Sequence[list[dict]], names: Optional[Sequence[str]] = None) -> list[dict]:
    """One sweep from several: the first reference row, then every configuration row in
    the order given. Raises ValueError when a configuration appears in two parts (named
    by `names`, default their positions), when two parts record different judges (their
    JUDGE column; a part written without one is taken as any), or when two parts' reference
    rows differ beyond float noise: their samples were judged by different judges, or
    against other held-out text.

    Args:
        parts: the sweeps' rows.
        names: each part's name for messages; None: their positions.

    Returns:
        The merged rows.

    Raises:
        ValueError: names not one per part, a row without a column the merge reads (sampler; steps and temperature,
            or a reference row's judge_nll and entropy), a configuration in two parts, parts of
            different judges, or parts with different reference rows.
    """
    names = list(names) if names is not None else [f"sweep {i + 1}" for i in range(len(parts))]
    if len(names) != len(parts):  # zip() dropped the parts past the last name, without a word
        raise ValueError(f"merge_sweeps: names must name each of the {len(parts)} parts, got {len(names)}")
    _check_columns(parts, names)
    _check_one_judge(parts, names)
    reference, rows, seen = [], [], {}
    for name, part in zip(names, parts):
        for row in part:
            if row["sampler"] == REFERENCE:
                if not reference:
                    reference, reference_part = [row], name
                elif not all(math.isclose(float(row[k]), float(reference[0][k]), rel_tol=1e-5) for k in _MEASURED):
                    raise ValueError(f"the reference rows of {reference_part} and {name} differ (judge NLL "
                                     f"{reference[0]['judge_nll']} and {row['judge_nll']}): their samples were "
                                     "judged by other judges or against other held-out text")
                continue
            key = (row["sampler"], row["steps"], row["temperature"])
            if key in seen:
                raise ValueError(f"configuration {key} appears in both {seen[key]} and {name}")
            seen[key] = name
            rows.append(row)
    return reference + rows


def _check_columns(parts: Sequence[list[dict]], names: Sequence[str]) -> None:
    """ValueError naming the part and row that lacks a column merge_sweeps reads (a row of a
    foreign CSV: a frontier's, one's own), where the merge raised a bare KeyError."""
    for name, part in zip(names, parts):
        for i, row in enumerate(part, start=1):
            needed = ("sampler",) + (_MEASURED if row.get("sampler") == REFERENCE else ("steps", "temperature"))
            missing = [key for key in needed if key not in row]
            if missing:
                raise ValueError(f"{name} row {i}: no {', '.join(missing)} column (not a row of a sweep CSV, "
                                 "ddpd-eval quality's)")


def _check_one_judge(parts: Sequence[list[dict]], names: Sequence[str]) -> None:
    """ValueError when the parts' JUDGE columns name more than one judge: without reference
    rows nothing else tells their NLLs apart."""
    first = None
    for name, part in zip(names, parts):
        for row in part:
            judge = row.get(JUDGE)
            if judge in (None, ""):  # a sweep written before the column, or not by ddpd-eval quality
                continue
            if first is None:
                first = (name, judge)
            elif judge != first[1]:
                raise ValueError(f"{first[0]} and {name} were judged by different judges ({first[1]} and {judge}): "
                                 "their judge NLLs do not compare; merge sweeps of one judge")


COMPARE_COLUMNS = (("steps", "Steps", ""), ("sampler", "Sampler", ""), ("baseline", "Baseline", ""),
                   ("verdict", "Judge NLL vs baseline", ""), ("better", "better", ""), ("worse", "worse", ""),
                   ("undecided", "undecided", ""),
                   ("nll_difference", "NLL difference at matched entropy (nats/token)", "+.3f"),
                   ("nll_difference_se", "± s.e.", ".3f"), ("matched", "matched points", ""))


def _interpolate(points: list[dict], entropy: float) -> Optional[tuple[float, dict, float]]:
    """The piecewise-linear curve through `points` (sorted by entropy) at `entropy`: (NLL, its
    derivatives {("judge_nll" | "entropy", index in points): d}, its slope in entropy), or None
    outside the points' entropy range (no extrapolation)."""
    for i, (a, b) in enumerate(zip(points, points[1:])):
        if a["entropy"] <= entropy <= b["entropy"] and b["entropy"] > a["entropy"]:
            w = (entropy - a["entropy"]) / (b["entropy"] - a["entropy"])
            slope = (b["judge_nll"] - a["judge_nll"]) / (b["entropy"] - a["entropy"])
            return ((1 - w) * a["judge_nll"] + w * b["judge_nll"],
                    {("judge_nll", i): 1 - w, ("judge_nll", i + 1): w,
                     ("entropy", i): -slope * (1 - w), ("entropy", i + 1): -slope * w}, slope)
    exact = [i for i, p in enumerate(points) if p["entropy"] == entropy]
    return (points[exact[0]]["judge_nll"], {("judge_nll", exact[0]): 1.0}, 0.0) if exact else None


def difference_at(curve: list[dict], point: dict) -> Optional[tuple[float, Optional[float]]]:
    """The NLL of the piecewise-linear curve through `curve`'s rows (a temperature sweep) at
    `point`'s entropy minus `point`'s NLL, and its standard error (the delta method, as
    matched_entropy's); None outside the curve's entropy range (no extrapolation).

    Args:
        curve: rows with "judge_nll" and "entropy" (and their "_se"), numbers.
        point: a row likewise.

    Returns:
        (difference, standard error or None), or None.
    """
    ours = sorted(curve, key=lambda r: r["entropy"])
    got = _point_difference(ours, point, ("point", 0))
    if got is None:
        return None
    rows = {("ours", i): r for i, r in enumerate(ours)} | {("point", 0): point}
    return got[0], _difference_se(got[1], rows)


def _point_difference(ours: list[dict], point: dict, key: tuple) -> Optional[tuple[float, dict]]:
    """(the curve through `ours` at `point`'s entropy minus `point`'s NLL, its derivatives
    {(row key, "judge_nll" | "entropy"): d}, ours' rows keyed ("ours", i) and point's `key`),
    or None outside the curve's entropy range."""
    got = _interpolate(ours, point["entropy"])
    if got is None:
        return None
    nll, derivatives, slope = got
    gradient = {(("ours", i), m): d for (m, i), d in derivatives.items()}
    gradient.update({(key, "judge_nll"): -1.0, (key, "entropy"): slope})
    return nll - point["judge_nll"], gradient


def _difference_se(gradient: dict, rows: dict) -> Optional[float]:
    """The delta method's standard error of a function of the rows' judge NLLs and entropies
    with derivatives `gradient` {(row key, "judge_nll" | "entropy"): d}, each row's two taken
    as independent; None when a row involved has no standard error."""
    variance = 0.0
    for (key, measure), d in gradient.items():
        se = rows[key].get(f"{measure}_se")
        if se in (None, "") or math.isnan(float(se)):  # NaN: a row of one sample
            return None
        variance += (d * float(se)) ** 2
    return math.sqrt(variance)


def matched_entropy(rows: list[dict], sampler: str, baseline: str, steps: int) -> Optional[dict]:
    """Judge NLL of `sampler` against `baseline` at one step budget, at matched unigram
    entropy. Each temperature sweep is a curve NLL(entropy). A baseline point counts as
    'better' for the sampler when the sampler's curve passes below it at the same
    entropy (interpolated, never extrapolated) or, outside the curve's range, when a
    sampler point has at least its entropy and at most its NLL (better on both axes);
    'worse' in the mirror cases; else 'undecided'. The verdict is 'lower' or 'higher'
    when every decided point agrees, 'mixed' otherwise, 'not comparable' with none
    decided; nll_difference is the mean difference over the interpolated points, and
    nll_difference_se its standard error by the delta method from the rows' judge_nll_se and
    entropy_se (the entropy's through the curve's slope; None when a row lacks one): the
    verdict counts points, so a difference within two standard errors is a tie whatever the
    verdict says. None when either sampler has no row at this budget.

    Args:
        rows: rows of a sweep.
        sampler: the sampler's name.
        baseline: the baseline's name.
        steps: the step budget.

    Returns:
        {"steps", "sampler", "baseline", "verdict", the point counts, "nll_difference",
        "nll_difference_se", "matched"}, or None.
    """
    def points(name):
        return sorted((r for r in rows if r["sampler"] == name and r["steps"] == steps), key=lambda r: r["entropy"])

    ours, theirs = points(sampler), points(baseline)
    if not ours or not theirs:
        return None
    counts, differences, gradients = {"better": 0, "worse": 0, "undecided": 0}, [], []
    for k, b in enumerate(theirs):
        got = _point_difference(ours, b, ("theirs", k))
        if got is not None:
            differences.append(got[0])
            gradients.append(got[1])
            outcome = "better" if got[0] < 0 else "worse" if got[0] > 0 else "undecided"
        elif any(p["entropy"] >= b["entropy"] and p["judge_nll"] <= b["judge_nll"] for p in ours):
            outcome = "better"
        elif any(p["entropy"] <= b["entropy"] and p["judge_nll"] >= b["judge_nll"] for p in ours):
            outcome = "worse"
        else:
            outcome = "undecided"
        counts[outcome] += 1
    decided = counts["better"] + counts["worse"]
    verdict = ("not comparable" if not decided else "lower" if not counts["worse"] else
               "higher" if not counts["better"] else "mixed")
    return {"steps": steps, "sampler": sampler, "baseline": baseline, "verdict": verdict, **counts,
            "nll_difference": sum(differences) / len(differences) if differences else None,
            "nll_difference_se": _mean_se(gradients, ours, theirs), "matched": len(differences)}


def _mean_se(gradients: list[dict], ours: list[dict], theirs: list[dict]) -> Optional[float]:
    """The standard error of the mean of the matched differences whose derivatives are
    `gradients` (the sampler's points shared by several differences count once)."""
    if not gradients:
        return None
    mean: dict = {}
    for gradient in gradients:
        for key, d in gradient.items():
            mean[key] = mean.get(key, 0.0) + d / len(gradients)
    rows = {("ours", i): r for i, r in enumerate(ours)} | {("theirs", k): r for k, r in enumerate(theirs)}
    return _difference_se(mean, rows)


def compare_markdown(rows: list[dict]) -> str:
    """matched_entropy results as a Markdown table.

    Args:
        rows: matched_entropy dicts.

    Returns:
        The table.
    """
    return markdown_table(rows, COMPARE_COLUMNS)
