"""ddpd-eval end to end on tiny untrained checkpoints and a slice of text8-mini."""
import csv
import importlib.util
import json
import os
import re
import socket

import pytest
import torch

from ddpd.assets import BOOKS
from ddpd.checkpoint import STATE_META, CheckpointError, save_checkpoint
from ddpd.cli.eval import main
from ddpd.eval import training
from ddpd.models import build_model, config_for
from hang_guard import HANG_GUARD_SECONDS, default_signals

V, L = 27, 16
WIKI = str(BOOKS)  # the text8-format corpus shipped with the package


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_cli")
    torch.manual_seed(0)
    paths = {}
    for kind in ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar"):
        config = config_for(kind, V, L, d_model=16, n_layers=1, n_heads=2)
        paths[kind] = str(root / kind)
        save_checkpoint(paths[kind], build_model(kind, config),
                        {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"},
                         "schedule": "linear", "vocab_size": V, "training": {"seq_len": L}})
    with open(WIKI, encoding="ascii") as f:
        (root / "slice.txt").write_text(f.read(20_000))
    paths["data"] = str(root / "slice.txt")
    paths["root"] = root
    return paths


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_elbo_command_writes_reproducible_tables(setup, capsys):
    p = setup
    args = ["elbo", "--planner", p["planner"], "--denoiser", p["mask-denoiser"], p["uniform-denoiser"],
            "--uniform", p["uniform"], "--data", p["data"], "--num-sequences", 6, "--batch-size", 4,
            "--no-progress"]
    results = []
    for name in ("a.json", "b.json"):
        code, out, err = _run(capsys, *args, "--out", p["root"] / name)
        assert code == 0, err
        with open(p["root"] / name) as f:
            results.append(json.load(f))
    assert "| planner+mask-denoiser |" in out and "Denoising at alpha = 0.85" in out
    assert (p["root"] / "b.md").read_text().strip() == out.strip()
    first, second = results
    assert [r["method"] for r in first["elbo"]] == ["uniform", "planner+uniform-denoiser", "planner+mask-denoiser",
                                                    "planner+mask-denoiser(true-mask)", "mask-diffusion"]
    assert [r["denoiser"] for r in first["denoising"]] == ["uniform", "uniform-denoiser", "mask-denoiser",
                                                           "mask-denoiser-planner"]
    assert first["elbo"] == second["elbo"] and first["denoising"] == second["denoising"]
    assert all(r["num_sequences"] == 6 and r["length"] == L for r in first["elbo"])


def test_elbo_refuses_what_it_cannot_do_before_working(setup, capsys, tmp_path):
    """Usage errors (exit 2, naming the flag) before any model runs: an --out whose Markdown
    twin is itself (the table overwrote the JSON), checkpoints that give no row at all, a
    --t-max whose alpha is 0 under the checkpoints' schedule."""
    p = setup
    common = ["--data", p["data"], "--num-sequences", 2, "--no-progress"]
    code, out, err = _run(capsys, "elbo", "--planner", p["planner"], "--denoiser", p["mask-denoiser"], *common,
                          "--out", tmp_path / "results.md")
    assert code == 2 and "--out" in err and "give a .json path" in err and not list(tmp_path.iterdir())
    code, out, err = _run(capsys, "elbo", "--planner", p["planner"], *common)
    assert code == 2 and "neither an ELBO nor a denoising row" in err, err
    config = config_for("mask-denoiser", V, L, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(tmp_path / "cosine", build_model("mask-denoiser", config),
                    {"kind": "mask-denoiser", "model": config.to_dict(), "tokenizer": {"name": "text8"},
                     "schedule": "cosine", "vocab_size": V, "training": {"seq_len": L}})
    code, out, err = _run(capsys, "elbo", "--denoiser", tmp_path / "cosine", *common, "--t-max", 1e-9)
    assert code == 2 and err.startswith("ddpd-eval: error: --t-max 1e-09: alpha(t_max)") and "cosine" in err, err


def _time_dependent_denoiser(path, schedule):
    """A mask denoiser whose logits depend on t, recorded with `schedule`: an untrained one
    ignores t (adaLN-Zero starts its modulation at zero), so no schedule would show."""
    torch.manual_seed(1)
    config = config_for("mask-denoiser", V, L, d_model=16, n_layers=1, n_heads=2)
    model = build_model("mask-denoiser", config)
    with torch.no_grad():
        for param in model.parameters():
            if not param.any():
                param.normal_(0.0, 0.5)
    save_checkpoint(path, model, {"kind": "mask-denoiser", "model": config.to_dict(), "tokenizer": {"name": "text8"},
                                  "schedule": schedule, "vocab_size": V, "training": {"seq_len": L}})
    return path


def test_elbo_rows_are_the_estimators_under_the_checkpoints_schedule_and_seed(setup, capsys, tmp_path):
    """The rows are evaluate_elbo's and evaluate_denoising's under the schedule the checkpoint
    records and the --seed given; the same weights under the linear schedule, or another
    seed, give other rows."""
    from ddpd.checkpoint import load_model
    from ddpd.eval import ModelSet, evaluate_denoising, evaluate_elbo, heldout_sequences
    from ddpd.training.data import Text8Tokenizer

    rows = {}
    for name, schedule, seed in (("cosine", "cosine", 5), ("linear", "linear", 5), ("seed 0", "cosine", 0)):
        checkpoint = _time_dependent_denoiser(tmp_path / schedule, schedule)
        out = tmp_path / f"{name}.json"
        code, _, err = _run(capsys, "elbo", "--denoiser", checkpoint, "--data", setup["data"], "--num-sequences", 2,
                            "--seed", seed, "--no-progress", "--out", out)
        assert code == 0, err
        results = json.loads(out.read_text())
        rows[name] = (results["elbo"], results["denoising"])
    for other in ("linear", "seed 0"):
        for table, mine, theirs in zip(("elbo", "denoising"), rows["cosine"], rows[other]):
            assert mine != theirs, (other, table)
    models = ModelSet(V, mask_denoiser=load_model(tmp_path / "cosine")[0].eval())
    sequences = heldout_sequences(setup["data"], Text8Tokenizer(), L, "test", 2)
    with torch.no_grad():
        expected = (evaluate_elbo(models, sequences, t_max=0.999, schedule="cosine", seed=5),
                    evaluate_denoising(models, sequences, alpha=0.85, schedule="cosine", seed=5))
    assert json.loads(json.dumps(expected)) == list(rows["cosine"])


def test_elbo_of_a_lone_uniform_denoiser_is_its_denoising_table(setup, capsys, tmp_path):
    code, out, err = _run(capsys, "elbo", "--denoiser", setup["uniform-denoiser"], "--data", setup["data"],
                          "--num-sequences", 2, "--no-progress", "--out", tmp_path / "r.json")
    assert code == 0, err
    assert "ELBO" not in out and "Denoising at alpha = 0.85" in out and "| uniform-denoiser |" in out
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["elbo"] == [] and [r["denoiser"] for r in results["denoising"]] == ["uniform-denoiser"]


def test_a_denoising_only_run_names_its_tokens_settings_and_takes_any_t_max(setup, capsys, tmp_path):
    """With no ELBO row the table is still headed by the tokens it ran on; --out's settings are
    the command line's, less the subcommand and the terminal's; --t-max, read by the ELBO rows
    alone, is not checked against the schedule (its cosine alpha of 1e-9 is 0)."""
    config = config_for("uniform-denoiser", V, L, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(tmp_path / "cosine", build_model("uniform-denoiser", config),
                    {"kind": "uniform-denoiser", "model": config.to_dict(), "tokenizer": {"name": "text8"},
                     "schedule": "cosine", "vocab_size": V, "training": {"seq_len": L}})
    out = tmp_path / "r.json"
    code, printed, err = _run(capsys, "elbo", "--denoiser", tmp_path / "cosine", "--data", setup["data"],
                              "--split", "validation", "--num-sequences", 3, "--t-max", 1e-9, "--seed", 4,
                              "--batch-size", 2, "--no-progress", "--out", out)
    assert code == 0 and err == "", err
    assert printed.startswith(f"On 3 x {L} tokens of the validation split\n\nDenoising at alpha = 0.85\n\n| Denoiser |")
    assert json.loads(out.read_text())["settings"] == {
        "planner": None, "denoiser": [str(tmp_path / "cosine")], "uniform": None, "data": setup["data"],
        "split": "validation", "num_sequences": 3, "mc_samples": 1, "t_max": 1e-9, "alpha": 0.85, "batch_size": 2,
        "seed": 4, "device": "auto", "threads": None, "out": str(out)}


def test_models_of_different_lengths_are_warned_about(setup, capsys, tmp_path):
    config = config_for("planner", V, 2 * L, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(tmp_path / "long", build_model("planner", config),
                    {"kind": "planner", "model": config.to_dict(), "tokenizer": {"name": "text8"},
                     "training": {"seq_len": 2 * L}})
    code, out, err = _run(capsys, "elbo", "--planner", tmp_path / "long", "--denoiser", setup["mask-denoiser"],
                          "--data", setup["data"], "--num-sequences", 2, "--no-progress")
    assert code == 0, err
    assert err == (f"ddpd-eval: warning: --planner {tmp_path / 'long'} takes sequences of {2 * L} tokens, "
                   f"--denoiser {setup['mask-denoiser']} of {L}: using {L}\n")
    assert f"on 2 x {L} tokens" in out


def test_data_other_than_the_recorded_corpus_is_warned_about(setup, capsys, tmp_path):
    """Evaluated on a prefix of its training corpus, a denoiser's "test split" lay inside
    the text it was trained on, and nothing said so."""
    from ddpd.training.data import fingerprint

    with open(WIKI, encoding="ascii") as f:
        whole = f.read(40_000)
    (tmp_path / "whole.txt").write_text(whole)
    config = config_for("mask-denoiser", V, L, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(tmp_path / "d", build_model("mask-denoiser", config),
                    {"kind": "mask-denoiser", "model": config.to_dict(), "tokenizer": {"name": "text8"},
                     "corpus": fingerprint(whole)})
    args = ["elbo", "--denoiser", tmp_path / "d", "--num-sequences", 2, "--no-progress"]
    code, _, err = _run(capsys, *args, "--data", tmp_path / "whole.txt")
    assert code == 0 and err == "", err
    code, _, err = _run(capsys, *args, "--data", setup["data"])  # its first 20 000 characters
    assert code == 0 and err == (f"ddpd-eval: warning: --denoiser {tmp_path / 'd'} was trained on another corpus "
                                 f"than --data {setup['data']} (the fingerprints differ): the test split is held out "
                                 "of --data only, not of the text the networks were trained on\n")


def test_quality_command(setup, capsys):
    p = setup
    out_dir = p["root"] / "quality"
    code, out, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                          "--judge", p["ar"], "--data", p["data"], "--samplers", "ddpd-A-mask", "dfm-eta0",
                          "--steps", 2, "--temperatures", 1.0, "--num-samples", 2, "--reference-sequences", 3,
                          "--out-dir", out_dir, "--no-progress")
    assert code == 0, err
    with open(out_dir / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["sampler"] for r in rows] == ["held-out text", "ddpd-A-mask", "dfm-eta0"]
    assert "wrote " in out


def test_quality_with_an_ngram_judge_scores_with_the_ngram_of_the_train_split(setup, capsys):
    """--judge ngram:ORDER builds the judge from --data's train split, as frontier's does, and
    names it in every row, so that merge refuses parts judged by another order."""
    from ddpd.eval import heldout_sequences, judge_nll
    from ddpd.eval.ngram import NGramJudge
    from ddpd.training.data import load_splits, tokenizer_from_config

    p = setup
    argv = ["--denoiser", p["mask-denoiser"], "--data", p["data"], "--samplers", "maskgit", "--steps", 2,
            "--temperatures", 1.0, "--num-samples", 2, "--reference-sequences", 3, "--no-progress"]
    rows = {}
    for order in (2, 3):
        out_dir = p["root"] / f"quality-ngram{order}"
        code, _, err = _run(capsys, "quality", "--judge", f"ngram:{order}", *argv, "--out-dir", out_dir)
        assert code == 0 and err == "", err
        with open(out_dir / "sweep.csv") as f:
            rows[order] = list(csv.DictReader(f))
    tokenizer = tokenizer_from_config({"name": "text8"})
    reference = heldout_sequences(p["data"], tokenizer, L, "test", 3)
    judge = NGramJudge(load_splits(p["data"], tokenizer)["train"], V, 3)
    assert float(rows[3][0]["judge_nll"]) == pytest.approx(judge_nll(judge, reference).mean().item(), rel=1e-6)
    assert rows[2][0]["judge_nll"] != rows[3][0]["judge_nll"]
    assert {r["judge"] for r in rows[3]} == {rows[3][0]["judge"]} and rows[3][0]["judge"].startswith("ngram:3:")
    code, _, err = _run(capsys, "merge", p["root"] / "quality-ngram2" / "sweep.csv",
                        p["root"] / "quality-ngram3" / "sweep.csv", "--out-dir", p["root"] / "merged-ngram")
    assert code == 1 and "were judged by different judges (ngram:2:" in err, err
    code, _, err = _run(capsys, "quality", "--judge", "ngram", *argv[:2], "--out-dir", p["root"] / "q-no-data")
    assert code == 2 and err == "ddpd-eval: error: --judge ngram needs --data (its train split builds the judge)\n"


def test_networks_that_return_nan_are_warned_about(setup, capsys, tmp_path):
    """The samplers' NaNOutputWarning, for each sampled configuration, as one line of the tool."""
    p = setup
    config = config_for("mask-denoiser", V, L, d_model=16, n_layers=1, n_heads=2)
    model = build_model("mask-denoiser", config)
    with torch.no_grad():
        model.backbone.embed.weight.mul_(3e37)  # finite weights that overflow float32: NaN logits
    save_checkpoint(str(tmp_path / "nan"), model, {"kind": "mask-denoiser", "model": config.to_dict(),
                                                   "tokenizer": {"name": "text8"}, "schedule": "linear"})
    code, _, err = _run(capsys, "quality", "--denoiser", tmp_path / "nan", "--judge", p["ar"], "--data", p["data"],
                        "--samplers", "dfm-eta0", "maskgit", "--steps", 2, "--temperatures", 1.0, "--num-samples", 2,
                        "--reference-sequences", 3, "--out-dir", tmp_path / "q", "--no-progress")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "NaN" in line]
    assert len(warnings) == 2 and all(line.startswith("ddpd-eval: warning: the denoiser returned NaN or +inf in 2 of 2 "
                                                      "passes") for line in warnings), err


def test_quality_sweep_with_truncated_draws(setup, capsys):
    """--top-k/--top-p/--min-p cut every sampler's token draws and name themselves in the
    sampler names; --top-k 1 is the greedy sweep (--temperatures 0), sample for sample."""
    p = setup
    tables = {}
    for name, argv in (("greedy", ["--temperatures", 0.0]), ("top-k", ["--top-k", 1]),
                       ("top-p", ["--top-p", 0.5, "--min-p", 0.1])):
        code, _, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                            "--judge", p["ar"], "--samplers", "ddpd-A-mask", "maskgit", "--steps", 3,
                            "--num-samples", 3, "--out-dir", p["root"] / f"q-{name}", "--no-progress", *argv)
        assert code == 0, err
        with open(p["root"] / f"q-{name}" / "sweep.csv") as f:
            tables[name] = [(r["sampler"], r["judge_nll"], r["entropy"]) for r in csv.DictReader(f)]
    assert [r[0] for r in tables["top-k"]] == ["ddpd-A-mask top-k=1"] * 3 + ["maskgit top-k=1"] * 3
    assert [r[0] for r in tables["top-p"]][::3] == ["ddpd-A-mask top-p=0.5 min-p=0.1", "maskgit top-p=0.5 min-p=0.1"]
    greedy = [r[1:] for r in tables["greedy"]]
    assert [r[1:] for r in tables["top-k"]] == [g for g in greedy for _ in range(3)]  # at every temperature
    code, _, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                        "--judge", p["ar"], "--top-k", 0, "--out-dir", p["root"] / "q-bad")
    assert code == 2 and err.count("\n") == 1 and "--top-k" in err


def test_an_interrupted_sweep_leaves_the_previous_sweep_and_its_own_rows_apart(setup, capsys, monkeypatch):
    """A rerun into the same --out-dir, interrupted, rewrote sweep.csv with its own rows only,
    while sweep.md and sweep.png still showed the previous sweep."""
    import signal

    import ddpd.eval.quality as quality

    p = setup
    out_dir = p["root"] / "rerun"
    common = ["quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"], "--judge", p["ar"],
              "--samplers", "ddpd-A-mask", "dfm-eta0", "--temperatures", 1.0, "--num-samples", 2, "--no-progress",
              "--out-dir", out_dir]
    code, _, err = _run(capsys, *common, "--steps", 2)
    assert code == 0, err
    before = {name: (out_dir / name).read_bytes() for name in ("sweep.csv", "sweep.md")}
    metrics, calls = quality.quality_metrics, []

    def signalled_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics(*args, **kwargs)

    monkeypatch.setattr(quality, "quality_metrics", signalled_at_the_second)
    code, _, err = _run(capsys, *common, "--steps", 3)
    partial = out_dir / "sweep.partial.csv"
    assert code == 128 + signal.SIGTERM
    assert err == f"ddpd-eval: interrupted by SIGTERM; the 1 finished row(s) are in {partial}\n"
    assert {name: (out_dir / name).read_bytes() for name in before} == before
    with open(partial) as f:
        assert [(r["sampler"], r["steps"]) for r in csv.DictReader(f)] == [("ddpd-A-mask", "3")]
    calls[:] = [1]  # stopped again before its first row: the partial file is not this run's
    code, _, err = _run(capsys, *common, "--steps", 3)
    assert err == f"ddpd-eval: interrupted by SIGTERM; no row was finished, nothing written ({partial} is an " \
                  "earlier run's)\n"
    monkeypatch.setattr(quality, "quality_metrics", metrics)
    code, _, err = _run(capsys, *common, "--steps", 3)
    assert code == 0, err
    plot = ["sweep.png"] if importlib.util.find_spec("matplotlib") else []  # the [eval] extra draws it
    assert not partial.exists() and sorted(n for n in os.listdir(out_dir) if not n.startswith(".")) == [
        "sweep.csv", "sweep.md", *plot]


def test_sweep_run_in_parts_merges_into_the_whole_sweep(setup, capsys):
    p = setup
    common = ["quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"], "--judge", p["ar"],
              "--data", p["data"], "--steps", 2, 3, "--temperatures", 1.0, "--num-samples", 2,
              "--reference-sequences", 3, "--no-progress"]
    runs = {"whole": ["ddpd-A-mask", "dfm-eta0", "maskgit"], "part1": ["ddpd-A-mask"],
            "part2": ["dfm-eta0", "maskgit"]}
    for name, samplers in runs.items():
        code, _, err = _run(capsys, *common, "--samplers", *samplers, "--out-dir", p["root"] / name)
        assert code == 0, err
    code, out, err = _run(capsys, "merge", p["root"] / "part1" / "sweep.csv", p["root"] / "part2" / "sweep.csv",
                          "--out-dir", p["root"] / "merged")
    assert code == 0, err
    assert "| held-out text |" in out

    def table(name):
        with open(p["root"] / name / "sweep.csv") as f:
            return [{k: v for k, v in row.items() if k != "sampling_seconds"} for row in csv.DictReader(f)]

    assert table("merged") == table("whole") and len(table("whole")) == 1 + 3 * 2
    assert (p["root"] / "merged" / "sweep.md").read_text() != ""
    code, _, err = _run(capsys, "merge", p["root"] / "part1" / "sweep.csv", p["root"] / "whole" / "sweep.csv",
                        "--out-dir", p["root"] / "twice")
    assert code == 1 and (f"appears in both {p['root'] / 'part1' / 'sweep.csv'} and "
                          f"{p['root'] / 'whole' / 'sweep.csv'}") in err, err


def _sweep_text(rows):
    header = "sampler,steps,temperature,judge_nll,entropy,notes"
    return "\n".join([header] + rows) + "\n"


@pytest.mark.parametrize("rows, message", [
    ([], "holds no row"),
    (["ddpd-A-mask,2,1.0,3.2,nan,"], "line 2: entropy must be a finite number, got nan"),
    (["ddpd-A-mask,2,1.0,inf,3.1,"], "line 2: judge_nll must be a finite number, got inf"),
    (["ddpd-A-mask,,1.0,3.2,3.1,"], "line 2: steps must be an int >= 1, got None"),
    (["ddpd-A-mask,two,1.0,3.2,3.1,"], "line 2: steps must be a number, got 'two'"),
    (["ddpd-A-mask,0,1.0,3.2,3.1,"], "line 2: steps must be an int >= 1, got 0"),
    (["ddpd-A-mask,2,nan,3.2,3.1,"], "line 2: temperature must be a finite number, got nan"),
    ([",2,1.0,3.2,3.1,"], "line 2: the sampler is empty"),
    (["ddpd-A-mask,2,1.0,3.2,3.1,", "ddpd-A-mask,2,1.0,3.3,3.0,"],
     "line 3: configuration ('ddpd-A-mask', 2, 1.0) already appears on line 2"),
    (["ddpd-A-mask,2,1.0,3.2,3.1,,extra"], "line 2: more cells than the 6 of the header"),
    (["ddpd-A-mask,2,1.0"], "line 2: fewer cells than the 6 of the header"),
    (["ddpd-A-mask,2,1.0,3.2," + "9" * 200_000 + ","], "line 2: not CSV (field larger than field limit"),
])
def test_a_sweep_that_would_be_merged_or_compared_wrongly_is_refused(tmp_path, capsys, rows, message):
    """read_sweep checks every row: a NaN sorts nowhere in compare's matching, a
    duplicated row counts twice, a missing cell used to end in a traceback."""
    path = tmp_path / "sweep.csv"
    path.write_text(_sweep_text(rows))
    for argv in (["merge", path, "--out-dir", tmp_path / "out"], ["compare", path]):
        code, _, err = _run(capsys, *argv)
        assert code == 1 and err.startswith(f"ddpd-eval: error: {path}") and message in err, err
        assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_sweep_without_a_temperature_column_names_the_column(tmp_path):
    """Without the check the first row ended in a KeyError on 'temperature'."""
    from ddpd.eval import read_sweep

    path = tmp_path / "sweep.csv"
    path.write_text("sampler,steps,judge_nll,entropy\nmaskgit,2,3.2,3.1\n")
    with pytest.raises(ValueError, match=r"sweep.csv: not a sweep CSV \(no temperature column"):
        read_sweep(str(path))


def test_parts_judged_against_other_references_are_not_merged(tmp_path, capsys):
    """merge kept the first part's reference row and took the others' samples as judged alike."""
    parts = []
    for i, reference in enumerate(("1.2114125,4.03", "1.2114126,4.03", "1.4,4.1")):
        parts.append(tmp_path / f"part{i}.csv")
        parts[-1].write_text(_sweep_text([f"held-out text,,,{reference},", f"maskgit,{i + 2},1.0,3.2,3.1,"]))
    code, _, err = _run(capsys, "merge", parts[0], parts[1], "--out-dir", tmp_path / "same")
    assert code == 0, err  # float noise between devices
    code, _, err = _run(capsys, "merge", parts[0], parts[2], "--out-dir", tmp_path / "other")
    assert code == 1 and err.count("\n") == 1, err
    assert f"the reference rows of {parts[0]} and {parts[2]} differ (judge NLL 1.2114125 and 1.4)" in err, err
    assert not (tmp_path / "other").exists()


def test_parts_of_other_judges_are_not_merged_without_reference_rows(setup, tmp_path, capsys):
    """Without --data no reference row told two judges apart: merge joined their NLLs as one sweep."""
    p = setup
    torch.manual_seed(1)
    config = config_for("ar", V, L, d_model=16, n_layers=1, n_heads=2)
    other = tmp_path / "other-ar"
    save_checkpoint(str(other), build_model("ar", config),
                    {"kind": "ar", "model": config.to_dict(), "tokenizer": {"name": "text8"}, "schedule": "linear",
                     "vocab_size": V, "training": {"seq_len": L}})
    common = ["quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"], "--steps", 2,
              "--temperatures", 1.0, "--num-samples", 2, "--no-progress"]
    for name, judge, sampler in (("a", p["ar"], "ddpd-A-mask"), ("b", other, "maskgit"),
                                 ("c", p["ar"], "maskgit")):
        code, _, err = _run(capsys, *common, "--judge", judge, "--samplers", sampler, "--out-dir", tmp_path / name)
        assert code == 0, err
    with open(tmp_path / "a" / "sweep.csv") as f:
        judges = {row["judge"] for row in csv.DictReader(f)}
    with open(os.path.join(p["ar"], "config.json")) as f:
        assert judges == {"sha256:" + json.load(f)["sha256"]["model.safetensors"][:16]}
    parts = [tmp_path / name / "sweep.csv" for name in "abc"]
    code, _, err = _run(capsys, "merge", parts[0], parts[1], "--out-dir", tmp_path / "mixed")
    assert code == 1 and err.count("\n") == 1 and f"{parts[0]} and {parts[1]} were judged by different judges" in err
    assert not (tmp_path / "mixed").exists()
    code, _, err = _run(capsys, "merge", parts[0], parts[2], "--out-dir", tmp_path / "same")
    assert code == 0, err
    # a sweep written before the judge was recorded is taken as of any judge
    (tmp_path / "old.csv").write_text(_sweep_text(["dfm-eta0,2,1.0,3.2,3.1,"]))
    code, _, err = _run(capsys, "merge", parts[0], tmp_path / "old.csv", "--out-dir", tmp_path / "old")
    assert code == 0, err


@pytest.mark.parametrize("other", [{"judge_nll": 1.22}, {"entropy": 4.031}])
def test_reference_rows_a_little_apart_or_apart_in_entropy_alone_are_not_merged(other):
    """Float noise is 1e-5 relative; 0.7% apart is another judge, and so is another entropy."""
    from ddpd.eval import merge_sweeps

    reference = {"sampler": "held-out text", "steps": "", "temperature": "", "judge_nll": 1.2114125,
                 "entropy": 4.03}
    parts = [[reference, {"sampler": "maskgit", "steps": 2, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}],
             [dict(reference, **other), {"sampler": "maskgit", "steps": 3, "temperature": 1.0, "judge_nll": 3.2,
                                         "entropy": 3.1}]]
    with pytest.raises(ValueError, match="the reference rows of a and b differ"):
        merge_sweeps(parts, ["a", "b"])


@pytest.mark.parametrize("row, missing", [
    ({"policy": "maskgit", "steps": 4, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}, "sampler"),
    ({"sampler": "maskgit", "judge_nll": 3.2, "entropy": 3.1}, "steps, temperature"),
    ({"sampler": "held-out text", "judge_nll": 1.2}, "entropy")])
def test_merge_sweeps_names_a_row_without_a_column_it_reads(row, missing):
    """Rows of a foreign CSV (a frontier's, one's own) raised a bare KeyError: 'steps'."""
    from ddpd.eval import merge_sweeps

    reference = {"sampler": "held-out text", "steps": "", "temperature": "", "judge_nll": 1.2, "entropy": 4.0}
    with pytest.raises(ValueError) as err:
        merge_sweeps([[reference], [reference, row]], ["a.csv", "b.csv"])
    assert str(err.value) == f"b.csv row 2: no {missing} column (not a row of a sweep CSV, ddpd-eval quality's)"


@pytest.mark.parametrize("names", [["a"], ["a", "b", "c"]])
def test_merge_sweeps_refuses_names_not_one_a_part(names):
    """zip() dropped the parts past the last name: two parts and one name merged the first alone."""
    from ddpd.eval import merge_sweeps

    row = {"sampler": "maskgit", "steps": 2, "temperature": 1.0, "judge_nll": 3.2, "entropy": 3.1}
    with pytest.raises(ValueError, match=f"names must name each of the 2 parts, got {len(names)}"):
        merge_sweeps([[row], [dict(row, steps=3)]], names)


def test_a_frontier_csv_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "frontier.csv"
    path.write_text("sampler,policy,steps,temperature,judge_nll,entropy,passes\n"
                    "maskgit,maskgit,4,1.0,3.2,3.1,4\nmaskgit,threshold:0.9,4,1.0,3.5,3.0,3\n")
    code, _, err = _run(capsys, "compare", path)
    assert code == 1 and "a frontier CSV (ddpd-eval frontier), not a sweep CSV" in err, err


def test_a_sweep_of_a_spreadsheet_reads_back(tmp_path):
    """A byte-order mark, CRLF line ends, 8.0 for 8 and a column of one's own are fine."""
    from ddpd.eval import read_sweep

    path = tmp_path / "sweep.csv"
    path.write_bytes(b"\xef\xbb\xbf" + _sweep_text(["ddpd-A-mask,8.0,1,3.2,3.1,first try"]).replace(
        "\n", "\r\n").encode())
    assert read_sweep(str(path)) == [{"sampler": "ddpd-A-mask", "steps": 8, "temperature": 1, "judge_nll": 3.2,
                                      "entropy": 3.1, "notes": "first try"}]


def test_compare_command(setup, capsys):
    p = setup
    code, _, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                        "--judge", p["ar"], "--samplers", "ddpd-A-mask", "dfm-eta0", "maskgit", "--steps", 2, 3,
                        "--temperatures", 0.8, 1.0, "--num-samples", 2, "--out-dir", p["root"] / "cmp",
                        "--no-progress")
    assert code == 0, err
    sweep = p["root"] / "cmp" / "sweep.csv"
    code, out, err = _run(capsys, "compare", sweep, "--out", p["root"] / "cmp" / "compare.md")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("| ") and "Steps" not in line]
    # every budget x baseline (dfm-eta0, maskgit) x sampler (ddpd-A-mask)
    assert [line.split(" | ")[:3] for line in lines] == [["| 2", "ddpd-A-mask", "dfm-eta0"],
                                                          ["| 2", "ddpd-A-mask", "maskgit"],
                                                          ["| 3", "ddpd-A-mask", "dfm-eta0"],
                                                          ["| 3", "ddpd-A-mask", "maskgit"]]
    assert (p["root"] / "cmp" / "compare.md").read_text() in out + "\n"
    code, _, err = _run(capsys, "compare", sweep, "--baselines", "dfm-eta15")
    assert code == 2 and "not there: ['dfm-eta15']" in err


@pytest.mark.parametrize("rows, message", [
    (["held-out text,,,1.2,4.0,", "ddpd-A-mask,2,1.0,3.2,3.1,"],
     "has no baseline rows (dfm-* or maskgit) to compare; name them with --baselines"),
    (["maskgit,2,1.0,3.2,3.1,"], "has no sampler rows (ddpd-* or tau-planned-*) to compare; name them with --samplers"),
    (["ddpd-A-mask,2,1.0,3.2,3.1,", "dfm-eta0,3,1.0,3.3,3.0,"],
     "no step budget of {path} has rows of both a sampler ['ddpd-A-mask'] and a baseline ['dfm-eta0']"),
])
def test_compare_says_when_the_sweep_has_nothing_to_compare(tmp_path, capsys, rows, message):
    """A sweep whose samplers and baselines share no step budget printed an empty table, exit 0."""
    path = tmp_path / "sweep.csv"
    path.write_text(_sweep_text(rows))
    code, out, err = _run(capsys, "compare", path, "--out", tmp_path / "compare.md")
    assert code == 2 and err.count("\n") == 1 and message.format(path=path) in err, err
    assert out == "" and not (tmp_path / "compare.md").exists()


def test_training_command_reports_the_runs(setup, tmp_path, capsys):
    from ddpd.training.trainer import TrainConfig, Trainer

    runs = []
    for kind in ("planner", "ar"):
        runs.append(str(tmp_path / kind))
        Trainer(TrainConfig(kind=kind, data=setup["data"], out=runs[-1], steps=4, batch_size=4, seq_len=L,
                            d_model=16, n_layers=1, n_heads=2, warmup=1, eval_every=2, eval_batches=1,
                            save_every=4)).train()
    code, out, err = _run(capsys, "training", *runs, "--out-dir", tmp_path / "report")
    assert code == 0, err
    assert "| planner |" in out and "| ar |" in out
    with open(tmp_path / "report" / "training.json") as f:
        rows = json.load(f)
    assert [r["step"] for r in rows] == [4, 4] and [h["step"] for h in rows[0]["history"]] == [0, 2, 4]
    assert rows[0]["final_val_loss"] == rows[0]["history"][-1]["val_loss"]
    assert rows[0]["best_val_loss"] == min(h["val_loss"] for h in rows[0]["history"])
    assert rows[0]["train_seconds"] > 0 and rows[0]["tokens_per_s"] > 0
    # weights only (a bundle): its size and settings, no time or losses (it was refused)
    code, out, err = _run(capsys, "training", setup["planner"], "--out-dir", tmp_path / "weights")
    assert code == 0, err
    with open(tmp_path / "weights" / "training.json") as f:
        (row,) = json.load(f)
    config = json.loads(open(os.path.join(setup["planner"], "config.json")).read())
    assert row["kind"] == "planner" and row["parameters"] > 0 and row["d_model"] == config["model"]["d_model"]
    assert row["step"] == config.get("step") and row["history"] == []
    assert all(row[k] is None for k in ("train_seconds", "tokens_per_s", "best_val_loss", "final_train_loss"))
    config = json.loads((tmp_path / "ar" / "config.json").read_text())
    (tmp_path / "ar" / "config.json").write_text(json.dumps({**config, "training": None}))  # an edited config
    code, _, err = _run(capsys, "training", runs[1])
    assert code == 1 and err == (f"ddpd-eval: error: checkpoint {runs[1]}: config.json 'training' must be an "
                                 "object of ddpd-train settings, got None\n"), err
    # sizes nobody could allocate: counted on the meta device, or refused naming the file
    (tmp_path / "ar" / "config.json").write_text(json.dumps({**config, "model": {**config["model"], "d_model": 10**12,
                                                                                "n_heads": 1}}))
    code, _, err = _run(capsys, "training", runs[1])
    assert code == 1 and err.startswith(f"ddpd-eval: error: checkpoint {runs[1]}: config.json does not describe a "
                                        "valid ar model") and err.count("\n") == 1, err
    del config["model"]["vocab_size"]
    (tmp_path / "ar" / "config.json").write_text(json.dumps(config))
    code, _, err = _run(capsys, "training", runs[1])
    assert code == 1 and f"checkpoint {runs[1]}: " in err and "vocab_size" in err, err


def test_training_rows_name_their_runs(setup, tmp_path, capsys):
    """Two planner runs gave two rows both called "planner": each row names its directory, as given."""
    import shutil

    runs = [setup["planner"], str(tmp_path / "planner-copy")]
    shutil.copytree(runs[0], runs[1])
    code, out, err = _run(capsys, "training", *runs, "--out-dir", tmp_path / "report")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("| Network | Run | Parameters | d_model |")
    assert [line.split(" | ")[:2] for line in lines[2:4]] == [["| planner", run] for run in runs]
    assert out.startswith((tmp_path / "report" / "training.md").read_text())
    with open(tmp_path / "report" / "training.json") as f:
        assert [row["run"] for row in json.load(f)] == runs


def test_training_rows_give_the_sequences_of_an_optimizer_step(setup, tmp_path, capsys, monkeypatch):
    """The Batch column was --batch-size, per micro-batch and process: a run with --grad-accum 4,
    or under torchrun, showed a quarter (or less) of what each step saw. The column is named
    Micro-batch, and Sequences/step gives batch_size x grad_accum x processes."""
    from ddpd.training.trainer import TrainConfig, Trainer

    run = str(tmp_path / "planner")
    Trainer(TrainConfig(kind="planner", data=setup["data"], out=run, steps=1, batch_size=3, grad_accum=4, seq_len=L,
                        d_model=16, n_layers=1, n_heads=2, warmup=0, eval_every=1, eval_batches=1)).train()
    code, out, err = _run(capsys, "training", run, "--out-dir", tmp_path / "report")
    assert code == 0, err
    header, _, line = out.splitlines()[:3]
    cells = dict(zip(header.strip("|").split(" | "), line.strip("|").split(" | ")))
    assert (cells["Micro-batch"].strip(), cells["Sequences/step"].strip()) == ("3", "12"), out
    (row,) = json.loads((tmp_path / "report" / "training.json").read_text())
    assert (row["batch_size"], row["grad_accum"], row["processes"], row["step_sequences"]) == (3, 4, 1, 12)
    load = training.load_train_state

    def two_processes(path):  # the state as two torchrun processes record it
        tensors, meta = load(path)
        return tensors, {**meta, "world_size": 2}

    monkeypatch.setattr(training, "load_train_state", two_processes)
    assert training.training_row(run)["step_sequences"] == 24
    monkeypatch.undo()
    # weights only (a bundle's): no process count, so no step's size
    assert training.training_row(setup["planner"])["step_sequences"] is None


def test_the_first_val_loss_column_says_it_is_the_first_finite_one(setup, tmp_path, capsys, monkeypatch):
    """The column "Val loss at 0" showed the first finite validation loss: a later step's where
    step 0's was NaN. It is named First val loss, and training.json gives its step."""
    from ddpd.training.trainer import TrainConfig, Trainer

    run = str(tmp_path / "planner")
    Trainer(TrainConfig(kind="planner", data=setup["data"], out=run, steps=2, batch_size=2, seq_len=L, d_model=16,
                        n_layers=1, n_heads=2, warmup=0, eval_every=1, eval_batches=1)).train()
    load = training.load_train_state

    def untrained_nan(path):  # step 0's validation loss NaN, as a network that starts out overflowing gives
        tensors, meta = load(path)
        meta["history"][0]["val_loss"] = float("nan")
        return tensors, meta

    monkeypatch.setattr(training, "load_train_state", untrained_nan)
    code, out, err = _run(capsys, "training", run, "--out-dir", tmp_path / "report")
    assert code == 0, err
    (row,) = json.loads((tmp_path / "report" / "training.json").read_text())
    assert (row["history"][0]["step"], row["history"][0]["val_loss"]) == (0, None)  # NaN is written null
    assert (row["first_val_step"], row["first_val_loss"]) == (1, row["history"][1]["val_loss"])
    header, _, line = out.splitlines()[:3]
    cells = dict(zip(header.strip("|").split(" | "), line.strip("|").split(" | ")))
    assert "Val loss at 0" not in cells and cells["First val loss"].strip() == f"{row['first_val_loss']:.4f}", out


def _row_of(monkeypatch, config, meta, path="runs/planner"):
    """training_row of a checkpoint whose config.json and training record are given."""
    monkeypatch.setattr(training, "read_config", lambda p: config)
    monkeypatch.setattr(training, "_record", lambda p: meta)
    monkeypatch.setattr(training, "_parameters", lambda p, c: 10)
    return training.training_row(path)


def test_training_rows_give_the_states_step_the_best_step_and_the_last_losses(monkeypatch):
    """The step is the training state's (config.json's may be older); the final train loss is the last
    recorded one and the final val loss the last finite one, not whatever the last entry holds."""
    history = [{"step": 0, "val_loss": 3.0, "train_loss": None}, {"step": 1, "train_loss": 2.5},
               {"step": 2, "val_loss": 1.0, "train_loss": 2.0}, {"step": 3, "val_loss": 2.0, "train_loss": 1.5},
               {"step": 4, "val_loss": float("nan"), "train_loss": None}]
    meta = {"step": 4, "history": history, "train_seconds": 2.0, "train_tokens": 64, "world_size": 1}
    config = {"kind": "planner", "model": {"d_model": 16}, "training": {"batch_size": 2, "grad_accum": 3}, "step": 3}
    row = _row_of(monkeypatch, config, meta)
    assert (row["run"], row["step"], row["tokens_per_s"], row["step_sequences"]) == ("runs/planner", 4, 32.0, 6)
    assert (row["first_val_loss"], row["first_val_step"], row["best_val_loss"], row["best_step"]) == (3.0, 0, 1.0, 2)
    assert (row["final_train_loss"], row["final_val_loss"]) == (1.5, 2.0)


def test_training_rows_skip_infinite_val_losses_and_keep_a_zero_train_loss(monkeypatch):
    """An infinite validation loss is no first or final loss, as NaN is not; the best loss reached
    twice is at its first step; a train loss of exactly 0 is a recorded one."""
    history = [{"step": 0, "val_loss": float("inf"), "train_loss": None},
               {"step": 1, "val_loss": 1.0, "train_loss": 2.0},
               {"step": 2, "val_loss": 1.5, "train_loss": 1.0}, {"step": 3, "val_loss": 1.0, "train_loss": 0.0},
               {"step": 4, "val_loss": float("-inf"), "train_loss": None}]
    meta = {"step": 4, "history": history, "train_seconds": 2.0, "train_tokens": 64, "world_size": 1}
    row = _row_of(monkeypatch, {"kind": "planner", "model": {}, "training": {}}, meta)
    assert (row["first_val_step"], row["first_val_loss"], row["final_val_loss"]) == (1, 1.0, 1.0)
    assert (row["best_val_loss"], row["best_step"], row["final_train_loss"]) == (1.0, 1, 0.0)


def test_training_rows_of_a_run_without_a_finite_val_loss_or_a_second_give_none(monkeypatch):
    """A record whose validation losses are all NaN, or that holds no training time (a run stopped
    before its first step), has no losses or throughput to give: None, not an IndexError or a
    ZeroDivisionError; the step budget and time limit asked for are in the row all the same."""
    history = [{"step": 0, "val_loss": float("nan"), "train_loss": None}, {"step": 1, "train_loss": 2.5}]
    meta = {"step": 1, "history": history, "train_seconds": 0.0, "train_tokens": 0, "world_size": 1}
    config = {"kind": "planner", "model": {}, "training": {"batch_size": 2, "steps": 10, "max_time": 60.0}}
    row = _row_of(monkeypatch, config, meta)
    assert (row["steps"], row["max_time"], row["train_seconds"], row["tokens_per_s"]) == (10, 60.0, 0.0, None)
    assert [row[k] for k in ("first_val_loss", "first_val_step", "best_val_loss", "best_step",
                             "final_val_loss")] == [None] * 5
    assert row["final_train_loss"] == 2.5


def test_training_rows_of_a_config_without_training_settings_give_the_models_and_its_step(monkeypatch):
    """A config.json with no 'training' section (weights kept without ddpd-train's settings) is
    not refused: its row gives the network's settings and config.json's step, and no history."""
    row = _row_of(monkeypatch, {"kind": "planner", "model": {"d_model": 16, "n_layers": 2}, "step": 5}, {})
    assert (row["d_model"], row["n_layers"], row["batch_size"], row["step"]) == (16, 2, None, 5)
    assert row["history"] == [] and row["processes"] is None


def test_training_rows_count_parameters_without_allocating_them(monkeypatch):
    """The parameter count builds the network on the meta device: config.json is not checked
    against a digest, and a large (or edited) one must not allocate the weights it describes."""
    import ddpd.models

    devices = []

    def count(model):
        devices.append({p.device.type for p in model.parameters()})
        return 7

    monkeypatch.setattr(ddpd.models, "count_parameters", count)
    config = {"kind": "planner", "model": {"vocab_size": V, "out_dim": 1, "d_model": 16, "n_layers": 1, "n_heads": 2}}
    assert training._parameters("runs/planner", config) == 7 and devices == [{"meta"}]


def test_training_rows_refuse_a_model_section_that_builds_no_network_as_a_checkpoint_error():
    """A model section missing fields is the checkpoint's fault: CheckpointError naming the directory
    and the kind, with the config's own message, not the ValueError of TransformerConfig."""
    with pytest.raises(CheckpointError, match=r"^checkpoint runs/ar: config.json does not describe a valid ar "
                                              r"model: TransformerConfig.from_dict: missing required fields"):
        training._parameters("runs/ar", {"kind": "ar", "model": {"d_model": 16}})


@pytest.mark.parametrize("settings, meta, step", [
    ({"batch_size": 2, "grad_accum": 3}, {}, 7),  # weights only: no process count
    ({"batch_size": 2, "grad_accum": True}, {"step": 7, "world_size": 1}, 7),  # an edited config's true
    ({"batch_size": 2, "grad_accum": 3}, {}, "7"),
    ({"batch_size": 2}, {"step": 7, "world_size": 1}, 7),  # no grad_accum recorded: not taken as 1
])
def test_training_rows_leave_out_what_the_checkpoint_does_not_record_as_integers(monkeypatch, settings, meta, step):
    row = _row_of(monkeypatch, {"kind": "planner", "model": {}, "training": settings, "step": step}, meta)
    assert row["step_sequences"] is None
    assert row["step"] == (step if isinstance(step, int) else None)


def test_training_rows_refuse_a_malformed_training_record(tmp_path, monkeypatch):
    (tmp_path / STATE_META).write_text("{}")
    monkeypatch.setattr(training, "read_config", lambda p: {"kind": "planner", "model": {}, "training": {}})
    monkeypatch.setattr(training, "load_train_state", lambda p: ({}, {"step": 2, "history": "lost"}))
    monkeypatch.setattr(training, "_parameters", lambda p, c: 10)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {tmp_path}: train_state.json: ")):
        training.training_row(str(tmp_path))


def test_training_rows_quote_a_bad_training_setting_in_40_characters(monkeypatch):
    with pytest.raises(CheckpointError, match=re.escape(f"settings, got {repr([0] * 100)[:40]}") + "$"):
        _row_of(monkeypatch, {"kind": "planner", "model": {}, "training": [0] * 100}, {})


def test_training_rows_give_the_networks_shape_and_the_runs_settings_in_their_columns(monkeypatch):
    """Heads, dropout and sequence length come from config.json into the row and the table, each
    under its own column; Tokens/s is the run's, all processes' tokens over the training time."""
    config = {"kind": "planner", "model": {"d_model": 16, "n_layers": 2, "n_heads": 4, "dropout": 0.1},
              "training": {"batch_size": 2, "grad_accum": 1, "seq_len": 32, "lr": 3e-4, "dropout": 0.1}}
    meta = {"step": 4, "history": [], "train_seconds": 2.0, "train_tokens": 512, "world_size": 2}
    row = _row_of(monkeypatch, config, meta)
    assert [row[k] for k in ("d_model", "n_layers", "n_heads", "dropout", "seq_len", "lr")] == [16, 2, 4, 0.1, 32, 3e-4]
    assert (row["tokens_per_s"], row["step_sequences"]) == (256.0, 4)
    header, _, line = training.training_markdown([row]).splitlines()
    assert header == ("| Network | Run | Parameters | d_model | Layers | Heads | Dropout | Micro-batch "
                      "| Sequences/step | Length | Peak LR | Steps | Train seconds | Tokens/s | First val loss "
                      "| Best val loss | at step | Final train loss | Final val loss |")
    cells = {k.strip(): v.strip() for k, v in zip(header.strip("|").split("|"), line.strip("|").split("|"))}
    assert [cells[k] for k in ("Layers", "Heads", "Dropout", "Length", "Tokens/s")] == ["2", "4", "0.1", "32", "256"]


def test_the_training_table_groups_thousands_and_rounds_lr_seconds_and_losses():
    row = {"kind": "planner", "run": "r", "parameters": 1234567, "lr": 1 / 3000, "train_seconds": 12.6,
           "tokens_per_s": 12345.6, "final_val_loss": 1.23456, "first_val_loss": 3.45678, "best_val_loss": 1.11111,
           "best_step": 40, "final_train_loss": 0.987654}
    header, _, line = training.training_markdown([row]).splitlines()
    cells = {k.strip(): v.strip() for k, v in zip(header.strip("|").split("|"), line.strip("|").split("|"))}
    assert [cells[k] for k in ("Parameters", "Peak LR", "Train seconds", "Tokens/s", "Final val loss")] == [
        "1,234,567", "0.000333333", "13", "12,346", "1.2346"]
    assert [cells[k] for k in ("First val loss", "Best val loss", "at step", "Final train loss")] == [
        "3.4568", "1.1111", "40", "0.9877"]


def test_convergence_command(setup, capsys):
    p = setup
    out_dir = p["root"] / "convergence"
    code, out, err = _run(capsys, "convergence", "--planner", p["planner"], "--denoiser", p["uniform-denoiser"],
                          "--steps", 4, "--num-samples", 3, "--batch-size", 2, "--out-dir", out_dir, "--no-progress")
    assert code == 0, err
    with open(out_dir / "convergence.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert out.splitlines()[0].startswith("at step 3 of 4 (before its move): noise left ")  # it said "after 4"
    assert {"noise_left", "z_changed", "met_eps_0.05", "met_eps_0.01", "stopped_eps_0.01"} <= set(rows[0])


def test_convergence_rows_do_not_depend_on_the_batch_size(setup, capsys):
    """The last batch holds the samples left, not a whole --batch-size: each sample's noise is
    its row's, so the rows of 3 samples are the same in batches of 2 as in one batch."""
    p = setup
    tables = []
    for batch_size in (2, 3):
        out_dir = p["root"] / f"convergence-{batch_size}"
        code, _, err = _run(capsys, "convergence", "--planner", p["planner"], "--denoiser", p["uniform-denoiser"],
                            "--steps", 4, "--num-samples", 3, "--batch-size", batch_size, "--out-dir", out_dir,
                            "--no-progress")
        assert code == 0, err
        tables.append((out_dir / "convergence.csv").read_text())
    assert tables[0] == tables[1]


@pytest.mark.parametrize("argv, message, status", [
    (["elbo", "--planner", "{root}/nowhere", "--denoiser", "{mask-denoiser}", "--data", "{data}"],
     "checkpoint directory not found", 1),
    (["elbo", "--uniform", "{uniform}", "--data", "{root}/missing.txt"], "--data: no such file", 2),
    (["elbo", "--uniform", "{uniform}", "--data", "{root}"], "is a directory, not a text file", 2),
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--num-sequences", "100000"],
     "--num-sequences: the test split of", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--data", "{data}", "--samplers", "dfm-uni",
      "--reference-sequences", "100000", "--out-dir", "{root}/q3"], "--reference-sequences: the test split of", 2),
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--mc-samples", "0"], "--mc-samples must be >= 1", 2),
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--t-max", "1"], "--t-max must be in (0.0, 1.0)", 2),
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--seed", "-1"], "--seed must be in [0, ", 2),
    # ddpd-sample's range and wording: 2**63 and above were taken
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--seed", str(2**63)],
     f"--seed must be in [0, 2**63), got {2**63}\n", 2),
    # the boundaries of the ranges: the first value refused
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--batch-size", "0"], "--batch-size must be >= 1, got 0",
     2),
    (["elbo", "--uniform", "{uniform}", "--data", "{data}", "--alpha", "0"], "--alpha must be in (0.0, 1.0), got 0.0",
     2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--data", "{data}", "--reference-sequences", "0",
      "--out-dir", "{root}/q2"], "--reference-sequences must be >= 1, got 0", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--eps", "1", "--out-dir", "{root}/q2"],
     "--eps must be in (0.0, 1.0), got 1.0", 2),
    # the held-out reference row without --data: both were ignored
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--reference-sequences", "64", "--out-dir",
      "{root}/q2"], "--reference-sequences 64 chooses the held-out text of --data, and none is given: give --data "
                    "or leave --reference-sequences out", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--split", "validation", "--out-dir", "{root}/q2"],
     "--split validation chooses the held-out text of --data", 2),
    (["frontier", "{planner}", "--judge", "ngram", "--data", "{data}", "--target-steps", "0", "--out-dir",
      "{root}/f2"], "--target-steps must be >= 1, got 0", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--samplers", "maskgit", "--out-dir", "{root}/q2"],
     "--samplers: ['maskgit'] not available", 2),
    # the checkpoints run it at another --eta: the message blamed the checkpoints alone
    (["quality", "--denoiser", "{mask-denoiser}", "--judge", "{ar}", "--samplers", "dfm-eta5", "--out-dir",
      "{root}/q2"], "--samplers: ['dfm-eta5'] not available with these checkpoints; available: ['dfm-eta0', "
                    "'dfm-eta15', 'maskgit']; dfm-eta<ETA> runs at each --eta, here 0 15", 2),
    # --eta with no dfm-eta sampler in the sweep was ignored
    (["quality", "--denoiser", "{mask-denoiser}", "--judge", "{ar}", "--samplers", "maskgit", "--eta", "5",
      "--out-dir", "{root}/q2"], "--eta 5 acts on the dfm-eta<ETA> samplers (one mask denoiser) only, and this "
                                 "sweep runs none of them", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--eta", "0.5", "--out-dir", "{root}/q2"],
     "--eta 0.5 acts on the dfm-eta<ETA> samplers", 2),
    # --eps with no option-A ddpd sampler in the sweep (B and C run the whole budget) was ignored
    (["quality", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "--judge", "{ar}", "--samplers",
      "ddpd-AB-mask", "maskgit", "--eps", "0.1", "--out-dir", "{root}/q2"],
     "--eps 0.1 acts on the eps stop of the ddpd-A-* samplers only, and this sweep runs none of them", 2),
    # a planner alone, or a uniform denoiser without one, runs no sampler: it said "expected at least one SamplerSpec"
    (["quality", "--planner", "{planner}", "--judge", "{ar}", "--out-dir", "{root}/q2"],
     "these checkpoints run no sampler:", 2),
    (["quality", "--denoiser", "{uniform-denoiser}", "--judge", "{ar}", "--out-dir", "{root}/q2"],
     "these checkpoints run no sampler:", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--temperatures", "1", "nan", "--out-dir",
      "{root}/q2"], "--temperatures must be in [0.0, 1e+36], got nan", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--samplers", "dfm-uni", "dfm-uni", "--out-dir",
      "{root}/q2"], "--samplers: dfm-uni given more than once", 2),
    # no dfm-eta<ETA> at any --eta with these checkpoints: no hint at --eta
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--samplers", "dfm-eta0", "--out-dir", "{root}/q2"],
     "available: ['ddpd-A-uniform-model', 'ddpd-AB-uniform-model', 'ddpd-ABC-uniform-model', "
     "'ddpd-A-uniform-model-one-pass', 'ddpd-AB-uniform-model-one-pass', 'ddpd-ABC-uniform-model-one-pass', "
     "'dfm-uni']\n", 2),
    (["convergence", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "--eps", "0.05", "0.05",
      "--out-dir", "{root}/c2"], "--eps: 0.05 given more than once", 2),
    (["quality", "--uniform", "{uniform}", "--judge", "{ar}", "--steps", "2", "4", "2", "--temperatures", "1",
      "1.0", "--out-dir", "{root}/q2"], "--steps: 2 given more than once", 2),
    (["frontier", "{planner}", "--judge", "ngram", "--data", "{data}", "--budgets", "8", "8", "--out-dir",
      "{root}/f2"], "--budgets: 8 given more than once", 2),
    (["elbo", "--planner", "{planner}", "--uniform", "{uniform}", "--data", "{data}"],
     "--planner: its rows need a --denoiser", 2),
    (["convergence", "--planner", "{planner}", "--out-dir", "{root}/c2"], "give --planner and exactly one", 2),
    # no model at all: convergence takes no --uniform, which the hint named
    (["convergence", "--out-dir", "{root}/c2"], "no model to evaluate: give --planner and exactly one --denoiser\n",
     2),
    (["elbo", "--data", "{data}"], "no model to evaluate: give --planner with --denoiser, and/or --uniform\n", 2),
    (["quality", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "{mask-denoiser}", "--judge", "{ar}",
      "--out-dir", "{root}/q2"], ": a mask-denoiser checkpoint was already given\n", 2),
    (["convergence", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "{uniform-denoiser}", "--out-dir",
      "{root}/c2"], "give --planner and exactly one --denoiser", 2),  # not the first of two, silently
    (["convergence", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "--num-samples", "0", "--out-dir",
      "{root}/c2"], "--num-samples must be >= 1, got 0", 2),
])
def test_errors_are_one_line_with_a_nonzero_exit(setup, capsys, argv, message, status):
    """A bad command line exits with status 2 naming the flag; a failure while working with 1."""
    argv = [a.format(**setup) for a in argv] + ["--no-progress"]
    code, out, err = _run(capsys, *argv)
    assert code == status
    assert err.startswith("ddpd-eval: error:") and message in err and err.count("\n") == 1, err


def test_a_labelled_corpus_is_refused_as_data(setup, capsys, tmp_path):
    labelled = tmp_path / "corpus.jsonl"
    labelled.write_text('{"text": "ab", "label": 0}\n')
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", labelled, "--no-progress")
    assert code == 2 and err == (f"ddpd-eval: error: --data: {labelled} is a labelled corpus (.jsonl); "
                                 "ddpd-eval reads plain text\n")


@pytest.mark.parametrize("argv", [["compare", "missing.csv"], ["merge", "missing.csv", "--out-dir", "m"]])
def test_a_missing_sweep_is_a_usage_error(tmp_path, capsys, argv):
    code, _, err = _run(capsys, *[str(tmp_path / a) if a != argv[0] and not a.startswith("--") else a for a in argv])
    assert code == 2 and err == f"ddpd-eval: error: no such sweep file: {tmp_path / 'missing.csv'}\n", err


@pytest.mark.parametrize("argv, message", [
    (["elbo", "--uniform", "x"], "required: --data"),
    # convergence reads no text and samples with a planner and a denoiser: it took and ignored these
    (["convergence", "--planner", "p", "--data", "x", "--out-dir", "c"], "unrecognized arguments: --data x"),
    (["convergence", "--uniform", "u", "--out-dir", "c"], "unrecognized arguments: --uniform u"),
])
def test_argument_errors_exit_2_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["elbo", "--uniform", "{uniform}", "--data", "{data}", "--out", ""],
                                  ["convergence", "--planner", "{planner}", "--out-dir", ""]])
def test_an_empty_output_path_is_a_usage_error(setup, capsys, argv):
    code, _, err = _run(capsys, *[a.format(**setup) for a in argv])
    assert code == 2 and err.count("\n") == 1 and "must be a path, got ''" in err, err


def test_a_corpus_shorter_than_the_checkpoints_length_names_data(setup, capsys, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("abc def")
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", str(short), "--no-progress")
    assert code == 2 and err.startswith("ddpd-eval: error: --data: the test split of") and \
        err.endswith(f"fewer than one sequence of {L} (the checkpoints' length)\n"), err


@pytest.mark.parametrize("content", ["", "\n"])
def test_an_empty_corpus_is_a_usage_error_as_a_missing_one_is(setup, capsys, tmp_path, content):
    """docs/cli.md: a missing --data exits 2; an empty one exited 1 with "data file ... is empty",
    after loading the checkpoints, naming no flag."""
    empty = tmp_path / "empty.txt"
    empty.write_text(content)
    for command in (["elbo", "--uniform", setup["uniform"]],
                    ["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--out-dir", tmp_path / "q"],
                    ["frontier", setup["planner"], "--judge", "ngram", "--out-dir", tmp_path / "f"]):
        code, out, err = _run(capsys, *command, "--data", empty, "--no-progress")
        assert (code, out, err) == (2, "", f"ddpd-eval: error: --data: {empty} is empty\n"), command
    assert sorted(os.listdir(tmp_path)) == ["empty.txt"]


def test_a_corpus_found_empty_once_read_is_a_usage_error_as_an_empty_file_is(setup, capsys, tmp_path):
    """A --data with no size to check first (a device or a pipe: /dev/null, <(true)) passed the
    check of an empty file and exited 1 with "data file /dev/null is empty", naming no flag."""
    from ddpd.checkpoint import load_model, save_bundle

    save_bundle(str(tmp_path / "bundle"), *load_model(setup["planner"]), *load_model(setup["mask-denoiser"]))
    for command in (["elbo", "--uniform", setup["uniform"]],
                    ["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--out-dir", tmp_path / "q"],
                    ["frontier", tmp_path / "bundle", "--judge", "ngram", "--out-dir", tmp_path / "f"]):
        code, out, err = _run(capsys, *command, "--data", "/dev/null", "--no-progress")
        assert (code, out, err) == (2, "", "ddpd-eval: error: --data: /dev/null is empty\n"), command
    assert sorted(os.listdir(tmp_path)) == ["bundle"]


def test_a_corpus_the_checkpoints_tokenizer_cannot_encode_names_data(setup, capsys, tmp_path):
    """It exited 1 with "data FILE: text must contain only ...", naming neither the flag nor
    whose tokenizer refused it, where a corpus too short for the checkpoints names both."""
    mixed = tmp_path / "mixed-case.txt"
    mixed.write_text("First Citizen: Before we proceed any further, hear me speak.\n" * 20)
    for command in (["elbo", "--uniform", setup["uniform"]],
                    ["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--out-dir", tmp_path / "q"]):
        code, out, err = _run(capsys, *command, "--data", mixed, "--no-progress")
        assert (code, out) == (2, "") and not (tmp_path / "q").exists()
        assert err == (f"ddpd-eval: error: --data {mixed}: the checkpoints' tokenizer cannot encode it: text must "
                       "contain only space and a-z (text8 format), got 'F' (U+0046) at position 0; 139 such "
                       "character(s) in total\n"), err


def test_a_corpus_that_is_not_utf8_is_a_usage_error_as_one_the_tokenizer_cannot_encode(setup, capsys, tmp_path,
                                                                                         monkeypatch):
    """A --data file that is not UTF-8 exited 1 with "data file PATH is not UTF-8 text", where
    text the checkpoints' tokenizer cannot encode exits 2 naming the flag: both are a bad input
    the command line names (docs/cli.md's exit statuses)."""
    from ddpd.checkpoint import load_model, save_bundle

    save_bundle(str(tmp_path / "bundle"), *load_model(setup["planner"]), *load_model(setup["mask-denoiser"]))
    monkeypatch.chdir(tmp_path)  # a relative --data: the loader names the file by its absolute path
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    for command in (["elbo", "--uniform", setup["uniform"]],
                    ["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--out-dir", tmp_path / "q"],
                    ["frontier", tmp_path / "bundle", "--judge", "ngram", "--out-dir", tmp_path / "f"]):
        code, out, err = _run(capsys, *command, "--data", "latin1.txt", "--no-progress")
        assert (code, out) == (2, "") and sorted(os.listdir(tmp_path)) == ["bundle", "latin1.txt"], command
        assert err == "ddpd-eval: error: --data latin1.txt: not UTF-8 text (byte 0xe9 at offset 3)\n", err


def test_a_corpus_it_cannot_open_is_a_usage_error_as_a_missing_one_is(setup, capsys, tmp_path, monkeypatch):
    """A --data that is there but that open() refuses (a UNIX socket: ENXIO) exited 1 with a bare
    "[Errno 6] No such device or address: '/abs/path'", naming neither the flag nor the path as
    typed, where ddpd-train refuses it as a usage error."""
    from ddpd.checkpoint import load_model, save_bundle

    save_bundle(str(tmp_path / "bundle"), *load_model(setup["planner"]), *load_model(setup["mask-denoiser"]))
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind("corpus.sock")
        for command in (["elbo", "--uniform", setup["uniform"]],
                        ["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--out-dir", "q"],
                        ["frontier", "bundle", "--judge", "ngram", "--out-dir", "f"]):
            code, out, err = _run(capsys, *command, "--data", "corpus.sock", "--no-progress")
            assert (code, out, err) == (2, "", "ddpd-eval: error: --data corpus.sock: No such device or address\n"), \
                command
    assert sorted(os.listdir(tmp_path)) == ["bundle", "corpus.sock"]


def test_checkpoints_that_record_no_tokenizer_cannot_read_data(setup, capsys, tmp_path):
    """A network saved from Python without a tokenizer in its config: nothing can encode --data."""
    config = config_for("uniform", V, L, d_model=16, n_layers=1, n_heads=2)
    save_checkpoint(tmp_path / "untold", build_model("uniform", config),
                    {"kind": "uniform", "model": config.to_dict(), "schedule": "linear"})
    code, out, err = _run(capsys, "elbo", "--uniform", tmp_path / "untold", "--data", setup["data"],
                          "--out", tmp_path / "e.json", "--no-progress")
    assert (code, out) == (2, "") and not (tmp_path / "e.json").exists()
    assert err == "ddpd-eval: error: the checkpoints do not record their tokenizer; cannot encode --data\n"


def test_a_merge_without_matplotlib_says_the_plot_was_skipped(tmp_path, capsys, monkeypatch):
    """The notice goes to stderr, the files written to stdout; no sweep.png."""
    from ddpd.eval import quality
    from ddpd.eval.report import PLOT_HINT, MissingDependency

    def missing():
        raise MissingDependency(PLOT_HINT)

    monkeypatch.setattr(quality, "pyplot", missing)
    part = tmp_path / "part.csv"
    part.write_text(_sweep_text(["maskgit,2,1.0,3.2,3.1,"]))
    code, out, err = _run(capsys, "merge", part, "--out-dir", tmp_path / "m")
    assert code == 0 and err == f"ddpd-eval: plot skipped: {PLOT_HINT}\n"
    assert out.endswith(f"wrote {tmp_path / 'm' / 'sweep.csv'}, {tmp_path / 'm' / 'sweep.md'}\n"), out
    assert sorted(os.listdir(tmp_path / "m")) == ["sweep.csv", "sweep.md"]


def test_a_checkpoint_of_the_wrong_kind_is_a_usage_error(setup, capsys):
    code, _, err = _run(capsys, "elbo", "--planner", setup["mask-denoiser"], "--data", setup["data"])
    assert code == 2 and err.count("\n") == 1
    assert f"--planner {setup['mask-denoiser']} holds a 'mask-denoiser' model, expected planner" in err


def test_reports_are_replaced_atomically(setup, tmp_path, capsys, monkeypatch):
    """A full disk while writing a report leaves the previous report whole."""
    import errno

    from ddpd.training.trainer import TrainConfig, Trainer

    run = str(tmp_path / "planner")
    with Trainer(TrainConfig(kind="planner", data=setup["data"], out=run, steps=2, batch_size=4, seq_len=L,
                             d_model=16, n_layers=1, n_heads=2, warmup=1, eval_every=2, eval_batches=1,
                             save_every=2)) as trainer:
        trainer.train()
    code, _, err = _run(capsys, "training", run, "--out-dir", tmp_path / "report")
    assert code == 0, err
    before = {name: (tmp_path / "report" / name).read_bytes() for name in ("training.json", "training.md")}

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code, _, err = _run(capsys, "training", run, "--out-dir", tmp_path / "report")
    assert code == 1 and err.count("\n") == 1 and "No space left on device" in err
    assert {name: (tmp_path / "report" / name).read_bytes() for name in before} == before
    assert sorted(os.listdir(tmp_path / "report")) == ["training.json", "training.md"]


def _handles_sigterm(pid):
    """Whether the process has installed its SIGTERM handler (Linux: /proc/PID/status)."""
    import signal

    with open(f"/proc/{pid}/status") as f:
        caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc to see the handler installed")
def test_sigterm_stops_an_evaluation_in_one_line(setup, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    p = setup
    out = tmp_path / "elbo.json"
    proc = subprocess.Popen([sys.executable, "-m", "ddpd.cli.eval", "elbo", "--uniform", p["uniform"],
                             "--data", p["data"], "--mc-samples", "100000", "--out", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=default_signals)
    deadline = time.monotonic() + HANG_GUARD_SECONDS  # the loop ends as soon as the handler is there
    while not _handles_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err == "ddpd-eval: interrupted by SIGTERM\n"
    assert os.listdir(tmp_path) == []  # nothing half written


def test_progress_bars_stay_off_a_redirected_stream(setup, capsys):
    """With progress on (the default), a stderr that is not a terminal gets no bar."""
    p = setup
    code, _, err = _run(capsys, "elbo", "--uniform", p["uniform"], "--data", p["data"], "--num-sequences", 4)
    assert code == 0 and err == "", err
    code, _, err = _run(capsys, "convergence", "--planner", p["planner"], "--denoiser", p["uniform-denoiser"],
                        "--steps", 2, "--num-samples", 2, "--out-dir", p["root"] / "conv-bars")
    assert code == 0 and "\r" not in err and "batch" not in err, err  # (a skipped plot may be reported)


def test_fused_quality_sweep_of_every_sampler_scores_the_reference_samples(setup, capsys):
    """One sampler table with ddpd-sample: --fused runs every sampler on its fused path,
    whose samples (so judge NLL and entropy) are the reference path's."""
    p = setup
    tables = []
    for name, fused in (("ref", []), ("fused", ["--fused"])):
        code, _, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                            p["uniform-denoiser"], "--uniform", p["uniform"], "--judge", p["ar"], "--steps", 3,
                            "--temperatures", 1.0, "--num-samples", 3, "--batch-size", 2, "--eta", 0, 2,
                            "--out-dir", p["root"] / name, "--no-progress", *fused)
        assert code == 0, err
        with open(p["root"] / name / "sweep.csv") as f:
            tables.append([(r["sampler"], r["judge_nll"], r["entropy"]) for r in csv.DictReader(f)])
    assert tables[0] == tables[1]
    assert [r[0] for r in tables[0]] == [
        "ddpd-A-mask", "ddpd-AB-mask", "ddpd-ABC-mask", "ddpd-A-uniform", "ddpd-AB-uniform", "ddpd-ABC-uniform",
        "ddpd-A-uniform-model", "ddpd-AB-uniform-model", "ddpd-ABC-uniform-model", "ddpd-A-uniform-model-one-pass",
        "ddpd-AB-uniform-model-one-pass", "ddpd-ABC-uniform-model-one-pass", "tau-planned-mask",
        "tau-planned-uniform", "dfm-eta0", "dfm-eta2", "dfm-uni", "maskgit"]


def test_dtype_of_the_sampling_networks(setup, capsys, monkeypatch):
    import ddpd.models

    cast = []
    prepare = ddpd.models.prepare_for_sampling
    monkeypatch.setattr(ddpd.models, "prepare_for_sampling",
                        lambda model, dtype, device: cast.append((model.kind, dtype)) or prepare(model, dtype, device))
    p = setup
    code, _, err = _run(capsys, "quality", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                        "--judge", p["ar"], "--samplers", "ddpd-A-mask", "maskgit", "--steps", 2, "--temperatures",
                        1.0, "--num-samples", 2, "--dtype", "bfloat16", "--out-dir", p["root"] / "bf16",
                        "--no-progress")
    assert code == 0, err
    assert cast == [("planner", torch.bfloat16), ("mask-denoiser", torch.bfloat16)]  # not the judge
    cast.clear()
    code, _, err = _run(capsys, "convergence", "--planner", p["planner"], "--denoiser", p["uniform-denoiser"],
                        "--steps", 3, "--num-samples", 2, "--dtype", "bfloat16", "--out-dir", p["root"] / "c16",
                        "--no-progress")
    assert code == 0, err
    assert cast == [("planner", torch.bfloat16), ("uniform-denoiser", torch.bfloat16)]


def test_denoising_without_a_noisy_position_is_undefined_not_zero(setup, capsys, tmp_path):
    """At alpha 0.99999 no position of 2 x 16 tokens is corrupted (with this seed): the
    denoising row has no cross-entropy and no accuracy to report (it said NaN and 0.0000,
    and the JSON held a bare NaN, which is not JSON)."""
    code, out, err = _run(capsys, "elbo", "--denoiser", setup["mask-denoiser"], "--data", setup["data"],
                          "--num-sequences", 2, "--alpha", 0.99999, "--no-progress", "--out", tmp_path / "r.json")
    assert code == 0, err
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text
    row, = json.loads(text)["denoising"]
    assert row["noisy_positions"] == 0 and row["bits"] is None and row["accuracy"] is None
    assert "| mask-denoiser |  |  |  | 0.99999 |" in out


def test_outputs_are_checked_before_any_model_is_loaded(setup, capsys, tmp_path, monkeypatch):
    """An --out that is a directory, an --out-dir with a file in its way: one line, exit 1,
    before the work (elbo failed after its whole run, quality after its first configuration)."""
    import ddpd.cli.eval as eval_cli

    monkeypatch.setattr(eval_cli, "load_models", lambda args: pytest.fail("the models were loaded"))
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "keep.jsonl").write_text("x")
    for argv, message in (
            (["elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--out", tmp_path / "a_dir"],
             f"cannot write {tmp_path / 'a_dir'}: it is a directory"),
            (["elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--out", tmp_path / "r.json"], None),
            (["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--samplers", "dfm-uni",
              "--out-dir", tmp_path / "keep.jsonl" / "q"], f"{tmp_path / 'keep.jsonl'} is not a directory")):
        if message is None:  # the Markdown twin r.md is a directory
            (tmp_path / "r.md").mkdir()
            message = f"cannot write {tmp_path / 'r.md'}: it is a directory"
        code, _, err = _run(capsys, *argv)
        assert code == 1 and message in err and err.count("\n") == 1, err
    assert (tmp_path / "keep.jsonl").read_text() == "x" and not (tmp_path / "r.json").exists()


@pytest.mark.integration
@pytest.mark.parametrize("command", ["training", "elbo"])
def test_a_reader_that_went_away_loses_no_report(setup, tmp_path, command):
    """`ddpd-eval ... | true`: the report was printed before it was written, and the broken
    pipe ended the tool (exit 1) with nothing written."""
    import subprocess
    import sys

    p, out = setup, tmp_path / "report"
    argv = {"training": ["training", p["planner"], "--out-dir", str(out)],
            "elbo": ["elbo", "--uniform", p["uniform"], "--data", p["data"], "--num-sequences", "2",
                     "--out", str(out / "elbo.json"), "--no-progress"]}[command]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "ddpd.cli.eval", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=HANG_GUARD_SECONDS,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert sorted(os.listdir(out)) == (["training.json", "training.md"] if command == "training"
                                       else ["elbo.json", "elbo.md"])


def test_a_name_too_long_is_refused_before_any_work(setup, tmp_path, capsys, monkeypatch):
    """elbo's --out of 255 bytes has a 256-byte .md twin: refused only after the evaluation,
    the JSON written without its Markdown."""
    monkeypatch.setattr("ddpd.cli.eval.load_models", lambda args: pytest.fail("models loaded before --out was checked"))
    out = tmp_path / ("a" * 253 + ".j")
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--out", out)
    assert code == 1 and err.count("\n") == 1 and "a name of 256 bytes, over the 255 a file name may take" in err, err
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- one writer per report, reports as one set


def test_a_second_evaluator_of_the_same_reports_is_refused_at_its_start(setup, tmp_path, capsys):
    """Two evaluators on one --out-dir both exited 0 with a mixed set of reports."""
    from ddpd import files

    out_dir = tmp_path / "report"
    code, _, err = _run(capsys, "training", setup["planner"], "--out-dir", out_dir)
    assert code == 0, err
    assert sorted(os.listdir(out_dir)) == ["training.json", "training.md"]  # what locked_outputs locks
    before = {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)}
    with files.OutputLock(out_dir / "training.json"):  # another evaluator writing it (flock: per open file)
        code, out, err = _run(capsys, "training", setup["ar"], "--out-dir", out_dir)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"ddpd-eval: error: {out_dir / 'training.json'} is being written by pid {os.getpid()} ")
    assert {name: (out_dir / name).read_bytes() for name in os.listdir(out_dir)} == before
    for argv in (["merge", tmp_path / "part.csv", "--out-dir", tmp_path / "merged"],
                 ["compare", tmp_path / "part.csv", "--baselines", "dfm-eta0", "--out", tmp_path / "c.md"]):
        (tmp_path / "part.csv").write_text(_sweep_text(["ddpd-A-mask,2,1.0,3.2,3.1,", "dfm-eta0,2,1.0,3.3,3.0,"]))
        code, _, err = _run(capsys, *argv)
        assert code == 0, err
    from ddpd.cli.eval import REPORTS

    written = {name for name in os.listdir(tmp_path / "merged") if not name.startswith(".")}
    assert written and written <= set(REPORTS["merge"])


@pytest.mark.integration
def test_a_report_set_left_half_renamed_is_finished_by_the_next_evaluator(setup, tmp_path, capsys, monkeypatch):
    """A kill between the renames of training.md and training.json left halves of two runs;
    now the next evaluator of that --out-dir finishes the set before anything else, even
    one that then fails."""
    import subprocess
    import sys

    out_dir = tmp_path / "report"
    code, _, err = _run(capsys, "training", setup["planner"], "--out-dir", out_dir)
    assert code == 0, err
    killed = f"""
import os, sys
from ddpd.cli.eval import main
real = os.replace
def replace(a, b):
    real(a, b)
    if os.path.basename(b).startswith("training."):
        os._exit(137)  # killed after the first report's rename: no cleanup runs
os.replace = replace
main(["training", {setup["ar"]!r}, "--out-dir", {str(out_dir)!r}])
"""
    assert subprocess.run([sys.executable, "-c", killed], capture_output=True).returncode == 137

    def kinds():
        return {json.loads((out_dir / "training.json").read_text())[0]["kind"],
                (out_dir / "training.md").read_text().splitlines()[2].split("|")[1].strip()}

    def failing(runs):
        raise ValueError("a run that cannot be read")

    monkeypatch.setattr("ddpd.eval.training.training_rows", failing)
    code, _, err = _run(capsys, "training", setup["planner"], "--out-dir", out_dir)
    assert code == 1 and "a run that cannot be read" in err, err
    assert kinds() == {"ar"}  # the killed run's set, whole
    assert sorted(os.listdir(out_dir)) == ["training.json", "training.md"]


# convergence samples with a planner and one denoiser, which it checks itself (argparse has no "both")
NEEDED_BY_THE_COMMAND = {"convergence": {"--planner", "--denoiser"}}


def _documented_synopses():
    """{command: the flags its synopsis in docs/cli.md shows outside brackets, as required}."""
    from pathlib import Path

    reference = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    section = reference.split("## `ddpd-eval`")[1]
    block = section.split("```\n")[1]  # the section's first block: its synopses
    lines = re.sub(r"\n  ", " ", block).splitlines()  # a synopsis goes on in its indented lines
    synopses = {}
    for line in lines:
        assert set(re.findall(r"--[a-z-]+", line)) == _options(line.split()[1]), line  # every flag, and no other
        depth, shown = 0, []
        for token in re.findall(r"\[|\]|[^\s\[\]]+", line):
            depth += {"[": 1, "]": -1}.get(token, 0)
            if depth == 0 and token.startswith("--"):
                shown.append(token)
        synopses[line.split()[1]] = shown
    return synopses


def _options(command):
    from ddpd.cli.eval import build_parser

    parser = build_parser()._subparsers._group_actions[0].choices[command]
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def test_the_documented_synopses_show_as_required_only_what_is_required():
    """`ddpd-eval elbo` showed --uniform (and --planner, --denoiser) as required; none is."""
    from ddpd.cli.eval import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    synopses = _documented_synopses()
    assert set(synopses) == set(commands)
    for command, shown in synopses.items():
        required = {a.option_strings[0] for a in commands[command]._actions if a.required and a.option_strings}
        assert set(shown) == required | NEEDED_BY_THE_COMMAND.get(command, set()), command


@pytest.mark.parametrize("command", [
    ["quality", "--uniform", "{uniform}", "--samplers", "dfm-uni", "--out-dir", "{root}/judged"],
    ["frontier", "{bundle}", "--out-dir", "{root}/judged"],
])
def test_a_judge_one_token_too_short_is_refused(setup, tmp_path, capsys, command):
    """An AR judge scores up to max_seq_len - 1 tokens (its first is a context): one of max_seq_len L
    cannot score samples of L tokens, which quality and frontier refuse before any sampling."""
    from ddpd.checkpoint import save_bundle

    config = config_for("ar", V, L - 1, d_model=16, n_layers=1, n_heads=2)  # max_seq_len L
    save_checkpoint(str(tmp_path / "judge"), build_model("ar", config),
                    {"kind": "ar", "model": config.to_dict(), "tokenizer": {"name": "text8"}, "vocab_size": V})
    meta = {"tokenizer": {"name": "text8"}, "schedule": "linear", "training": {"seq_len": L}}
    pair = []
    for kind in ("planner", "mask-denoiser"):
        c = config_for(kind, V, L, d_model=16, n_layers=1, n_heads=2)
        pair += [build_model(kind, c), {"kind": kind, "model": c.to_dict(), **meta}]
    save_bundle(str(tmp_path / "bundle"), *pair)
    paths = {**setup, "bundle": tmp_path / "bundle"}
    code, out, err = _run(capsys, *(a.format(**paths) for a in command), "--judge", tmp_path / "judge")
    assert code == 2 and out == "", err
    assert err == f"ddpd-eval: error: --judge: scores sequences of up to {L - 1} tokens, the samples have {L}\n"


def test_every_help_that_states_a_default_states_the_parsers():
    """--help, and docs/cli.md's synopses after it, said what a flag left out means."""
    from ddpd.cli.eval import build_parser

    checked = 0
    for command, parser in build_parser()._subparsers._group_actions[0].choices.items():
        for action in parser._actions:
            stated = re.search(r"(?:\(|; )default:? ([^)]*)\)", action.help or "")
            if not stated or isinstance(action.default, bool) or not isinstance(action.default, (int, float, list)):
                continue  # --device's default is in words
            default = action.default if isinstance(action.default, list) else [action.default]
            words = stated.group(1).split()
            if isinstance(default[0], (int, float)):
                words = [float(word) for word in words]
            assert words == default, f"{command} {action.option_strings}: {action.help}"
            checked += 1
    assert checked >= 25


def test_help_names_only_what_the_command_takes():
    """convergence's --dtype help excepted "the judge", which convergence has none of, and
    --data's named hf:NAME where the source is hf:NAME[:CONFIG], as ddpd-train's says."""
    from ddpd.cli.eval import build_parser

    for command, parser in build_parser()._subparsers._group_actions[0].choices.items():
        helps = {action.dest: action.help or "" for action in parser._actions}
        if "judge" not in helps:
            assert not [dest for dest, text in helps.items() if "judge" in text], command
        if "data" in helps:
            assert "hf:NAME[:CONFIG]" in helps["data"], command


def test_elbo_reports_the_t_max_and_samples_it_ran_with(setup, capsys, tmp_path):
    """--t-max and --mc-samples reach the estimators (each row records what it ran with) and
    the heading of the table, and the printed columns are the rows' terms."""
    code, out, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--num-sequences", 3,
                          "--t-max", 0.9, "--mc-samples", 2, "--no-progress", "--out", tmp_path / "r.json")
    assert code == 0, err
    results = json.loads((tmp_path / "r.json").read_text())
    [row] = results["elbo"]
    assert (row["t_max"], row["mc_samples"]) == (0.9, 2)
    # the settings are the flags that decide the numbers, not the progress bars' or the streams'
    assert (results["settings"]["t_max"], results["settings"]["mc_samples"]) == (0.9, 2)
    assert not {"command", "progress", "stdout"} & set(results["settings"])
    assert "t_max=0.9, 2 MC sample(s)" in out
    cells = [f"{row[name]:.4f}" for name in ("rate_matching", "transitioning", "elbo", "elbo_se")]
    assert f"| uniform | {' | '.join(cells)} | yes |" in out, out


# ---------------------------------------------------------------- each flag reaches the setting it names

from ddpd.sampling import DDPDOptions, Execution, Temperature, Truncation  # noqa: E402


class _Recorded(Exception):
    """Raised by a stand-in once it has recorded its arguments: nothing after it needs to run."""


@pytest.fixture
def swept(monkeypatch):
    """{"specs": sampler_specs' settings, "sweep": run_sweep's keywords, "dtype": the --dtype
    resolved} of a quality run, which stops at run_sweep."""
    import ddpd.eval
    import ddpd.models
    from ddpd.cli import eval as cli_eval

    seen = {}
    specs, resolve = cli_eval.sampler_specs, ddpd.models.resolve_dtype

    def recorded_specs(loaded, etas, eps, fused=False, dtype="auto", truncation=None):
        seen["specs"] = {"etas": etas, "eps": eps, "fused": fused, "dtype": dtype, "truncation": truncation}
        return specs(loaded, etas, eps, fused, dtype, truncation)

    def recorded_sweep(samplers, **kwargs):
        seen["sweep"] = {"samplers": [s.name for s in samplers], **kwargs}
        raise _Recorded

    monkeypatch.setattr(cli_eval, "sampler_specs", recorded_specs)
    monkeypatch.setattr(ddpd.eval, "run_sweep", recorded_sweep)
    monkeypatch.setattr(ddpd.models, "resolve_dtype", lambda dtype, device: seen.setdefault("dtype", dtype) and
                        resolve(dtype, device))
    return seen


# a quality run of a planner and a mask denoiser without flags: docs/cli.md's defaults
QUALITY_SPECS = {"etas": [0.0, 15.0], "eps": 0.01, "fused": False, "dtype": "float32", "truncation": Truncation()}
QUALITY_SWEEP = {"samplers": ["ddpd-A-mask", "ddpd-AB-mask", "ddpd-ABC-mask", "tau-planned-mask", "dfm-eta0",
                              "dfm-eta15", "maskgit"],
                 "steps": [64, 128, 256, 512], "temperatures": [0.8, 0.9, 1.0], "num_samples": 64, "seed": 0,
                 "batch_size": 32, "reference": None, "progress": True}


@pytest.mark.parametrize("argv,specs,sweep,dtype", [
    ([], {}, {}, "auto"),
    (["--steps", "2", "4", "--temperatures", "0.5", "--num-samples", "3", "--seed", "7", "--batch-size", "2",
      "--no-progress"], {}, {"steps": [2, 4], "temperatures": [0.5], "num_samples": 3, "seed": 7, "batch_size": 2,
                             "progress": False}, "auto"),
    (["--samplers", "maskgit", "dfm-eta2", "--eta", "2"], {"etas": [2.0]}, {"samplers": ["maskgit", "dfm-eta2"]},
     "auto"),
    (["--samplers", "ddpd-A-mask", "--eps", "0.25", "--fused"], {"eps": 0.25, "fused": True},
     {"samplers": ["ddpd-A-mask"]}, "auto"),
    (["--dtype", "bfloat16", "--top-k", "3", "--top-p", "0.9", "--min-p", "0.05"],
     {"dtype": "bfloat16", "truncation": Truncation(3, 0.9, 0.05)},
     {"samplers": [f"{name} top-k=3 top-p=0.9 min-p=0.05" for name in QUALITY_SWEEP["samplers"]]}, "bfloat16"),
])
def test_each_quality_flag_reaches_the_setting_it_names(setup, capsys, swept, argv, specs, sweep, dtype):
    """docs/cli.md's quality flags and their defaults as the samplers and the sweep receive them."""
    with pytest.raises(_Recorded):
        main(["quality", "--planner", setup["planner"], "--denoiser", setup["mask-denoiser"], "--judge", setup["ar"],
              "--out-dir", str(setup["root"] / "q-flags"), *argv])
    assert swept["specs"] == {**QUALITY_SPECS, **specs} and swept["dtype"] == dtype
    assert {key: swept["sweep"][key] for key in QUALITY_SWEEP} == {**QUALITY_SWEEP, **sweep}


@pytest.mark.parametrize("argv,split,count", [([], "test", 256), (["--split", "validation"], "validation", 256),
                                              (["--reference-sequences", "3"], "test", 3)])
def test_the_quality_reference_is_the_split_and_count_of_data_asked_for(setup, capsys, swept, monkeypatch, argv,
                                                                        split, count):
    """--data's held-out reference row scores --reference-sequences sequences of --split."""
    import ddpd.eval

    asked = []
    monkeypatch.setattr(ddpd.eval, "heldout_sequences", lambda source, tokenizer, seq_len, split, num, text:
                        asked.append((source, seq_len, split, num)) or torch.zeros(num, seq_len, dtype=torch.long))
    with pytest.raises(_Recorded):
        main(["quality", "--uniform", setup["uniform"], "--judge", setup["ar"], "--data", setup["data"],
              "--out-dir", str(setup["root"] / "q-reference"), *argv])
    assert asked == [(setup["data"], L, split, count)] and swept["sweep"]["reference"].shape == (count, L)


@pytest.fixture
def sampled(monkeypatch):
    """(function name, keyword arguments) of every ddpd.sampling sampler call."""
    from ddpd import sampling

    seen = []
    for name in ("ddpd_sample", "tau_leaping_planned", "tau_leaping_mask", "mask_sample"):
        def spy(*args, _name=name, _real=getattr(sampling, name), **kwargs):
            seen.append((_name, kwargs))
            return _real(*args, **kwargs)
        monkeypatch.setattr(sampling, name, spy)
    return seen


def test_each_quality_sampler_runs_with_the_settings_of_its_sweep(setup, tmp_path, capsys, monkeypatch, sampled):
    """A sweep's sampler draws with --eps, --fused, --dtype, the truncation, the checkpoints'
    schedule, and the steps, temperature, seed and first row of its configuration."""
    import ddpd.eval

    for kind in ("planner", "mask-denoiser"):
        config = config_for(kind, V, L, d_model=16, n_layers=1, n_heads=2)
        save_checkpoint(str(tmp_path / kind), build_model(kind, config),
                        {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"},
                         "schedule": "cosine"})

    def run_each(samplers, **kwargs):
        for spec in samplers:
            spec.run(2, 3, 0.5, 7, 4)  # batch size, steps, temperature, seed, first row
        raise _Recorded

    monkeypatch.setattr(ddpd.eval, "run_sweep", run_each)
    with pytest.raises(_Recorded):
        main(["quality", "--planner", str(tmp_path / "planner"), "--denoiser", str(tmp_path / "mask-denoiser"),
              "--judge", setup["ar"], "--samplers", "ddpd-A-mask", "dfm-eta2", "--eta", "2", "--eps", "0.25",
              "--fused", "--top-k", "3", "--out-dir", str(tmp_path / "q")])
    assert [name for name, _ in sampled] == ["ddpd_sample", "tau_leaping_mask"]
    for name, kwargs in sampled:
        assert (kwargs["steps"], kwargs["temperature"], kwargs["schedule"]) == (3, Temperature(0.5), "cosine"), name
        assert (kwargs["noise"].seed, kwargs["noise"].first_row) == (7, 4), name
        assert kwargs["execution"] == Execution(fused=True, dtype="float32") and kwargs["truncation"] == Truncation(3)
    assert sampled[0][1]["ddpd"] == DDPDOptions(eps=0.25) and sampled[1][1]["eta"] == 2.0


@pytest.fixture
def estimated(monkeypatch):
    """(estimator, the sequences' shape, its keywords) of each call of an elbo run, whose
    estimators return no row."""
    import ddpd.eval

    seen = []
    for name in ("evaluate_elbo", "evaluate_denoising"):
        monkeypatch.setattr(ddpd.eval, name, lambda models, sequences, _name=name, **kwargs:
                            seen.append((_name, tuple(sequences.shape), kwargs)) or [])
    return seen


ELBO_DEFAULTS = {"schedule": "linear", "seed": 0, "batch_size": 32, "progress": True}


@pytest.mark.parametrize("argv,elbo,denoising,common", [
    ([], {"mc_samples": 1, "t_max": 0.999}, {"alpha": 0.85}, {}),
    (["--mc-samples", "2", "--t-max", "0.9", "--alpha", "0.5", "--seed", "3", "--batch-size", "4", "--no-progress"],
     {"mc_samples": 2, "t_max": 0.9}, {"alpha": 0.5}, {"seed": 3, "batch_size": 4, "progress": False}),
])
def test_each_elbo_flag_reaches_the_estimator_it_names(setup, capsys, estimated, argv, elbo, denoising, common):
    code, _, err = _run(capsys, "elbo", "--planner", setup["planner"], "--denoiser", setup["mask-denoiser"],
                        "--data", setup["data"], "--num-sequences", 5, *argv)
    assert code == 0, err
    assert estimated == [("evaluate_elbo", (5, L), {**ELBO_DEFAULTS, **common, **elbo}),
                         ("evaluate_denoising", (5, L), {**ELBO_DEFAULTS, **common, **denoising})]


def test_elbo_of_a_planner_with_a_uniform_denoiser_alone_is_estimated(setup, capsys, estimated):
    """--planner's rows need a --denoiser of either kind, not a mask one."""
    code, _, err = _run(capsys, "elbo", "--planner", setup["planner"], "--denoiser", setup["uniform-denoiser"],
                        "--data", setup["data"], "--num-sequences", 2)
    assert code == 0, err
    assert [name for name, _, _ in estimated] == ["evaluate_elbo", "evaluate_denoising"]


def test_elbo_reads_the_split_and_count_of_data_asked_for(setup, capsys, estimated):
    """--split and --num-sequences choose the held-out sequences (every chunk of the split without it)."""
    from ddpd.eval import heldout_sequences
    from ddpd.training.data import tokenizer_from_config

    every = heldout_sequences(setup["data"], tokenizer_from_config({"name": "text8"}), L, "validation")
    for argv, count in (([], every.shape[0]), (["--num-sequences", "5"], 5)):
        code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--split",
                            "validation", *argv)
        assert code == 0, err
        assert [shape for _, shape, _ in estimated] == [(count, L)] * 2
        estimated.clear()


def test_each_convergence_flag_reaches_the_sampler(setup, capsys, sampled):
    """--temperature (1.0 without it), --seed, --dtype and the denoiser's kind reach both DDPD
    runs of each batch; the stopped run stops at the strictest --eps."""
    for argv, temperature, seed in (([], 1.0, 0), (["--temperature", "0.5", "--seed", "3"], 0.5, 3)):
        code, _, err = _run(capsys, "convergence", "--planner", setup["planner"], "--denoiser", setup["mask-denoiser"],
                            "--steps", 3, "--num-samples", 3, "--batch-size", 2, "--eps", 0.2, 0.1, 0.3,
                            "--dtype", "float32", "--out-dir", setup["root"] / "c-flags", "--no-progress", *argv)
        assert code == 0, err
        assert [kwargs["ddpd"] for _, kwargs in sampled] == [DDPDOptions(stop="budget"),
                                                             DDPDOptions(stop="eps", eps=0.1)] * 2
        for _, kwargs in sampled:
            assert (kwargs["steps"], kwargs["temperature"], kwargs["denoiser_type"]) == (3, temperature, "mask")
            assert kwargs["execution"] == Execution(dtype="float32") and kwargs["noise"].seed == seed
        assert [kwargs["noise"].first_row for _, kwargs in sampled] == [0, 0, 2, 2]
        sampled.clear()


def _compared_pairs(out):
    return [line.split(" | ")[:3] for line in out.splitlines() if line.startswith("| ") and "Steps" not in line]


def test_compare_defaults_take_every_sampler_and_baseline_of_the_sweep_but_the_reference(tmp_path, capsys):
    """docs/cli.md: by default every ddpd-* and tau-planned-* sampler against every dfm-* and
    maskgit baseline, each budget in turn (baselines, then samplers); the reference and the
    other samplers (tau-mask) are neither."""
    path = tmp_path / "sweep.csv"
    path.write_text(_sweep_text(["held-out text,,,1.2,4.0,", "tau-mask,2,1.0,3.0,3.0,"] + [
        f"{name},{steps},1.0,3.{steps},3.1," for steps in (3, 2)
        for name in ("maskgit", "tau-planned-A-mask", "dfm-eta0", "ddpd-A-mask")]))
    code, out, err = _run(capsys, "compare", path)
    assert code == 0, err
    assert _compared_pairs(out) == [["| 2", "tau-planned-A-mask", "maskgit"], ["| 2", "ddpd-A-mask", "maskgit"],
                                    ["| 2", "tau-planned-A-mask", "dfm-eta0"], ["| 2", "ddpd-A-mask", "dfm-eta0"],
                                    ["| 3", "tau-planned-A-mask", "maskgit"], ["| 3", "ddpd-A-mask", "maskgit"],
                                    ["| 3", "tau-planned-A-mask", "dfm-eta0"], ["| 3", "ddpd-A-mask", "dfm-eta0"]]
    code, out, err = _run(capsys, "compare", path, "--samplers", "tau-mask", "--baselines", "maskgit")
    assert code == 0, err
    assert _compared_pairs(out) == [["| 2", "tau-mask", "maskgit"]]
    code, out, err = _run(capsys, "compare", path, "--samplers", "held-out text")
    assert code == 2 and "not there: ['held-out text']" in err, err


def test_compare_names_an_unknown_sampler_before_saying_the_defaults_found_none(tmp_path, capsys):
    """A name given that the sweep lacks is the error, not the empty list of baselines the
    defaults found beside it."""
    path = tmp_path / "sweep.csv"
    path.write_text(_sweep_text(["ddpd-A-mask,2,1.0,3.2,3.1,"]))
    code, _, err = _run(capsys, "compare", path, "--samplers", "ddpd-B-mask")
    assert code == 2 and "not there: ['ddpd-B-mask']; the sweep has ['ddpd-A-mask']" in err, err


_COMMAND_LINES = {"elbo": ["elbo", "--data", "d"], "quality": ["quality", "--judge", "j", "--out-dir", "o"],
                  "convergence": ["convergence", "--out-dir", "o"], "compare": ["compare", "s.csv"],
                  "frontier": ["frontier", "--judge", "ngram", "--out-dir", "o"]}
_INF, _ABOVE = "inf", "2e36"  # above MAX_TEMPERATURE


@pytest.mark.parametrize("command, flag, refused, taken", [
    ("elbo", "--batch-size", ["0"], ["1"]), ("elbo", "--num-sequences", ["0"], ["1"]),
    ("elbo", "--mc-samples", ["0"], ["1"]), ("quality", "--num-samples", ["0"], ["1"]),
    ("quality", "--reference-sequences", ["0"], ["1"]), ("quality", "--steps", ["0"], ["1"]),
    ("convergence", "--steps", ["0"], ["1"]), ("frontier", "--budgets", ["0"], ["1"]),
    ("frontier", "--target-steps", ["0"], ["1"]),
    ("elbo", "--t-max", ["0", "1"], ["0.5"]), ("elbo", "--alpha", ["0", "1"], ["0.5"]),
    ("quality", "--eps", ["0", "1"], ["0.5"]), ("convergence", "--eps", ["0", "1"], ["0.5"]),
    ("convergence", "--temperature", ["-0.5", _ABOVE], ["0", "1e36"]),
    ("quality", "--temperatures", ["-0.5", _ABOVE], ["0", "1e36"]),
    ("frontier", "--temperatures", ["-0.5", _ABOVE], ["0", "1e36"]),
    ("frontier", "--target-temperature", ["-0.5", _ABOVE], ["0", "1e36"]),
    ("quality", "--eta", ["-0.5", _INF], ["0", "1e36"]),
    ("quality", "--seed", ["-1", str(2**63)], ["0", str(2**63 - 1)]),
])
def test_each_numeric_flag_is_held_to_its_documented_range(command, flag, refused, taken):
    """INT_FLAGS, FLOAT_FLAGS and --seed: each bound, open or closed, as docs/cli.md states it."""
    from ddpd.cli.common import UsageError
    from ddpd.cli.eval import build_parser, check_args

    for value in refused:
        args = build_parser().parse_args(_COMMAND_LINES[command] + [flag, value])
        with pytest.raises(UsageError, match=f"^{flag} must be"):
            check_args(args)
    for value in taken:
        check_args(build_parser().parse_args(_COMMAND_LINES[command] + [flag, value]))


@pytest.mark.parametrize("command, flag, values", [
    ("quality", "--samplers", ["maskgit", "maskgit"]), ("quality", "--steps", ["2", "2"]),
    ("quality", "--temperatures", ["1.0", "1.0"]), ("quality", "--eta", ["1.0", "1.0"]),
    ("convergence", "--eps", ["0.1", "0.1"]), ("compare", "--baselines", ["maskgit", "maskgit"]),
    ("frontier", "--policies", ["threshold:0.9", "threshold:0.9"]), ("frontier", "--budgets", ["8", "8"]),
])
def test_a_value_given_twice_to_a_sweep_list_is_refused(command, flag, values):
    from ddpd.cli.common import UsageError
    from ddpd.cli.eval import build_parser, check_args

    args = build_parser().parse_args(_COMMAND_LINES[command] + [flag, *values])
    with pytest.raises(UsageError, match=f"^{flag}: {values[0]} given more than once"):
        check_args(args)


def test_training_and_compare_write_their_reports_only_where_asked_and_say_so(setup, tmp_path, capsys,
                                                                                monkeypatch):
    """training writes training.md (the table printed) and training.json into --out-dir and
    names both; compare names its --out; without them, neither writes a file nor says it did."""
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "report"
    code, out, err = _run(capsys, "training", setup["planner"], "--out-dir", report)
    assert code == 0, err
    table = (report / "training.md").read_text()
    assert out.startswith(table) and out.endswith(f"\nwrote {report / 'training.md'}, {report / 'training.json'}\n")
    assert [row["run"] for row in json.loads((report / "training.json").read_text())] == [setup["planner"]]
    code, out, err = _run(capsys, "training", setup["planner"])
    assert code == 0 and "wrote" not in out and out.startswith("| Network |"), err
    sweep = tmp_path / "sweep.csv"
    sweep.write_text(_sweep_text(["ddpd-A-mask,2,1.0,3.2,3.1,", "maskgit,2,1.0,3.3,3.0,"]))
    code, out, err = _run(capsys, "compare", sweep, "--out", tmp_path / "compare.md")
    assert code == 0 and out.endswith(f"\nwrote {tmp_path / 'compare.md'}\n"), err
    code, out, err = _run(capsys, "compare", sweep)
    assert code == 0 and "wrote" not in out, err
    assert sorted(os.listdir(tmp_path)) == ["compare.md", "report", "sweep.csv"]


def test_threads_are_applied_before_the_command_runs(setup, capsys, monkeypatch):
    import ddpd.cli.eval as cli
    from ddpd.cli.common import UsageError

    applied = []

    def apply(threads):
        applied.append(threads)
        raise UsageError("stopped after the threads")

    monkeypatch.setattr(cli, "apply_threads", apply)
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--threads", 2)
    assert (code, applied, err) == (2, [2], "ddpd-eval: error: stopped after the threads\n")


def test_elbo_refuses_an_out_whose_markdown_twin_is_the_data(setup, capsys, tmp_path):
    """elbo writes --out x.json and x.md: x.md is an output too, refused over the --data it reads."""
    corpus = tmp_path / "corpus.md"
    corpus.write_text(open(setup["data"]).read())
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", corpus, "--out",
                        tmp_path / "corpus.json")
    assert code == 2 and f"--out {tmp_path / 'corpus.json'} would replace --data {corpus}" in err, err
    assert corpus.read_text() == open(setup["data"]).read() and sorted(os.listdir(tmp_path)) == ["corpus.md"]


def test_two_checkpoints_trained_on_other_text_are_warned_about_in_one_line(setup, capsys, tmp_path):
    """Both the planner and the denoiser recorded another corpus: one warning names both, in
    the plural."""
    from ddpd.training.data import fingerprint

    for kind in ("planner", "mask-denoiser"):
        config = config_for(kind, V, L, d_model=16, n_layers=1, n_heads=2)
        save_checkpoint(tmp_path / kind, build_model(kind, config),
                        {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"},
                         "corpus": fingerprint("another text"), "training": {"seq_len": L}})
    code, _, err = _run(capsys, "elbo", "--planner", tmp_path / "planner", "--denoiser", tmp_path / "mask-denoiser",
                        "--data", setup["data"], "--num-sequences", 2, "--no-progress")
    assert code == 0 and err == (f"ddpd-eval: warning: --planner {tmp_path / 'planner'}, --denoiser "
                                 f"{tmp_path / 'mask-denoiser'} were trained on another corpus than --data "
                                 f"{setup['data']} (the fingerprints differ): the test split is held out of --data "
                                 "only, not of the text the networks were trained on\n"), err


def test_more_sequences_than_the_split_holds_names_the_flag_and_the_value(setup, capsys):
    code, _, err = _run(capsys, "elbo", "--uniform", setup["uniform"], "--data", setup["data"], "--num-sequences",
                        100000, "--no-progress")
    assert code == 2 and err.startswith("ddpd-eval: error: --num-sequences: the test split of ")
    assert err.endswith(", got --num-sequences 100000\n"), err


def test_a_command_line_without_a_command_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "ddpd-eval: error: the following arguments are required: command\n"


def test_convergence_prints_the_last_rows_noise_and_stopped_fraction_and_its_reports(setup, capsys, tmp_path):
    """The summary line rounds the last row of convergence.csv (noise left to 4 places, the
    fraction stopped at the strictest --eps to 3), then names the reports written."""
    p = setup
    code, out, err = _run(capsys, "convergence", "--planner", p["planner"], "--denoiser", p["mask-denoiser"],
                          "--steps", 3, "--num-samples", 2, "--eps", 0.5, 0.25, "--out-dir", tmp_path, "--no-progress")
    assert code == 0, err
    with open(tmp_path / "convergence.csv") as f:
        last = list(csv.DictReader(f))[-1]
    written = [str(tmp_path / "convergence.csv")]
    if importlib.util.find_spec("matplotlib"):
        written.append(str(tmp_path / "convergence.png"))
    assert out.splitlines() == [
        f"at step 2 of 3 (before its move): noise left {float(last['noise_left']):.4f}, stopped (eps=0.25) "
        f"{float(last['stopped_eps_0.25']):.3f}", "wrote " + ", ".join(written)]


@pytest.mark.parametrize("argv, name", [
    (["training", "{planner}", "--out-dir", "{planner}/reports"], "the run {planner}"),
    (["frontier", "{planner}", "--judge", "ngram", "--data", "{data}", "--out-dir", "{planner}/reports"],
     "the bundle {planner}"),
    (["convergence", "--planner", "{planner}", "--denoiser", "{mask-denoiser}", "--out-dir", "{planner}/reports"],
     "--planner {planner}"),
])
def test_an_out_dir_inside_a_checkpoint_read_names_the_checkpoint_as_given(setup, capsys, argv, name):
    code, _, err = _run(capsys, *[a.format(**setup) for a in argv])
    assert code == 2 and err == (f"ddpd-eval: error: --out-dir {setup['planner']}/reports is inside "
                                 f"{name.format(**setup)}, a checkpoint this run reads; write it elsewhere\n"), err


def test_values_given_twice_to_a_sweep_list_are_named_in_order_once_each():
    from ddpd.cli.common import UsageError
    from ddpd.cli.eval import build_parser, check_args

    args = build_parser().parse_args(_COMMAND_LINES["quality"] + ["--steps", "8", "4", "8", "2", "4", "8"])
    with pytest.raises(UsageError, match=r"^--steps: 4, 8 given more than once \(each value is one configuration\)$"):
        check_args(args)


@pytest.mark.integration
def test_a_stdout_that_fails_is_an_error_once_the_reports_are_written(setup, tmp_path):
    """`ddpd-eval ... >/dev/full`: not a reader that went away, a failure: exit 1 in one line
    saying the reports are written all the same."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "ddpd.cli.eval", "training", setup["planner"], "--out-dir",
                               str(tmp_path)], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=HANG_GUARD_SECONDS, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and done.stderr == ("ddpd-eval: error: cannot write stdout: No space left on "
                                                    "device; the files are written\n"), done.stderr
    assert sorted(os.listdir(tmp_path)) == ["training.json", "training.md"]


def test_an_eps_no_sampler_reads_is_named_to_six_significant_digits(setup, capsys):
    p = setup
    code, _, err = _run(capsys, "quality", "--denoiser", p["mask-denoiser"], "--judge", p["ar"], "--samplers",
                        "maskgit", "--eps", 0.1234567, "--out-dir", p["root"] / "q-eps", "--no-progress")
    assert code == 2 and err == ("ddpd-eval: error: --eps 0.123457 acts on the eps stop of the ddpd-A-* samplers "
                                 "only, and this sweep runs none of them\n"), err


@pytest.mark.parametrize("flags, disable", [([], None), (["--no-progress"], True)])
def test_convergence_shows_its_progress_bar_on_a_terminal_unless_told_not_to(setup, capsys, monkeypatch, tmp_path,
                                                                             flags, disable):
    """tqdm's disable=None: a bar on a terminal only; --no-progress: none anywhere."""
    import tqdm.auto

    bars = []

    def bar(iterable, **kwargs):
        bars.append((kwargs["desc"], kwargs["disable"]))
        return iterable

    monkeypatch.setattr(tqdm.auto, "tqdm", bar)
    code, _, err = _run(capsys, "convergence", "--planner", setup["planner"], "--denoiser", setup["mask-denoiser"],
                        "--steps", 2, "--num-samples", 1, "--out-dir", tmp_path, *flags)
    assert code == 0 and bars == [("convergence", disable)], err
