"""The frontier sweep (ddpd.eval.frontier, ddpd-eval frontier) and the n-gram judge."""
import collections
import csv
import math
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from ddpd.cli.eval import main
from ddpd.eval.frontier import (
    Config,
    against_baselines,
    budget,
    frontier_markdown,
    passes_to_reach,
    read_frontier,
    rows_of,
    run_frontier,
)
from ddpd.eval.ngram import NGramJudge
from ddpd.eval.report import write_csv


class Uniform:
    """A judge that gives every token probability 1/V."""

    def __init__(self, vocab):
        self.vocab = vocab

    def log_likelihood(self, x):
        return torch.full((x.shape[0],), -x.shape[1] * math.log(self.vocab))


def fake(calls, passes=4):
    def run(n, first):
        calls.append((n, first))
        tokens = (torch.arange(first, first + n)[:, None] + torch.arange(6)) % 5
        return SimpleNamespace(tokens=tokens, planner_passes=torch.full((n,), passes // 2),
                               denoiser_passes=torch.full((n,), passes - passes // 2), commits=torch.full((n,), 6))
    return run


def test_run_frontier_measures_each_configuration_once_and_resumes(tmp_path):
    path = str(tmp_path / "frontier.csv")
    calls = []
    configs = [Config("ddpd", "one-at-a-time", 3, 1.0, fake(calls, 6)),
               Config("maskgit", "maskgit", 3, 1.0, fake(calls))]
    rows = run_frontier(configs, judge=Uniform(5), vocab_size=5, num_samples=5, seed=0, batch_size=2, csv_path=path)
    assert calls == [(2, 0), (2, 2), (1, 4)] * 2
    assert [r["passes"] for r in rows] == [6.0, 4.0]
    assert rows[0]["tokens_per_pass"] == pytest.approx(1.0)
    assert rows[0]["judge_nll"] == pytest.approx(math.log(5))
    calls.clear()
    more = configs + [Config("maskgit", "threshold:threshold=0.9", 3, 1.0, fake(calls))]
    again = run_frontier(more, judge=Uniform(5), vocab_size=5, num_samples=5, seed=0, batch_size=2, csv_path=path)
    assert calls == [(2, 0), (2, 2), (1, 4)]  # only the new configuration ran
    assert len(again) == 3 and len(read_frontier(path)) == 3
    with open(path, newline="") as f:
        assert len(list(csv.DictReader(f))) == 3


def test_run_frontier_gives_resumed_and_measured_rows_the_same_types(tmp_path):
    """Resumed rows had steps, num_samples and seed as text beside the measured rows' ints: sorting
    the rows by steps raised."""
    path = str(tmp_path / "frontier.csv")
    configs = [Config("maskgit", "maskgit", 3, 1.0, fake([]), budget=3), Config("maskgit", "maskgit", 5, 1.0, fake([]))]
    run_frontier(configs[:1], judge=Uniform(5), vocab_size=5, num_samples=2, seed=7, batch_size=2, csv_path=path)
    rows = run_frontier(configs, judge=Uniform(5), vocab_size=5, num_samples=2, seed=7, batch_size=2, csv_path=path)
    assert [(r["steps"], r["budget"], r["num_samples"], r["seed"]) for r in rows] == [(3, 3, 2, 7), (5, "", 2, 7)]
    assert sorted(r["steps"] for r in rows) == [3, 5]


def test_run_frontier_refuses_a_csv_that_measures_a_configuration_twice(tmp_path):
    """Two CSVs joined by hand: the later row of a configuration was kept and the earlier one
    dropped from the file on the next write, without a word."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    config = Config("maskgit", "maskgit", 3, 1.0, fake(calls))
    run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    with open(path, newline="") as f:
        row = next(csv.DictReader(f))
    write_csv([row, dict(row, temperature="1.00", judge_nll="9.0")], path)
    with pytest.raises(ValueError, match=f"^{path} lines 2 and 3: the same configuration measured twice"):
        run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    assert len(calls) == 1 and len(read_frontier(path)) == 2  # nothing measured, nothing dropped


@pytest.mark.parametrize("change, error, match", [
    (dict(num_samples=0), ValueError, "num_samples must be >= 1, got 0"),
    (dict(num_samples=-3), ValueError, "num_samples must be >= 1, got -3"),
    (dict(num_samples=2.0), TypeError, "num_samples must be an int"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
    (dict(batch_size=None), TypeError, "batch_size must be an int"),
])
def test_run_frontier_names_a_bad_sample_count(tmp_path, change, error, match):
    calls = []
    args = dict(judge=Uniform(5), vocab_size=5, num_samples=2, seed=0, batch_size=2,
                csv_path=str(tmp_path / "frontier.csv"))
    with pytest.raises(error, match=match):
        run_frontier([Config("maskgit", "maskgit", 3, 1.0, fake(calls))], **{**args, **change})
    assert not calls and not os.path.exists(args["csv_path"])


@pytest.mark.parametrize("cell, value", [("judge_nll", "abc"), ("seconds", "1,5"), ("temperature", "T")])
def test_read_frontier_names_the_file_line_and_column_of_a_cell_that_is_no_number(tmp_path, cell, value):
    """A non-numeric cell raised "could not convert string to float: 'abc'", naming no file."""
    path = tmp_path / "frontier.csv"
    rows = {"sampler": "ddpd", "policy": "one-at-a-time", "steps": "3", "temperature": "1.0", "num_samples": "5",
            "seed": "0", "judge_nll": "1.5", "entropy": "4.0", "passes": "6", "seconds": "0.5"}
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows))
        writer.writeheader()
        writer.writerows([rows, dict(rows, **{cell: value})])
    with pytest.raises(ValueError) as err:
        read_frontier(str(path))
    assert str(err.value) == f"{path} line 3, column {cell}: {value!r} is not a number"


def test_read_frontier_reads_whole_numbers_written_as_floats(tmp_path):
    """A spreadsheet's 16.0 in the budget column gave a bare int() error, and 3.0 steps a key
    that no configuration matched (measured again on resume)."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    config = Config("maskgit", "maskgit", 3, 1.0, fake(calls), budget=16)
    run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    write_csv([dict(rows[0], steps="3.0", budget="16.0", num_samples="1.0")], path)
    again = run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    assert len(calls) == 1 and budget(again[0]) == 16
    write_csv([dict(rows[0], budget="16.5")], path)
    with pytest.raises(ValueError, match=r"line 2, column budget: '16.5' is not a whole number"):
        read_frontier(path)
    write_csv([dict(rows[0], seed="seven")], path)  # no number at all: Decimal's own error named nothing
    with pytest.raises(ValueError, match=r"line 2, column seed: 'seven' is not a whole number"):
        read_frontier(path)


def test_a_ddpd_row_without_a_budget_is_filed_under_its_configurations_budget(tmp_path):
    """A row written without a budget cell had its budget guessed as round(passes): a ddpd row
    stopped early at budget 32 (30.4 mean passes) was filed under 30, away from its sweep."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    config = Config("ddpd", "one-at-a-time", 16, 1.0, fake(calls), budget=32)
    run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    old = {k: v for k, v in read_frontier(path)[0].items() if k != "budget"}
    write_csv([dict(old, passes=30.4)], path)
    assert budget(read_frontier(path)[0]) == 31  # read alone: at least the passes it spent
    again = run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1,
                         csv_path=path)
    assert len(calls) == 1 and budget(again[0]) == 32  # resumed: its configuration says
    assert [budget(r) for r in read_frontier(path)] == [32]  # and the CSV keeps it for the reports


def test_run_frontier_keys_each_temperature_exactly(tmp_path):
    """The key wrote a temperature with :g, six digits: 1.0000001 took the row of 1.0."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    near = [Config("maskgit", "maskgit", 3, t, fake(calls)) for t in (1.0, 1.0000001)]
    run_frontier(near[:1], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    rows = run_frontier(near, judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    assert calls == [(1, 0), (1, 0)] and [r["temperature"] for r in rows] == [1.0, 1.0000001]


@pytest.mark.parametrize("name", ["frontier.csv", "matched-64-samples.csv", "matched-128-samples.csv"])
def test_the_committed_frontiers_resume_with_nothing_left_to_measure(tmp_path, name):
    """Their rows stay keyed as the sweeps that wrote them key them (--temperatures 0.9 1.0 1.1).
    (planner-on-draws-frontier.csv joins two planners' sweeps, told apart by its planner column:
    no one run's CSV, which run_frontier refuses to resume.)"""
    import shutil
    from pathlib import Path

    path = tmp_path / name
    shutil.copy(Path(__file__).resolve().parents[2] / "docs" / "parallel" / name, path)
    rows = read_frontier(str(path))
    by_value = {t: t for t in (0.9, 1.0, 1.1)}  # as argparse reads --temperatures
    for (num_samples, seed) in {(r["num_samples"], r["seed"]) for r in rows}:
        configs = [Config(r["sampler"], r["policy"], int(r["steps"]), by_value[r["temperature"]],
                          lambda n, first: pytest.fail("measured again")) for r in rows
                   if (r["num_samples"], r["seed"]) == (num_samples, seed)]
        again = run_frontier(configs, judge=Uniform(27), vocab_size=27, num_samples=int(num_samples),
                             seed=int(seed), batch_size=16, csv_path=str(path))
        assert len(again) == len(configs)
    assert path.read_bytes() == (Path(__file__).resolve().parents[2] / "docs" / "parallel" / name).read_bytes()


def test_a_signal_while_a_row_is_written_keeps_the_row(tmp_path, monkeypatch, signal_raises):
    """A signal handler's exception as the CSV was being written dropped the row just measured."""
    import ddpd.eval.frontier as frontier

    write_csv = frontier.write_csv

    def write_then_signal(rows, path):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before kill returns
        write_csv(rows, path)

    path, calls = str(tmp_path / "frontier.csv"), []
    monkeypatch.setattr(frontier, "write_csv", write_then_signal)
    with pytest.raises(signal_raises):
        run_frontier([Config("maskgit", "maskgit", 3, 1.0, fake(calls))], judge=Uniform(5), vocab_size=5,
                     num_samples=2, seed=0, batch_size=2, csv_path=path)
    assert [row["policy"] for row in read_frontier(path)] == ["maskgit"]


def test_a_resumed_frontiers_bar_starts_at_the_rows_already_measured(tmp_path, monkeypatch):
    """The rows taken from the CSV went through the bar as configurations finished in no
    time, and its rate and time left counted them: a resumed sweep said it was nearly done."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    path, calls = str(tmp_path / "frontier.csv"), []
    configs = [Config("maskgit", "maskgit", s, 1.0, fake(calls)) for s in (3, 4, 5)]
    run_frontier(configs[:2], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    monkeypatch.setattr(sys, "stderr", Terminal())
    run_frontier(configs, judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path,
                 progress=True)
    frames = sys.stderr.getvalue().replace("\r", "\n").split("\n")
    assert "| 2/3 [" in next(f for f in frames if f) and "| 3/3 [" in frames[-2], frames


def test_passes_to_reach_takes_the_cheapest_configuration_at_matched_entropy():
    def row(policy, nll, entropy, passes):
        return dict(sampler="ddpd", policy=policy, steps=8, temperature=1.0, judge_nll=nll, entropy=entropy,
                    passes=passes)

    rows = [row("error-budget:bound=4", 1.9, 4.0, 16.0), row("error-budget:bound=4", 2.01, 4.02, 8.0),
            row("error-budget:bound=4", 2.5, 4.0, 4.0), row("error-budget:bound=1", 2.3, 4.0, 8.0),
            dict(row("maskgit", 1.5, 3.5, 8.0), sampler="maskgit")]
    reach = {r["family"]: r for r in passes_to_reach(rows, 2.0, 4.0)}
    assert reach["ddpd error-budget:bound=4"]["reached"] and reach["ddpd error-budget:bound=4"]["passes"] == 8.0
    assert not reach["ddpd error-budget:bound=1"]["reached"] and reach["ddpd error-budget:bound=1"]["judge_nll"] == 2.3
    assert not reach["maskgit maskgit"]["reached"]  # its entropy is 12% lower: not matched
    assert [r["family"] for r in passes_to_reach(rows, 2.0, 4.0, label=str.upper)] == [
        "DDPD ERROR-BUDGET:BOUND=4", "DDPD ERROR-BUDGET:BOUND=1", "MASKGIT MASKGIT"]


def test_passes_to_reach_reads_each_budget_at_the_targets_own_entropy():
    def row(policy, steps, temperature, nll, entropy):
        return dict(sampler="maskgit", policy=policy, steps=steps, temperature=temperature, judge_nll=nll,
                    entropy=entropy, passes=float(steps), judge_nll_se=0.03, entropy_se=0.01)

    target = dict(judge_nll=2.312, entropy=3.956, judge_nll_se=0.03, entropy_se=0.01)
    # within the 1% window at T 0.9 (2.300 at 0.95% less entropy), yet 0.10 above the target at its entropy
    steep = [row("a", 32, 0.9, 2.300, 3.918), row("a", 32, 1.1, 2.526, 3.994)]
    # budget 64 passes below the target at its entropy, budget 128 too: the fewer passes win
    low = [row("b", 64, 0.9, 2.20, 3.90), row("b", 64, 1.1, 2.40, 4.00),
           row("b", 128, 0.9, 2.10, 3.90), row("b", 128, 1.1, 2.30, 4.00)]
    short = [row("c", 32, 0.9, 2.0, 3.80), row("c", 32, 1.1, 2.1, 3.90)]  # its sweep ends below 3.956
    reach = {r["family"]: r for r in passes_to_reach(steep + low + short, 2.312, 3.956, target=target)}
    a, b, c = reach["maskgit a"], reach["maskgit b"], reach["maskgit c"]
    assert a["reached"] and not a["matched_reached"]
    assert a["matched_difference"] == pytest.approx(2.300 + 0.038 * 0.226 / 0.076 - 2.312)
    assert a["matched_difference_se"] > 0.03  # the target's own 0.03 and the curve's at least
    assert b["matched_reached"] and b["matched_passes"] == 64.0
    assert b["matched_difference"] == pytest.approx(0.0, abs=1e-9)  # 2.20 + 0.56 * 0.2: the target
    assert c["matched_reached"] is None and c["matched_difference"] is None  # never extrapolated
    assert passes_to_reach(steep, 2.312, 3.956)[0]["matched_difference_se"] is None  # no target row: no s.e.


def test_passes_to_reach_breaks_a_tie_at_the_targets_entropy_by_the_smaller_budget():
    """Two budgets reaching the target at the same passes and difference went on to compare their
    standard errors, one None (its rows of one sample): TypeError instead of a reach table."""
    def row(steps, temperature, nll, entropy, se):
        return dict(sampler="maskgit", policy="threshold:0.9", steps=steps, temperature=temperature, judge_nll=nll,
                    entropy=entropy, passes=20.0, judge_nll_se=se, entropy_se=se)

    target = dict(judge_nll=2.3, entropy=3.95, judge_nll_se=0.03, entropy_se=0.01)
    rows = [row(64, 0.9, 2.2, 3.9, 0.02), row(64, 1.1, 2.4, 4.0, 0.02),  # an adaptive policy done in 20 passes
            row(32, 0.9, 2.2, 3.9, math.nan), row(32, 1.1, 2.4, 4.0, math.nan)]
    reach = passes_to_reach(rows, 2.3, 3.95, target=target)[0]
    assert reach["matched_reached"] and reach["matched_passes"] == 20.0
    assert reach["matched_difference_se"] is None  # budget 32's reading, the smaller budget


def test_against_baselines_compares_each_ddpd_policy_at_its_budget_and_matched_entropy():
    def row(sampler, policy, steps, temperature, nll, entropy, passes):
        return dict(sampler=sampler, policy=policy, steps=steps, temperature=temperature, judge_nll=nll,
                    entropy=entropy, passes=passes)

    rows = [row("ddpd", "one-at-a-time", 16, 1.0, 5.0, 4.0, 32.0),
            row("ddpd", "error-budget:bound=0", 32, 0.9, 2.0, 3.80, 32.0),  # budget 32: curve 2.0 -> 2.4
            row("ddpd", "error-budget:bound=0", 32, 1.1, 2.4, 4.00, 32.0),
            row("maskgit", "maskgit", 32, 1.0, 2.3, 3.90, 32.0),  # the curve gives 2.2 here: better
            row("maskgit", "maskgit", 64, 1.0, 1.0, 3.90, 64.0),  # no ddpd row at 64
            row("maskgit", "threshold:0.9", 32, 1.0, 2.1, 3.95, 20.0)]  # adaptive: fewer passes, budget 32
    assert [budget(r) for r in rows] == [32, 32, 32, 32, 64, 32]
    assert budget(dict(rows[3], budget="128")) == 128  # a stored budget wins
    compared = against_baselines(rows)
    assert [(c["steps"], c["baseline"], c["verdict"]) for c in compared] == \
        [(32, "maskgit maskgit", "lower"), (32, "maskgit threshold:0.9", "higher")]
    assert compared[0]["nll_difference"] == pytest.approx(-0.1)
    assert compared[1]["nll_difference"] == pytest.approx(0.2)


def test_a_row_not_finite_is_left_out_of_the_reach_and_comparison_tables():
    """A NaN judge NLL (a judge's, or a cell edited) compares false with everything: it became its
    family's best NLL at matched entropy, and broke the temperature sweep's curve, so the family
    neither reached the target nor compared with the baseline, which its other rows do."""
    def row(sampler, policy, temperature, nll, entropy):
        return dict(sampler=sampler, policy=policy, steps=32, temperature=temperature, judge_nll=nll,
                    entropy=entropy, passes=32.0)

    rows = [row("ddpd", "error-budget:bound=0", 1.0, math.nan, 3.9),
            row("ddpd", "error-budget:bound=0", 0.9, 2.0, 3.88), row("ddpd", "error-budget:bound=0", 1.1, 2.4, 4.00),
            row("maskgit", "maskgit", 1.0, 2.3, 3.90)]
    unreached = passes_to_reach(rows, 1.5, 3.9)[0]  # the best NLL at matched entropy: T=0.9's, not NaN
    assert unreached["judge_nll"] == 2.0 and unreached["config"] == "error-budget:bound=0 steps=32 T=0.9"
    reach = passes_to_reach(rows, 2.3, 3.9)[0]  # the curve 2.0 -> 2.4 at 3.9: 2.0 + 0.4 / 6
    assert reach["matched_reached"] and reach["matched_difference"] == pytest.approx(2.0 + 0.4 / 6 - 2.3)
    compared = against_baselines(rows)
    assert [c["verdict"] for c in compared] == ["lower"]
    assert compared[0]["nll_difference"] == pytest.approx(2.0 + 0.4 / 6 - 2.3)
    assert passes_to_reach(rows, 2.3, 3.9) == passes_to_reach(rows[1:], 2.3, 3.9)


def test_ngram_judge_is_a_normalised_law():
    torch.manual_seed(0)
    text = torch.randint(0, 4, (3000,))
    text[::7] = 3  # some structure
    judge = NGramJudge(text, 4, order=3)
    for prefix in ([0, 1], [3, 3], [2, 0]):
        x = torch.tensor([prefix + [w] for w in range(4)])
        total = torch.exp(judge.log_likelihood(x) - judge.log_likelihood(torch.tensor([prefix]))).sum()
        assert float(total) == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="order"):
        NGramJudge(text, 4, order=0)
    with pytest.raises(ValueError, match=r"discount must be in \(0.0, 1.0\), got nan"):
        NGramJudge(text, 4, discount=float("nan"))
    with pytest.raises(TypeError, match="discount must be a number, got str"):
        NGramJudge(text, 4, discount="0.5")
    with pytest.raises(ValueError, match=r"ids in \[0, 4\)"):
        judge.log_likelihood(torch.tensor([[0, 9]]))


@pytest.mark.parametrize("x, error, match", [
    (torch.zeros(0, 3, dtype=torch.long), ValueError, r"x must have shape \[B, D\] with B, D >= 1, got \(0, 3\)"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, r"x must have shape \[B, D\] with B, D >= 1, got \(2, 0\)"),
    (torch.tensor([[0.5, 1.7]]), TypeError, "x must have dtype torch.int64, got torch.float32"),
    (torch.tensor([[True, False]]), TypeError, "x must have dtype torch.int64, got torch.bool"),
    (torch.tensor([[0, 1]], dtype=torch.int32), TypeError, "x must have dtype torch.int64, got torch.int32"),
    ([[0, 1]], TypeError, "x must be a torch.Tensor"),
])
def test_ngram_judge_scores_only_token_ids(x, error, match):
    judge = NGramJudge(torch.tensor([0, 1, 2, 3] * 10), 4, order=3)
    with pytest.raises(error, match=match):
        judge.log_likelihood(x)


@pytest.mark.parametrize("tokens, error, match", [
    (torch.tensor([0.0, 1.0, 2.0, 3.0] * 10), TypeError, "tokens must have dtype torch.int64, got torch.float32"),
    (torch.tensor([True, False] * 10), TypeError, "tokens must have dtype torch.int64, got torch.bool"),
    (torch.tensor([0, 1, 2, 3] * 10, dtype=torch.int32), TypeError, "dtype torch.int64, got torch.int32"),
    ([0, 1, 2, 3] * 10, TypeError, "tokens must be a torch.Tensor"),
    (torch.tensor([0, 1, 2]), ValueError, r"tokens must be more than 3 ids in \[0, 4\), got shape \(3,\)"),
    (torch.zeros(4, 4, dtype=torch.long), ValueError, r"more than 3 ids in \[0, 4\), got shape \(4, 4\)"),
    (torch.tensor([0, 1, 7, 3, -2]), ValueError, r"tokens must be ids in \[0, 4\), got range \[-2, 7\]"),
    (torch.tensor([0, 1, 2, 3, 4]), ValueError, r"tokens must be ids in \[0, 4\), got range \[0, 4\]"),
    (torch.tensor([0, 1, 2, 3, -1]), ValueError, r"tokens must be ids in \[0, 4\), got range \[-1, 3\]"),
])
def test_ngram_judge_counts_only_token_ids(tokens, error, match):
    with pytest.raises(error, match=match):
        NGramJudge(tokens, 4, order=3)


@pytest.mark.parametrize("vocab_size, match", [
    (1, r"^vocab_size must be >= 2, got 1$"),
    (2**60, r"^tokens.numel\(\) \* vocab_size must fit 62 bits, got 8 \* 1152921504606846976$"),
    (2**59, r"^tokens.numel\(\) \* vocab_size must fit 62 bits, got 8 \* 576460752303423488$"),  # just 2**62
])
def test_ngram_judge_refuses_a_vocabulary_it_cannot_key(vocab_size, match):
    """A one-token vocabulary, and one whose n-gram keys (below N V) would overflow, are named."""
    with pytest.raises(ValueError, match=match):
        NGramJudge(torch.zeros(8, dtype=torch.long), vocab_size, order=3)


def _ngram_oracle(text: list, vocab_size: int, order: int, x: list, d: float = 0.75) -> float:
    """log p(x) by the judge's formula from counts in dicts of tuples."""
    counts = collections.Counter(tuple(text[i:i + m]) for m in range(1, order + 1) for i in range(len(text) - m + 1))
    contexts, followers = collections.Counter(), collections.Counter()
    for gram, c in counts.items():
        if len(gram) > 1:
            contexts[gram[:-1]] += c
            followers[gram[:-1]] += 1

    def p(h, w):
        if not h:
            return (counts[(w,)] + 1) / (len(text) + vocab_size)
        lower = p(h[1:], w)
        if contexts[h] == 0:
            return lower
        return (max(counts[h + (w,)] - d, 0) + d * followers[h] * lower) / contexts[h]

    return sum(math.log(p(tuple(x[max(0, i - order + 1):i]), x[i])) for i in range(len(x)))


def test_ngram_judge_is_its_formula_at_any_order_over_a_large_vocabulary():
    """GPT-2's 50257 tokens at order 6: the ids of an n-gram in base V no longer fit an int64
    (the judge refused orders above 3); keys by the rank of each context do."""
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([50256, 7, 31000, 2, 9, 11111])[torch.randint(0, 6, (400,), generator=g)]
    ids[::5] = 42  # a few contexts with several followers
    judge = NGramJudge(ids, 50257, order=6)
    rows = torch.cat([ids[100:120].view(1, -1), ids[:20].flip(0).view(1, -1)])
    got = judge.log_likelihood(rows)
    for row, value in zip(rows.tolist(), got.tolist()):
        assert value == pytest.approx(_ngram_oracle(ids.tolist(), 50257, 6, row), rel=1e-12)


def test_ngram_judge_prefers_text_like_its_corpus():
    torch.manual_seed(0)
    text = torch.tensor([0, 1, 2, 3] * 500)
    judge = NGramJudge(text, 4, order=3)
    assert float(judge.log_likelihood(torch.tensor([[0, 1, 2, 3, 0, 1]]))) > \
        float(judge.log_likelihood(torch.tensor([[3, 2, 1, 0, 3, 2]])))


@pytest.mark.parametrize("rows_first", [1, 0])
def test_an_interrupted_frontier_says_where_its_rows_are_and_how_to_resume(tmp_path, capsys, monkeypatch, rows_first):
    """A frontier stopped by a signal said only "interrupted by SIGINT": not that the rows
    measured are in frontier.csv, nor that the same command resumes from them."""
    import ddpd.eval.frontier as frontier

    write_csv, writes = frontier.write_csv, []

    def write_then_signal(rows, path):
        writes.append(path)
        if len(writes) > rows_first:
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs before kill returns
        write_csv(rows, path)

    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    out = tmp_path / "out"
    monkeypatch.setattr(frontier, "write_csv", write_then_signal)
    argv = ["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "2", "--target-steps", "1",
            "--num-samples", "1", "--policies", "threshold:0.9", "--no-progress", "--out-dir", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    csv_path = out / "frontier.csv"
    assert err.endswith(f"ddpd-eval: interrupted by SIGINT; the {rows_first + 1} row(s) of this sweep measured so far "
                        f"are in {csv_path}, and the same command resumes from them\n"), err
    assert len(read_frontier(str(csv_path))) == rows_first + 1  # the row being written when it came is kept


def test_an_interrupted_frontier_counts_its_own_rows_apart_from_an_earlier_seeds(tmp_path, capsys, monkeypatch):
    """The count was every row of frontier.csv, those of an earlier run into --out-dir with
    another seed among them, as if this sweep had measured them."""
    import ddpd.eval.frontier as frontier

    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "2", "--target-steps", "1",
            "--num-samples", "1", "--policies", "threshold:0.9", "--no-progress", "--out-dir", str(out)]
    assert main([*argv, "--seed", "1"]) == 0
    csv_path = out / "frontier.csv"
    earlier = len(read_frontier(str(csv_path)))
    write_csv = frontier.write_csv

    def write_then_signal(rows, path):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs before kill returns
        write_csv(rows, path)

    capsys.readouterr()
    monkeypatch.setattr(frontier, "write_csv", write_then_signal)
    assert main([*argv, "--seed", "2"]) == 130
    assert capsys.readouterr().err.endswith(
        f"ddpd-eval: interrupted by SIGINT; the 1 row(s) of this sweep measured so far are in {csv_path} "
        f"({earlier + 1} in all), and the same command resumes from them\n")
    assert len(read_frontier(str(csv_path))) == earlier + 1


def test_a_frontier_interrupted_before_its_first_row_says_none_was_finished(tmp_path, capsys, monkeypatch):
    import ddpd.eval.frontier as frontier

    monkeypatch.setattr(frontier, "run_frontier", lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGINT))
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    assert main(["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "2", "--target-steps", "1",
                 "--num-samples", "1", "--no-progress", "--out-dir", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err.endswith("ddpd-eval: interrupted by SIGINT; no configuration was finished\n")


def test_ddpd_eval_frontier_writes_its_reports(tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "2", "--target-steps", "1",
            "--num-samples", "1", "--policies", "error-budget:bound=2,max_k=4", "threshold:0.9", "--fused",
            "--no-progress", "--out-dir", str(out)]
    assert main(argv) == 0
    rows = read_frontier(str(out / "frontier.csv"))
    assert {(r["sampler"], r["policy"].split(":")[0]) for r in rows} == {
        ("ddpd", "one-at-a-time"), ("ddpd", "error-budget"), ("maskgit", "maskgit"), ("maskgit", "threshold")}
    assert (out / "frontier.md").read_text().count("| ddpd |") == 2
    assert {r["budget"] for r in rows} == {2}  # the target's 1 step is a 2-pass budget too
    report = (out / "frontier.md").read_text()  # policies named by their fields off their defaults
    assert "| 2 | ddpd error-budget:bound=2,max_k=4 | maskgit maskgit:choice_temperature=4.5 |" in report
    reach = report.split("Passes to reach")[1].split("Each ddpd policy")[0]
    assert "| ddpd error-budget:bound=2,max_k=4 | " in reach  # and the reach table the same
    assert main(argv) == 0  # resumed: nothing left to run
    assert "Passes to reach" in capsys.readouterr().out
    other_judge = [("ngram:2" if a == "ngram:3" else a) for a in argv]
    assert main(other_judge) == 2 and main(argv + ["--eps", "0.5"]) == 2  # its rows would be taken for theirs
    err = capsys.readouterr().err
    assert "measured with other judge (" in err and "measured with other eps (" in err
    other_data = [("books" if a == str(corpus) else a) for a in argv]  # a corpus by name, not a file
    assert main(other_data) == 2 and "measured with other judge_source (" in capsys.readouterr().err
    assert len(read_frontier(str(out / "frontier.csv"))) == len(rows)
    # another seed adds its rows to the CSV, and its reports hold only its own: pooled, two
    # seeds made one zigzag curve a policy was compared along
    capsys.readouterr()
    seed_1 = argv + ["--seed", "1"]
    assert main(seed_1) == 0
    assert len(read_frontier(str(out / "frontier.csv"))) == 2 * len(rows)
    assert (out / "frontier.md").read_text().count("| ddpd |") == 2


def test_ddpd_eval_frontier_prints_as_the_other_subcommands(tmp_path, capsys, monkeypatch):
    """Without matplotlib the notice went to stdout, among the report (quality's goes to stderr)."""
    from ddpd.eval import frontier
    from ddpd.eval.report import PLOT_HINT, MissingDependency

    def no_matplotlib(*args, **kwargs):
        raise MissingDependency(PLOT_HINT)

    monkeypatch.setattr(frontier, "plot_frontier", no_matplotlib)
    out = tmp_path / "out"
    assert main(["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]) == 0
    printed, err = capsys.readouterr()
    assert err == f"ddpd-eval: plot skipped: {PLOT_HINT}\n" and "skipped" not in printed
    assert printed == (out / "frontier.md").read_text() + "\n"


@pytest.mark.integration
def test_ddpd_eval_frontier_keeps_going_for_a_reader_that_went_away(tmp_path):
    """`ddpd-eval frontier ... | true` ended in "error: [Errno 32] Broken pipe", exit status 1."""
    import subprocess
    import sys

    from hang_guard import HANG_GUARD_SECONDS

    out = tmp_path / "out"
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "ddpd.cli.eval", "frontier", "--judge", "ngram:2", "--data",
                               "books", *FAST, "--out-dir", str(out)], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=HANG_GUARD_SECONDS, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(write)
    # without the [eval] extra the one line that says the plot was skipped
    problems = [line for line in done.stderr.splitlines() if not line.startswith("ddpd-eval: plot skipped: ")]
    assert done.returncode == 0 and problems == [], done.stderr
    assert (out / "frontier.md").exists()


def test_ddpd_eval_frontier_without_defaults_runs_the_target_and_the_policies(tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    out = tmp_path / "out"
    assert main(["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "4", "--target-steps", "1",
                 "--num-samples", "1", "--policies", "threshold:0.9", "--no-defaults", "--no-progress",
                 "--out-dir", str(out)]) == 0
    rows = read_frontier(str(out / "frontier.csv"))
    assert sorted((r["sampler"], r["policy"], r["steps"]) for r in rows) == [
        ("ddpd", "one-at-a-time", 1), ("maskgit", "threshold:threshold=0.9", 4)]


def test_ddpd_eval_frontier_gives_a_policy_spelled_with_spaces_to_its_sampler(tmp_path, capsys):
    """parse_policy strips the name of 'error-budget :bound=2', but its sampler was told by the
    spec's text: refused under --samplers ddpd, and under both handed to the mask loop, which
    failed after the target had run."""
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    out = tmp_path / "out"
    assert main(["frontier", "--judge", "ngram:3", "--data", str(corpus), "--budgets", "4", "--target-steps", "1",
                 "--num-samples", "1", "--samplers", "ddpd", "--policies", "error-budget :bound=2",
                 "--no-defaults", "--no-progress", "--out-dir", str(out)]) == 0, capsys.readouterr().err
    rows = read_frontier(str(out / "frontier.csv"))
    assert sorted((r["sampler"], r["policy"].split(":")[0]) for r in rows) == [
        ("ddpd", "error-budget"), ("ddpd", "one-at-a-time")]


def test_ddpd_eval_frontier_refuses_a_bad_judge_and_policy(tmp_path, capsys, measured):
    """(measured: a command line let through stops at run_frontier instead of sampling.)"""
    out = str(tmp_path / "out")
    assert main(["frontier", "--judge", "ngram:x", "--data", "books", "--out-dir", out]) == 2
    assert main(["frontier", "--judge", "ngram", "--out-dir", out]) == 2
    assert main(["frontier", "--judge", "ngram", "--data", "books", "--policies", "fastest", "--out-dir", out]) == 2
    err = capsys.readouterr().err
    assert "ngram[:ORDER]" in err and "needs --data" in err and "policy must be one of" in err
    assert main(["frontier", "--judge", "ngram:0", "--data", "books", "--out-dir", out]) == 2
    assert "ORDER in [1, 12]" in capsys.readouterr().err
    assert main(["frontier", "--judge", "ngram", "--data", "books", "--budgets", "8", "0", "--out-dir", out]) == 2
    assert "--budgets must be" in capsys.readouterr().err
    assert main(["frontier", "--judge", "ngram", "--data", "books", "--samplers", "ddpd", "--policies",
                 "threshold:0.9", "--out-dir", out]) == 2
    assert "--policies threshold:0.9 is a policy of the maskgit sampler" in capsys.readouterr().err


def test_cli_md_lists_the_default_policies():
    from pathlib import Path

    from ddpd.cli.frontier import DEFAULT_POLICIES

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text().replace("\n", " ")
    assert all(f"`{spec}`" in text for spec in DEFAULT_POLICIES)


def test_ddpd_eval_frontier_checks_its_inputs_before_any_work(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["frontier", "--judge", "ngram", "--data", str(tmp_path), "--out-dir", out]) == 2
    assert f"--data: {tmp_path} is a directory, not a text file" in capsys.readouterr().err
    assert main(["frontier", str(tmp_path / "none"), "--judge", "ngram", "--data", "books", "--out-dir", out]) == 1
    assert "checkpoint directory not found" in capsys.readouterr().err


def _tiny(kind, vocab=27, tokenizer=("text8",), seq_len=8):
    from ddpd.models import build_model, config_for

    torch.manual_seed(0)
    config = config_for(kind, vocab, seq_len, d_model=16, n_layers=1, n_heads=2)
    recorded = {"tokenizer": {"name": tokenizer[0]}} if tokenizer else {}
    return build_model(kind, config), {"kind": kind, "model": config.to_dict(), **recorded}


FAST = ["--budgets", "2", "--target-steps", "1", "--num-samples", "1", "--policies", "threshold:0.9",
        "--no-defaults", "--no-progress"]


def test_ddpd_eval_frontier_runs_a_bundle_that_save_bundle_wrote(tmp_path, capsys):
    """Only ddpd-train writes a top-level vocab_size: a save_bundle bundle ended in KeyError."""
    from ddpd.checkpoint import save_bundle, save_checkpoint

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    save_checkpoint(tmp_path / "ar", *_tiny("ar", seq_len=16))
    for judge in (["--judge", "ngram:2", "--data", "books"], ["--judge", str(tmp_path / "ar")]):
        out = tmp_path / judge[1].replace("/", "_").replace(":", "_")
        assert main(["frontier", str(tmp_path / "b"), *judge, *FAST, "--out-dir", str(out)]) == 0, \
            capsys.readouterr().err
        assert len(read_frontier(str(out / "frontier.csv"))) == 2  # the target and the policy
    save_bundle(tmp_path / "untold", *_tiny("planner", tokenizer=None), *_tiny("mask-denoiser", tokenizer=None))
    capsys.readouterr()  # the runs above may have said that the plot was skipped (no matplotlib)
    assert main(["frontier", str(tmp_path / "untold"), "--judge", "ngram", "--data", "books", *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("ddpd-eval: error: the networks' checkpoints do not record their tokenizer; "
                                       "cannot encode --data for --judge ngram\n")


def test_ddpd_eval_frontier_refuses_networks_that_do_not_agree_before_sampling(tmp_path, capsys, monkeypatch):
    """A 50257-symbol planner with a 27-symbol denoiser ran to the end, and a GPT-2 judge
    scored text8 ids as GPT-2 tokens."""
    from ddpd.checkpoint import save_checkpoint
    from ddpd.eval import frontier

    monkeypatch.setattr(frontier, "run_frontier", lambda *a, **k: pytest.fail("sampled"))
    bundle = tmp_path / "mixed"
    save_checkpoint(bundle / "planner", *_tiny("planner", 50257, ("gpt2",)))  # a pair put together by hand
    save_checkpoint(bundle / "denoiser", *_tiny("mask-denoiser"))
    assert main(["frontier", str(bundle), "--judge", "ngram", "--data", "books", *FAST,
                 "--out-dir", str(tmp_path / "o1")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: {bundle / 'denoiser'} has vocab_size 27, but "
                                       f"{bundle / 'planner'} has 50257: they cannot be used together\n")
    save_checkpoint(tmp_path / "gpt2", *_tiny("ar", 50257, ("gpt2",), seq_len=16))
    assert main(["frontier", "--judge", str(tmp_path / "gpt2"), *FAST, "--out-dir", str(tmp_path / "o2")]) == 2
    assert "--judge " + str(tmp_path / "gpt2") + " has vocab_size 50257, but" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("text", ['{"networks": ', "[1]", "\xff"])
def test_ddpd_eval_frontier_names_a_damaged_settings_file(tmp_path, capsys, text):
    """A damaged input is a failure, exit status 1 (docs/cli.md), as a damaged frontier.csv in the
    same --out-dir is (below) and a corrupt checkpoint; frontier.json's exited 2."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "frontier.json").write_bytes(text.encode("latin-1"))
    (out / "frontier.csv").write_text("")  # rows it would say the settings of
    assert main(["frontier", "--judge", "ngram", "--data", "books", *FAST, "--out-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ddpd-eval: error: {out / 'frontier.json'} is damaged (not ") and err.count("\n") == 1


def test_ddpd_eval_frontier_names_a_damaged_rows_file(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "frontier.csv").write_text("sampler\nmaskgit\n")
    code = main(["frontier", "--judge", "ngram", "--data", "books", *FAST, "--out-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"ddpd-eval: error: {out / 'frontier.csv'} line 2: not a frontier row"), err


def test_ddpd_eval_frontier_names_the_flags_of_the_settings_that_differ(tmp_path, capsys):
    """A run refused for --out-dir's rows named the settings only, `judge_source` for --data and
    `networks` for the bundle, which no flag is called."""
    import shutil

    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    out = tmp_path / "out"
    argv = ["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 400).strip())
    assert main([str(corpus) if a == "books" else a for a in argv] + ["--eps", "0.5"]) == 2
    assert "measured with other judge_source (--data), eps (--eps) (" in capsys.readouterr().err
    planner, config = _tiny("planner")
    with torch.no_grad():  # other weights
        next(planner.parameters()).add_(1.0)
    shutil.rmtree(tmp_path / "b")
    save_bundle(tmp_path / "b", planner, config, *_tiny("mask-denoiser"))
    assert main(argv) == 2 and "measured with other networks (BUNDLE) (" in capsys.readouterr().err


def test_ddpd_eval_frontier_refuses_rows_of_another_batch_size_or_path(tmp_path, capsys):
    """Near-ties of the confidence policies round with the batch's shape and the path: a resume
    with another --batch-size or --fused mixed rows measured differently."""
    import json

    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    out = tmp_path / "out"
    argv = ["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    settings = json.loads((out / "frontier.json").read_text())
    assert (settings["batch_size"], settings["fused"]) == (16, False)
    assert main(argv + ["--batch-size", "2"]) == 2 and main(argv + ["--fused"]) == 2
    err = capsys.readouterr().err
    assert "measured with other batch_size (" in err and "measured with other fused (" in err
    del settings["batch_size"], settings["fused"]  # as written before they were recorded
    (out / "frontier.json").write_text(json.dumps(settings))
    assert main(argv + ["--fused"]) == 0, capsys.readouterr().err  # unknown: taken as this run's, and recorded
    assert json.loads((out / "frontier.json").read_text())["fused"] is True


@pytest.mark.parametrize("judge, order", [("ngram", 6), ("ngram:3", 3), ("ngram:012", 12), ("ngram_ar", None),
                                          ("ngrams", None), ("runs/ngram:3", None), ("ngram:3/ar", None)])
def test_a_judge_is_an_ngram_spec_only_when_it_reads_ngram_or_ngram_order(judge, order):
    """Any --judge that began with "ngram" was an n-gram spec, never a checkpoint directory."""
    from ddpd.cli.frontier import ngram_order

    if "/" in judge:  # a path that is no directory: an ar judge that check_checkpoints reports missing
        assert ngram_order(judge) is None
    else:
        assert ngram_order(judge) == order


def test_data_with_a_checkpoint_judge_is_refused(tmp_path, capsys):
    """--data builds the n-gram judge alone: with an ar --judge the run ignored it."""
    from ddpd.checkpoint import save_bundle, save_checkpoint

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    save_checkpoint(tmp_path / "ar", *_tiny("ar", seq_len=16))
    out = tmp_path / "o"
    assert main(["frontier", str(tmp_path / "b"), "--judge", str(tmp_path / "ar"), "--data", "books", *FAST,
                 "--out-dir", str(out)]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: --data builds an ngram judge, and --judge {tmp_path / 'ar'} "
                                       "is a checkpoint: leave --data out (or give --judge ngram[:ORDER])\n")
    assert not out.exists()


@pytest.mark.parametrize("judge", ["ngram:", "ngram:x", "ngram:3x", "ngram:²"])
def test_ngram_with_a_colon_and_no_order_is_refused(tmp_path, capsys, judge):
    """`--judge ngram:` was taken as ngram:6."""
    assert main(["frontier", "--judge", judge, "--data", "books", "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("ddpd-eval: error: --judge must be a checkpoint directory or ngram[:ORDER], "
                                       f"got {judge!r}\n")


def test_a_judge_directory_named_like_ngram_is_a_checkpoint(tmp_path, capsys, monkeypatch):
    """An ar judge in ngram_ar was refused by frontier, and quality wrote its reports into it."""
    import json

    from ddpd.checkpoint import save_bundle, save_checkpoint

    monkeypatch.chdir(tmp_path)
    save_bundle("b", *_tiny("planner"), *_tiny("mask-denoiser"))
    save_checkpoint("ngram_ar", *_tiny("ar", seq_len=16))
    assert main(["frontier", "b", "--judge", "ngram_ar", *FAST, "--out-dir", "o"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "frontier.json").read_text())["judge"] == "ar"
    capsys.readouterr()
    quick = ["--steps", "2", "--num-samples", "1", "--no-progress"]
    for argv in (["frontier", "b", *FAST], ["quality", "--planner", "b/planner", "--denoiser", "b/denoiser", *quick]):
        assert main([*argv, "--judge", "ngram_ar", "--out-dir", "ngram_ar"]) == 2
        assert capsys.readouterr().err == ("ddpd-eval: error: --out-dir ngram_ar is inside --judge ngram_ar, a "
                                           "checkpoint this run reads; write it elsewhere\n")
    assert sorted(os.listdir("ngram_ar")) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("budget, policy, name", [("1", [], "ddpd one-at-a-time"),
                                                  ("1", ["--policies", "error-budget:bound=2,plan_every=4",
                                                         "--no-defaults"], "ddpd error-budget:bound=2,plan_every=4")])
def test_ddpd_eval_frontier_refuses_a_budget_below_one_step(tmp_path, capsys, budget, policy, name):
    """Budget 1 ran ddpd a step of 2 passes, labelled budget 1 beside MaskGIT's 1-pass row."""
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    assert main(["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", "--samplers", "ddpd",
                 *policy, "--budgets", "8", budget, "--target-steps", "1", "--num-samples", "1", "--no-progress",
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: --budgets {budget} buys no step of {name}: "
                                       "one costs 2 network passes\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("samplers, policies, budget, name", [
    ("maskgit", [], 2**24 + 1, "maskgit maskgit:choice_temperature=4.5"),
    ("maskgit", ["--policies", "remdm", "--no-defaults"], 2**24 + 1, "maskgit remdm:schedule=cap"),
    ("ddpd", ["--policies", "error-budget:spread=cosine", "--no-defaults"], 2**25 + 2,
     "ddpd error-budget:bound=1,spread=cosine")])
def test_ddpd_eval_frontier_refuses_a_budget_beyond_a_step_table_before_sampling(tmp_path, capsys, samplers,
                                                                                 policies, budget, name):
    """A budget whose steps a policy's step table cannot hold was refused when its configuration
    ran, after the target and every configuration before it had been sampled: exit status 1,
    naming `steps`, not --budgets."""
    from ddpd.checkpoint import save_bundle
    from ddpd.sampling.policies import MAX_TABLE_STEPS

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    assert main(["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", "--samplers", samplers,
                 *policies, "--budgets", "4", str(budget),
                 "--target-steps", "1", "--num-samples", "1", "--no-progress", "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: --budgets {budget} buys {name} {MAX_TABLE_STEPS + 1} "
                                       f"steps, more than its step table holds ({MAX_TABLE_STEPS})\n")
    assert not (tmp_path / "o").exists()


def test_ddpd_eval_frontier_says_which_budgets_give_the_same_steps(tmp_path, capsys):
    """--budgets 4 5 gave ddpd 2 steps at both and kept budget 4's rows only, without a word."""
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    argv = ["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", "--target-steps", "1",
            "--num-samples", "1", "--policies", "error-budget:bound=2,max_k=4", "threshold:0.9", "--no-progress",
            "--temperatures", "0.9", "1.0"]
    assert main(argv + ["--budgets", "4", "5", "--out-dir", str(tmp_path / "o1")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["ddpd-eval: warning: --budgets 4 and 5 give ddpd one-at-a-time the same 2 steps: the rows "
                        "of budget 4 stand for both",
                        "ddpd-eval: warning: --budgets 4 and 5 give ddpd error-budget:bound=2,max_k=4 the same 2 "
                        "steps: the rows of budget 4 stand for both"]
    rows = read_frontier(str(tmp_path / "o1" / "frontier.csv"))
    assert sorted((r["sampler"], r["steps"], r["budget"]) for r in rows if r["policy"] != "one-at-a-time") == [
        ("ddpd", 2, 4)] * 2 + [("maskgit", 4, 4)] * 4 + [("maskgit", 5, 5)] * 4
    assert main(argv + ["--budgets", "3", "4", "--out-dir", str(tmp_path / "o2")]) == 0  # the target's 1 step
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == ["ddpd-eval: warning: --budgets 3 and the target (--target-steps 1, 2 passes) give ddpd "
                        "one-at-a-time the same 1 steps at T=1: the rows of budget 2 stand for both"]


def test_ddpd_eval_frontier_names_the_bundles_directory_of_the_wrong_kind(tmp_path, capsys, monkeypatch):
    """The message named a --planner flag that ddpd-eval frontier does not have."""
    from ddpd.checkpoint import save_checkpoint
    from ddpd.eval import frontier

    monkeypatch.setattr(frontier, "run_frontier", lambda *a, **k: pytest.fail("sampled"))
    bundle = tmp_path / "swapped"
    save_checkpoint(bundle / "planner", *_tiny("mask-denoiser"))
    save_checkpoint(bundle / "denoiser", *_tiny("planner"))
    assert main(["frontier", str(bundle), "--judge", "ngram", "--data", "books", *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: the bundle's planner/ ({bundle / 'planner'}) holds a "
                                       "'mask-denoiser' model, expected planner\n")
    save_checkpoint(bundle / "planner", *_tiny("planner"))
    assert main(["frontier", str(bundle), "--judge", "ngram", "--data", "books", *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: the bundle's denoiser/ ({bundle / 'denoiser'}) holds a "
                                       "'planner' model, expected mask-denoiser\n")


@pytest.mark.parametrize("order", [3, 1])  # 1: as many tokens as the order is too few as well
def test_ddpd_eval_frontier_names_data_too_small_for_the_ngram_judge(tmp_path, capsys, order):
    """Too short a --data ended in NGramJudge's "tokens must be more than 3 ids", exit status 1:
    an n-gram judge needs more tokens than its order."""
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    corpus = tmp_path / "short.txt"
    corpus.write_text("ab")
    assert main(["frontier", str(tmp_path / "b"), "--judge", f"ngram:{order}", "--data", str(corpus), *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: --data {corpus}: its train split holds 1 token, too "
                                       f"few for --judge ngram:{order} (it needs more than {order})\n")


def test_ddpd_eval_frontier_names_data_the_checkpoints_tokenizer_cannot_encode(tmp_path, capsys):
    """--judge ngram on a mixed-case --data ended in "data FILE: text must contain only ...",
    exit status 1, naming neither the flag nor whose tokenizer refused it."""
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    corpus = tmp_path / "mixed.txt"
    corpus.write_text("First Citizen: hear me speak. " * 20)
    assert main(["frontier", str(tmp_path / "b"), "--judge", "ngram", "--data", str(corpus), *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"ddpd-eval: error: --data {corpus}: the checkpoints' tokenizer "
                                              "cannot encode it: text must contain only space and a-z")
    assert not (tmp_path / "o").exists()


def test_ddpd_eval_frontier_takes_other_settings_where_no_row_was_measured(tmp_path, capsys):
    """A run stopped before its first row left frontier.json alone, and a rerun with another
    --eps was refused: --out-dir held "a frontier measured with other eps" and no row."""
    import json

    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    out = tmp_path / "out"
    argv = ["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    (out / "frontier.csv").unlink()
    assert main(argv + ["--eps", "0.5"]) == 0, capsys.readouterr().err
    assert json.loads((out / "frontier.json").read_text())["eps"] == 0.5
    assert main(argv) == 2 and "measured with other eps (" in capsys.readouterr().err  # now it holds rows


def test_run_frontier_counts_planner_and_denoiser_passes_per_sample(tmp_path):
    def run(n, first):
        return SimpleNamespace(tokens=torch.zeros(n, 6, dtype=torch.long), planner_passes=torch.full((n,), 1),
                               denoiser_passes=torch.full((n,), 3), commits=torch.full((n,), 6))

    row, = run_frontier([Config("ddpd", "error-budget:bound=1", 3, 1.0, run)], judge=Uniform(5), vocab_size=5,
                        num_samples=5, seed=0, batch_size=2, csv_path=str(tmp_path / "frontier.csv"))
    assert (row["planner_passes"], row["denoiser_passes"], row["passes"]) == (1.0, 3.0, 4.0)


def _reach_row(policy, steps, nll, entropy, passes, **more):
    return dict(sampler="ddpd", policy=policy, steps=steps, temperature=1.0, judge_nll=nll, entropy=entropy,
                passes=passes, **more)


def test_passes_to_reach_reads_a_budgets_sweep_at_its_most_passes_and_reaches_below_the_target():
    # one budget (32) whose adaptive sweep spent 20 and 30 passes: it costs its most; its curve
    # lies 0.5 below the target at the target's entropy, which reaches the target
    rows = [_reach_row("a", 16, 1.5, 3.9, 20.0, budget=32), _reach_row("a", 16, 1.5, 4.1, 30.0, budget=32)]
    reach, = passes_to_reach(rows, 2.0, 4.0)
    assert reach["matched_reached"] and reach["matched_passes"] == 30.0
    assert reach["matched_difference"] == pytest.approx(-0.5)


def test_passes_to_reach_falls_back_to_the_lowest_nll_at_matched_entropy():
    rows = [_reach_row("a", 8, 2.5, 4.0, 8.0), _reach_row("a", 16, 2.3, 4.0, 16.0)]
    reach, = passes_to_reach(rows, 2.0, 4.0)
    assert not reach["reached"] and (reach["judge_nll"], reach["passes"]) == (2.3, 16.0)


def test_a_ddpd_rows_budget_is_its_passes_rounded_and_not_its_steps():
    assert budget(_reach_row("a", 16, 2.0, 4.0, 31.75)) == 32  # a few samples stopped early: not 31
    # steps 16 of plan-every-1 ddpd cost 32 passes: compared with MaskGIT's 32 steps, not its 16
    rows = [_reach_row("a", 16, 2.0, 3.8, 32.0), _reach_row("a", 16, 2.4, 4.0, 32.0),
            dict(_reach_row("maskgit", 32, 2.3, 3.9, 32.0), sampler="maskgit"),
            dict(_reach_row("maskgit", 16, 2.3, 3.9, 16.0), sampler="maskgit")]
    assert [(c["steps"], c["verdict"]) for c in against_baselines(rows)] == [(32, "lower")]


def _reference_log_likelihood(corpus, vocab, order, discount, row):
    """Interpolated absolute discounting written out from counts, as the module docstring states it."""
    from collections import Counter

    counts = Counter(tuple(corpus[i:i + m]) for m in range(1, order + 1) for i in range(len(corpus) - m + 1))

    def prob(h, w):
        if not h:
            return (counts[(w,)] + 1) / (len(corpus) + vocab)  # add-one unigram
        following = [counts[h + (v,)] for v in range(vocab)]
        lower = prob(h[1:], w)
        if sum(following) == 0:
            return lower  # a context never seen backs off whole
        n_h = sum(c > 0 for c in following)
        return (max(counts[h + (w,)] - discount, 0) + discount * n_h * lower) / sum(following)

    return sum(math.log(prob(tuple(row[max(0, i - order + 1):i]), w)) for i, w in enumerate(row))


def test_ngram_judge_matches_the_formula_written_out():
    # token 4 never occurs (its add-one share only); 3 ends the corpus, so its last n-grams count
    corpus = [0, 1, 2, 0, 1, 0, 2, 2, 1, 0, 1, 2, 3]
    judge = NGramJudge(torch.tensor(corpus), 5, order=3, discount=0.5)
    rows = [[0], [0, 1], [1, 2, 3], [4, 0, 1, 2], [2, 3, 3, 0, 1, 1]]
    for row in rows:
        want = _reference_log_likelihood(corpus, 5, 3, 0.5, row)
        assert float(judge.log_likelihood(torch.tensor([row]))) == pytest.approx(want, rel=1e-12), row


def test_the_frontier_plan_buys_the_steps_a_policys_passes_allow():
    """ddpd's steps follow its policy: planning every 4 steps, 10 passes buy 8 steps; without the
    plan of step 0 (known_noise), 1 pass buys a step."""
    import argparse

    from ddpd.cli.frontier import _plan
    from ddpd.sampling.policies import parse_policy

    every_4, known = parse_policy("error-budget:bound=2,plan_every=4"), parse_policy("error-budget:known_noise=true")
    args = argparse.Namespace(samplers=["ddpd", "maskgit"], budgets=[10], temperatures=[1.0], target_steps=3,
                              target_temperature=1.0, one_pass=False)
    target = {("ddpd", None, 3, 1.0): 6}
    assert _plan(args, {"ddpd": [every_4], "maskgit": []}) == {**target, ("ddpd", every_4, 8, 1.0): 10}
    args.budgets = [1]
    assert _plan(args, {"ddpd": [known], "maskgit": []}) == {**target, ("ddpd", known, 1, 1.0): 1}


def test_ddpd_eval_frontier_refuses_a_settings_file_that_lacks_a_setting_it_always_recorded(tmp_path, capsys):
    """Only the settings recorded since a later version (batch size, path) may be missing: a
    frontier.json without --eps says nothing of the eps its rows were measured with."""
    import json

    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    settings = json.loads((out / "frontier.json").read_text())
    del settings["eps"]
    (out / "frontier.json").write_text(json.dumps(settings))
    capsys.readouterr()
    assert main(argv) == 2 and "measured with other eps (" in capsys.readouterr().err


def test_ddpd_eval_frontier_reports_only_the_rows_of_its_sample_count(tmp_path, capsys):
    """The CSV keeps the rows of every --num-samples; frontier.md, as for --seed, this run's."""
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert main(argv + ["--num-samples", "2"]) == 0, capsys.readouterr().err
    assert len(read_frontier(str(out / "frontier.csv"))) == 4
    table = (out / "frontier.md").read_text().split("\n\n")[0]
    assert len(table.splitlines()) == 4  # the header, its rule and this run's two rows


def test_ddpd_eval_frontier_does_not_reach_the_target_with_the_target(tmp_path, capsys):
    """The target's own row is no family's way to reach it."""
    out = tmp_path / "out"
    assert main(["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]) == 0
    reach = (out / "frontier.md").read_text().split("Passes to reach")[1].split("Each ddpd policy")[0]
    assert "| maskgit threshold" in reach and "one-at-a-time" not in reach.split("\n\n", 1)[1]


def test_ddpd_eval_frontier_warns_of_a_target_it_could_not_measure(tmp_path, capsys):
    """A NaN target (a judge's, or a cell edited) made every family read "not reached", with no
    word why; the reach table is left out with a warning, the other reports written."""
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0
    rows = read_frontier(str(out / "frontier.csv"))
    write_csv([dict(r, judge_nll="nan") if r["policy"] == "one-at-a-time" else r for r in rows],
              str(out / "frontier.csv"))
    capsys.readouterr()
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "ddpd-eval: warning: the target (ddpd one at a time, 1 steps, T=1.0) has judge NLL nan" in err
    text = (out / "frontier.md").read_text()
    assert "Passes to reach" not in text and "| maskgit | threshold" in text


def test_ddpd_eval_frontier_reports_rows_of_a_policy_spec_it_no_longer_reads(tmp_path, capsys):
    """Rows an earlier version wrote into --out-dir keep their policy spec as written: the
    reports name them so, where shortening the spec would refuse it."""
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0
    rows = read_frontier(str(out / "frontier.csv"))
    old = next(r for r in rows if r["sampler"] == "maskgit")
    write_csv(rows + [{**old, "policy": "threshold:cutoff=0.9"}], str(out / "frontier.csv"))
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| maskgit threshold:cutoff=0.9 |" in printed and printed == (out / "frontier.md").read_text() + "\n"


def test_ddpd_eval_frontier_refuses_a_bundle_without_its_denoiser(tmp_path, capsys):
    from ddpd.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "b" / "planner", *_tiny("planner"))
    assert main(["frontier", str(tmp_path / "b"), "--judge", "ngram", "--data", "books", *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: {tmp_path / 'b'}: not a bundle (a planner/ and a "
                                       "denoiser/ checkpoint)\n")


def test_ddpd_eval_frontier_without_a_default_bundle_says_how_to_give_one(tmp_path, capsys, monkeypatch):
    """No BUNDLE argument and no default: one line naming frontier's own way to pass a bundle
    (the default message names ddpd-sample's --checkpoint), before --out-dir is made."""
    from ddpd import pretrained

    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path))
    assert main(["frontier", "--judge", "ngram", "--data", "books", *FAST, "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ddpd-eval: error: no default model in {pretrained.ENV_VAR}={tmp_path}: ") and \
        err.endswith(f"pass your own checkpoints with a BUNDLE argument, or set {pretrained.ENV_VAR} to a bundle "
                     "directory\n") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_an_ngram_judge_takes_every_order_up_to_the_largest():
    from ddpd.cli.common import UsageError
    from ddpd.cli.frontier import _judge_order
    from ddpd.eval.ngram import MAX_ORDER

    assert _judge_order(SimpleNamespace(judge=f"ngram:{MAX_ORDER}", data="books")) == MAX_ORDER
    assert _judge_order(SimpleNamespace(judge="ngram:1", data="books")) == 1
    with pytest.raises(UsageError, match=rf"ORDER in \[1, {MAX_ORDER}\], got 'ngram:{MAX_ORDER + 1}'"):
        _judge_order(SimpleNamespace(judge=f"ngram:{MAX_ORDER + 1}", data="books"))


def test_ddpd_eval_frontier_passes_its_flags_to_each_sampler(tmp_path, capsys, monkeypatch):
    """--eps, --fused, the temperature and each batch's first row reach ddpd_sample and
    mask_sample (a batch drawn from row 0 again would repeat the samples of the first)."""
    from ddpd import sampling

    calls = []

    def recorded(name, sample, count):  # the position of n among the arguments
        def run(*args, **kwargs):
            ddpd = kwargs.get("ddpd")
            calls.append((name, args[count], kwargs["noise"].first_row, kwargs["temperature"],
                          ddpd and ddpd.eps, kwargs["execution"].fused))
            return sample(*args, **kwargs)
        return run

    monkeypatch.setattr(sampling, "ddpd_sample", recorded("ddpd", sampling.ddpd_sample, 2))
    monkeypatch.setattr(sampling, "mask_sample", recorded("mask", sampling.mask_sample, 1))
    assert main(["frontier", "--judge", "ngram:2", "--data", "books", "--budgets", "2", "--target-steps", "1",
                 "--num-samples", "3", "--batch-size", "2", "--policies", "threshold:0.9", "--no-defaults",
                 "--temperatures", "0.5", "--eps", "0.2", "--fused", "--no-progress",
                 "--out-dir", str(tmp_path / "o")]) == 0, capsys.readouterr().err
    assert calls == [("ddpd", 2, 0, 1.0, 0.2, True), ("ddpd", 1, 2, 1.0, 0.2, True),
                     ("mask", 2, 0, 0.5, None, True), ("mask", 1, 2, 0.5, None, True)]


def test_ddpd_eval_frontier_takes_a_judge_just_long_enough(tmp_path, capsys):
    """An ar judge of max_seq_len L + 1 scores samples of L tokens (its first is a context)."""
    from ddpd.checkpoint import save_bundle, save_checkpoint

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    save_checkpoint(tmp_path / "ar", *_tiny("ar", seq_len=8))  # max_seq_len 9
    assert main(["frontier", str(tmp_path / "b"), "--judge", str(tmp_path / "ar"), *FAST,
                 "--out-dir", str(tmp_path / "o")]) == 0, capsys.readouterr().err


def test_a_judge_directory_named_like_a_mistyped_ngram_spec_is_a_checkpoint(tmp_path, monkeypatch):
    from ddpd.cli.common import UsageError
    from ddpd.cli.frontier import ngram_order

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="ngram"):
        ngram_order("ngram:ar")
    os.mkdir("ngram:ar")
    assert ngram_order("ngram:ar") is None


def test_ddpd_eval_frontier_refuses_rows_judged_by_a_corpus_since_edited(tmp_path, capsys):
    """frontier.json records an n-gram judge's corpus file by its content, not its path."""
    corpus = tmp_path / "text.txt"
    corpus.write_text(("the cat sat on the mat and the dog ate the hat " * 40).strip())
    argv = ["frontier", "--judge", "ngram:2", "--data", str(corpus), *FAST, "--out-dir", str(tmp_path / "o")]
    assert main(argv) == 0, capsys.readouterr().err
    corpus.write_text(("a dog sat on the hat and the cat ate the mat " * 40).strip())
    capsys.readouterr()
    assert main(argv) == 2 and "measured with other judge_source (" in capsys.readouterr().err


def test_ddpd_eval_frontier_warns_of_no_budget_the_target_alone_costs(tmp_path, capsys):
    """--budgets 2 with --target-steps 1 is one budget of the one-at-a-time target, not two."""
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", "--budgets", "2", "--target-steps", "1",
            "--num-samples", "1", "--samplers", "ddpd", "--policies", "error-budget:bound=2,max_k=4", "--no-progress"]
    assert main(argv + ["--out-dir", str(tmp_path / "o")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_passes_to_reach_counts_a_row_on_the_edge_of_either_window():
    """Within nll_slack and within entropy_tolerance include the edge (numbers exact in binary)."""
    reach, = passes_to_reach([_reach_row("a", 8, 2.25, 5.0, 8.0)], 2.0, 4.0, nll_slack=0.25, entropy_tolerance=0.25)
    assert reach["reached"] and reach["passes"] == 8.0


def test_passes_to_reach_at_the_targets_entropy_reaches_at_the_slack_else_takes_the_nearest():
    at_slack = [_reach_row("a", 8, 2.0, 3.0, 8.0), _reach_row("a", 8, 2.5, 5.0, 8.0)]  # 2.25 at 4.0
    reach, = passes_to_reach(at_slack, 2.0, 4.0, nll_slack=0.25)
    assert reach["matched_reached"] and reach["matched_difference"] == 0.25
    # neither budget reaches: the one nearest the target is shown, not the farthest
    short = [_reach_row("a", 8, 3.0, 3.0, 8.0), _reach_row("a", 8, 3.0, 5.0, 8.0),
             _reach_row("a", 16, 2.5, 3.0, 16.0), _reach_row("a", 16, 2.5, 5.0, 16.0)]
    reach, = passes_to_reach(short, 2.0, 4.0)
    assert not reach["matched_reached"] and (reach["matched_passes"], reach["matched_difference"]) == (16.0, 0.5)


def test_a_row_with_an_empty_budget_cell_takes_its_steps():
    assert budget(dict(_reach_row("a", 8, 2.0, 4.0, 8.0), sampler="maskgit", budget="")) == 8


def test_against_baselines_labels_the_baseline_too():
    rows = [_reach_row("a", 16, 2.0, 3.8, 32.0), _reach_row("a", 16, 2.4, 4.0, 32.0),
            dict(_reach_row("maskgit", 32, 2.3, 3.9, 32.0), sampler="maskgit")]
    compared, = against_baselines(rows, label=str.upper)
    assert (compared["sampler"], compared["baseline"]) == ("DDPD A", "MASKGIT MASKGIT")


def test_run_frontier_records_each_measures_own_standard_error(tmp_path):
    from ddpd.eval.quality import quality_metrics

    class SumJudge:
        def log_likelihood(self, x):
            return -x.sum(1).float()

    samples = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 1], [0, 1, 2, 3], [4, 4, 1, 2]])

    def run(n, first):
        return SimpleNamespace(tokens=samples[first:first + n], planner_passes=torch.ones(n),
                               denoiser_passes=torch.ones(n), commits=torch.full((n,), 4))

    row, = run_frontier([Config("maskgit", "maskgit", 3, 1.0, run)], judge=SumJudge(), vocab_size=5,
                        num_samples=4, seed=0, batch_size=4, csv_path=str(tmp_path / "frontier.csv"))
    want = quality_metrics(samples, SumJudge(), 5)
    assert want["judge_nll_se"] != pytest.approx(want["entropy_se"])
    assert (row["judge_nll_se"], row["entropy_se"]) == (pytest.approx(want["judge_nll_se"]),
                                                        pytest.approx(want["entropy_se"]))


def test_read_frontier_names_an_empty_measurement_and_takes_an_empty_optional_cell(tmp_path):
    path = tmp_path / "frontier.csv"
    row = {"sampler": "maskgit", "policy": "maskgit", "steps": "3", "temperature": "1.0", "num_samples": "5",
           "seed": "0", "judge_nll": "1.5", "entropy": "4.0", "passes": "6", "seconds": ""}
    write_csv([row], str(path))
    assert read_frontier(str(path))[0]["seconds"] == ""
    write_csv([dict(row, judge_nll="")], str(path))
    with pytest.raises(ValueError, match=r"line 2: not a frontier row \(no judge_nll\)"):
        read_frontier(str(path))


def test_rows_read_back_with_empty_standard_errors_compare_without_one(tmp_path):
    """read_frontier keeps an empty optional cell as "": a row measured without its standard errors
    still compares, its difference with no standard error, instead of float("") failing."""
    rows = [_reach_row("a", 16, 2.0, 3.8, 32.0), _reach_row("a", 16, 2.4, 4.0, 32.0),
            dict(_reach_row("maskgit", 32, 2.3, 3.9, 32.0), sampler="maskgit")]
    path = str(tmp_path / "frontier.csv")
    write_csv([dict(r, num_samples=1, seed=0, judge_nll_se="", entropy_se="") for r in rows], path)
    compared, = against_baselines(read_frontier(path))
    assert compared["nll_difference"] == pytest.approx(-0.1) and compared["nll_difference_se"] is None
    target = dict(judge_nll=2.2, entropy=3.9, judge_nll_se="", entropy_se="")
    reach, = passes_to_reach(read_frontier(path)[:2], 2.2, 3.9, target=target)
    assert reach["matched_difference"] == pytest.approx(0.0, abs=1e-12) and reach["matched_difference_se"] is None


def test_ngram_judge_counts_at_most_max_order():
    from ddpd.eval.ngram import MAX_ORDER

    text = torch.tensor([0, 1, 2, 3] * 10)
    assert MAX_ORDER == 12  # docs/cli.md: up to 12
    default = NGramJudge(text, 4)  # docs/cli.md: of order 6 by default
    assert (default.order, default.discount) == (6, 0.75)
    assert NGramJudge(text, 4, order=MAX_ORDER).order == MAX_ORDER
    with pytest.raises(ValueError, match=rf"^order must be in \[1, {MAX_ORDER}\], got {MAX_ORDER + 1}$"):
        NGramJudge(text, 4, order=MAX_ORDER + 1)


class _Recorded(Exception):
    """Raised by a stand-in once it has recorded its arguments: nothing after it needs to run."""


@pytest.fixture
def measured(monkeypatch):
    """{"configs": (sampler, policy, steps, temperature, budget) of each, "kwargs": run_frontier's
    keywords, "run": the configurations} of a frontier run, which stops at run_frontier."""
    from ddpd.eval import frontier

    seen = {}

    def recorded(configs, **kwargs):
        seen.update(configs=[(c.sampler, c.policy, c.steps, c.temperature, c.budget) for c in configs],
                    kwargs=kwargs, run=configs)
        raise _Recorded

    monkeypatch.setattr(frontier, "run_frontier", recorded)
    return seen


def test_ddpd_eval_frontier_without_flags_runs_its_documented_defaults(tmp_path, measured):
    """docs/cli.md's defaults: the target (512 steps at T=1, 1024 passes) first, then ddpd and
    MaskGIT with their own default and DEFAULT_POLICIES at budgets 32 64 128 256 and T=1, 16
    samples a point in batches of 16 from seed 0, eps 0.01 on the reference path."""
    import json

    from ddpd.cli.frontier import DEFAULT_POLICIES
    from ddpd.sampling.policies import parse_policy, policy_spec

    with pytest.raises(_Recorded):
        main(["frontier", "--judge", "ngram:2", "--data", "books", "--out-dir", str(tmp_path / "o")])
    configs = measured["configs"]
    assert configs[0] == ("ddpd", "one-at-a-time", 512, 1.0, 1024)
    assert {c[4] for c in configs[1:]} == {32, 64, 128, 256} and {c[3] for c in configs} == {1.0}
    expected = {"one-at-a-time", "maskgit:choice_temperature=4.5", *map(policy_spec, map(parse_policy,
                                                                                          DEFAULT_POLICIES))}
    assert {c[1] for c in configs} == expected and {c[0] for c in configs} == {"ddpd", "maskgit"}
    kwargs = measured["kwargs"]
    assert (kwargs["num_samples"], kwargs["seed"], kwargs["batch_size"], kwargs["progress"]) == (16, 0, 16, True)
    settings = json.loads((tmp_path / "o" / "frontier.json").read_text())
    assert (settings["eps"], settings["batch_size"], settings["fused"]) == (0.01, 16, False)


def test_ddpd_eval_frontier_flags_reach_its_plan_and_samplers(tmp_path, measured, monkeypatch):
    """Each flag reaches the point, the sweep or the sampler it names (--seed the noise too)."""
    from ddpd import sampling

    calls = []
    for name in ("ddpd_sample", "mask_sample"):
        monkeypatch.setattr(sampling, name, lambda *args, _name=name, **kwargs: calls.append((_name, kwargs)))
    with pytest.raises(_Recorded):
        main(["frontier", "--judge", "ngram:2", "--data", "books", "--budgets", "8", "--temperatures", "0.5", "0.7",
              "--target-steps", "3", "--target-temperature", "0.7", "--num-samples", "3", "--seed", "5",
              "--batch-size", "2", "--eps", "0.2", "--policies", "threshold:0.9", "--no-defaults", "--fused",
              "--no-progress", "--out-dir", str(tmp_path / "o")])
    threshold = "threshold:threshold=0.9"
    assert measured["configs"] == [("ddpd", "one-at-a-time", 3, 0.7, 6), ("maskgit", threshold, 8, 0.5, 8),
                                   ("maskgit", threshold, 8, 0.7, 8)]
    kwargs = measured["kwargs"]
    assert (kwargs["num_samples"], kwargs["seed"], kwargs["batch_size"], kwargs["progress"]) == (3, 5, 2, False)
    for config in measured["run"]:
        config.run(2, 4)
    assert [(name, kwargs["steps"], kwargs["temperature"], kwargs["noise"].seed, kwargs["noise"].first_row,
             kwargs["execution"].fused) for name, kwargs in calls] == [("ddpd_sample", 3, 0.7, 5, 4, True),
                                                                       ("mask_sample", 8, 0.5, 5, 4, True),
                                                                       ("mask_sample", 8, 0.7, 5, 4, True)]
    assert calls[0][1]["ddpd"].eps == 0.2 and calls[0][1]["ddpd"].policy is None


def test_ddpd_eval_frontier_reaches_for_the_target_at_its_own_temperature(tmp_path, capsys):
    """--budgets 2 buys the one-at-a-time ddpd one step at every --temperatures too: of the rows at
    --target-steps, the target is the one at --target-temperature."""
    assert main(["frontier", "--judge", "ngram:2", "--data", "books", "--budgets", "2", "--target-steps", "1",
                 "--temperatures", "0.5", "--num-samples", "1", "--samplers", "ddpd", "--policies",
                 "error-budget:bound=2,max_k=4", "--no-progress", "--out-dir", str(tmp_path / "o")]) == 0
    assert "Passes to reach ddpd one at a time, 1 steps, T=1.0 " in capsys.readouterr().out


def test_ddpd_eval_frontier_takes_a_budget_that_fills_a_step_table(tmp_path, measured):
    """A budget that buys exactly MAX_TABLE_STEPS steps is planned: only one more is refused."""
    from ddpd.sampling.policies import MAX_TABLE_STEPS

    with pytest.raises(_Recorded):
        main(["frontier", "--judge", "ngram:2", "--data", "books", "--samplers", "maskgit", "--budgets",
              str(MAX_TABLE_STEPS), "--target-steps", "1", "--out-dir", str(tmp_path / "o")])
    assert measured["configs"][1] == ("maskgit", "maskgit:choice_temperature=4.5", MAX_TABLE_STEPS, 1.0,
                                      MAX_TABLE_STEPS)


def test_a_row_with_an_empty_budget_cell_is_filed_under_its_configurations_budget(tmp_path):
    """A ddpd row whose budget cell is empty (written beside rows that have one) takes its configuration's."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    config = Config("ddpd", "one-at-a-time", 16, 1.0, fake(calls), budget=32)
    run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    write_csv([dict(read_frontier(path)[0], budget="", passes=30.4)], path)
    again = run_frontier([config], judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1,
                         csv_path=path)
    assert len(calls) == 1 and budget(again[0]) == 32 and [budget(r) for r in read_frontier(path)] == [32]


def test_a_resumed_row_keeps_the_budget_it_was_measured_at(tmp_path):
    """A row's own budget is not overwritten by that of a configuration with the same key."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    run_frontier([Config("ddpd", "one-at-a-time", 16, 1.0, fake(calls), budget=32)], judge=Uniform(5),
                 vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    again = run_frontier([Config("ddpd", "one-at-a-time", 16, 1.0, fake(calls), budget=33)], judge=Uniform(5),
                         vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    assert len(calls) == 1 and budget(again[0]) == 32 and [budget(r) for r in read_frontier(path)] == [32]


ROW = {"sampler": "maskgit", "policy": "maskgit", "steps": "3", "temperature": "1.0", "num_samples": "5", "seed": "0",
       "judge_nll": "1.5", "entropy": "4.0", "passes": "6"}  # a frontier.csv row, as read_frontier reads it


@pytest.mark.parametrize("cell", ["sampler", "policy", "steps", "temperature", "num_samples", "seed", "judge_nll",
                                  "entropy", "passes"])
def test_read_frontier_names_each_empty_cell(tmp_path, cell):
    """A row without its judge NLL, entropy or passes, or without a cell of its key (it could not
    be told from another configuration's), is refused, naming the column."""
    path = tmp_path / "frontier.csv"
    write_csv([dict(ROW, **{cell: ""})], str(path))
    with pytest.raises(ValueError, match=rf"line 2: not a frontier row \(no {cell}\)"):
        read_frontier(str(path))


def test_read_frontier_reads_every_measurement_as_a_float(tmp_path):
    """Each measurement cell comes back a float (a standard error left as text printed unrounded)."""
    path = tmp_path / "frontier.csv"
    measures = ("judge_nll", "judge_nll_se", "entropy", "entropy_se", "passes", "planner_passes",
                "denoiser_passes", "tokens_per_pass", "temperature", "seconds")
    row = dict({"sampler": "maskgit", "policy": "maskgit", "steps": "3", "num_samples": "5", "seed": "0"},
               **{k: "1.25" for k in measures})
    write_csv([row], str(path))
    got, = read_frontier(str(path))
    assert {k: got[k] for k in measures} == {k: 1.25 for k in measures}


def test_a_row_with_passes_not_finite_is_left_out_of_the_reach_table():
    """A NaN mean passes took the family's fewest passes to reach the target."""
    rows = [_reach_row("a", 8, 2.0, 4.0, math.nan), _reach_row("a", 16, 2.0, 4.0, 16.0)]
    assert passes_to_reach(rows, 2.0, 4.0) == passes_to_reach(rows[1:], 2.0, 4.0)


def test_frontier_markdown_lays_out_its_columns_and_rounding():
    """The frontier table's columns, in order and rounded; the comparison's first column is the pass budget."""
    row = dict(sampler="ddpd", policy="p", steps=16, temperature=1.0, judge_nll=2.34567, judge_nll_se=0.01234,
               entropy=3.98765, passes=31.7, planner_passes=15.7, denoiser_passes=16.0, tokens_per_pass=0.254,
               num_samples=64)
    compared = [dict(steps=32, sampler="ddpd p", baseline="maskgit maskgit", verdict="lower")]
    lines = frontier_markdown([row], compared=compared).splitlines()
    assert lines[:3] == [
        "| Sampler | Policy | Steps | T | Judge NLL | ± s.e. | Entropy (bits) | Passes / sample | Planner | Denoiser "
        "| Tokens / pass | Samples |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| ddpd | p | 16 | 1.0 | 2.3457 | 0.0123 | 3.988 | 31.7 | 15.7 | 16.0 | 0.25 | 64 |"]
    assert next(line for line in lines if line.startswith("| Passes |")).startswith(
        "| Passes | Sampler | Baseline | Judge NLL vs baseline |")


def test_plot_frontier_draws_temperature_one_solid_and_its_neighbours_dashed(tmp_path, monkeypatch):
    """Line styles go by distance from T=1, so the untempered sweep is the solid line."""
    pytest.importorskip("matplotlib")
    import ddpd.eval.frontier as frontier
    from ddpd.eval.report import pyplot

    figures = []
    monkeypatch.setattr(frontier, "save_figure", lambda fig, path, **kw: figures.append(fig))
    rows = [dict(sampler="maskgit", policy="maskgit", passes=p, temperature=t, entropy=3.9, judge_nll=2.0)
            for t in (0.8, 1.0, 1.1) for p in (16, 32)]
    frontier.plot_frontier(rows, str(tmp_path / "plot.png"))
    styles = {line.get_label(): line.get_linestyle() for line in figures[0].axes[0].get_lines()}
    pyplot().close(figures[0])
    assert styles == {"maskgit maskgit T=1": "-", "maskgit maskgit T=1.1": "--", "maskgit maskgit T=0.8": ":"}


def test_passes_to_reach_shows_no_nll_for_a_family_never_at_matched_entropy():
    """A family whose rows all lie outside the entropy window reports no best NLL, not its lowest anywhere."""
    reach, = passes_to_reach([_reach_row("a", 8, 1.5, 3.5, 8.0)], 2.0, 4.0)
    assert not reach["reached"] and math.isnan(reach["judge_nll"]) and reach["config"] == "-"


def test_passes_to_reach_at_the_targets_entropy_breaks_a_tie_in_passes_by_the_smaller_difference():
    """Two budgets reaching the target in as many passes: the one further below the target is shown."""
    rows = [_reach_row("a", 8, 2.0, 3.0, 20.0, budget=8), _reach_row("a", 8, 2.0, 5.0, 20.0, budget=8),
            _reach_row("a", 16, 1.5, 3.0, 20.0, budget=16), _reach_row("a", 16, 1.5, 5.0, 20.0, budget=16)]
    reach, = passes_to_reach(rows, 2.0, 4.0)
    assert reach["matched_reached"] and reach["matched_difference"] == -0.5


def test_ddpd_eval_frontier_names_judge_for_the_rows_of_another_checkpoint_judge(tmp_path, capsys, measured):
    """Rows judged by another AR checkpoint are refused naming --judge, not --data."""
    from ddpd.checkpoint import save_bundle, save_checkpoint

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    judge, config = _tiny("ar", seq_len=16)
    save_checkpoint(tmp_path / "ar", judge, config)
    argv = ["frontier", str(tmp_path / "b"), "--judge", str(tmp_path / "ar"), *FAST, "--out-dir", str(tmp_path / "o")]
    with pytest.raises(_Recorded):
        main(argv)
    (tmp_path / "o" / "frontier.csv").write_text("")
    with torch.no_grad():  # other weights
        next(judge.parameters()).add_(1.0)
    save_checkpoint(tmp_path / "ar", judge, config)
    assert main(argv) == 2 and "measured with other judge_source (--judge) (" in capsys.readouterr().err


def test_run_frontier_records_the_samples_unigram_entropy(tmp_path):
    from ddpd.eval.quality import quality_metrics

    samples = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 1], [0, 1, 2, 3], [4, 4, 1, 2]])

    def run(n, first):
        return SimpleNamespace(tokens=samples[first:first + n], planner_passes=torch.ones(n),
                               denoiser_passes=torch.ones(n), commits=torch.full((n,), 4))

    row, = run_frontier([Config("maskgit", "maskgit", 3, 1.0, run)], judge=Uniform(5), vocab_size=5,
                        num_samples=4, seed=0, batch_size=3, csv_path=str(tmp_path / "frontier.csv"))
    want = quality_metrics(samples, Uniform(5), 5)
    assert want["entropy"] != pytest.approx(want["entropy_se"])
    assert row["entropy"] == pytest.approx(want["entropy"])


@pytest.mark.parametrize("value", ["inf", "-Infinity", "nan"])
def test_read_frontier_names_a_whole_number_cell_that_is_not_finite(tmp_path, value):
    path = tmp_path / "frontier.csv"
    write_csv([dict(ROW, steps=value)], str(path))
    with pytest.raises(ValueError, match=rf"line 2, column steps: '{value}' is not a whole number"):
        read_frontier(str(path))


def test_read_frontier_reads_a_64_bit_seed_exactly_even_written_as_a_float(tmp_path):
    """A float would round 2**64 - 1 to 2**64: the row's key would match no configuration."""
    path = tmp_path / "frontier.csv"
    write_csv([dict(ROW, seed=f"{2 ** 64 - 1}.0")], str(path))
    assert read_frontier(str(path))[0]["seed"] == 2 ** 64 - 1


def test_a_row_with_entropy_not_finite_is_left_out_of_the_reach_table():
    """A NaN entropy fell outside every window and broke the family's temperature curve."""
    rows = [_reach_row("a", 16, 1.9, math.nan, 20.0, budget=16), _reach_row("a", 16, 2.0, 3.8, 16.0, budget=16),
            _reach_row("a", 16, 2.2, 4.2, 16.0, budget=16)]
    assert passes_to_reach(rows, 2.0, 4.0) == passes_to_reach(rows[1:], 2.0, 4.0)


def test_passes_to_reach_counts_a_row_far_below_the_target_as_reaching_it():
    reach, = passes_to_reach([_reach_row("a", 8, 1.0, 4.0, 8.0), _reach_row("a", 16, 2.0, 4.0, 16.0)], 2.0, 4.0)
    assert reach["reached"] and (reach["passes"], reach["judge_nll"]) == (8.0, 1.0)


def test_plot_frontier_draws_each_line_in_order_of_passes_with_a_colour_a_family(tmp_path, monkeypatch):
    """Rows come in the CSV's order (budgets resumed out of order): a line drawn in that order zigzags.
    Ten families keep the ten colours of tab10."""
    pytest.importorskip("matplotlib")
    import ddpd.eval.frontier as frontier
    from ddpd.eval.report import pyplot

    figures = []
    monkeypatch.setattr(frontier, "save_figure", lambda fig, path, **kw: figures.append(fig))
    rows = [dict(sampler="maskgit", policy=f"p{i}", passes=p, temperature=1.0, entropy=3.9, judge_nll=2.0 / p)
            for i in range(10) for p in (64, 16, 32)]
    frontier.plot_frontier(rows, str(tmp_path / "plot.png"))
    lines = figures[0].axes[0].get_lines()
    drawn = [list(line.get_xdata()) for line in lines]
    colours = [line.get_color() for line in lines]
    tab10 = pyplot().get_cmap("tab10").colors
    pyplot().close(figures[0])
    assert drawn == [[16.0, 32.0, 64.0]] * 10
    assert colours == list(tab10)


def test_a_target_with_entropy_not_finite_leaves_the_reach_table_out_with_a_warning(capsys):
    from ddpd.cli.frontier import _reach

    target = dict(_reach_row("one-at-a-time", 8, 2.0, math.nan, 16.0), judge_nll_se=0.1, entropy_se=0.1)
    rows = [target, _reach_row("a", 8, 2.0, 4.0, 8.0)]
    assert _reach(rows, target, "the target") == []
    assert "the target (the target) has judge NLL 2.0 and entropy nan" in capsys.readouterr().err


def test_the_frontier_plan_gives_a_mask_loop_a_step_for_a_budget_of_one_pass():
    import argparse

    from ddpd.cli.frontier import _plan
    from ddpd.sampling.policies import MaskGIT

    args = argparse.Namespace(samplers=["ddpd", "maskgit"], budgets=[1], temperatures=[1.0], target_steps=3,
                              target_temperature=1.0, one_pass=False)
    assert _plan(args, {"ddpd": [], "maskgit": [MaskGIT()]}) == {("ddpd", None, 3, 1.0): 6,
                                                                  ("maskgit", MaskGIT(), 1, 1.0): 1}


def test_ngram_judge_builds_from_one_token_more_than_its_order():
    """order + 1 ids are the fewest a judge takes ("more than order"), and it scores by its formula."""
    judge = NGramJudge(torch.tensor([0, 1, 2, 3]), 4, order=3)
    x = [0, 1, 2, 0, 1]
    value = float(judge.log_likelihood(torch.tensor([x])))
    assert value == pytest.approx(_ngram_oracle([0, 1, 2, 3], 4, 3, x), rel=1e-12)


def test_rows_of_keeps_the_rows_of_the_sweeps_configurations_seed_and_sample_count(tmp_path):
    """A temperature given as an int (1) or written as 1.00 keys its row as 1.0 does; rows of
    another seed, sample count or configuration in the same CSV are left out."""
    path = str(tmp_path / "frontier.csv")
    calls = []
    configs = [Config("maskgit", "maskgit", 3, 1, fake(calls)), Config("ddpd", "one-at-a-time", 3, 0.9, fake(calls))]
    ours = run_frontier(configs, judge=Uniform(5), vocab_size=5, num_samples=1, seed=0, batch_size=1, csv_path=path)
    assert rows_of(ours, configs, 1, 0) == ours
    other = [Config("maskgit", "maskgit", 4, 1.0, fake(calls))]
    run_frontier(configs + other, judge=Uniform(5), vocab_size=5, num_samples=1, seed=1, batch_size=1, csv_path=path)
    every = read_frontier(path)
    assert len(every) == 5
    assert [(r["policy"], r["seed"]) for r in rows_of(every, configs, 1, 0)] == [("maskgit", 0), ("one-at-a-time", 0)]
    assert rows_of(every, configs, 2, 0) == [] and len(rows_of(every, configs + other, 1, 1)) == 3
    written = [dict(ours[0], temperature="1.00", steps="3", num_samples="1", seed="0")]
    assert rows_of(written, configs, 1, 0) == written


def test_ddpd_eval_frontier_draws_the_target_line_only_for_a_measured_target(tmp_path, capsys, monkeypatch):
    """The plot's horizontal line is the target's judge NLL; a NaN target draws none (a line at
    NaN, labelled "target nan", said nothing)."""
    pytest.importorskip("matplotlib")
    import ddpd.eval.frontier as frontier
    from ddpd.eval.report import pyplot

    labels = []

    def keep_labels(fig, path, **kw):
        labels.append([line.get_label() for line in fig.axes[0].get_lines()])
        pyplot().close(fig)

    monkeypatch.setattr(frontier, "save_figure", keep_labels)
    out = tmp_path / "out"
    argv = ["frontier", "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0
    rows = read_frontier(str(out / "frontier.csv"))
    (target,) = [r for r in rows if r["policy"] == "one-at-a-time"]
    assert [label for label in labels[0] if label.startswith("target")] == [
        f"target {target['judge_nll']:.3f} (entropy {target['entropy']:.2f})"]
    write_csv([dict(r, judge_nll="nan") if r["policy"] == "one-at-a-time" else r for r in rows],
              str(out / "frontier.csv"))
    assert main(argv) == 0
    assert len(labels) == 2 and not [label for label in labels[1] if label.startswith("target")]


def test_plot_frontier_gives_each_of_more_than_ten_families_its_own_colour(tmp_path, monkeypatch):
    """Past ten families tab10 would repeat its colours: the eleventh would look like the first."""
    pytest.importorskip("matplotlib")
    import ddpd.eval.frontier as frontier
    from ddpd.eval.report import pyplot

    figures = []
    monkeypatch.setattr(frontier, "save_figure", lambda fig, path, **kw: figures.append(fig))
    rows = [dict(sampler="maskgit", policy=f"p{i}", passes=p, temperature=1.0, entropy=3.9, judge_nll=2.0 / p)
            for i in range(11) for p in (16, 32)]
    frontier.plot_frontier(rows, str(tmp_path / "plot.png"))
    colours = [line.get_color() for line in figures[0].axes[0].get_lines()]
    tab20 = pyplot().get_cmap("tab20").colors
    pyplot().close(figures[0])
    assert len(set(colours)) == 11 and colours == list(tab20[:11])


def test_frontier_markdown_signs_the_difference_from_the_target():
    """The reach table's NLL - target carries its sign both ways, rounded to three digits, beside
    the passes and the standard error."""
    reach = [dict(family=f"ddpd {name}", reached=difference <= 0.02, passes=32.0, judge_nll=2.5, entropy=3.9,
                  config="-", matched_reached=difference <= 0.02, matched_passes=31.6,
                  matched_difference=difference, matched_difference_se=0.0123)
             for name, difference in (("above", 0.0456), ("below", -0.0123))]
    lines = frontier_markdown([], reach, "the target").splitlines()
    rows = [line for line in lines if line.startswith("| ddpd ")]
    assert [row.split(" | ")[-4:] for row in rows] == [["False", "31.6", "+0.046", "0.012 |"],
                                                        ["True", "31.6", "-0.012", "0.012 |"]]


def test_ddpd_eval_frontier_runs_ddpd_on_the_uniform_model_and_the_mask_loop_on_the_denoiser(tmp_path, capsys,
                                                                                          monkeypatch):
    """--model uniform: ddpd is ddpd_sample_uniform on the bundle's uniform/ (its rows those of a
    direct call from the same noise), the mask loop mask_sample on its denoiser/, each run on the
    device of --device (left to the CPU default, the uniform model's time met its weights on
    a GPU on the wrong device)."""
    from ddpd import sampling
    from ddpd.checkpoint import load_model, save_bundle
    from ddpd.eval.quality import quality_metrics
    from ddpd.sampling import DDPDOptions, Execution, PhiloxNoise
    from ddpd.sampling.policies import ddpd_steps, parse_policy

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"), uniform=_tiny("uniform"))
    calls = []

    def recorded(name, sample):
        def run(model, *args, **kwargs):
            calls.append((name, model.config.to_dict() if hasattr(model, "config") else None, kwargs.get("device")))
            return sample(model, *args, **kwargs)
        return run

    monkeypatch.setattr(sampling, "ddpd_sample", recorded("ddpd_sample", sampling.ddpd_sample))
    monkeypatch.setattr(sampling, "ddpd_sample_uniform", recorded("uniform", sampling.ddpd_sample_uniform))
    monkeypatch.setattr(sampling, "mask_sample", recorded("mask", sampling.mask_sample))
    spec = "error-budget:bound=2,max_k=4"
    out = tmp_path / "o"
    assert main(["frontier", str(tmp_path / "b"), "--model", "uniform", "--judge", "ngram:2", "--data", "books",
                 "--budgets", "4", "--target-steps", "2", "--num-samples", "2", "--policies", spec, "maskgit",
                 "--no-defaults", "--no-progress", "--out-dir", str(out)]) == 0, capsys.readouterr().err
    assert [name for name, _, _ in calls] == ["uniform", "uniform", "mask"]
    assert [device for _, _, device in calls] == [torch.device("cpu")] * 3
    uniform, _ = load_model(str(tmp_path / "b" / "uniform"))
    denoiser, _ = load_model(str(tmp_path / "b" / "denoiser"))
    assert calls[0][1] == uniform.config.to_dict() and calls[2][1] == denoiser.config.to_dict()
    rows = {row["policy"].split(":")[0]: row for row in read_frontier(str(out / "frontier.csv"))}
    policy = parse_policy(spec)
    with torch.no_grad():
        direct = sampling.ddpd_sample_uniform(uniform.eval(), 2, 8, 27, steps=ddpd_steps(4, policy),
                                              noise=PhiloxNoise(0, first_row=0), execution=Execution(),
                                              ddpd=DDPDOptions(eps=0.01, policy=policy))
    row = rows["error-budget"]
    assert row["passes"] == float(direct.passes.float().mean())
    assert row["tokens_per_pass"] == int(direct.commits.sum()) / int(direct.passes.sum())
    assert row["entropy"] == quality_metrics(direct.tokens, Uniform(27), 27)["entropy"]  # the same tokens
    assert "ddpd one at a time (the uniform model), 2 steps" in (out / "frontier.md").read_text()


def test_ddpd_eval_frontier_model_uniform_needs_the_bundles_uniform_model(tmp_path, capsys):
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    argv = ["frontier", str(tmp_path / "b"), "--model", "uniform", "--judge", "ngram", "--data", "books", *FAST,
            "--out-dir", str(tmp_path / "o")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"ddpd-eval: error: --model uniform: the bundle {tmp_path / 'b'} holds no "
                                       "uniform/; python -m ddpd.pretrained PLANNER DENOISER --uniform DIR writes "
                                       "one with both\n")
    assert not (tmp_path / "o").exists()


def test_ddpd_eval_frontier_model_uniform_without_the_mask_loop_needs_no_denoiser(tmp_path, capsys):
    from ddpd.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "b" / "uniform", *_tiny("uniform"))
    argv = ["frontier", str(tmp_path / "b"), "--model", "uniform", "--judge", "ngram:2", "--data", "books",
            "--budgets", "2", "--target-steps", "1", "--num-samples", "1", "--no-progress"]
    assert main(argv + ["--samplers", "ddpd", "--policies", "error-budget:bound=1", "--out-dir",
                        str(tmp_path / "o")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(argv + ["--out-dir", str(tmp_path / "o2")]) == 2  # MaskGIT, the default, runs the mask denoiser
    assert capsys.readouterr().err.startswith(f"ddpd-eval: error: --model uniform: the bundle {tmp_path / 'b'} "
                                              "holds no denoiser/ (--samplers runs the mask loop on it); ")


def test_ddpd_eval_frontier_refuses_rows_of_the_other_model(tmp_path, capsys):
    """The pair's rows and the uniform model's share their keys: a resume with the other --model
    would have taken them for its own. The pair's digest is of planner/ and denoiser/ alone, as
    before --model, so a bundle that gains uniform/ keeps its rows."""
    import json

    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"))
    out = tmp_path / "out"
    argv = ["frontier", str(tmp_path / "b"), "--judge", "ngram:2", "--data", "books", *FAST, "--out-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    pair = json.loads((out / "frontier.json").read_text())
    assert pair["model"] == "pair"
    save_bundle(tmp_path / "c", *_tiny("planner"), *_tiny("mask-denoiser"), uniform=_tiny("uniform"))
    assert main(argv[:1] + [str(tmp_path / "c")] + argv[2:]) == 0, capsys.readouterr().err  # the same pair
    assert json.loads((out / "frontier.json").read_text()) == pair
    assert main(argv[:1] + [str(tmp_path / "c"), "--model", "uniform"] + argv[2:]) == 2
    assert "measured with other networks (BUNDLE), model (--model) (" in capsys.readouterr().err
    # the uniform model's digest is of the bundle's denoiser/ and uniform/, whichever --samplers run
    uniform = ["frontier", str(tmp_path / "c"), "--model", "uniform", "--judge", "ngram:2", "--data", "books",
               *FAST, "--out-dir", str(tmp_path / "u")]
    assert main(uniform) == 0, capsys.readouterr().err
    ddpd_only = [a if a != "threshold:0.9" else "error-budget:bound=1" for a in uniform] + ["--samplers", "ddpd"]
    assert main(ddpd_only) == 0, capsys.readouterr().err


def test_ddpd_eval_frontier_one_pass_buys_a_step_a_pass(tmp_path, capsys, monkeypatch):
    """--one-pass: each ddpd step of the uniform model draws from its planning pass, so a budget of
    4 passes buys 4 steps (2 without) and the target's 3 steps cost 3 passes; refused with the pair,
    and rows of the other setting are not taken for this run's."""
    from ddpd import sampling
    from ddpd.checkpoint import save_bundle

    save_bundle(tmp_path / "b", *_tiny("planner"), *_tiny("mask-denoiser"), uniform=_tiny("uniform"))
    calls = []

    def recorded(*args, **kwargs):
        calls.append((kwargs["steps"], kwargs["ddpd"].one_pass))
        return sample(*args, **kwargs)

    sample = sampling.ddpd_sample_uniform
    monkeypatch.setattr(sampling, "ddpd_sample_uniform", recorded)
    out = tmp_path / "o"
    argv = ["frontier", str(tmp_path / "b"), "--model", "uniform", "--judge", "ngram:2", "--data", "books",
            "--budgets", "4", "--target-steps", "3", "--num-samples", "1", "--samplers", "ddpd", "--policies",
            "error-budget:bound=1", "--no-defaults", "--no-progress", "--out-dir", str(out)]
    assert main(argv + ["--one-pass"]) == 0, capsys.readouterr().err
    assert calls == [(3, True), (4, True)]
    rows = read_frontier(str(out / "frontier.csv"))
    assert [(r["steps"], r["budget"], r["passes"]) for r in rows] == [(3, 3, 3.0), (4, 4, 4.0)]
    assert "(the uniform model, one pass a step), 3 steps" in (out / "frontier.md").read_text()
    assert main(argv) == 2 and "measured with other one_pass (--one-pass) (" in capsys.readouterr().err
    calls.clear()
    assert main(argv[:-1] + [str(tmp_path / "two")]) == 0, capsys.readouterr().err
    assert calls == [(3, False), (2, False)]  # two passes a step
    pair = [a for a in argv if a not in ("--model", "uniform")]
    assert main(pair + ["--one-pass"]) == 2
    assert capsys.readouterr().err == ("ddpd-eval: error: --one-pass needs --model uniform: the pair's planner and "
                                       "denoiser are two passes a step\n")
