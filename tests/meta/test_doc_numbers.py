"""The numbers docs/parallel.md, docs/text8/README.md and docs/performance.md quote, recomputed
from the committed raw files they come from (docs/parallel/*.csv, docs/text8/quality/sweep.csv,
benchmarks/results/)."""
import csv
import re
from pathlib import Path

from ddpd.eval.frontier import against_baselines, read_frontier

ROOT = Path(__file__).resolve().parents[2]
PARALLEL = " ".join((ROOT / "docs" / "parallel.md").read_text().split())
TEXT8 = " ".join((ROOT / "docs" / "text8" / "README.md").read_text().split())
PERFORMANCE = " ".join((ROOT / "docs" / "performance.md").read_text().split())
GPU_LOG = (ROOT / "benchmarks" / "results" / "nvidia-h200.txt").read_text()


def _rows(name):
    with open(ROOT / "docs" / "parallel" / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_plan_every_4_is_above_maskgit_only_where_the_sweeps_are_compared():
    compared = [c for c in against_baselines(read_frontier(str(ROOT / "docs/parallel/frontier.csv")))
                if "plan_every=4" in c["sampler"] and c["baseline"].startswith("maskgit maskgit")]
    higher = [c["steps"] for c in compared if c["verdict"] == "higher"]
    assert higher == [32, 64, 128] and len(compared) == 4
    assert "revising every 4 steps is above MaskGIT at 32, 64 and 128 passes" in PARALLEL


def test_the_planner_detection_ranges_are_those_of_the_csvs():
    errors = _rows("planner-errors.csv")
    confidence = [float(r["confidence"]) for r in errors]
    assert f"({min(confidence):.2f}-{max(confidence):.2f}), though the planner" in PARALLEL
    assert f"against {min(confidence):.2f}-{max(confidence):.2f})" in PARALLEL
    draws = _rows("planner-on-draws.csv")
    before = {r["fraction"]: r for r in draws if r["steps"] == "0"}
    after = [r for r in draws if r["steps"] != "0" and int(r["steps"]) == max(int(d["steps"]) for d in draws)]
    moved = [float(r["parallel"]) - float(before[r["fraction"]]["parallel"]) for r in after]
    lost = [float(before[r["fraction"]]["uniform"]) - float(r["uniform"]) for r in after]
    assert f"the area moves by {min(moved):.3f} to {max(moved):+.3f}" in PARALLEL
    assert f"the planner loses {min(lost):.3f}-{max(lost):.3f} on uniform noise" in PARALLEL


def test_the_frontier_judge_standard_errors_are_those_of_its_rows():
    se = [(r["policy"].split(":")[0], int(r["budget"]), float(r["judge_nll_se"])) for r in _rows("frontier.csv")]
    wide = [v for *_, v in se if v > 0.085]
    assert {k[:2] for k in se if k[2] > 0.085} == {("threshold", 128), ("factor", 64), ("factor", 128)}
    narrow = [v for *_, v in se if v <= 0.085]
    quoted = (f"standard errors of the judge NLL are {min(narrow):.2f}-{max(narrow):.2f}, "
              f"{min(wide):.2f}-{max(wide):.2f} for threshold 0.9 at 128 passes and factor 1 at 64-128")
    assert quoted in PARALLEL


def test_the_sweeps_below_the_target_entropy_are_quoted_with_their_range():
    highest = {}
    for name in ("frontier.csv", "matched-64-samples.csv", "matched-128-samples.csv"):
        for r in _rows(name):
            if r["policy"] != "one-at-a-time" and int(r["budget"]) <= 128:
                highest.setdefault((name, r["policy"], r["budget"]), []).append(float(r["entropy"]))
    highest = {k: max(v) for k, v in highest.items() if len(v) > 1}  # the temperature sweeps
    assert max(highest.values()) < 3.956
    low, high = min(highest.values()), max(highest.values())
    assert f"stays below 3.956 bits ({low:.3f}-{high:.3f})" in PARALLEL


def _sweep():
    with open(ROOT / "docs" / "text8" / "quality" / "sweep.csv", newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r["steps"]]


def test_the_text8_sweep_ran_every_configuration_with_128_samples():
    rows = _sweep()
    assert len({(r["sampler"], r["steps"], r["temperature"]) for r in rows}) == len(rows) == 15 * 4 * 3
    assert {r["num_samples"] for r in rows} == {"128"}
    assert "= 180 configurations of 128 samples, all of them" in TEXT8


def _span(rows, column, digits):
    values = [float(r[column]) for r in rows]
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def test_the_512_step_ddpd_rows_are_quoted_with_their_range():
    at_512 = [r for r in _sweep() if r["steps"] == "512"]
    for sampler, joined in (("ddpd-AB-uniform-model", " at entropy "), ("ddpd-ABC-uniform-model", " at "),
                            ("ddpd-A-uniform-model", " at ")):
        rows = [r for r in at_512 if r["sampler"] == sampler]
        assert _span(rows, "judge_nll", 3) + joined + _span(rows, "entropy", 3) in TEXT8
    pair = [r for r in at_512 if r["sampler"].endswith("-mask") and not r["sampler"].startswith("tau")]
    assert f"planner + mask denoiser: {_span(pair, 'judge_nll', 3)} at {_span(pair, 'entropy', 3)}" in TEXT8


def test_the_quoted_512_step_verdicts_are_those_of_compare_md():
    compare = (ROOT / "docs" / "text8" / "quality" / "compare.md").read_text()
    for sampler, baseline, quoted in (("ddpd-AB-uniform-model", "maskgit", "0.360 ± 0.040 lower"),
                                      ("ddpd-ABC-uniform-model", "dfm-uni", "0.602 ± 0.022 below DFM-Uni"),
                                      ("ddpd-A-uniform-model", "maskgit", "0.174 ± 0.035 below MaskGIT")):
        row = re.search(rf"\| 512 \| {sampler} \| {baseline} \| lower \|[^\n]*\| -([\d.]+) \| ([\d.]+) \|", compare)
        assert row and quoted.startswith(f"{row[1]} ± {row[2]}") and quoted in TEXT8


def test_maskgit_lowest_nll_range_is_that_of_the_sweep():
    maskgit = [r for r in _sweep() if r["sampler"] == "maskgit"]
    low = [r for r in maskgit if r["temperature"] == "0.8" and r["steps"] in ("64", "128")]
    assert min(float(r["judge_nll"]) for r in maskgit) == min(float(r["judge_nll"]) for r in low)
    quoted = f"({_span(low, 'judge_nll', 3)} at T = 0.8, 64-128 steps, entropy {_span(low, 'entropy', 2)} bits"
    assert quoted in TEXT8


def _logged(pattern):
    """The groups of pattern's first match in the latest GPU check's log."""
    return re.search(pattern, GPU_LOG).groups()


def test_the_latest_gpu_checks_sampling_paragraph_quotes_its_log():
    pair = r"planner pass \+ denoiser trunk: ([\d.]+) ms\nfused step: ([\d.]+) ms"
    networks, fused = (float(v) for v in _logged(pair))
    reference, ratio = _logged(r"reference step: ([\d.]+) ms \(([\d.]+)x\)")
    assert (f"the fused step takes {fused:.2f} ms against {networks:.2f} ms for the planner pass plus the "
            f"denoiser trunk timed alone ({fused / networks:.3f}x") in PERFORMANCE
    assert f"and the reference step {reference} ms ({float(ratio):.1f}x" in PERFORMANCE
    compiled = _logged(r"batch 64, 512 steps: [\d.]+ samples/s \(compile and warm-up (\d+) s\)")[0]
    assert f"a compilation and warm-up of {compiled} s at batch 64" in PERFORMANCE
    default = [float(v) for v in _logged(r"\| 64 \| [^|]+\| [^|]+\| [^|]+\| ([\d.]+)/s")
               + _logged(r"\| 512 \| [^|]+\| [^|]+\| [^|]+\| ([\d.]+)/s")]
    before = (10.2, 16.1)  # the fused float32 runs of 923c60c:benchmarks/results/nvidia-h200-2026-11-27-2.txt
    ratios = [f"{d / b:.1f}x" for d, b in zip(default, before)]
    assert f"the check of 2026-11-28's default run is {ratios[0]} and {ratios[1]} the fused float32 run" in PERFORMANCE


def _uniform_rows(folder):
    return read_frontier(str(ROOT / "docs" / "parallel" / folder / "frontier.csv"))


def test_the_uniform_models_frontier_table_is_that_of_its_csvs():
    """Each cell of the uniform model's table, judge NLL (entropy) at T = 1 by budget, in the order
    of its row; a budget a row spent short of shows its passes."""
    rows = {folder: [r for r in _uniform_rows(folder) if r["temperature"] == 1.0 and r["policy"] != "one-at-a-time"]
            for folder in ("uniform", "uniform-one-pass")}
    lines = {"uniform": {"plan_every=1000": "DDPD, no planner pass (plan every 1000)",
                         "plan_every=16,": "DDPD, plan every 16, revise > 0.8",
                         "plan_every=4,": "DDPD, plan every 4, revise > 0.5, bound 1",
                         "maskgit:": "MaskGIT (bundled mask denoiser)"},
             "uniform-one-pass": {"plan_every=4,": "the same, one pass a step",
                                  "bound=1,max_k=256,order=risk,spread=cosine,known_noise=True,plan_every=1,":
                                      "DDPD, plan every step, bound 1, one pass a step",
                                  "revise_above=0.8": "DDPD, plan every step, revise > 0.8, one pass a step"}}
    for folder, named in lines.items():
        for key, label in named.items():
            ours = sorted((r for r in rows[folder] if key in r["policy"] and r["budget"] in (32, 64, 128, 256)),
                          key=lambda r: r["budget"])
            assert [r["budget"] for r in ours] == [32, 64, 128, 256], (folder, key)
            cells = []
            for r in ours:
                cell = f"{r['judge_nll']:.3f} ({r['entropy']:.2f})"
                cells.append(cell if r["passes"] > r["budget"] - 1 else f"{cell}, {r['passes']:.0f} passes")
            assert f"| {label} | {' | '.join(cells)} |" in PARALLEL, (label, cells)


def test_the_uniform_models_one_at_a_time_rows_and_verdicts_are_those_of_its_csvs():
    two = {r["steps"]: r for r in _uniform_rows("uniform") if r["policy"] == "one-at-a-time"}
    one = {r["steps"]: r for r in _uniform_rows("uniform-one-pass") if r["policy"] == "one-at-a-time"}
    for row, label in ((two[512], "two passes a step (the paper's listing)"), (one[512], "512 steps, one pass a step"),
                       (one[256], "256 steps, one pass a step (the budget ends it)")):
        assert f"{label} | {row['judge_nll']:.3f} ± {row['judge_nll_se']:.3f} | {row['entropy']:.3f} |" in PARALLEL
    # MaskGIT's points lie below every policy's curve of the one-pass sweep at 32-128 passes
    compared = against_baselines(_uniform_rows("uniform-one-pass"))
    assert {(c["steps"], c["verdict"], c["worse"]) for c in compared if c["steps"] <= 128} == \
        {(steps, "higher", 3) for steps in (32, 64, 128)}
    assert "worse at all 3 of MaskGIT's points, each budget" in PARALLEL


def test_the_ar_judges_uniform_model_table_is_that_of_its_csv():
    rows = _uniform_rows("uniform-one-pass-ar")
    for passes in (32, 64, 128):
        ddpd = min((r for r in rows if r["sampler"] == "ddpd" and r["budget"] == passes), key=lambda r: r["judge_nll"])
        maskgit = next(r for r in rows if r["sampler"] == "maskgit" and r["budget"] == passes
                       and r["temperature"] == 0.9)
        assert (f"| {passes} | {ddpd['judge_nll']:.3f} ({ddpd['entropy']:.2f}) | "
                f"{maskgit['judge_nll']:.3f} ({maskgit['entropy']:.2f}) |") in " ".join(
                    (ROOT / "docs" / "parallel.md").read_text().split())
        better = [r for r in rows if r["sampler"] == "ddpd" and r["budget"] == passes
                  and r["judge_nll"] < maskgit["judge_nll"] and r["entropy"] > maskgit["entropy"]]
        assert better == []  # no planned point beats MaskGIT's T = 0.9 on both axes
    (target,) = [r for r in rows if r["policy"] == "one-at-a-time"]
    assert (f"{target['judge_nll']:.3f} ± {target['judge_nll_se']:.3f} at {target['entropy']:.3f} bits in "
            f"{target['passes']:.0f} passes") in PARALLEL
