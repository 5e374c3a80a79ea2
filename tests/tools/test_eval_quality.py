"""Sample-quality metrics, sweeps and convergence records (ddpd.eval.quality, ddpd.eval.convergence)."""
import csv
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from ddpd.eval import convergence, quality, report
from ddpd.eval.convergence import PlannerRecorder, convergence_rows, stopped_fraction, write_convergence
from ddpd.eval.quality import SamplerSpec, judge_nll, run_sweep, unigram_entropy, write_sweep
from ddpd.models import build_model, config_for
from ddpd.sampling.options import DDPDOptions
from ddpd.training.data import Text8Tokenizer

V = 27


def test_unigram_entropy_of_known_samples():
    enc = Text8Tokenizer().encode
    x = torch.tensor([enc("aaaa"), enc("abab"), enc("abcd"), enc("aabc")])
    torch.testing.assert_close(unigram_entropy(x, V), torch.tensor([0.0, 1.0, 2.0, 1.5]))


@pytest.fixture(scope="module")
def judge():
    torch.manual_seed(0)
    return build_model("ar", config_for("ar", V, 16, d_model=16, n_layers=1, n_heads=2)).eval()


def test_judge_nll_is_the_per_token_negative_log_likelihood(judge):
    x = torch.randint(0, V, (5, 16), generator=torch.Generator().manual_seed(1))
    expected = -judge.log_likelihood(x) / 16
    torch.testing.assert_close(judge_nll(judge, x, batch_size=2), expected)
    # log p(x) is a sum of log-probabilities of tokens, by the chain rule: below 0
    assert bool((expected > 0).all())
    with pytest.raises(TypeError, match="judge must have a log_likelihood"):
        judge_nll(lambda x: x, x)


@pytest.mark.parametrize("x, error, match", [
    (torch.zeros(0, 16, dtype=torch.long), ValueError, r"must have shape \[B, D\] with B, D >= 1, got \(0, 16\)"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, r"must have shape \[B, D\] with B, D >= 1, got \(2, 0\)"),
    (torch.zeros(2, 16), TypeError, "must have dtype torch.int64, got torch.float32"),
    (torch.zeros(2, 16, dtype=torch.int32), TypeError, "must have dtype torch.int64, got torch.int32"),
])
def test_judge_nll_and_quality_metrics_refuse_empty_or_non_integer_samples(judge, x, error, match):
    with pytest.raises(error, match="^x " + match):
        judge_nll(judge, x)
    with pytest.raises(error, match="^tokens " + match):
        quality.quality_metrics(x, judge, V)


def _fake_sampler(name, length=16):
    """Each sample's tokens depend only on (seed, its id, steps): like a per-row stream."""

    def run(n, steps, temperature, seed, first_row):
        rows = torch.arange(first_row, first_row + n)
        tokens = (rows[:, None] * 7 + torch.arange(length) * (steps + seed)) % (V if temperature >= 1 else 3)
        return SimpleNamespace(tokens=tokens, stop_step=torch.full((n,), steps - 1), planner_rows=n * steps,
                               denoiser_rows=n * steps)

    return SamplerSpec(name, run)


def test_sweep_rows_are_batch_invariant_and_complete(judge):
    specs = [_fake_sampler("a"), _fake_sampler("b")]
    kwargs = dict(steps=[2, 4], temperatures=[0.5, 1.0], num_samples=5, judge=judge, vocab_size=V, seed=3)
    rows = run_sweep(specs, batch_size=2, **kwargs)
    assert [(r["sampler"], r["steps"], r["temperature"]) for r in rows] == \
        [(s, n, t) for s in "ab" for n in (2, 4) for t in (0.5, 1.0)]

    def timeless(table):
        return [{k: v for k, v in r.items() if k != "sampling_seconds"} for r in table]

    assert timeless(rows) == timeless(run_sweep(specs, batch_size=5, **kwargs))
    low = [r for r in rows if r["temperature"] == 0.5]
    assert all(r["entropy"] <= math.log2(3) + 1e-6 for r in low)  # three symbols at most
    assert rows[0]["mean_steps"] == 1.0 and rows[0]["nfe"] == 4.0


def test_sweep_reports_each_row_as_it_goes_and_scores_on_the_judge_device(judge):
    seen = []
    rows = run_sweep([_fake_sampler("a")], steps=[2, 4], temperatures=[1.0], num_samples=3, judge=judge,
                     vocab_size=V, reference=torch.zeros(2, 16, dtype=torch.long),
                     on_row=lambda so_far: seen.append(len(so_far)))
    assert seen == [1, 2, 3] and len(rows) == 3

    class MetaJudge(torch.nn.Module):
        """Lives on the meta device: fails unless judge_nll moves the samples there."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))

        def log_likelihood(self, x):
            assert x.device == self.weight.device
            return torch.zeros(x.shape[0])

    assert judge_nll(MetaJudge(), torch.zeros(3, 4, dtype=torch.long)).tolist() == [0.0, 0.0, 0.0]


def test_sweep_reference_row_and_outputs(judge, tmp_path):
    reference = torch.randint(0, V, (6, 16), generator=torch.Generator().manual_seed(4))
    rows = run_sweep([_fake_sampler("a")], steps=[2], temperatures=[1.0], num_samples=3, judge=judge,
                     vocab_size=V, reference=reference)
    assert rows[0]["sampler"] == quality.REFERENCE
    assert rows[0]["judge_nll"] == pytest.approx(float(judge_nll(judge, reference).mean()))
    paths = write_sweep(rows, str(tmp_path / "out"))
    with open(paths["csv"]) as f:
        table = list(csv.DictReader(f))
    assert [r["sampler"] for r in table] == [quality.REFERENCE, "a"]
    with open(paths["markdown"]) as f:
        markdown = f.read()
    assert markdown.startswith("| Sampler | Steps |") and markdown.count("\n") == 4
    pytest.importorskip("matplotlib")
    assert os.path.getsize(paths["plot"]) > 1000


def test_missing_matplotlib_skips_the_plot_with_a_clear_message(judge, tmp_path, monkeypatch):
    def missing():
        raise report.MissingDependency(report.PLOT_HINT)

    monkeypatch.setattr(quality, "pyplot", missing)
    rows = run_sweep([_fake_sampler("a")], steps=[2], temperatures=[1.0], num_samples=2, judge=judge, vocab_size=V)
    paths = write_sweep(rows, str(tmp_path))
    assert paths["plot"] is None and "pip install 'ddpd[eval]'" in paths["plot_skipped"]
    assert os.path.isfile(paths["csv"])


@pytest.mark.parametrize("kwargs, error", [
    (dict(samplers=[]), "expected at least one SamplerSpec"),
    (dict(steps=[0]), "steps must be >= 1"),
    (dict(temperatures=[]), "must be non-empty"),
    (dict(steps=[]), "must be non-empty"),
    (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(num_samples=0), "num_samples must be >= 1"),
    (dict(temperatures=[float("nan")]), "temperatures must be in \\[0.0, inf\\], got nan"),
    (dict(temperatures=[-0.5]), "temperatures must be in"),
])
def test_sweep_validates_inputs(judge, kwargs, error):
    args = dict(samplers=[_fake_sampler("a")], steps=[2], temperatures=[1.0], num_samples=2, judge=judge,
                vocab_size=V)
    args.update(kwargs)
    with pytest.raises(ValueError, match=error):
        run_sweep(args.pop("samplers"), **args)


def test_sweep_refuses_a_sampler_that_is_no_sampler_spec(judge):
    with pytest.raises(TypeError, match="samplers must be SamplerSpec, got function"):
        run_sweep([lambda n, s, t, seed, first: None], steps=[1], temperatures=[1.0], num_samples=2, judge=judge,
                  vocab_size=V)


def test_read_sweep_names_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "sweep.csv"
    path.write_bytes(b"sampler,steps,temperature,judge_nll,entropy\nddpd\xff,2,1.0,3.2,3.1\n")
    with pytest.raises(ValueError, match=f"{path}: not UTF-8 text \\(invalid start byte at byte 48\\)"):
        quality.read_sweep(str(path))


def test_pyplot_without_matplotlib_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    with pytest.raises(report.MissingDependency, match="pip install 'ddpd\\[eval\\]'"):
        report.pyplot()


def test_pyplot_of_a_broken_matplotlib_says_how_to_install_it(monkeypatch):
    """A matplotlib present but failing to import (ImportError, not only a missing module) gets
    the same hint."""
    def use(backend):
        raise ImportError("cannot import name '_path' from partially initialized module")

    monkeypatch.setitem(sys.modules, "matplotlib", SimpleNamespace(use=use))
    with pytest.raises(report.MissingDependency, match="pip install 'ddpd\\[eval\\]'"):
        report.pyplot()


def test_pyplot_switches_matplotlib_to_agg():
    """Plots are drawn off-screen whatever backend matplotlib was set to before."""
    import matplotlib

    matplotlib.use("svg")
    report.pyplot()
    assert matplotlib.get_backend().lower() == "agg"


def test_a_report_named_without_a_folder_is_written_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report.write_text("a", "plain.md")
    assert (tmp_path / "plain.md").read_text() == "a"


def test_a_report_set_inside_another_joins_the_outer_one(tmp_path):
    """An inner block renames nothing: the outer block's end renames all its files together."""
    inner, outer = tmp_path / "inner.txt", tmp_path / "outer.txt"
    with report.one_set():
        report.write_text("a", str(outer))
        with report.one_set():
            report.write_text("b", str(inner))
        assert not inner.exists() and not outer.exists()
    assert inner.read_text() == "b" and outer.read_text() == "a"


def test_a_figure_in_a_report_set_is_written_at_its_end_in_its_extension_format(tmp_path):
    """save_figure inside one_set joins the set (nothing before its end), and an .svg holds SVG, not PNG."""
    plt = report.pyplot()
    path = tmp_path / "plot.svg"
    with report.one_set():
        report.save_figure(plt.figure(), str(path))
        assert not path.exists()
    assert b"<svg" in path.read_bytes()[:400]


def test_a_report_set_that_raises_leaves_no_file_and_no_temporary(tmp_path):
    """A failed block publishes none of its reports and leaves nothing of them behind."""
    with pytest.raises(ValueError, match="bad row"):
        with report.one_set():
            report.write_text("a", str(tmp_path / "sweep.md"))
            report.write_csv([{"a": 1}], str(tmp_path / "sweep.csv"))
            raise ValueError("bad row")
    assert os.listdir(tmp_path) == []


def test_a_figure_is_written_into_folders_it_makes(tmp_path):
    plt = report.pyplot()
    path = tmp_path / "plots" / "sweep" / "plot.png"
    report.save_figure(plt.figure(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_path_without_an_extension_is_written_as_png(tmp_path):
    plt = report.pyplot()
    path = tmp_path / "plot"
    report.save_figure(plt.figure(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_reports_are_indented_by_two_and_end_in_a_newline(tmp_path):
    path = tmp_path / "e.json"
    report.write_json({"rows": [{"bits": 1.5}]}, str(path))
    assert path.read_text() == '{\n  "rows": [\n    {\n      "bits": 1.5\n    }\n  ]\n}\n'


def test_mean_and_se_average_in_float64():
    """float32 values are averaged in float64: 2**24 + 1 is not rounded away."""
    from ddpd.eval.report import mean_and_se

    assert mean_and_se(torch.tensor([2.0**24, 1.0]))[0] == (2.0**24 + 1) / 2


def test_sweep_rejects_a_sampler_returning_the_wrong_shape(judge):
    bad = SamplerSpec("bad", lambda n, s, t, seed, first: SimpleNamespace(tokens=torch.zeros(n + 1, 4).long()))
    with pytest.raises(ValueError, match="sampler 'bad' must return .tokens of shape \\[2, D\\]"):
        run_sweep([bad], steps=[1], temperatures=[1.0], num_samples=2, judge=judge, vocab_size=V)


def test_quality_metrics_length_is_the_sample_length_not_the_sample_count(judge):
    metrics = quality.quality_metrics(torch.zeros(2, 5, dtype=torch.long), judge, V)
    assert (metrics["num_samples"], metrics["length"]) == (2, 5)


def test_judge_nll_refuses_a_batch_size_below_1_by_name(judge):
    with pytest.raises(ValueError, match="^batch_size must be >= 1"):
        judge_nll(judge, torch.zeros(2, 4, dtype=torch.long), batch_size=0)


def test_sweep_gives_every_configuration_the_same_seed_and_every_row_the_judge(judge):
    """The same initial noise for every (sampler, steps, temperature), and the judge named on
    the reference row too, so that no row of the CSV passes for another judge's."""
    seeds = []

    def run(n, steps, temperature, seed, first_row):
        seeds.append(seed)
        return SimpleNamespace(tokens=torch.zeros(n, 16, dtype=torch.long))

    rows = run_sweep([SamplerSpec("a", run)], steps=[2, 5], temperatures=[0.5, 1.0], num_samples=2, judge=judge,
                     vocab_size=V, seed=7, reference=torch.zeros(2, 16, dtype=torch.long), judge_id="sha256:ab")
    assert seeds == [7] * 4
    assert [r[quality.JUDGE] for r in rows] == ["sha256:ab"] * 5


def test_sweep_csv_has_one_column_order_with_a_reference_row_or_without(judge, tmp_path):
    """The judge column stood before the sampling columns with a reference row, after them without."""
    headers = []
    for reference in (None, torch.zeros(2, 16, dtype=torch.long)):
        rows = run_sweep([_fake_sampler("a")], steps=[2], temperatures=[1.0], num_samples=2, judge=judge,
                         vocab_size=V, seed=0, reference=reference, judge_id="sha256:ab")
        report.write_csv(rows, tmp_path / "sweep.csv")
        headers.append((tmp_path / "sweep.csv").read_text().splitlines()[0])
    assert headers[0] == headers[1] and headers[0].startswith("sampler,steps,temperature,judge,judge_nll,"), headers


def test_sweep_markdown_columns_and_rounding():
    """Columns in SWEEP_COLUMNS' order; NLLs to 4 places, entropies to 3, counts of passes to 1."""
    row = {"sampler": "ddpd-A-mask", "steps": 8, "temperature": 0.9, "judge_nll": 2.123456, "judge_nll_se": 0.01234,
           "entropy": 4.12345, "entropy_se": 0.02345, "mean_steps": 7.25, "nfe": 16.04, "num_samples": 64}
    assert quality.sweep_markdown([row]).splitlines() == [
        "| Sampler | Steps | Temperature | Judge NLL (nats/token) | ± s.e. | Unigram entropy (bits) | ± s.e. "
        "| Steps taken | Forward passes / sample | Samples |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| ddpd-A-mask | 8 | 0.9 | 2.1235 | 0.0123 | 4.123 | 0.023 | 7.2 | 16.0 | 64 |",
    ]


def test_read_sweep_keeps_a_judge_digest_of_digits_as_text(tmp_path):
    """A digest is compared as text by merge_sweeps: '0123' read as the int 123 would name another judge."""
    path = tmp_path / "sweep.csv"
    path.write_text("sampler,steps,temperature,judge_nll,entropy,judge\nmaskgit,2,1.0,3.2,3.1,0123\n")
    assert quality.read_sweep(str(path))[0][quality.JUDGE] == "0123"


def test_merge_sweeps_takes_a_blank_judge_as_any_judge():
    """A part whose rows leave the judge blank (written before the column) merges with any judge's."""
    row = {"sampler": "maskgit", "steps": 2, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}
    parts = [[dict(row, judge="")], [dict(row, steps=3, judge="sha256:ab")]]
    assert [r["steps"] for r in quality.merge_sweeps(parts)] == [2, 3]


def test_read_sweep_gives_the_reference_row_blank_steps_and_temperature(tmp_path):
    """The reference row read back is the row run_sweep wrote: steps and temperature "", not None."""
    path = tmp_path / "sweep.csv"
    path.write_text("sampler,steps,temperature,judge_nll,entropy\nheld-out text,,,1.5,4.1\nmaskgit,2,1.0,3.2,3.1\n")
    reference, row = quality.read_sweep(str(path))
    assert (reference["steps"], reference["temperature"]) == ("", "")
    assert (row["steps"], row["temperature"]) == (2, 1.0)


def test_merge_sweeps_names_unnamed_parts_from_1():
    row = {"sampler": "maskgit", "steps": 2, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}
    with pytest.raises(ValueError, match=r"^configuration \('maskgit', 2, 1.0\) appears in both sweep 1 and sweep 3$"):
        quality.merge_sweeps([[row], [dict(row, steps=3)], [row]])


# ---------------------------------------------------------------- convergence


def test_planner_recorder_statistics():
    logits = [torch.tensor([[5.0, 5.0], [5.0, -9.0]]), torch.tensor([[-9.0, 5.0], [-9.0, -9.0]])]
    outputs = iter(logits)
    recorder = PlannerRecorder(lambda x: next(outputs), eps=(0.05, 0.001))
    recorder.start_run(2)
    x = torch.zeros(2, 2, dtype=torch.long)
    assert recorder(x) is logits[0] and recorder(x) is logits[1]  # the sampler gets the planner's logits
    first, second = recorder.rows()
    p5, p9 = torch.sigmoid(torch.tensor(5.0)).item(), torch.sigmoid(torch.tensor(-9.0)).item()
    assert first["noise_left"] == pytest.approx((2 * p5 + p5 + p9) / 4)
    assert math.isnan(first["z_changed"])
    assert second["z_changed"] == pytest.approx(2 / 4)  # position 0 of both rows flipped to clean
    assert second["met_eps_0.05"] == pytest.approx(0.5) and second["met_eps_0.001"] == pytest.approx(0.5)
    assert first["met_eps_0.05"] == 0.0


def test_planner_recorder_names_every_eps_apart():
    """:g wrote 0.0500001 and 0.05000001 alike, so one column held both."""
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape), eps=(0.05, 0.05000001))
    recorder.start_run(1)
    recorder(torch.zeros(1, 2, dtype=torch.long))
    assert {"met_eps_0.05", "met_eps_0.05000001"} <= set(recorder.rows()[0])


def test_planner_recorder_sums_batches_and_refuses_a_shrinking_batch():
    recorder = PlannerRecorder(lambda x: torch.full(x.shape, 9.0 if x.shape[0] == 3 else -9.0))
    for n in (3, 2):
        recorder.start_run(n)
        recorder(torch.zeros(n, 4, dtype=torch.long))
    assert recorder.counts == [5]
    p9, p_9 = torch.sigmoid(torch.tensor([9.0, -9.0])).tolist()
    assert recorder.rows()[0]["noise_left"] == pytest.approx((3 * p9 + 2 * p_9) / 5)  # both runs, by sample
    assert recorder.rows()[0]["met_eps_0.05"] == pytest.approx(2 / 5)
    recorder.start_run(3)
    with pytest.raises(RuntimeError, match="saw 2 sequences at step 0, expected all 3"):
        recorder(torch.zeros(2, 4, dtype=torch.long))


def test_recorder_on_the_ddpd_sampler_counts_one_call_per_step():
    sampling = pytest.importorskip("ddpd.sampling")
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape))
    recorder.start_run(3)
    sampling.ddpd_sample(recorder, lambda x, t: torch.zeros(*x.shape, V), 3, 8, V, steps=5,
                         ddpd=DDPDOptions(stop="budget"), seed=0)
    assert len(recorder.rows()) == 5 and recorder.counts == [3] * 5


def test_a_numpy_eps_names_the_stopped_column_as_the_recorder_names_its_own():
    """float32 0.01 is 0.009999999776482582 as a float: the recorder's met_eps column and the
    stopped column must carry the same name, or the plot misses the stopped curve's panel."""
    np = pytest.importorskip("numpy")
    eps = np.float32(0.01)
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape), eps=(eps,))
    recorder.start_run(2)
    recorder(torch.zeros(2, 4, dtype=torch.long))
    (row,) = convergence_rows(recorder.rows(), torch.zeros(1), eps=eps)
    met, stopped = (key for key in row if key.startswith(("met_eps_", "stopped_eps_")))
    assert met.removeprefix("met_eps_") == stopped.removeprefix("stopped_eps_")


def test_stopped_fraction_and_convergence_outputs(tmp_path):
    stopped = stopped_fraction(torch.tensor([0, 2, 2, 5]), steps=5)
    torch.testing.assert_close(stopped, torch.tensor([0.25, 0.25, 0.75, 0.75, 0.75]))
    recorded = [{"step": i, "noise_left": 1.0 / (i + 1), "z_changed": 0.0, "met_eps_0.05": 0.0,
                 "met_eps_0.01": 0.0} for i in range(5)]
    rows = convergence_rows(recorded, stopped, eps=0.01)
    assert rows[2]["stopped_eps_0.01"] == 0.75
    # a stopped run shorter than the recorded one leaves its later steps blank, not stopped
    assert math.isnan(convergence_rows(recorded, stopped[:3], eps=0.01)[4]["stopped_eps_0.01"])
    paths = write_convergence(rows, str(tmp_path))
    with open(paths["csv"]) as f:
        assert len(list(csv.DictReader(f))) == 5


@pytest.mark.parametrize("stop_step, error, match", [
    ([0, 2], ValueError, "stop_step must be a 1-D tensor, got list"),
    (torch.zeros(2, 2, dtype=torch.long), ValueError, r"stop_step must be a 1-D tensor, got torch.Size\(\[2, 2\]\)"),
    (torch.tensor([0.0, 2.0]), TypeError, "stop_step must be a tensor of step numbers .*, got torch.float32"),
    (torch.tensor([True]), TypeError, r"an integer dtype\), got torch.bool"),
    (torch.tensor([1j]), TypeError, r"an integer dtype\), got torch.complex64"),
    (torch.tensor([], dtype=torch.long), ValueError, "stop_step must hold at least one sample's stop step, got none"),
    (torch.tensor([3, -1]), ValueError, "stop_step must be >= 0, got minimum -1"),
    (torch.tensor([5, 6]), ValueError, r"stop_step must be <= steps \(5\), got maximum 6"),
])
def test_stopped_fraction_refuses_what_is_not_stop_steps(stop_step, error, match):
    """A float, empty or negative stop_step failed in torch.bincount (or gave NaN fractions)."""
    with pytest.raises(error, match=match):
        stopped_fraction(stop_step, steps=5)


def test_planner_recorder_refuses_a_call_before_start_run():
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape))
    with pytest.raises(RuntimeError, match=r"call start_run\(batch_size\) before sampling"):
        recorder(torch.zeros(1, 2, dtype=torch.long))
    assert recorder.rows() == []


def test_write_convergence_without_matplotlib_writes_the_csv_and_says_why(monkeypatch, tmp_path):
    def missing():
        raise report.MissingDependency(report.PLOT_HINT)

    monkeypatch.setattr(convergence, "pyplot", missing)
    paths = write_convergence([{"step": 0, "noise_left": 0.5, "z_changed": 0.0}], str(tmp_path))
    assert paths["plot"] is None and "pip install 'ddpd[eval]'" in paths["plot_skipped"]
    assert os.path.isfile(paths["csv"]) and not os.path.exists(tmp_path / "convergence.png")


def test_the_convergence_plot_has_a_panel_for_every_eps(monkeypatch, tmp_path):
    """Three --eps drew the first two only, and so never the stopped curve of the strictest."""
    pytest.importorskip("matplotlib")
    from ddpd.eval import convergence

    figures = []
    monkeypatch.setattr(convergence, "save_figure", lambda fig, path, **kwargs: figures.append(fig))
    recorded = [{"step": i, "noise_left": 0.5, "z_changed": 0.0, "met_eps_0.1": 0.0, "met_eps_0.05": 0.0,
                 "met_eps_0.01": 0.0} for i in range(3)]
    convergence.plot_convergence(convergence_rows(recorded, torch.zeros(3), eps=0.01), str(tmp_path / "c.png"))
    titles = {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in figures[0].axes}
    assert [t for t in titles if t.startswith("samples with")] == [
        f"samples with p(z=N) < {eps} everywhere" for eps in ("0.1", "0.05", "0.01")]
    assert "stopped (eps run)" in titles["samples with p(z=N) < 0.01 everywhere"]


def _curve(name, steps, points):
    return [{"sampler": name, "steps": steps, "temperature": t, "entropy": e, "judge_nll": n}
            for t, (e, n) in zip((0.8, 0.9, 1.0), points)]


def test_matched_entropy_interpolates_and_never_extrapolates():
    from ddpd.eval.quality import matched_entropy

    rows = (_curve("ddpd", 512, [(3.90, 2.0), (4.00, 2.2), (4.10, 2.6)])
            + _curve("dfm", 512, [(3.95, 2.3), (4.05, 2.3), (4.30, 3.0)]))
    result = matched_entropy(rows, "ddpd", "dfm", 512)
    # at 3.95 the curve is 2.1 (0.2 below), at 4.05 it is 2.4 (0.1 above); 4.30 lies past its end and no
    # ddpd point is better or worse on both axes there
    assert result["better"] == 1 and result["worse"] == 1 and result["undecided"] == 1
    assert result["verdict"] == "mixed" and result["matched"] == 2
    assert result["nll_difference"] == pytest.approx((-0.2 + 0.1) / 2)
    # past the ends: a point with more entropy and less NLL is better on both axes
    rows += _curve("far", 512, [(4.4, 2.0), (4.5, 2.1), (4.6, 2.2)])
    far = matched_entropy(rows, "far", "dfm", 512)
    assert far["verdict"] == "lower" and far["better"] == 3 and far["matched"] == 0
    assert far["nll_difference"] is None and far["nll_difference_se"] is None  # no matched point: no s.e.
    assert matched_entropy(rows, "far", "ddpd", 512)["verdict"] == "lower"
    assert matched_entropy(rows, "ddpd", "far", 512)["verdict"] == "higher"
    assert matched_entropy(rows, "ddpd", "dfm", 256) is None


def test_matched_difference_has_the_delta_method_standard_error():
    from ddpd.eval.quality import matched_entropy

    ours = _curve("ddpd", 512, [(3.90, 2.0), (4.00, 2.2), (4.10, 2.6)])
    theirs = _curve("dfm", 512, [(3.95, 2.3), (4.05, 2.3), (4.30, 3.0)])
    for row, se in zip(ours + theirs, (0.1, 0.1, 0.2, 0.05, 0.05, 0.3)):
        row["judge_nll_se"], row["entropy_se"] = se, 0.0
    # NLL only: the middle point serves both matched points (weights 1/2 + 1/2); 4.30 is not
    # matched, so its s.e. does not count: sqrt(0.05^2 + 0.1^2 + 0.1^2 + 0.05^2 + 0.05^2) / 2
    result = matched_entropy(ours + theirs, "ddpd", "dfm", 512)
    assert result["nll_difference_se"] == pytest.approx(0.0275 ** 0.5 / 2)
    # entropy only, 0.01 on every row: slopes 2 and 4 carry it. d/d e_0 = -2/2 * 1/2, d/d e_1 =
    # (-2/2 - 4/2) / 2, d/d e_2 = -4/2 * 1/2, the baseline's own entropies 2/2 and 4/2
    for row in ours + theirs:
        row["judge_nll_se"], row["entropy_se"] = 0.0, 0.01
    gradient = (-0.5, -1.5, -1.0, 1.0, 2.0)
    result = matched_entropy(ours + theirs, "ddpd", "dfm", 512)
    assert result["nll_difference_se"] == pytest.approx(0.01 * sum(d * d for d in gradient) ** 0.5)
    ours[0]["entropy_se"] = float("nan")  # a row of one sample: no spread known
    assert matched_entropy(ours + theirs, "ddpd", "dfm", 512)["nll_difference_se"] is None
    del ours[0]["entropy_se"]
    assert matched_entropy(ours + theirs, "ddpd", "dfm", 512)["nll_difference_se"] is None
    assert matched_entropy(ours + theirs, "ddpd", "dfm", 512)["nll_difference"] == pytest.approx(-0.05)


def test_one_sample_has_no_standard_error():
    from ddpd.eval.report import mean_and_se

    mean, se = mean_and_se(torch.tensor([2.5]))
    assert mean == 2.5 and math.isnan(se)
    assert mean_and_se(torch.tensor([1.0, 3.0])) == (2.0, 1.0)


def test_one_sample_gives_its_nan_standard_error_without_a_warning():
    """The standard error of one value is NaN by rule, not from torch's std of one value, which
    warns of its degrees of freedom on the stderr of every report of one sample."""
    import warnings

    from ddpd.eval.report import mean_and_se

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, se = mean_and_se(torch.tensor([[4.0]]))
    assert mean == 4.0 and math.isnan(se)


def test_markdown_tables_format_every_number_and_leave_missing_values_blank():
    """ints take a float format as floats do; a missing key and None are blank cells; the
    first column is left-aligned and the rest right-aligned, one cell a column in every row."""
    from ddpd.eval.report import markdown_table

    rows = [{"name": "a", "count": 1234567, "share": 3, "se": None}, {"name": "b", "share": 0.25}]
    columns = (("name", "Name", ""), ("count", "Count", ","), ("share", "Share", ".3f"), ("se", "s.e.", ".3f"))
    assert markdown_table(rows, columns).splitlines() == [
        "| Name | Count | Share | s.e. |",
        "|---|---:|---:|---:|",
        "| a | 1,234,567 | 3.000 |  |",
        "| b |  | 0.250 |  |",
    ]


def test_markdown_tables_escape_a_bar_in_a_cell():
    """A run directory named with '|' stays one cell: the bar is escaped as GitHub reads it."""
    from ddpd.eval.report import markdown_table

    table = markdown_table([{"run": "runs/a|b", "step": 3}], (("run", "Run", ""), ("step", "Steps", "")))
    assert table.splitlines()[2] == "| runs/a\\|b | 3 |"


def test_json_reports_write_an_undefined_value_as_null(tmp_path):
    """An undefined standard error is null in the JSON written, which strict readers accept."""
    import json

    from ddpd.eval.report import write_json

    path = str(tmp_path / "e.json")
    write_json({"elbo": [{"elbo": 2.5, "elbo_se": math.nan, "bound": (math.inf, 1.0)}]}, path)
    with open(path) as f:
        loaded = json.load(f, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    assert loaded == {"elbo": [{"elbo": 2.5, "elbo_se": None, "bound": [None, 1.0]}]}


def test_quality_metrics_gives_each_measure_its_own_standard_error():
    class SumJudge:
        """log p(x) = -sum of the ids: NLL per token the row's mean id."""

        def log_likelihood(self, x):
            return -x.sum(1).float()

    from ddpd.eval.report import mean_and_se

    enc = Text8Tokenizer().encode
    x = torch.tensor([enc("aaaa"), enc("abab"), enc("abcd"), enc("aabc")])
    metrics = quality.quality_metrics(x, SumJudge(), V)
    nll, nll_se = mean_and_se(x.double().mean(1))
    entropy, entropy_se = mean_and_se(torch.tensor([0.0, 1.0, 2.0, 1.5]))
    assert (metrics["judge_nll"], metrics["judge_nll_se"]) == (pytest.approx(nll), pytest.approx(nll_se))
    assert (metrics["entropy"], metrics["entropy_se"]) == (pytest.approx(entropy), pytest.approx(entropy_se))
    assert metrics["judge_ppl"] == pytest.approx(math.exp(nll))  # the NLL is in nats
    assert (metrics["num_samples"], metrics["length"]) == (4, 4)


def test_matched_entropy_counts_a_point_on_the_curve_undecided_and_any_worse_point_mixed():
    from ddpd.eval.quality import matched_entropy

    ours = _curve("ddpd", 512, [(1.0, 2.0), (2.0, 3.0), (3.0, 5.0)])  # exact in binary: the tie is exact
    tied = _curve("dfm", 512, [(1.5, 2.5), (2.5, 4.5)])  # on the curve, then 0.5 above it
    result = matched_entropy(ours + tied, "ddpd", "dfm", 512)
    assert (result["better"], result["worse"], result["undecided"], result["verdict"]) == (1, 0, 1, "lower")
    # two points above the curve and one below: one against is enough for "mixed"
    split = _curve("maskgit", 512, [(1.5, 3.0), (2.5, 4.5), (2.75, 4.0)])
    result = matched_entropy(ours + split, "ddpd", "maskgit", 512)
    assert (result["better"], result["worse"], result["verdict"]) == (2, 1, "mixed")


def test_matched_entropy_outside_the_curve_decides_a_tie_on_one_axis():
    """Past the curve's ends, as good on one axis and better on the other decides the point."""
    from ddpd.eval.quality import matched_entropy

    ours = _curve("ddpd", 512, [(4.4, 2.0), (4.5, 2.1)])
    same_nll_less_entropy = _curve("dfm", 512, [(4.3, 2.0)])  # below the curve's range, ddpd's 4.4 as good
    result = matched_entropy(ours + same_nll_less_entropy, "ddpd", "dfm", 512)
    assert (result["better"], result["worse"], result["verdict"], result["matched"]) == (1, 0, "lower", 0)
    same_nll_more_entropy = _curve("maskgit", 512, [(4.6, 2.1)])  # above it, ddpd's 4.5 as bad
    result = matched_entropy(ours + same_nll_more_entropy, "ddpd", "maskgit", 512)
    assert (result["better"], result["worse"], result["verdict"], result["matched"]) == (0, 1, "higher", 0)


def test_difference_at_weighs_each_end_of_the_segment_by_its_distance():
    """A point a quarter along a segment: the near end carries 3/4 of the NLL and of the slope's
    entropy term, whose standard errors differ here so that swapping the weights shows."""
    from ddpd.eval.quality import difference_at

    curve = [{"entropy": 1.0, "judge_nll": 2.0, "judge_nll_se": 0.0, "entropy_se": 0.1},
             {"entropy": 2.0, "judge_nll": 4.0, "judge_nll_se": 0.0, "entropy_se": 0.0}]
    point = {"entropy": 1.25, "judge_nll": 2.0, "judge_nll_se": 0.0, "entropy_se": 0.0}
    difference, se = difference_at(curve, point)
    # curve at 1.25: 2.5; d/d e_0 = -slope (1 - w) = -2 * 0.75
    assert difference == pytest.approx(0.5) and se == pytest.approx(0.15)


def test_difference_at_reads_a_one_point_curve_at_its_own_entropy_only():
    from ddpd.eval.quality import difference_at

    curve = [{"entropy": 2.0, "judge_nll": 3.0, "judge_nll_se": 0.3, "entropy_se": 0.1}]
    point = {"entropy": 2.0, "judge_nll": 2.5, "judge_nll_se": 0.4, "entropy_se": 0.2}
    assert difference_at(curve, point) == (pytest.approx(0.5), pytest.approx(0.5))  # slope 0: the NLLs' s.e.
    assert difference_at(curve, dict(point, entropy=2.01)) is None


def test_z_changed_compares_each_step_with_the_one_before():
    outputs = iter([torch.tensor([[5.0, 5.0]]), torch.tensor([[-9.0, 5.0]]), torch.tensor([[-9.0, -9.0]])])
    recorder = PlannerRecorder(lambda x: next(outputs))
    recorder.start_run(1)
    for _ in range(3):
        recorder(torch.zeros(1, 2, dtype=torch.long))
    # step 2 flips position 1 only: against step 0 both positions would have flipped
    assert [row["z_changed"] for row in recorder.rows()[1:]] == [0.5, 0.5]


def test_unigram_entropy_divides_by_the_sample_length_not_the_sample_count():
    enc = Text8Tokenizer().encode
    x = torch.tensor([enc("aabbccdd"), enc("aaaaaaaa")])  # 2 samples of 8 tokens
    torch.testing.assert_close(unigram_entropy(x, V), torch.tensor([2.0, 0.0]))


def test_sweep_counts_passes_only_from_samplers_that_report_both_and_averages_the_steps(judge):
    """A sampler without planner_rows and denoiser_rows has no forward-pass count (not 0),
    and one with denoiser_rows alone none either: half the passes are not the passes."""
    def tokens(n, first_row):
        return (torch.arange(first_row, first_row + n)[:, None] + torch.arange(16)) % V

    def uncounted(n, steps, temperature, seed, first_row):  # stop steps 0, 1, 2, 3: mean 1.5
        return SimpleNamespace(tokens=tokens(n, first_row), stop_step=torch.arange(first_row, first_row + n))

    def half(n, steps, temperature, seed, first_row):
        return SimpleNamespace(tokens=tokens(n, first_row), denoiser_rows=n * steps)

    rows = run_sweep([SamplerSpec("uncounted", uncounted), SamplerSpec("half", half)], steps=[2],
                     temperatures=[1.0], num_samples=4, judge=judge, vocab_size=V, batch_size=3)
    assert [(r["mean_steps"], r["nfe"]) for r in rows] == [(1.5, None), (None, None)]


def test_matched_entropy_and_difference_at_sort_each_sweep_by_entropy():
    """A sweep's rows come in temperature order, which need not be the order of their entropy."""
    from ddpd.eval.quality import difference_at, matched_entropy

    ours = _curve("ddpd", 512, [(4.10, 2.6), (3.90, 2.0), (4.00, 2.2)])
    theirs = _curve("dfm", 512, [(4.05, 2.3), (3.95, 2.3)])
    result = matched_entropy(ours + theirs, "ddpd", "dfm", 512)
    assert (result["better"], result["worse"], result["matched"]) == (1, 1, 2)
    assert result["nll_difference"] == pytest.approx((-0.2 + 0.1) / 2)
    assert difference_at(ours, {"entropy": 4.05, "judge_nll": 2.3})[0] == pytest.approx(0.1)


@pytest.mark.parametrize("entropy", [1.0, 2.0])
def test_a_point_at_either_end_of_the_curve_takes_the_end_segments_slope(entropy):
    """At a curve's end its one segment gives the slope that carries the point's entropy error."""
    from ddpd.eval.quality import difference_at

    curve = [{"entropy": 1.0, "judge_nll": 2.0, "judge_nll_se": 0.0, "entropy_se": 0.0},
             {"entropy": 2.0, "judge_nll": 4.0, "judge_nll_se": 0.0, "entropy_se": 0.0}]
    point = {"entropy": entropy, "judge_nll": 2.0 * entropy, "judge_nll_se": 0.0, "entropy_se": 0.1}
    assert difference_at(curve, point) == (pytest.approx(0.0), pytest.approx(0.2))  # slope 2 x 0.1


def test_planner_recorder_refuses_no_eps_or_an_eps_of_0_or_1():
    for eps in ((0.0,), (0.05, 1.0), ()):
        with pytest.raises(ValueError, match=r"eps must be thresholds in \(0, 1\)"):
            PlannerRecorder(lambda x: x, eps=eps)


def _plots():
    from ddpd.eval.convergence import plot_convergence
    from ddpd.eval.frontier import plot_frontier
    from ddpd.eval.quality import plot_quality

    sweep = [{"sampler": "ddpd-A", "steps": 8, "temperature": t, "entropy": 3.0 + t, "judge_nll": 2.0 - t}
             for t in (0.9, 1.0)]
    frontier = [{"sampler": "maskgit", "policy": "", "passes": p, "temperature": 1.0, "entropy": 3.9,
                 "judge_nll": 2.0} for p in (32, 64)]
    steps = [{"step": i, "noise_left": 0.5, "z_changed": 0.0, "met_eps_0.01": 0.0} for i in range(3)]
    return [(plot_quality, sweep), (plot_frontier, frontier), (plot_convergence, steps)]


@pytest.mark.parametrize("index", range(3))
def test_every_plot_closes_its_figure_written_or_not(tmp_path, index):
    """pyplot holds a figure until it is closed: the frontier's plot never closed its own (a
    test run warned of more than 20 open figures), and none closed one whose write failed."""
    plt = pytest.importorskip("matplotlib.pyplot")
    plot, rows = _plots()[index]
    before = plt.get_fignums()
    plot(rows, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 0 and plt.get_fignums() == before
    (tmp_path / "file").write_text("")
    with pytest.raises(Exception):  # a parent that is a file: whichever error the OS gives
        plot(rows, str(tmp_path / "file" / "plot.png"))
    assert plt.get_fignums() == before


def test_unigram_entropy_refuses_an_id_outside_the_vocabulary():
    """An id of V or more (or below 0) has no count to go to: named, not an index error of scatter."""
    for x, got in (([[0, 27]], r"\[0, 27\]"), ([[-1, 3]], r"\[-1, 3\]")):
        with pytest.raises(ValueError, match=rf"^x must hold ids in \[0, 27\), got range {got}$"):
            unigram_entropy(torch.tensor(x), V)


def test_a_sweep_with_two_temperatures_of_one_entropy_is_read_without_dividing_by_zero():
    """Greedy-like temperatures can give identical samples, so a sweep may hold one entropy twice:
    its vertical segment has no slope, and the curve is read on the segment after it."""
    from ddpd.eval.quality import difference_at, matched_entropy

    curve = [{"entropy": 2.0, "judge_nll": 3.0}, {"entropy": 2.0, "judge_nll": 3.5},
             {"entropy": 3.0, "judge_nll": 4.0}]
    assert difference_at(curve, {"entropy": 2.0, "judge_nll": 3.0}) == (0.5, None)  # 3.5 on (2.0, 3.5)-(3.0, 4.0)
    assert difference_at(curve, {"entropy": 2.5, "judge_nll": 3.0}) == (0.75, None)
    rows = [dict(r, sampler="ddpd", steps=8) for r in curve] + [{"sampler": "dfm", "steps": 8, "entropy": 2.0,
                                                                 "judge_nll": 4.0}]
    result = matched_entropy(rows, "ddpd", "dfm", 8)
    assert (result["better"], result["matched"], result["nll_difference"]) == (1, 1, -0.5)


def test_judge_nll_is_float32_whatever_the_judge_returns():
    class DoubleJudge:
        def log_likelihood(self, x):
            return -x.sum(1).double()

    nll = judge_nll(DoubleJudge(), torch.ones(3, 4, dtype=torch.long))
    assert nll.dtype == torch.float32 and nll.tolist() == [1.0, 1.0, 1.0]


def test_matched_difference_of_exact_rows_has_a_standard_error_of_0():
    """Rows whose standard errors are all 0 (identical samples) give a difference known exactly:
    0, not an unknown standard error."""
    from ddpd.eval.quality import difference_at, matched_entropy

    ours = _curve("ddpd", 512, [(1.0, 2.0), (2.0, 4.0)])
    theirs = _curve("dfm", 512, [(1.5, 2.5)])
    for row in ours + theirs:
        row["judge_nll_se"] = row["entropy_se"] = 0.0
    result = matched_entropy(ours + theirs, "ddpd", "dfm", 512)
    assert (result["nll_difference"], result["nll_difference_se"]) == (pytest.approx(0.5), 0.0)
    assert difference_at(ours, theirs[0]) == (pytest.approx(0.5), 0.0)


def test_a_curve_of_one_entropy_is_read_at_its_first_row():
    """Every row of a sweep at one entropy (identical samples at each temperature): the curve is
    its first row in temperature order, whose standard error the difference takes."""
    from ddpd.eval.quality import difference_at

    curve = [{"entropy": 2.0, "judge_nll": 3.0, "judge_nll_se": 0.3, "entropy_se": 0.0},
             {"entropy": 2.0, "judge_nll": 3.5, "judge_nll_se": 0.0, "entropy_se": 0.0}]
    point = {"entropy": 2.0, "judge_nll": 2.0, "judge_nll_se": 0.4, "entropy_se": 0.1}
    assert difference_at(curve, point) == (pytest.approx(1.0), pytest.approx(0.5))


def test_sweep_counts_no_passes_when_any_batch_leaves_them_out(judge):
    """A sampler whose first batch reports no forward passes: the passes of the later batches
    alone are not the configuration's passes."""
    def late(n, steps, temperature, seed, first_row):
        tokens = (torch.arange(first_row, first_row + n)[:, None] + torch.arange(16)) % V
        counts = dict(planner_rows=n, denoiser_rows=n) if first_row else {}
        return SimpleNamespace(tokens=tokens, **counts)

    rows = run_sweep([SamplerSpec("late", late)], steps=[2], temperatures=[1.0], num_samples=4, judge=judge,
                     vocab_size=V, batch_size=3)
    assert rows[0]["nfe"] is None


@pytest.mark.parametrize("vocab_size, error, match", [
    (0, ValueError, "vocab_size must be >= 1, got 0"),
    (2.0, TypeError, "vocab_size must be an int, got float 2.0"),
])
def test_unigram_entropy_refuses_a_vocabulary_size_that_is_no_count_by_name(vocab_size, error, match):
    with pytest.raises(error, match=f"^{match}$"):
        unigram_entropy(torch.zeros(1, 3, dtype=torch.long), vocab_size)


def test_the_quality_plot_puts_three_budgets_two_panels_a_line(tmp_path):
    """Three step budgets: two columns of panels, over two lines (the image's size follows)."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from ddpd.eval.quality import plot_quality

    rows = [{"sampler": "ddpd-A", "steps": s, "temperature": t, "entropy": 3.0 + t, "judge_nll": 2.0 - t}
            for s in (8, 16, 32) for t in (0.9, 1.0)]
    plot_quality(rows, str(tmp_path / "plot.png"))
    height, width = plt.imread(str(tmp_path / "plot.png")).shape[:2]
    assert (width, height) == (2 * 6 * 150, 2 * 4.5 * 150)


def test_quality_metrics_refuses_an_id_outside_the_vocabulary_before_judging():
    """The tokens are checked by their own name, before the judge sees an id it has no row for."""
    judged = []

    class RecordingJudge:
        def log_likelihood(self, x):
            judged.append(x)
            return torch.zeros(x.shape[0])

    with pytest.raises(ValueError, match=r"^tokens must hold ids in \[0, 27\), got range \[0, 27\]$"):
        quality.quality_metrics(torch.tensor([[0, 27]]), RecordingJudge(), V)
    assert judged == []


def test_read_sweep_names_a_frontier_csv_with_columns_of_its_own(tmp_path):
    """A frontier CSV holds more columns than the ones that tell it apart (policy and passes)."""
    path = tmp_path / "frontier.csv"
    path.write_text("sampler,policy,steps,temperature,judge_nll,judge_nll_se,entropy,entropy_se,passes,num_samples\n"
                    "maskgit,maskgit,4,1.0,3.2,0.1,3.1,0.1,4,8\n")
    with pytest.raises(ValueError, match=r"frontier.csv: a frontier CSV \(ddpd-eval frontier\), not a sweep CSV"):
        quality.read_sweep(str(path))


def test_merge_sweeps_names_the_part_of_the_first_reference_row():
    """The first part without a reference row: the message names the part whose reference row was kept."""
    row = {"sampler": "maskgit", "steps": 2, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}
    reference = {"sampler": quality.REFERENCE, "steps": "", "temperature": "", "judge_nll": 1.2, "entropy": 4.0}
    parts = [[row], [reference, dict(row, steps=3)], [dict(reference, judge_nll=1.4), dict(row, steps=4)]]
    with pytest.raises(ValueError, match="^the reference rows of b and c differ"):
        quality.merge_sweeps(parts, ["a", "b", "c"])


@pytest.mark.parametrize("cells, key", [("nan,4.1", "judge_nll"), ("1.5,", "entropy"), ("1.5,inf", "entropy")])
def test_read_sweep_refuses_a_reference_row_without_finite_measurements(tmp_path, cells, key):
    """merge_sweeps compares reference rows by their judge NLL and entropy: both must be numbers."""
    path = tmp_path / "sweep.csv"
    path.write_text(f"sampler,steps,temperature,judge_nll,entropy\nheld-out text,,,{cells}\nmaskgit,2,1.0,3.2,3.1\n")
    with pytest.raises(ValueError, match=f"sweep.csv line 2: {key} must be a finite number"):
        quality.read_sweep(str(path))


def test_planner_recorder_boundaries_p_one_half_is_clean_and_p_eps_is_not_met():
    """A position is predicted noisy iff p > 0.5 (logit 0 is clean), and a sample meets eps iff
    p < eps everywhere (p == eps does not)."""
    outputs = iter([torch.zeros(1, 2), torch.tensor([[-9.0, -9.0]])])
    recorder = PlannerRecorder(lambda x: next(outputs), eps=(0.5,))
    recorder.start_run(1)
    for _ in range(2):
        recorder(torch.zeros(1, 2, dtype=torch.long))
    first, second = recorder.rows()
    assert second["z_changed"] == 0.0  # clean at both steps
    assert first["met_eps_0.5"] == 0.0 and second["met_eps_0.5"] == 1.0


def test_planner_recorder_reads_low_precision_logits_in_float32():
    """bfloat16 logits (an autocast planner) are recorded as float32 probabilities."""
    logits = torch.tensor([[1.0, -2.0, 3.0]], dtype=torch.bfloat16)
    recorder = PlannerRecorder(lambda x: logits)
    recorder.start_run(1)
    assert recorder(torch.zeros(1, 3, dtype=torch.long)) is logits
    expected = torch.sigmoid(logits.float()).mean().item()
    assert recorder.rows()[0]["noise_left"] == pytest.approx(expected, rel=1e-6)


def test_planner_recorder_keeps_the_eps_in_the_order_given():
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape), eps=(0.01, 0.1, 0.05))
    recorder.start_run(1)
    recorder(torch.zeros(1, 2, dtype=torch.long))
    assert [k for k in recorder.rows()[0] if k.startswith("met_eps_")] == [
        "met_eps_0.01", "met_eps_0.1", "met_eps_0.05"]


def test_planner_recorder_and_stopped_fraction_refuse_zero_sizes():
    with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0$"):
        PlannerRecorder(lambda x: x).start_run(0)
    with pytest.raises(ValueError, match="^steps must be >= 1, got 0$"):
        stopped_fraction(torch.tensor([0, 1]), steps=0)


def test_convergence_rows_leave_the_recorded_rows_alone_and_name_the_eps_exactly():
    """The stopped column is added to copies, and named by float_text: 0.05000001 is not 0.05."""
    recorded = [{"step": i, "noise_left": 0.5, "z_changed": 0.0} for i in range(2)]
    rows = convergence_rows(recorded, torch.tensor([0.25, 1.0]), eps=0.05000001)
    assert [r["stopped_eps_0.05000001"] for r in rows] == [0.25, 1.0]
    assert all(set(r) == {"step", "noise_left", "z_changed"} for r in recorded)


def test_planner_recorder_numbers_steps_from_0_and_refuses_what_is_not_callable():
    recorder = PlannerRecorder(lambda x: torch.zeros(x.shape))
    recorder.start_run(1)
    for _ in range(3):
        recorder(torch.zeros(1, 2, dtype=torch.long))
    assert [row["step"] for row in recorder.rows()] == [0, 1, 2]
    with pytest.raises(TypeError, match="^planner must be callable, got int$"):
        PlannerRecorder(3)


@pytest.mark.parametrize("eps", [("0.01",), ("0.1", "0.05", "0.01")])
def test_the_convergence_plot_draws_both_top_panels_and_hides_the_empty_ones(monkeypatch, tmp_path, eps):
    """One eps still gets the z-flips panel; with three the third top panel is turned off."""
    pytest.importorskip("matplotlib")
    figures = []
    monkeypatch.setattr(convergence, "save_figure", lambda fig, path, **kwargs: figures.append(fig))
    rows = [{"step": i, "noise_left": 0.5, "z_changed": 0.0, **{f"met_eps_{e}": 0.0 for e in eps}} for i in range(3)]
    convergence.plot_convergence(rows, str(tmp_path / "c.png"))
    top = figures[0].axes[:max(2, len(eps))]
    assert [ax.get_title() for ax in top[:2]] == ["noise left: sum_d p(z=N) / D",
                                                  "fraction of z flips vs previous step"]
    assert [ax.axison for ax in top] == [True, True] + [False] * (len(top) - 2)


def test_stopped_fraction_counts_a_stop_at_the_last_step():
    """stop_step == steps - 1 stopped within the budget; only stop_step == steps used it all."""
    torch.testing.assert_close(stopped_fraction(torch.tensor([4, 5]), steps=5), torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5]))


def test_planner_recorder_passes_the_time_on_and_tracks_0_05_and_0_01_by_default():
    times = []

    def planner(x, t):
        times.append(t)
        return torch.full(x.shape, -9.0)

    recorder = PlannerRecorder(planner)
    recorder.start_run(1)
    t = torch.tensor([0.25])
    recorder(torch.zeros(1, 2, dtype=torch.long), t)
    assert times == [t]
    assert [k for k in recorder.rows()[0] if k.startswith("met_eps_")] == ["met_eps_0.05", "met_eps_0.01"]
    assert "stopped_eps_0.01" in convergence_rows(recorder.rows(), torch.ones(1))[0]


def test_planner_recorder_names_the_eps_it_was_given_when_refusing_them():
    with pytest.raises(ValueError, match=r"^eps must be thresholds in \(0, 1\), got \(0.5, 1\)$"):
        PlannerRecorder(lambda x: x, eps=(0.5, 1))
