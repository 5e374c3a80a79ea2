"""ddpd.cli.common, the helpers the three tools share, called directly: the exit statuses and
lines of run_tool, the checks of threads, finite values, empty paths and outputs, and what a
set of checkpoints used together must share."""
import argparse
import errno
import math
import os
import signal
import warnings

import pytest

from ddpd.checkpoint import CheckpointError
from ddpd.cli.common import (
    Interrupted,
    OneLineParser,
    UsageError,
    add_runtime_arguments,
    apply_threads,
    check_finite,
    check_seed,
    check_threads,
    flag_error,
    load_role,
    one_line,
    raise_swallowed_signal,
    refuse_empty_paths,
    refuse_outputs_over_inputs,
    refused_text,
    run_tool,
    shared_facts,
    signals_as_interrupts,
    training_length,
    unopened_data,
    warn_if_lengths_differ,
)


def _raising(err):
    def body():
        raise err

    return body


def test_an_error_without_a_message_is_named_by_its_class(capsys):
    """An OSError() has no text: the line would end in "error: " and say nothing."""
    assert run_tool("ddpd-x", _raising(OSError())) == 1
    assert capsys.readouterr().err == "ddpd-x: error: OSError\n"


def test_an_extension_that_cannot_be_built_is_one_line_without_its_prefix(capsys):
    """Pins the line of the extension's RuntimeError: its first line without "ddpd:", the
    tool's name standing in for it; any other RuntimeError is a bug and keeps its traceback."""
    err = RuntimeError("ddpd: the C++ extension is unavailable (ddpd._C was not built)\ncompiler output")
    assert run_tool("ddpd-x", _raising(err)) == 1
    assert capsys.readouterr().err == "ddpd-x: error: the C++ extension is unavailable (ddpd._C was not built)\n"
    with pytest.raises(RuntimeError, match="^an index out of range$"):
        run_tool("ddpd-x", _raising(RuntimeError("an index out of range")))


def test_a_keyboard_interrupt_that_no_signal_handler_raised_exits_130(capsys):
    """A KeyboardInterrupt not raised by the tools' handler (Python's own, outside the block)
    ends as Ctrl-C does: one line and 128 + SIGINT."""
    assert run_tool("ddpd-x", _raising(KeyboardInterrupt())) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "ddpd-x: interrupted\n"


def test_only_ddpd_warnings_become_the_tools_one_line(capsys):
    """A warning of another package (torch's, numpy's) goes on to Python's warning machinery,
    which shows it naming the file and the category a user looks up (here pytest records it);
    ddpd's own are `PROG: warning: ...`."""
    from ddpd.sampling import NaNOutputWarning

    def body():
        warnings.warn("a library's notice", UserWarning)
        warnings.warn("the denoiser returned NaN", NaNOutputWarning)
        return 0

    with pytest.warns(UserWarning, match="^a library's notice$"):
        assert run_tool("ddpd-x", body) == 0
    assert capsys.readouterr().err == "ddpd-x: warning: the denoiser returned NaN\n"


@pytest.mark.parametrize("omp", [" 2", "2 ", "2 ,1"])
def test_an_omp_num_threads_with_spaces_openmp_reads_is_taken(monkeypatch, omp):
    """OpenMP and torch skip the spaces around OMP_NUM_THREADS's first number: refusing
    " 2" would stop a run that OpenMP itself runs on 2 threads."""
    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    check_threads(None)


def test_threads_given_as_a_bool_are_refused(monkeypatch):
    """True is an int to isinstance: check_threads(True) would pass, and torch run 1 thread."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(UsageError, match=r"^--threads must be in \[1, 1024\], got True$"):
        check_threads(True)


def test_a_finite_value_is_zero_or_more_and_not_infinite():
    check_finite("--eta", 0.0)
    check_finite("--eta", None)
    for bad in (math.inf, math.nan, -1e-9):
        with pytest.raises(UsageError, match=f"^--eta must be a finite number >= 0, got {bad}$"):
            check_finite("--eta", bad)


def test_an_empty_path_is_refused_by_its_flags_spelling():
    """The dest out_dir is the flag --out-dir: the message named "--out_dir", no flag at all."""
    refuse_empty_paths(argparse.Namespace(out="x", out_dir=None), "out", "out_dir")
    with pytest.raises(UsageError, match="^--out-dir must be a path, got ''$"):
        refuse_empty_paths(argparse.Namespace(out="x", out_dir=""), "out", "out_dir")


def test_an_out_naming_the_pipe_stdout_goes_to_is_left_to_the_output_checks():
    """Only a regular file stdout goes to is "the file stdout goes to": `--out /dev/stdout | cat`
    names a pipe, which ddpd.files refuses as no regular file."""
    read, write = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(write, 1)
        refuse_outputs_over_inputs([("--out /proc/self/fd/1", "/proc/self/fd/1")])
    finally:
        os.dup2(saved, 1)
        for fd in (saved, read, write):
            os.close(fd)


@pytest.mark.parametrize("seq_len", [0, -1, True, 8.0])
def test_a_training_length_that_is_no_positive_int_is_refused(seq_len):
    """config.json carries no digest: an edited training.seq_len is one line naming it."""
    config = {"kind": "mask-denoiser", "model": {"max_seq_len": 8}, "training": {"seq_len": seq_len}}
    with pytest.raises(CheckpointError, match=rf"^ck: config.json's training.seq_len is {seq_len!r}, not a "):
        training_length("ck", config)
    assert training_length("ck", {**config, "training": {"seq_len": 1}}) == 1


def test_an_ar_judge_shares_the_vocabulary_and_tokenizer_but_not_the_schedule_or_length():
    """An AR judge has no noise schedule (config.json records none) and scores what the
    diffusion models make at their length: neither is compared nor counted."""
    tokenizer = {"name": "text8"}
    denoiser = {"kind": "mask-denoiser", "model": {"out_dim": 27, "max_seq_len": 8}, "tokenizer": tokenizer,
                "schedule": "cosine"}
    judge = {"kind": "ar", "model": {"out_dim": 27, "max_seq_len": 4}, "tokenizer": tokenizer}
    facts = shared_facts([("--denoiser d", denoiser), ("--judge j", judge)])
    assert facts == {"vocab_size": 27, "tokenizer": tokenizer, "schedule": "cosine", "seq_len": 8,
                     "seq_lens": {"--denoiser d": 8}}


@pytest.mark.parametrize("rank, world_size, says", [(None, None, True), ("0", "2", True), ("1", "2", False),
                                                    ("3", "4", False), ("1", None, True), ("2", "2", True),
                                                    ("x", "2", True)])
def test_only_process_0_of_a_torchrun_writes_an_argument_error(monkeypatch, capsys, rank, world_size, says):
    """Every process of a torchrun parses the same command line: each wrote the same error line.
    Process 0 writes it; the others exit 2 without it. A RANK without a group, or one that is not
    an int, still writes it."""
    for name, value in (("RANK", rank), ("WORLD_SIZE", world_size)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    parser = OneLineParser(prog="ddpd-train")
    parser.add_argument("--steps", required=True)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == ("ddpd-train: error: the following arguments are required: --steps\n" if says else ""), err


def test_runtime_flags_default_to_auto_and_no_threads_unless_suppressed():
    """--device defaults to "auto" (CUDA if available) and --threads to None; SUPPRESS omits both."""
    parser = argparse.ArgumentParser()
    add_runtime_arguments(parser)
    assert vars(parser.parse_args([])) == {"device": "auto", "threads": None}
    parser = argparse.ArgumentParser()
    add_runtime_arguments(parser, argparse.SUPPRESS)
    assert vars(parser.parse_args([])) == {}


def test_apply_threads_refuses_a_bad_count_before_torch_sees_it(monkeypatch):
    """apply_threads(0) is check_threads' one-line UsageError; torch.set_num_threads is never called."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with pytest.raises(UsageError, match=r"^--threads must be in \[1, 1024\], got 0$"):
        apply_threads(0)
    assert calls == []


def test_models_of_different_lengths_run_at_the_shortest_and_a_missing_schedule_is_linear(capsys):
    """A config.json without a schedule is linear, so it pairs with a "linear" one; seq_len is the
    shortest training length, and the tool warns naming the longest and the shortest."""
    planner = {"kind": "planner", "model": {"vocab_size": 27, "max_seq_len": 16}}
    denoiser = {"kind": "mask-denoiser", "model": {"out_dim": 27, "max_seq_len": 8}, "schedule": "linear"}
    facts = shared_facts([("--planner p", planner), ("--denoiser d", denoiser)])
    assert (facts["schedule"], facts["seq_len"]) == ("linear", 8)
    warn_if_lengths_differ("ddpd-x", facts["seq_lens"])
    assert capsys.readouterr().err == ("ddpd-x: warning: --planner p takes sequences of 16 tokens, --denoiser d "
                                       "of 8: using 8\n")


def test_a_value_error_from_below_exits_with_the_status_the_tool_gives(capsys):
    """ddpd-sample reads a ValueError of the samplers' checks as a usage error: status 2, not 1."""
    assert run_tool("ddpd-x", _raising(ValueError("steps must be >= 1, got 0")), value_error_status=2) == 2
    assert run_tool("ddpd-x", _raising(TypeError("steps must be an int"))) == 1
    assert capsys.readouterr().err == "ddpd-x: error: steps must be >= 1, got 0\nddpd-x: error: steps must be an int\n"


def test_out_of_memory_on_the_gpu_is_one_line_with_the_default_advice(capsys):
    """torch.OutOfMemoryError says "CUDA out of memory", not the CPU allocator's "can't allocate
    memory": it is known by its type, and the line advises what ddpd-sample and ddpd-eval can lower."""
    import torch

    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    assert run_tool("ddpd-x", _raising(err)) == 1
    assert capsys.readouterr().err == ("ddpd-x: error: out of memory: CUDA out of memory. Tried to allocate 2.00 GiB; "
                                       "lower --batch-size (or --num-samples), or use a smaller model\n")


def test_only_an_error_about_the_data_file_itself_names_data(tmp_path, monkeypatch):
    """The loader opens --data by its absolute path: an OSError or an "is empty" naming another
    file (a tokenizer's, a checkpoint's) is not --data's fault and is left as it is."""
    monkeypatch.chdir(tmp_path)
    own = str(tmp_path / "corpus.txt")
    refused = unopened_data("corpus.txt", OSError(errno.ENXIO, "No such device or address", own))
    assert str(refused) == "--data corpus.txt: No such device or address"
    assert unopened_data("corpus.txt", OSError(errno.ENXIO, "No such device or address", own + ".vocab")) is None
    assert unopened_data("corpus.txt", OSError(errno.ENXIO, "No such device or address")) is None
    assert str(refused_text("corpus.txt", ValueError(f"data file {own} is empty"))) == "--data: corpus.txt is empty"
    assert refused_text("corpus.txt", ValueError(f"data file {tmp_path / 'other.txt'} is empty")) is None


def test_a_setting_refused_below_is_named_by_its_flag_but_a_path_is_not():
    """A layer below names its settings as Python does (d_model, clock='exact'); the user typed
    --d-model and --clock exact. A path the run was given stays as typed, even where it begins
    with a flag's name."""
    flags = ["d_model", "clock", "label_dropout", "num_classes", "max_time"]
    assert str(flag_error(ValueError("TransformerConfig.d_model: expected a multiple of n_heads"), flags)) == \
        "--d-model: expected a multiple of n_heads"
    assert str(flag_error(ValueError("label_dropout needs num_classes > 0, got clock='exact'"), flags)) == \
        "--label-dropout needs --num-classes > 0, got --clock exact"
    assert str(flag_error(OSError("max_time/out is not writable"), flags, paths=["max_time/out"])) == \
        "max_time/out is not writable"


def test_a_checkpoint_of_another_kind_is_refused_naming_every_kind_the_role_takes(monkeypatch):
    """load_role's line names the flag and path (or the name given), the kind found and each kind
    the role accepts."""
    monkeypatch.setattr("ddpd.checkpoint.load_model", lambda path, device: ("model", {"kind": "planner"}))
    kinds = ("mask-denoiser", "uniform-denoiser")
    with pytest.raises(UsageError, match="^--denoiser ck holds a 'planner' model, expected mask-denoiser or "
                                         "uniform-denoiser$"):
        load_role("denoiser", "ck", kinds, "cpu")
    with pytest.raises(UsageError, match=r"^the bundle's denoiser/ \(b\) holds a 'planner' model, expected "):
        load_role("denoiser", "ck", kinds, "cpu", name="the bundle's denoiser/ (b)")
    assert load_role("planner", "ck", ("planner",), "cpu") == ("model", {"kind": "planner"})


def test_checkpoints_that_differ_are_named_against_the_first_that_set_the_value():
    """Three checkpoints where the last differs: the line names it and the first one, whose
    value the others were compared with."""
    def config(kind, name):
        return {"kind": kind, "model": {"vocab_size": 27, "out_dim": 27, "max_seq_len": 8}, "tokenizer": {"name": name}}

    entries = [("--planner p", config("planner", "text8")), ("--denoiser d", config("mask-denoiser", "text8")),
               ("--judge j", config("ar", "gpt2"))]
    with pytest.raises(UsageError, match=r"^--judge j has tokenizer \{'name': 'gpt2'\}, but --planner p has "
                                         r"\{'name': 'text8'\}: they cannot be used together$"):
        shared_facts(entries)


def test_a_swallowed_signal_is_raised_again_only_within_its_block():
    """An Interrupted a library caught is raised again at the next safe point of the same block;
    once the block is left it is forgotten, and a later run in the same process is not stopped."""
    with signals_as_interrupts():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except KeyboardInterrupt:
            pass  # as torch.compile's guards take it for a failed guard
        with pytest.raises(Interrupted) as raised:
            raise_swallowed_signal()
        assert raised.value.signum == signal.SIGTERM
    try:  # an Interrupted escaping would stop pytest itself, as Ctrl-C does
        raise_swallowed_signal()
    except Interrupted as stale:
        pytest.fail(f"a signal of a finished block stopped a later run: {stale.name}")


def test_an_edited_schedule_is_refused_for_a_diffusion_model_but_not_read_for_the_judge():
    """config.json's schedule has no digest: a diffusion model's is checked and named; an AR judge
    uses no schedule, so a stray key there stops nothing."""
    denoiser = {"kind": "mask-denoiser", "model": {"out_dim": 27, "max_seq_len": 8}, "schedule": "nonsense"}
    judge = {"kind": "ar", "model": {"out_dim": 27, "max_seq_len": 8}, "schedule": "nonsense"}
    with pytest.raises(CheckpointError, match="^--denoiser d: config.json cannot be used: schedule must be one of "):
        shared_facts([("--denoiser d", denoiser)])
    assert shared_facts([("--judge j", judge)]) == {"vocab_size": 27, "tokenizer": None, "seq_len": None,
                                                    "seq_lens": {}}


def test_seeds_run_from_zero_to_just_below_two_to_the_63():
    """--seed 0 is a seed like any other; -1 and 2**63 are refused naming the range."""
    check_seed(0)
    check_seed(2**63 - 1)
    check_seed(None)
    for bad in (-1, 2**63):
        with pytest.raises(UsageError, match=rf"^--seed must be in \[0, 2\*\*63\), got {bad}$"):
            check_seed(bad)


def test_an_error_line_is_its_first_line_with_text():
    """A message that starts with a newline or is only spaces still gives a line that says
    something: the first line of text, else the error's class."""
    assert one_line(ValueError("\n  the cause\nthe details")) == "the cause"
    assert one_line(OSError("  ")) == "OSError"


def test_an_empty_omp_num_threads_counts_as_unset(monkeypatch):
    """`OMP_NUM_THREADS= ddpd-sample ...` sets it to nothing: not a count to refuse, but the
    default of one thread."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    check_threads(None)
    apply_threads(None)
    assert calls == [1]
