"""The tools check their command line before the slow work: what the command line alone
decides (flag values, the files and checkpoint directories it names) fails in one line
before torch is imported, and what needs torch but no model fails before any model loads
(importing torch and loading models take seconds to tens of seconds on a busy machine)."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from hang_guard import HANG_GUARD_SECONDS

# The tool as its console script starts it (argv[0] names it), with torch made unimportable:
# a check that runs after `import torch` ends in an ImportError instead of its one line.
_WITHOUT_TORCH = """import sys
sys.modules["torch"] = None
sys.argv[0] = {tool!r}
from ddpd.cli.{module} import main
sys.exit(main(sys.argv[1:]))
"""


def _run_without_torch(tool, *argv):
    module = tool.split("-")[1]
    return subprocess.run([sys.executable, "-c", _WITHOUT_TORCH.format(tool=tool, module=module), *map(str, argv)],
                          capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)


@pytest.fixture
def files(tmp_path):
    """A checkpoint-like directory, a plain file, a sweep and a prompts file that exist."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "sweep.csv").write_text("sampler\n")
    return {"ckpt": tmp_path / "ckpt", "file": tmp_path / "file.txt", "missing": tmp_path / "missing",
            "q": tmp_path / "q", "sweep": tmp_path / "q" / "sweep.csv"}


CASES = [
    ("ddpd-sample", ["--checkpoint", "{missing}"], 1, "checkpoint directory not found: {missing}"),
    ("ddpd-sample", ["--planner", "{file}", "--denoiser", "{ckpt}"], 1, "checkpoint path is not a directory: {file}"),
    ("ddpd-sample", ["--planner", "{ckpt}"], 2, "--planner needs a --denoiser"),
    ("ddpd-sample", ["--checkpoint", "{ckpt}", "--denoiser", "{ckpt}"], 2, "give either --checkpoint or"),
    ("ddpd-sample", ["--prompts", "{missing}"], 2, "--prompts {missing}: No such file or directory"),
    ("ddpd-sample", ["--option", "D"], 2, "--option must combine the letters A, B, C"),
    ("ddpd-sample", ["--guidance-scale", "2"], 2, "--guidance-scale needs --labels"),
    ("ddpd-sample", ["--length", "0"], 2, "--length must be >= 1, got 0"),
    ("ddpd-sample", ["--threads", "0"], 2, "--threads must be in [1, 1024], got 0"),
    ("ddpd-sample", ["--out", ""], 2, "--out must be a path, got ''"),
    ("ddpd-train", ["planner", "--out", "{ckpt}"], 2, "--data is required"),
    ("ddpd-train", ["planner", "--data", "{missing}", "--out", "{ckpt}"], 2, "--data: no such file: {missing}"),
    ("ddpd-train", ["planner", "--data", "books", "--tokenizer", "gpt2", "--tiktoken", "{missing}", "--out", "{ckpt}"],
     2, "--tiktoken: no such file: {missing}"),
    ("ddpd-train", ["planner", "--out", "{missing}", "--resume"], 1, "checkpoint directory not found: {missing}"),
    ("ddpd-eval", ["elbo", "--planner", "{missing}", "--denoiser", "{ckpt}", "--data", "books"], 1,
     "checkpoint directory not found: {missing}"),
    ("ddpd-eval", ["elbo", "--uniform", "{ckpt}", "--data", "{missing}"], 2, "--data: no such file: {missing}"),
    ("ddpd-eval", ["quality", "--uniform", "{ckpt}", "--judge", "{missing}", "--out-dir", "{ckpt}"], 1,
     "checkpoint directory not found: {missing}"),
    ("ddpd-eval", ["quality", "--uniform", "{ckpt}", "--judge", "{ckpt}", "--out-dir", "{file}/q"], 1,
     "cannot write {file}/q: {file} is not a directory"),
    # a judge alone is no model to evaluate
    ("ddpd-eval", ["quality", "--judge", "{ckpt}", "--out-dir", "{q}"], 2,
     "no model to evaluate: give --planner with --denoiser, and/or --uniform"),
    ("ddpd-eval", ["convergence", "--out-dir", "{q}"], 2, "no model to evaluate: give --planner and exactly one"),
    ("ddpd-eval", ["merge", "{missing}", "--out-dir", "{ckpt}"], 2, "no such sweep file: {missing}"),
    ("ddpd-eval", ["training", "{ckpt}", "{missing}"], 1, "checkpoint directory not found: {missing}"),
    # an output over an input: the sweep turned into Markdown, a checkpoint's config.json into samples
    ("ddpd-eval", ["compare", "{sweep}", "--out", "{sweep}"], 2,
     "--out {sweep} would replace the sweep {sweep}, which this run reads; write it elsewhere"),
    ("ddpd-eval", ["merge", "{sweep}", "{file}", "--out-dir", "{q}"], 2,
     "--out-dir {q} would replace the sweep {sweep}, which this run reads"),
    ("ddpd-eval", ["elbo", "--uniform", "{ckpt}", "--data", "books", "--out", "{ckpt}/elbo.json"], 2,
     "--out {ckpt}/elbo.json is inside --uniform {ckpt}, a checkpoint this run reads; write it elsewhere"),
    ("ddpd-eval", ["quality", "--uniform", "{ckpt}", "--judge", "{ckpt}", "--out-dir", "{ckpt}"], 2,
     "--out-dir {ckpt} is inside --uniform {ckpt}, a checkpoint this run reads"),
    ("ddpd-eval", ["elbo", "--uniform", "{ckpt}", "--data", "{file}", "--out", "{file}"], 2,
     "--out {file} would replace --data {file}"),
    ("ddpd-sample", ["--checkpoint", "{ckpt}", "--out", "{ckpt}/planner/config.json"], 2,
     "--out {ckpt}/planner/config.json is inside --checkpoint {ckpt}, a checkpoint this run reads"),
    ("ddpd-sample", ["--prompts", "{file}", "--out", "{file}"], 2, "--out {file} would replace --prompts {file}"),
    ("ddpd-eval", ["elbo", "--uniform", "{ckpt}", "--data", "books", "--threads", "0"], 2,
     "--threads must be in [1, 1024], got 0"),
]


@pytest.mark.integration
@pytest.mark.parametrize("tool, argv, status, message", CASES, ids=[" ".join([c[0], *c[1]]) for c in CASES])
def test_the_command_line_is_checked_before_torch_is_imported(files, tool, argv, status, message):
    proc = _run_without_torch(tool, *(a.format(**files) for a in argv))
    assert proc.returncode == status and proc.stderr.startswith(f"{tool}: error: {message.format(**files)}"), \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


@pytest.mark.integration
@pytest.mark.parametrize("tool, argv", [("ddpd-sample", ["--num-samples", "1"]),
                                        ("ddpd-train", ["planner", "--data", "books", "--out", "{ckpt}"]),
                                        ("ddpd-eval", ["elbo", "--uniform", "{ckpt}", "--data", "books"])])
def test_a_command_line_that_passes_goes_on_to_import_torch(files, tool, argv):
    """The other side of the test above: with torch unimportable a good command line fails
    on the import, so the errors above were given before it."""
    proc = _run_without_torch(tool, *(a.format(**files) for a in argv))
    assert proc.returncode == 1 and "ModuleNotFoundError: import of torch halted" in proc.stderr, proc.stderr


def test_an_output_is_compared_with_the_inputs_as_they_resolve(tmp_path, monkeypatch):
    """Through a symbolic link, a hard link, `..` or a relative path, an output that is an input
    (or inside a checkpoint read) is still refused; one beside them is not."""
    from ddpd.cli.common import UsageError, refuse_outputs_over_inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "b" / "planner").mkdir(parents=True)
    (tmp_path / "sweep.csv").write_text("x")
    os.link(tmp_path / "sweep.csv", tmp_path / "hard.csv")
    os.symlink(tmp_path / "b", tmp_path / "link")
    for out in ("hard.csv", "b/../sweep.csv", str(tmp_path / "sweep.csv")):
        with pytest.raises(UsageError, match="would replace the sweep sweep.csv"):
            refuse_outputs_over_inputs([(f"--out {out}", out)], files=[("the sweep sweep.csv", "sweep.csv")])
    for out in ("link/planner/config.json", "b", "link"):
        with pytest.raises(UsageError, match="is inside --checkpoint b, a checkpoint"):
            refuse_outputs_over_inputs([(f"--out {out}", out)], checkpoints=[("--checkpoint b", "b")])
    refuse_outputs_over_inputs([("--out", "other.csv"), ("--out", "b2/x")], files=[("the sweep", "sweep.csv")],
                               checkpoints=[("--checkpoint b", "b")])
    # once b holds a network, only the network's directory is the checkpoint's: beside it is fine
    (tmp_path / "b" / "planner" / "config.json").write_text("{}")
    refuse_outputs_over_inputs([("--out", "b/samples.jsonl"), ("--out", "link/report")],
                               checkpoints=[("--checkpoint b", "b")])
    with pytest.raises(UsageError, match="is inside --checkpoint b, a checkpoint"):
        refuse_outputs_over_inputs([("--out", "link/planner/x")], checkpoints=[("--checkpoint b", "b")])


def test_the_tools_light_lists_are_the_packages():
    """The parsers' choices, written out in ddpd.cli so that parsing imports no torch."""
    from ddpd.cli import common, eval as eval_cli, samplers, train
    from ddpd.eval.elbo import DEFAULT_T_MAX
    from ddpd.models import DTYPE_CHOICES
    from ddpd.sampling.policies import MaskGIT
    from ddpd.training import trainer

    assert common.DTYPE_CHOICES == DTYPE_CHOICES
    assert samplers.MASKGIT_CHOICE_TEMPERATURE == MaskGIT().choice_temperature
    assert samplers.FLOAT32_MAX == torch.finfo(torch.float32).max
    assert eval_cli.DEFAULT_T_MAX == DEFAULT_T_MAX
    assert (train.KINDS, train.TOKENIZERS) == (trainer.KINDS, trainer.TOKENIZERS)


@pytest.fixture
def no_models(monkeypatch):
    def loaded(*args, **kwargs):
        raise AssertionError("the models were loaded before the command line was checked")

    monkeypatch.setattr("ddpd.cli.sample.load_models", loaded)
    monkeypatch.setattr("ddpd.cli.eval.load_models", loaded)


@pytest.mark.parametrize("argv, message", [
    (["--k", "0"], "--k must be"),
    (["--eps", "2"], "--eps must be"),
    (["--clock", "exact", "--stop", "eps"], "--stop eps is not available with --clock exact"),
    (["--clock", "exact", "--option", "A"], "--clock planner (--option A sets --stop and --selection)"),
    (["--top-p", "2"], "--top-p must be"),
    (["--eta", "-1"], "--eta must be a finite number >= 0"),  # refused though the ddpd sampler reads no eta
    (["--sampler", "maskgit", "--policy", "threshold:0.9", "--choice-temperature", "-5"], "--choice-temperature must"),
    (["--policy", ""], "--policy must be NAME[:FIELD=VALUE,...], got ''"),
    (["--policy", " "], "--policy must be NAME[:FIELD=VALUE,...], got ' '"),  # blank: named as given
    (["--policy", "error-budget:,,"], "policy error-budget has an empty field"),
    (["--option", ""], "--option must combine the letters A, B, C"),
    (["--option", "A+D"], "--option must combine the letters A, B, C (e.g. A+B+C), got 'A+D'"),
    # --k acts only in the parallel stage: alone, or under a policy, it was ignored
    (["--k", "4"], "--k 4 acts in the parallel stage only: give --parallel-steps N too"),
    (["--policy", "error-budget", "--k", "4"], "--k 4 acts in the parallel stage only"),
    (["--parallel-steps", "3"], "--parallel-steps 3 is a stage of k positions a step, and --k 1 is every step's "
                                "one: give --k 2 or more"),
    # --t-end acts on the exact clock only, --eps with the eps stop only: both were ignored
    (["--t-end", "0.5"], "--t-end 0.5 acts on the exact clock only: give --clock exact too"),
    (["--option", "B", "--eps", "0.5"], "--eps 0.5 acts with the eps stop (option A) only, and --option B runs the "
                                        "whole budget: give --option without B"),
    (["--option", "A+B+C", "--stop", "eps", "--eps", "0.5"], "and --option A+B+C runs the whole budget"),
    (["--stop", "budget", "--eps", "0.5"], "and --stop budget runs the whole budget: give --stop eps"),
    (["--clock", "exact", "--eps", "0.5"], "and --clock exact runs to --t-end: give --clock planner"),
    (["--labels", "0", "--guidance-scale", "1e39"], "--guidance-scale must be at most 3.40282e+38"),
    (["--guidance-scale", "0"], "--guidance-scale needs --labels (the classes to guide towards)"),  # below 1 too
    # the policy's own field decides; the flag was ignored
    (["--sampler", "maskgit", "--policy", "maskgit", "--choice-temperature", "2"],
     "with --policy maskgit give the policy's choice_temperature field"),
    (["--policy", "error-budget:bound=1", "--choice-temperature", "2"], "--choice-temperature sets the default"),
    # a policy without the field: the message told to give the field it does not have
    (["--sampler", "maskgit", "--policy", "threshold:0.9", "--choice-temperature", "2"],
     "with --policy threshold:0.9 it has none: leave --choice-temperature out"),
    (["--sampler", "maskgit", "--policy", "remdm", "--choice-temperature", "2"], "it has none"),
    # the name with spaces around it, which parse_policy strips: the advice was told it has no such field
    (["--sampler", "maskgit", "--policy", " maskgit ", "--choice-temperature", "2"],
     "with --policy  maskgit  give the policy's choice_temperature field"),
    # the policy's name is read before its fields
    (["--sampler", "maskgit", "--policy", "maskgit:choice_temperature=2", "--choice-temperature", "2"],
     "with --policy maskgit:choice_temperature=2 give the policy's choice_temperature field"),
    # a policy reaches only the sampler it belongs to: tau-leaping has none
    (["--sampler", "tau-leaping", "--policy", "threshold:0.9"],
     "--policy threshold:0.9 is a policy of --sampler maskgit, not of --sampler tau-leaping"),
    (["--policy", "error-budget:max_k=x"], "--policy: policy field max_k must be an int, got 'x'"),
    (["--policy", "error-budget:max_k=1_6"], "--policy: policy field max_k must be an int, got '1_6': a number has "
                                             "no underscores or spaces"),
    # a flag only another sampler reads was ignored
    (["--sampler", "maskgit", "--eta", "1"], "--eta is a setting of --sampler tau-leaping, not of --sampler maskgit"),
    (["--sampler", "maskgit", "--option", "A+B"], "--option is a setting of --sampler ddpd"),
    (["--sampler", "tau-leaping", "--clock", "exact"], "--clock is a setting of --sampler ddpd"),
    (["--sampler", "maskgit", "--k", "4"], "--k is a setting of --sampler ddpd"),
    (["--choice-temperature", "2"], "--choice-temperature is a setting of --sampler maskgit, not of --sampler ddpd"),
    (["--sampler", "maskgit", "--selection", "softmax"], "--selection is a setting of --sampler ddpd"),
    (["--sampler", "maskgit", "--t-end", "0.5"], "--t-end is a setting of --sampler ddpd"),
    (["--sampler", "maskgit", "--stop", "budget"], "--stop is a setting of --sampler ddpd, not of --sampler maskgit"),
    (["--sampler", "maskgit", "--eps", "0.5"], "--eps is a setting of --sampler ddpd, not of --sampler maskgit"),
    (["--sampler", "tau-leaping", "--parallel-steps", "2"], "--parallel-steps is a setting of --sampler ddpd"),
    # the boundaries of the ranges: the smallest value refused
    (["--k", "2"], "--k 2 acts in the parallel stage only: give --parallel-steps N too"),
    (["--seed", "-1"], "--seed must be in [0, 2**63), got -1"),
    (["--seed", str(2**63)], f"--seed must be in [0, 2**63), got {2**63}"),
    (["--fused", "--sync-every", "0"], "--sync-every must be >= 1, got 0"),
])
def test_sample_refuses_the_sampler_settings_before_loading_models(no_models, capsys, argv, message):
    from ddpd.cli.sample import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("ddpd-sample: error: ") and message in err and err.count("\n") == 1, err


def test_the_largest_float32_guidance_scale_is_accepted():
    """--guidance-scale is refused above float32's largest value, not at it ("must be at most")."""
    from ddpd.cli.sample import build_parser, check_command_line

    check_command_line(build_parser().parse_args(["--labels", "0", "--guidance-scale",
                                                  repr(torch.finfo(torch.float32).max)]))


def test_the_policies_with_a_choice_temperature_are_those_ddpd_sample_names():
    """ddpd-sample tells which --policy has a choice_temperature field without importing the policies."""
    import dataclasses

    from ddpd.cli.sample import CHOICE_TEMPERATURE_POLICIES
    from ddpd.sampling.policies import POLICIES

    assert set(CHOICE_TEMPERATURE_POLICIES) == {name for name, policy in POLICIES.items()
                                                if "choice_temperature" in {f.name for f in dataclasses.fields(policy)}}


def test_threads_are_checked_up_to_the_largest_allowed(monkeypatch):
    from ddpd.cli.common import MAX_THREADS, UsageError, check_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    check_threads(1)
    check_threads(MAX_THREADS)  # the bound itself is allowed: "--threads must be in [1, 1024]"
    for bad in (0, MAX_THREADS + 1):
        with pytest.raises(UsageError, match=rf"--threads must be in \[1, 1024\], got {bad}"):
            check_threads(bad)
    monkeypatch.setenv("OMP_NUM_THREADS", "2,1")  # OpenMP's list of nested levels: the first is torch's
    check_threads(None)


@pytest.mark.parametrize("omp", ["0", "0,2", "x", "-1"])
def test_an_omp_num_threads_openmp_cannot_use_is_refused_without_threads(monkeypatch, omp):
    from ddpd.cli.common import UsageError, check_threads

    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    with pytest.raises(UsageError, match=f"^OMP_NUM_THREADS must be a positive int .*, got '{omp}'$"):
        check_threads(None)
    check_threads(2)  # --threads decides


def test_apply_threads_sets_threads_else_leaves_omp_num_threads_to_torch_else_one(monkeypatch):
    """docs/cli.md: --threads N, else $OMP_NUM_THREADS (which torch reads itself), else 1."""
    from ddpd.cli.common import apply_threads

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    apply_threads(3)
    apply_threads(None)
    assert calls == [3, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    apply_threads(None)
    apply_threads(4)
    assert calls == [3, 1, 4]


@pytest.mark.parametrize("prog, argv, message", [
    ("ddpd-sample", ["--steps", "1_0"], "argument --steps: must be an int, got '1_0': a number has no underscores"),
    ("ddpd-sample", ["--temperature", "0_9"], "argument --temperature: must be a float, got '0_9': a number has no"),
    ("ddpd-sample", ["--length", " 64"], "argument --length: must be an int, got ' 64': a number has no underscores "
                                         "or spaces"),
    ("ddpd-train", ["planner", "--lr", "1e-3\n"], "argument --lr: must be a float, got '1e-3\\n': a number has no"),
    ("ddpd-eval frontier", ["frontier", "--budgets", "32", "6_4"], "argument --budgets: must be an int, got '6_4'"),
    ("ddpd-eval elbo", ["elbo", "--threads", "1_6"], "argument --threads: must be an int, got '1_6'"),
])
def test_a_number_with_an_underscore_or_a_space_is_refused(prog, argv, message, capsys):
    """Python's int() reads `1_0` as 10 and ` 64` as 64: `--steps 1_0`, a typo, ran ten steps."""
    from importlib import import_module

    with pytest.raises(SystemExit) as stopped:
        import_module(f"ddpd.cli.{prog.split()[0].split('-')[1]}").main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"{prog}: error: {message}") and err.count("\n") == 1, err


def test_number_flags_read_every_spelling_python_reads_but_underscores_and_spaces():
    import argparse

    from ddpd.cli.common import float_type, int_type, open_fraction, positive_int

    assert [int_type(t) for t in ("64", "-1", "+3", "007")] == [64, -1, 3, 7]
    assert [float_type(t) for t in ("1e3", "1E-3", ".5", "5.", "-0.5", "inf")] == [1e3, 1e-3, 0.5, 5.0, -0.5, math.inf]
    assert positive_int("8") == 8 and open_fraction("0.25") == 0.25
    for parse, text in [(int_type, "1_000"), (float_type, "1_0.5"), (float_type, "\t2"), (positive_int, "1_0"),
                        (open_fraction, "0.2_5")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {re.escape(repr(text))}: a number has no "
                                                             "underscores or spaces$"):
            parse(text)
    with pytest.raises(ValueError) as other:  # argparse's own "invalid int value: 'x'"
        int_type("x")
    assert not isinstance(other.value, argparse.ArgumentTypeError) and int_type.__name__ == "int"
