"""The default bundle (ddpd.pretrained) and ddpd-sample with no model argument.

A tiny randomly initialised planner + mask denoiser stands in for the bundled text8
models through DDPD_PRETRAINED_DIR in the tests of the command line; the packaged
bundle itself is checked for size, tokenizer and loading, and sampled once from a
fresh process with no argument but --fused.
"""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import ddpd.pretrained as pretrained
from ddpd.assets import BOOKS
from ddpd.checkpoint import (
    CheckpointError,
    load_bundle,
    load_model,
    read_config,
    save_bundle,
    save_checkpoint,
    settings_digest,
)
from ddpd.cli.sample import BUNDLED_STEPS_PER_TOKEN, NUM_SAMPLES_BUNDLED, main
from ddpd.models import build_model, config_for
from ddpd.training.data import Text8Tokenizer, tokenizer_from_config
from hang_guard import HANG_GUARD_SECONDS
from oracles.fixtures import single_thread  # noqa: F401  (autouse)

V, D = 27, 8
TINY = dict(d_model=16, n_layers=1, n_heads=2)
ALPHABET = set(" abcdefghijklmnopqrstuvwxyz")
ROOT = Path(__file__).resolve().parents[2]


def _model(kind, seed, tokenizer=None):
    torch.manual_seed(seed)
    config = config_for(kind, V, D, **TINY)
    return build_model(kind, config), {"kind": kind, "model": config.to_dict(),
                                       "tokenizer": tokenizer or {"name": "text8"}, "schedule": "linear"}


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained") / "text8"
    save_bundle(str(path), *_model("planner", 0), *_model("mask-denoiser", 1))
    return str(path)


@pytest.fixture
def as_default(tiny_bundle, monkeypatch):
    monkeypatch.setenv(pretrained.ENV_VAR, tiny_bundle)
    return tiny_bundle


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_bundle_follows_the_environment(as_default, monkeypatch):
    assert pretrained.default_bundle() == as_default
    monkeypatch.delenv(pretrained.ENV_VAR)
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", Path(as_default))
    assert pretrained.default_bundle() == as_default


@pytest.mark.parametrize("argv", [[], ["--fused"]])
def test_sample_with_no_model_argument(as_default, capsys, argv):
    code, stdout, stderr = run_cli(capsys, *argv)
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) == NUM_SAMPLES_BUNDLED == 4  # docs/cli.md's default with the bundled pair
    assert all(len(line) == D and set(line) <= ALPHABET for line in lines)
    assert f"{NUM_SAMPLES_BUNDLED} samples of {D} tokens" in stderr


def test_bundled_defaults_and_fused_equals_reference(as_default, tmp_path, capsys):
    runs = []
    for argv in ([], ["--fused"]):
        out = tmp_path / f"s{len(runs)}.jsonl"
        code, _, stderr = run_cli(capsys, *argv, "--out", str(out), "--quiet")
        assert code == 0, stderr
        runs.append([json.loads(line) for line in out.read_text().splitlines()])
    assert all(r["steps"] == BUNDLED_STEPS_PER_TOKEN * D == 2 * D for r in runs[0])  # --steps 512 at 256
    assert [r["tokens"] for r in runs[0]] == [r["tokens"] for r in runs[1]]


def test_user_checkpoints_keep_the_old_defaults(tiny_bundle, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path / "nowhere"))  # the default must not be consulted
    out = tmp_path / "s.jsonl"
    code, _, stderr = run_cli(capsys, "--checkpoint", tiny_bundle, "--out", str(out), "--quiet")
    assert code == 0, stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and all(r["steps"] == D for r in records)


@pytest.mark.integration
def test_console_script_with_no_model_argument(as_default):
    script = shutil.which("ddpd-sample")
    command = [script] if script else [sys.executable, "-m", "ddpd.cli.sample"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", pretrained.ENV_VAR: as_default}
    proc = subprocess.run(command + ["--fused"], capture_output=True, text=True, env=env, timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == NUM_SAMPLES_BUNDLED and all(set(line) <= ALPHABET for line in lines)


def test_load_default_checks_its_device_before_reading(tmp_path, monkeypatch):
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path / "nowhere"))  # reading it would raise BundleNotFoundError
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'tpu'"):
        pretrained.load_default("tpu")
    with pytest.raises(TypeError, match="device must be"):
        pretrained.load_default(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device cuda:0: CUDA is not available"):
        pretrained.load_default(torch.device("cuda", 0))


def test_load_default_returns_the_environment_bundle(as_default):
    planner, denoiser, tokenizer = pretrained.load_default(torch.device("cpu"))
    assert planner.kind == "planner" and denoiser.kind == "mask-denoiser" and tokenizer.vocab_size == V
    assert not any(p.requires_grad for p in denoiser.parameters())


@pytest.mark.parametrize("denoiser_kind, length, message", [
    ("uniform-denoiser", D, "must be a 'mask-denoiser'"), ("mask-denoiser", 2 * D, "must share max_seq_len"),
])
def test_load_default_refuses_an_environment_bundle_unlike_the_default(tmp_path, monkeypatch, denoiser_kind,
                                                                        length, message):
    torch.manual_seed(0)
    config = config_for(denoiser_kind, V, length, **TINY)
    denoiser = (build_model(denoiser_kind, config), {"kind": denoiser_kind, "model": config.to_dict(),
                                                     "tokenizer": {"name": "text8"}, "schedule": "linear"})
    save_bundle(str(tmp_path / "bundle"), *_model("planner", 0), *denoiser)
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path / "bundle"))
    with pytest.raises(ValueError, match=f"load_default: .*bundle: default bundle: .*{message}"):
        pretrained.load_default()


def test_no_bundle_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(pretrained.ENV_VAR, raising=False)
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", tmp_path / "text8")
    with pytest.raises(pretrained.BundleNotFoundError, match="the ddpd package.*planner/model.safetensors"):
        pretrained.default_bundle()
    for argv in ([], ["--fused"]):
        code, stdout, stderr = run_cli(capsys, *argv)
        assert code == 2 and stdout == ""
        assert len(stderr.strip().splitlines()) == 1 and "--checkpoint" in stderr and "Traceback" not in stderr


def test_incomplete_bundle_names_what_is_missing(tiny_bundle, tmp_path, monkeypatch, capsys):
    partial = tmp_path / "partial"
    shutil.copytree(Path(tiny_bundle) / "planner", partial / "planner")
    monkeypatch.setenv(pretrained.ENV_VAR, str(partial))
    code, _, stderr = run_cli(capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert pretrained.ENV_VAR in stderr and "denoiser/model.safetensors, denoiser/config.json" in stderr
    assert "planner/" not in stderr.split("lacks")[1].split(";")[0]


# The packaged bundle.

def _packaged_or_skip():
    assert pretrained.missing_files(pretrained.BUNDLE_DIR) == [], "the packaged bundle is incomplete"
    return pretrained.BUNDLE_DIR


def _english_words():
    """The words of the English text shipped with the package (ddpd.assets.BOOKS)."""
    return set(BOOKS.read_text(encoding="ascii").split())


@pytest.mark.integration
def test_packaged_bundle_samples_words_out_of_the_box(monkeypatch):
    """`ddpd-sample --fused` in a fresh process, with no model argument and the default
    thread policy: 256 text8 characters per sample, many of them in English words (those
    of the shipped books): the four default samples have 27-41% of their letters in such
    words, one sample (`--num-samples 1`, half the time of two) 36%, held-out Wikipedia text
    54%, uniform letters 0%."""
    env = {k: v for k, v in os.environ.items() if k not in (pretrained.ENV_VAR, "OMP_NUM_THREADS")}
    script = shutil.which("ddpd-sample")
    command = [script] if script else [sys.executable, "-m", "ddpd.cli.sample"]
    proc = subprocess.run(command + ["--fused", "--num-samples", "1"], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    if not torch.cuda.is_available():
        assert "1 CPU thread" in proc.stderr  # the default thread policy
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and all(len(line) == 256 and set(line) <= ALPHABET for line in lines)
    words = " ".join(lines).split()
    known = _english_words()
    share = sum(len(w) for w in words if w in known) / sum(len(w) for w in words)
    assert share > 0.2, (share, lines)


def test_packaged_bundle_size():
    size = pretrained.bundle_bytes(_packaged_or_skip())
    assert size <= pretrained.MAX_BUNDLE_BYTES, f"the bundled files take {size} bytes"
    assets = pretrained.bundle_bytes(ROOT / "ddpd" / "assets")
    assert size + assets < 50 * 10**6, f"the package's data takes {size} + {assets} bytes"


def test_packaged_bundle_is_a_text8_planner_and_mask_denoiser():
    path = _packaged_or_skip()
    configs = {role: read_config(str(path / role)) for role in pretrained.ROLES}
    pretrained.check_bundle_configs(configs)
    for config in configs.values():
        assert isinstance(tokenizer_from_config(config["tokenizer"]), Text8Tokenizer)
    assert not list(path.rglob("train_state.*")), "the bundle must not ship training state"
    planner, denoiser, _ = load_bundle(str(path))  # digests and weights match the configs
    assert planner.config.max_seq_len == denoiser.config.max_seq_len == 256


def test_packaged_bundle_holds_a_text8_uniform_model_beside_the_pair():
    path = _packaged_or_skip()
    assert pretrained.missing_files(path, "uniform") == []
    configs = {role: read_config(str(path / role)) for role in (*pretrained.ROLES, pretrained.UNIFORM)}
    pretrained.check_bundle_configs(configs)
    uniform, config = load_model(str(path / pretrained.UNIFORM))  # its digest and weights match its config
    assert uniform.kind == "uniform" and uniform.config.max_seq_len == 256


@pytest.mark.integration
def test_packaged_uniform_model_samples_words_out_of_the_box(monkeypatch):
    """`ddpd-sample --model uniform --fused` in a fresh process: 256 text8 characters, many of
    them in English words (the uniform model trained on these books and Wikipedia text)."""
    env = {k: v for k, v in os.environ.items() if k not in (pretrained.ENV_VAR, "OMP_NUM_THREADS")}
    script = shutil.which("ddpd-sample")
    command = [script] if script else [sys.executable, "-m", "ddpd.cli.sample"]
    proc = subprocess.run(command + ["--model", "uniform", "--fused", "--num-samples", "1"], capture_output=True,
                          text=True, env=env, timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert len(line) == 256 and set(line) <= ALPHABET
    words = line.split()
    share = sum(len(w) for w in words if w in _english_words()) / sum(len(w) for w in words)
    assert share > 0.2, (share, line)


# install_bundle: from training checkpoints to the packaged layout.

def _training_checkpoints(root, denoiser_kind="mask-denoiser", tokenizer=None):
    paths = {}
    for seed, (role, kind) in enumerate((("planner", "planner"), ("denoiser", denoiser_kind))):
        model, config = _model(kind, seed, tokenizer)
        paths[role] = str(root / role)
        save_checkpoint(paths[role], model, config, train_state=({"moment": torch.ones(3)}, {"step": 7}))
    return paths


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_install_bundle_keeps_weights_and_drops_training_state(tmp_path, dtype):
    paths = _training_checkpoints(tmp_path)
    dest = pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"), dtype)
    assert pretrained.missing_files(dest) == [] and not list(Path(dest).rglob("train_state.*"))
    _, denoiser, configs = load_bundle(dest)
    assert set(configs["planner"]["sha256"]) == {"model.safetensors"}
    reference = _model("mask-denoiser", 1)[0]  # the same seed as the checkpoint's
    for name, value in reference.state_dict().items():
        loaded = denoiser.state_dict()[name]
        assert loaded.dtype == torch.float32 and torch.equal(loaded, value.to(getattr(torch, dtype)).float()), name


def test_install_bundle_takes_the_shipped_bundle(tmp_path):
    """The shipped configs predate TransformerConfig.num_classes: re-storing them (e.g. as
    float16) was refused as 'config['model'] must describe the model'."""
    shipped = pretrained.default_bundle()
    assert "num_classes" not in read_config(os.path.join(shipped, "planner"))["model"]
    dest = pretrained.install_bundle(os.path.join(shipped, "planner"), os.path.join(shipped, "denoiser"),
                                     str(tmp_path / "text8"), "float16")
    before, after = load_bundle(shipped), load_bundle(dest)
    for role in (0, 1):
        for name, value in before[role].state_dict().items():
            assert torch.equal(after[role].state_dict()[name], value.half().float()), name


def test_install_bundle_drops_the_paths_of_the_training_machine(tmp_path):
    paths = _training_checkpoints(tmp_path)
    for role in ("planner", "denoiser"):
        config = read_config(paths[role])
        config["training"] = {"data": "/home/someone/corpora/wiki.txt", "out": "/scratch/run", "lr": 1e-3}
        config["settings_sha256"] = settings_digest(config)  # as ddpd-train saves it on that machine
        Path(paths[role], "config.json").write_text(json.dumps(config))
    dest = pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"))
    assert read_config(os.path.join(dest, "planner"))["training"] == {"data": "wiki.txt", "lr": 1e-3}


@pytest.mark.parametrize("data,recorded", [("corpora/text8/", "text8"),  # a folder by its last part
                                           ("hf:user/corpus/train.txt", "hf:user/corpus/train.txt")])
def test_install_bundle_records_a_corpus_by_its_name(tmp_path, data, recorded):
    paths = _training_checkpoints(tmp_path)
    for role in ("planner", "denoiser"):
        config = read_config(paths[role])
        config["training"] = {"data": data, "out": "/scratch/run"}
        config["settings_sha256"] = settings_digest(config)
        Path(paths[role], "config.json").write_text(json.dumps(config))
    dest = pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"))
    assert read_config(os.path.join(dest, "planner"))["training"] == {"data": recorded}


def test_float16_bundle_is_half_the_size(tmp_path):
    paths = _training_checkpoints(tmp_path)
    sizes = {dtype: pretrained.bundle_bytes(pretrained.install_bundle(paths["planner"], paths["denoiser"],
                                                                      str(tmp_path / dtype), dtype))
             for dtype in ("float32", "float16")}
    # The configs (a few KB) do not shrink: the threshold allows for them.
    assert sizes["float16"] < 0.5 * sizes["float32"] + 8000, sizes
    with pytest.raises(ValueError, match="dtype must be one of"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "x"), "int8")


@pytest.mark.parametrize("denoiser_kind,tokenizer,message", [
    ("uniform-denoiser", None, "must be a 'mask-denoiser'"),
    ("mask-denoiser", {"name": "gpt2", "path": "x", "sha256": "y"}, "tokenizer"),
])
def test_install_bundle_refuses_a_wrong_default(tmp_path, denoiser_kind, tokenizer, message):
    paths = _training_checkpoints(tmp_path, denoiser_kind, tokenizer)
    dest = tmp_path / "text8"
    with pytest.raises(ValueError, match=message):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(dest))
    assert not dest.exists()


def test_install_bundle_refuses_an_oversized_bundle(tmp_path, monkeypatch):
    paths = _training_checkpoints(tmp_path)
    dest = tmp_path / "text8"
    pretrained.install_bundle(paths["planner"], paths["denoiser"], str(dest))
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    monkeypatch.setattr(pretrained, "MAX_BUNDLE_BYTES", 1000)
    with pytest.raises(ValueError, match="over the 1000"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(dest))
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def test_install_bundle_refuses_weights_that_overflow_float16(tmp_path):
    paths = _training_checkpoints(tmp_path)
    model, config = _model("mask-denoiser", 1)
    with torch.no_grad():
        model.head.weight[0, 0] = 1e5  # finite in float32, inf in float16
    save_checkpoint(paths["denoiser"], model, config)
    dest = tmp_path / "text8"
    pretrained.install_bundle(paths["planner"], paths["denoiser"], str(dest), "bfloat16")
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"head\.weight has weights beyond the range of float16.*float32 or bfloat16"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(dest), "float16")
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def test_install_command(tmp_path, capsys, monkeypatch):
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    assert install_main([paths["planner"], paths["denoiser"], "--dest", str(tmp_path / "b")]) == 0
    assert "bytes" in capsys.readouterr().out
    # models that do not make a default bundle are a usage error, as ddpd-sample's wrong kind is
    assert install_main([paths["denoiser"], paths["planner"], "--dest", str(tmp_path / "c")]) == 2
    assert "must be a 'planner'" in capsys.readouterr().err
    assert install_main([paths["planner"], paths["denoiser"], "--dest", ""]) == 2
    assert capsys.readouterr().err == "python -m ddpd.pretrained: error: --dest must be a path, got ''\n"
    monkeypatch.chdir(tmp_path / "b")  # a bundle the shell stands in is not replaced: it would be left in a deleted one
    assert install_main([paths["planner"], paths["denoiser"], "--dest", "."]) == 2  # as ddpd-train --out .
    assert capsys.readouterr().err == (f"python -m ddpd.pretrained: error: cannot write {tmp_path / 'b'}: it is the "
                                       "working directory or holds it, and the directory is replaced whole (by a "
                                       "rename); name a directory below it\n")
    edited = os.path.join(paths["planner"], "config.json")
    with open(edited) as f:
        config = json.load(f)
    with open(edited, "w") as f:
        config["training"] = 5
        json.dump({**config, "settings_sha256": settings_digest(config)}, f)  # edited with care: the digest passes
    assert install_main([paths["planner"], paths["denoiser"], "--dest", str(tmp_path / "d")]) == 1
    assert capsys.readouterr().err == (f"python -m ddpd.pretrained: error: install_bundle: {paths['planner']}: "
                                       "config.json 'training' must be an object of ddpd-train settings, got 5\n")


def test_install_command_usage_shows_dest_as_required(capsys):
    """--dest has no default: the usage line must not bracket it as optional."""
    from ddpd.pretrained.__main__ import main as install_main

    with pytest.raises(SystemExit):
        install_main(["--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert " --dest DIR " in usage and "[--dest" not in usage
    assert install_main(["a", "b"]) == 2
    assert "--dest is required" in capsys.readouterr().err


def test_install_command_refuses_a_dest_holding_training_checkpoints(tmp_path, capsys):
    """The README's layout (--out runs/tiny/planner, --out runs/tiny/denoiser) counted as a
    bundle: --dest runs/tiny replaced both with weights-only copies, losing the optimizer state."""
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert install_main([paths["planner"], paths["denoiser"], "--dest", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"python -m ddpd.pretrained: error: refusing to replace {tmp_path}: "
                                       f"{paths['planner']} holds a training checkpoint, not a bundle's "
                                       "weights-only copy\n")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_install_command_exit_statuses_follow_the_tools(tmp_path, capsys):
    """docs/cli.md: 2 for what the command line asks that cannot be (as ddpd-sample's wrong kind,
    ddpd-train's --out over other files), 1 for a missing or damaged checkpoint. The tool exited
    1 for all of them."""
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    cases = [([paths["planner"], paths["planner"]], "b", 2, "must be a 'mask-denoiser'"),
             ([paths["planner"], paths["denoiser"]], "other", 2, "neither empty nor a ddpd checkpoint"),
             ([paths["planner"], paths["denoiser"]], paths["planner"], 2, "holds a ddpd checkpoint, not a bundle"),
             ([paths["planner"], str(tmp_path / "absent")], "b", 1, "checkpoint directory not found")]
    for models, dest, status, message in cases:
        assert install_main([*models, "--dest", str(tmp_path / dest)]) == status, (models, dest)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "b").exists() and os.listdir(tmp_path / "other") == ["notes.txt"]


@pytest.mark.integration
def test_install_command_with_a_reader_that_went_away(tmp_path):
    """`python -m ddpd.pretrained ... | true`: a BrokenPipeError traceback after the bundle
    was written (exit 1); `>/dev/full` the same with ENOSPC."""
    paths = _training_checkpoints(tmp_path)
    command = [sys.executable, "-m", "ddpd.pretrained", paths["planner"], paths["denoiser"]]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([*command, "--dest", str(tmp_path / "b")], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=HANG_GUARD_SECONDS, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "" and pretrained.missing_files(tmp_path / "b") == []
    with open("/dev/full", "w") as full:
        done = subprocess.run([*command, "--dest", str(tmp_path / "c")], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 1 and done.stderr == ("python -m ddpd.pretrained: error: cannot write stdout: No space "
                                                    "left on device; the bundle is written\n"), done.stderr
    assert pretrained.missing_files(tmp_path / "c") == []


def test_install_command_never_replaces_the_shipped_bundle_unasked(tmp_path, capsys, monkeypatch):
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    shipped = tmp_path / "pkg" / "text8"
    pretrained.install_bundle(paths["planner"], paths["denoiser"], str(shipped))
    before = {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()}
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", shipped)
    monkeypatch.setattr("ddpd.pretrained.__main__.BUNDLE_DIR", shipped)
    assert install_main([paths["planner"], paths["denoiser"]]) == 2  # no --dest: refused
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--dest is required" in err
    assert {p: p.read_bytes() for p in shipped.rglob("*") if p.is_file()} == before
    # named explicitly, it is replaced and the previous version kept beside it
    assert install_main([paths["planner"], paths["denoiser"], "--dest", str(shipped), "--dtype", "float16"]) == 0
    assert "previous bundle is in" in capsys.readouterr().out
    backup = shipped.parent / "text8.previous"
    assert {backup / p.relative_to(shipped): b for p, b in before.items()} == \
        {p: p.read_bytes() for p in backup.rglob("*") if p.is_file()}


# Packaging: files dropped into ddpd/pretrained/text8 ship with the package.

def _scratch_source(tmp_path):
    """A copy of the source tree with a dummy bundle (and training state that must not ship)."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build", "text8")
    src.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("ddpd", "kernels", "csrc"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for role in (*pretrained.ROLES, pretrained.UNIFORM):
        folder = src / "ddpd" / "pretrained" / "text8" / role
        folder.mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "train_state.safetensors", "train_state.json"):
            (folder / name).write_text("{}")
    return src


def _shipped(names):
    return sorted(n.split("ddpd/pretrained/", 1)[1] for n in names if "ddpd/pretrained/text8/" in n)


EXPECTED = sorted(f"text8/{role}/{name}" for role in (*pretrained.ROLES, pretrained.UNIFORM)
                  for name in pretrained.FILES)


@pytest.mark.integration
def test_package_data_includes_the_bundle(tmp_path):
    src = _scratch_source(tmp_path)
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path / "lib")], cwd=src, check=True,
                   capture_output=True, timeout=HANG_GUARD_SECONDS)
    names = [p.relative_to(tmp_path / "lib").as_posix() for p in (tmp_path / "lib").rglob("*") if p.is_file()]
    assert _shipped(names) == EXPECTED


@pytest.mark.integration
@pytest.mark.slow
def test_wheel_includes_the_bundle(tmp_path):
    src = _scratch_source(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "whl")], cwd=src, check=True, capture_output=True, timeout=HANG_GUARD_SECONDS)
    (wheel,) = (tmp_path / "whl").glob("ddpd-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert _shipped(archive.namelist()) == EXPECTED


def test_a_copy_of_the_shipped_bundle_with_an_edited_n_heads_is_refused(tmp_path, capsys):
    """The shipped configs record no settings digest: n_heads 8 for 4 fits the same weights
    and sampled garbage with exit status 0."""
    copy = tmp_path / "text8"
    shutil.copytree(pretrained.default_bundle(), copy)
    config = json.loads((copy / "planner" / "config.json").read_text())
    config["model"]["n_heads"] = 8
    (copy / "planner" / "config.json").write_text(json.dumps(config))
    code, out, err = run_cli(capsys, "--checkpoint", str(copy), "--length", "8", "--steps", "8", "--num-samples", "1")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert (f"checkpoint {copy / 'planner'}: config.json's model has n_heads 8, its training section 4 "
            "(edited or corrupt)") in err, err


# Rules of the loader and of install_bundle that no other test pins.

def _configs(planner_symbols=V, denoiser_symbols=V, schedules=("linear", "linear")):
    configs = {}
    for role, kind, symbols, schedule in zip(pretrained.ROLES, ("planner", "mask-denoiser"),
                                             (planner_symbols, denoiser_symbols), schedules):
        configs[role] = {"kind": kind, "model": config_for(kind, symbols, D, **TINY).to_dict(),
                         "tokenizer": {"name": "text8"}}
        if schedule is not None:
            configs[role]["schedule"] = schedule
    return configs


def test_check_bundle_configs_refuses_another_alphabet_or_schedule():
    pretrained.check_bundle_configs(_configs(schedules=(None, "linear")))  # no schedule: the linear one
    for symbols in ((V + 1, V + 1), (V, V + 1), (V + 1, V)):
        with pytest.raises(ValueError, match=r"expected 27 text8 symbols, got \{'planner reads': "):
            pretrained.check_bundle_configs(_configs(*symbols))
    with pytest.raises(ValueError, match="must share the schedule, got {'planner': 'linear', 'denoiser': 'cosine'}"):
        pretrained.check_bundle_configs(_configs(schedules=("linear", "cosine")))


@pytest.mark.parametrize("configs, error, message", [
    ({}, ValueError, "default bundle: configs must hold a config for each of planner, denoiser; planner, denoiser "
                     "missing"),
    ({"planner": {}}, ValueError, "default bundle: configs must hold a config for each of planner, denoiser; "
                                  "denoiser missing"),
    (None, TypeError, "default bundle: configs must be a dict {role: config}, got NoneType"),
    ({"planner": {}, "denoiser": "config.json"}, TypeError, "default bundle: the denoiser's config must be a dict, "
                                                            "got str"),
    ({"planner": {}, "denoiser": {}}, ValueError, "default bundle: the planner must be a 'planner' model, got None")])
def test_check_bundle_configs_names_a_role_missing(configs, error, message):
    """{} raised a bare KeyError: 'planner', and None a TypeError about subscripting."""
    with pytest.raises(error) as err:
        pretrained.check_bundle_configs(configs)
    assert str(err.value) == message


def test_load_default_returns_networks_without_gradients(as_default):
    planner, denoiser, _ = pretrained.load_default()
    assert not any(p.requires_grad for model in (planner, denoiser) for p in model.parameters())


def test_load_default_loads_onto_its_device(as_default, monkeypatch):
    import ddpd.checkpoint

    seen = []
    load_bundle_ = ddpd.checkpoint.load_bundle
    # the device asked for reaches load_bundle; the networks are read onto the CPU all the same
    monkeypatch.setattr(ddpd.checkpoint, "load_bundle", lambda path, device="cpu": seen.append(device) or
                        load_bundle_(path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    pretrained.load_default("cuda")
    assert seen == ["cuda"]


def test_missing_environment_bundle_is_named_with_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path))
    with pytest.raises(pretrained.BundleNotFoundError, match=f"no default model in {pretrained.ENV_VAR}={tmp_path}:"):
        pretrained.default_bundle()


def test_load_default_without_a_bundle_names_the_python_way_to_load_one(tmp_path, monkeypatch):
    """It asked a Python caller for ddpd-sample's --checkpoint flag."""
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path))
    with pytest.raises(pretrained.BundleNotFoundError) as raised:
        pretrained.load_default()
    assert "ddpd.checkpoint.load_bundle(DIR)" in str(raised.value) and "--checkpoint" not in str(raised.value)


def test_install_bundle_refuses_a_dest_that_is_no_path(tmp_path, monkeypatch):
    paths = _training_checkpoints(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="dest must be a directory path, got NoneType"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], None)
    assert not (tmp_path / "None").exists()


def test_install_bundle_takes_a_bundle_of_exactly_the_limit(tmp_path, monkeypatch):
    paths = _training_checkpoints(tmp_path)
    size = pretrained.bundle_bytes(pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "a")))
    monkeypatch.setattr(pretrained, "MAX_BUNDLE_BYTES", size)
    assert pretrained.missing_files(pretrained.install_bundle(paths["planner"], paths["denoiser"],
                                                              str(tmp_path / "b"))) == []


def test_installing_the_shipped_bundle_keeps_one_previous_version(tmp_path, monkeypatch):
    """None kept where the package had no bundle; the last one kept where it had, however dest
    names the shipped directory (here relative to the working directory)."""
    paths = _training_checkpoints(tmp_path)
    shipped = (tmp_path / "pkg" / "text8").resolve()
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", shipped)
    backup = shipped.parent / "text8.previous"
    shipped.parent.mkdir()
    monkeypatch.chdir(shipped.parent)
    versions = []
    for dtype in ("float32", "float16", "bfloat16"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], "text8", dtype)
        versions.append({p.relative_to(shipped): p.read_bytes() for p in shipped.rglob("*") if p.is_file()})
        kept = {p.relative_to(backup): p.read_bytes() for p in backup.rglob("*") if p.is_file()}
        assert kept == ({} if len(versions) == 1 else versions[-2]), dtype


@pytest.mark.parametrize("path, error", [("", ValueError), ("missing", NotADirectoryError),
                                         ("file", NotADirectoryError)])
def test_bundle_bytes_refuses_what_is_no_directory(tmp_path, monkeypatch, path, error):
    """"" measured the working directory and a missing path 0 bytes, without a word."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_bytes(b"12")
    with pytest.raises(error, match="bundle_bytes: "):
        pretrained.bundle_bytes(path)


def test_an_empty_environment_variable_is_no_override(tiny_bundle, monkeypatch):
    """DDPD_PRETRAINED_DIR= (set but empty) is unset, not the working directory."""
    monkeypatch.setenv(pretrained.ENV_VAR, "")
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", Path(tiny_bundle))
    assert pretrained.default_bundle() == tiny_bundle


def test_a_directory_in_place_of_a_bundle_file_counts_as_missing(tiny_bundle, tmp_path):
    copy = tmp_path / "text8"
    shutil.copytree(tiny_bundle, copy)
    (copy / "planner" / "config.json").unlink()
    (copy / "planner" / "config.json").mkdir()
    assert pretrained.missing_files(copy) == ["planner/config.json"]


def test_bundle_bytes_sums_the_files_at_every_depth_and_nothing_else(tmp_path):
    (tmp_path / "planner" / "deep").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "top").write_bytes(b"12345")
    (tmp_path / "planner" / "deep" / "w").write_bytes(b"123")
    assert pretrained.bundle_bytes(tmp_path) == 8


def test_install_bundle_keeps_a_config_without_training_or_corpus_as_it_is(tmp_path):
    """No training section stays none (not an empty one); one without a corpus only loses its output path."""
    paths = _training_checkpoints(tmp_path)
    config = read_config(paths["denoiser"])
    config["training"] = {"out": "/scratch/run", "lr": 1e-3}
    config["settings_sha256"] = settings_digest(config)
    Path(paths["denoiser"], "config.json").write_text(json.dumps(config))
    dest = pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"))
    assert "training" not in read_config(os.path.join(dest, "planner"))
    assert read_config(os.path.join(dest, "denoiser"))["training"] == {"lr": 1e-3}


@pytest.mark.parametrize("dtype", [None, "float16", "bfloat16"])
def test_install_command_stores_the_weights_as_its_dtype(tmp_path, capsys, dtype):
    """No --dtype stores float32: the weights come back exactly."""
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    dest = str(tmp_path / "b")
    argv = [paths["planner"], paths["denoiser"], "--dest", dest] + (["--dtype", dtype] if dtype else [])
    assert install_main(argv) == 0
    assert capsys.readouterr().out == f"wrote {dest} ({pretrained.bundle_bytes(dest)} bytes)\n"  # no previous kept
    stored = getattr(torch, dtype or "float32")
    _, denoiser, _ = load_bundle(dest)
    for name, value in _model("mask-denoiser", 1)[0].state_dict().items():
        assert torch.equal(denoiser.state_dict()[name], value.to(stored).float()), name


def test_install_command_refuses_an_unknown_dtype_before_reading_anything(tmp_path, capsys):
    from ddpd.pretrained.__main__ import main as install_main

    with pytest.raises(SystemExit) as raised:
        install_main(["p", "d", "--dest", str(tmp_path / "b"), "--dtype", "int8"])
    assert raised.value.code == 2 and "invalid choice: 'int8'" in capsys.readouterr().err


def test_install_command_a_write_that_fails_is_status_1(tmp_path, capsys):
    """A --dest below a file: the save fails with an OSError, reported in one line."""
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    (tmp_path / "file").write_text("x")
    assert install_main([paths["planner"], paths["denoiser"], "--dest", str(tmp_path / "file" / "b")]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("python -m ddpd.pretrained: error: ") and err.count("\n") == 1, err
    assert (tmp_path / "file").read_text() == "x"


def test_install_bundle_refuses_its_dest_before_reading_the_checkpoints(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="neither empty nor a ddpd checkpoint"):
        pretrained.install_bundle(str(tmp_path / "absent"), str(tmp_path / "absent"), str(tmp_path / "other"))


def test_no_bundle_error_names_the_callers_way_and_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(pretrained.ENV_VAR, raising=False)
    monkeypatch.setattr(pretrained, "BUNDLE_DIR", tmp_path)
    with pytest.raises(pretrained.BundleNotFoundError) as raised:
        pretrained.default_bundle(own="--mine DIR")
    assert str(raised.value) == (
        f"no default model in the ddpd package: {tmp_path} lacks planner/model.safetensors, planner/config.json, "
        "denoiser/model.safetensors, denoiser/config.json; pass your own checkpoints with --mine DIR, or set "
        "DDPD_PRETRAINED_DIR to a bundle directory")


def _edit_training(path, training):
    config = read_config(path)
    config["training"] = training
    config["settings_sha256"] = settings_digest(config)
    Path(path, "config.json").write_text(json.dumps(config))


def test_install_bundle_takes_a_null_training_section(tmp_path):
    """"training": null is no training section, as an absent one: nothing to make portable."""
    paths = _training_checkpoints(tmp_path)
    _edit_training(paths["planner"], None)
    dest = pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"))
    assert read_config(os.path.join(dest, "planner"))["training"] is None


def test_install_bundle_cuts_a_long_training_value_in_its_error(tmp_path):
    paths = _training_checkpoints(tmp_path)
    _edit_training(paths["planner"], "x" * 100)
    with pytest.raises(CheckpointError) as raised:
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "text8"))
    assert str(raised.value).endswith("must be an object of ddpd-train settings, got '" + "x" * 39)
    assert not (tmp_path / "text8").exists()


def test_install_command_without_dest_says_how_to_use_the_bundle(capsys):
    from ddpd.pretrained.__main__ import main as install_main

    assert install_main(["a", "b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "python -m ddpd.pretrained: error: --dest is required: the directory to write the bundle to (then set "
        f"DDPD_PRETRAINED_DIR to it to make it the default; --dest {pretrained.BUNDLE_DIR} replaces the bundle "
        "shipped in the package)\n")


def test_check_bundle_configs_refuses_a_config_without_a_tokenizer():
    configs = _configs()
    del configs["denoiser"]["tokenizer"]
    with pytest.raises(ValueError) as raised:
        pretrained.check_bundle_configs(configs)
    assert str(raised.value) == "default bundle: the denoiser must use the tokenizer {'name': 'text8'}, got None"


def test_install_bundle_takes_a_path_dest_and_names_an_unknown_dtype(tmp_path):
    paths = _training_checkpoints(tmp_path)
    assert pretrained.install_bundle(paths["planner"], paths["denoiser"], tmp_path / "text8") == str(tmp_path / "text8")
    with pytest.raises(ValueError, match=r"bfloat16'\), got 'half'$"):
        pretrained.install_bundle(paths["planner"], paths["denoiser"], str(tmp_path / "x"), "half")


# The single uniform model beside the pair (ddpd-sample --model uniform).

@pytest.fixture(scope="module")
def uniform_bundle(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained") / "text8"
    save_bundle(str(path), *_model("planner", 0), *_model("mask-denoiser", 1), uniform=_model("uniform", 2))
    return str(path)


def test_model_uniform_samples_the_bundles_uniform_model_with_the_bundled_defaults(uniform_bundle, tmp_path,
                                                                                   monkeypatch, capsys):
    """--model uniform draws what the bundle's uniform/ checkpoint draws when named, at the
    bundled defaults (4 samples, twice the length in steps); --model pair is the default."""
    monkeypatch.setenv(pretrained.ENV_VAR, uniform_bundle)
    runs = {}
    for name, argv in (("default uniform", ["--model", "uniform"]),
                       ("named", ["--checkpoint", f"{uniform_bundle}/uniform", "--steps", 2 * D, "--num-samples", 4]),
                       ("bundle uniform", ["--checkpoint", uniform_bundle, "--model", "uniform", "--steps", 2 * D,
                                           "--num-samples", 4]),
                       ("default pair", ["--model", "pair"]), ("default", [])):
        out = tmp_path / f"{len(runs)}.jsonl"
        code, _, stderr = run_cli(capsys, *map(str, argv), "--out", str(out), "--quiet")
        assert code == 0, stderr
        runs[name] = [json.loads(line)["tokens"] for line in out.read_text().splitlines()]
    assert len(runs["default uniform"]) == NUM_SAMPLES_BUNDLED
    assert runs["default uniform"] == runs["named"] == runs["bundle uniform"]
    assert runs["default pair"] == runs["default"] != runs["default uniform"]


@pytest.mark.parametrize("argv, message", [
    (["--model", "uniform", "--planner", "p", "--denoiser", "d"], "--model chooses networks of a bundle (the default "
                                                                  "one or --checkpoint's): with --planner/--denoiser"),
    (["--model", "uniform", "--checkpoint", "{bundle}/uniform"],
     "--model chooses networks of a bundle, and --checkpoint {bundle}/uniform is a single checkpoint"),
    (["--model", "uniform"], "no default uniform model in DDPD_PRETRAINED_DIR={pair}: {pair} lacks "
                             "uniform/model.safetensors, uniform/config.json; pass your own checkpoints with "
                             "--checkpoint UNIFORM_CHECKPOINT"),
    (["--model", "uniform", "--checkpoint", "{pair}"], "--model uniform: the bundle {pair} holds no uniform/ (a single "
                                                       "uniform model); python -m ddpd.pretrained --uniform DIR"),
])
def test_model_is_refused_where_it_chooses_nothing(uniform_bundle, tiny_bundle, monkeypatch, capsys, argv, message):
    monkeypatch.setenv(pretrained.ENV_VAR, tiny_bundle)  # a pair without a uniform model
    argv = [a.format(bundle=uniform_bundle, pair=tiny_bundle) for a in argv]
    code, stdout, stderr = run_cli(capsys, *argv, "--steps", "2")
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1, stderr
    assert message.format(bundle=uniform_bundle, pair=tiny_bundle) in stderr


def test_sample_and_pretrained_name_the_same_models():
    from ddpd.cli.sample import BUNDLE_MODELS

    assert BUNDLE_MODELS == tuple(pretrained.MODELS)


def test_load_default_uniform_returns_the_environment_bundles_uniform_model(uniform_bundle, tiny_bundle,
                                                                            monkeypatch):
    monkeypatch.setenv(pretrained.ENV_VAR, uniform_bundle)
    uniform, tokenizer = pretrained.load_default_uniform("cpu")
    assert uniform.kind == "uniform" and not uniform.training and isinstance(tokenizer, Text8Tokenizer)
    assert not any(p.requires_grad for p in uniform.parameters())
    assert pretrained.load_default()[1].kind == "mask-denoiser"  # the pair is still the default
    monkeypatch.setenv(pretrained.ENV_VAR, tiny_bundle)
    with pytest.raises(pretrained.BundleNotFoundError, match=r"no default uniform model .* lacks "
                                                             r"uniform/model.safetensors.* ddpd.checkpoint.load_model"):
        pretrained.load_default_uniform()


def test_save_bundle_writes_the_uniform_model_and_a_save_without_one_drops_it(tmp_path):
    path = str(tmp_path / "b")
    save_bundle(path, *_model("planner", 0), *_model("mask-denoiser", 1), uniform=_model("uniform", 2))
    assert pretrained.missing_files(path, "uniform") == [] and read_config(f"{path}/uniform")["kind"] == "uniform"
    (tmp_path / "b" / "notes.txt").write_text("kept")
    save_bundle(path, *_model("planner", 0), *_model("mask-denoiser", 1))
    assert sorted(os.listdir(path)) == ["denoiser", "notes.txt", "planner"]


@pytest.mark.parametrize("uniform, error, message", [
    (_model("mask-denoiser", 2), ValueError, "uniform config: kind must be one of ('uniform',), got 'mask-denoiser'"),
    (_model("uniform", 2, tokenizer={"name": "gpt2"}), ValueError, "the planner's tokenizer is {'name': 'text8'}, "
                                                                   "the uniform's {'name': 'gpt2'}"),
    (_model("uniform", 2)[0], TypeError, "uniform must be a (model, config) pair, got Uniform"),
])
def test_save_bundle_refuses_a_uniform_model_that_does_not_fit(tmp_path, uniform, error, message):
    with pytest.raises(error) as err:
        save_bundle(str(tmp_path / "b"), *_model("planner", 0), *_model("mask-denoiser", 1), uniform=uniform)
    assert message in str(err.value)
    assert not (tmp_path / "b").exists()


def test_install_bundle_takes_a_uniform_model_and_checks_it(tmp_path, capsys):
    from ddpd.pretrained.__main__ import main as install_main

    paths = _training_checkpoints(tmp_path)
    model, config = _model("uniform", 2)
    save_checkpoint(str(tmp_path / "uniform"), model, config, train_state=({"moment": torch.ones(3)}, {"step": 7}))
    assert install_main([paths["planner"], paths["denoiser"], "--uniform", str(tmp_path / "uniform"),
                                     "--dtype", "float16", "--dest", str(tmp_path / "out")]) == 0
    loaded, loaded_config = load_model(str(tmp_path / "out" / "uniform"))
    assert loaded_config["kind"] == "uniform" and not list((tmp_path / "out").rglob("train_state.*"))
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name].half().float()), name
    capsys.readouterr()
    assert install_main([paths["planner"], paths["denoiser"], "--uniform", paths["denoiser"],
                                     "--dest", str(tmp_path / "out2")]) == 2
    assert "default bundle: the uniform must be a 'uniform' model, got 'mask-denoiser'" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


def test_check_uniform_config_refuses_another_alphabet():
    config = _model("uniform", 0)[1]
    pretrained.check_uniform_config(config)
    other = {**config, "model": {**config["model"], "out_dim": V + 1}}
    with pytest.raises(ValueError, match=r"expected 27 text8 symbols, got \{'uniform reads': 27, 'uniform predicts': "
                                         r"28\}"):
        pretrained.check_uniform_config(other)
    with pytest.raises(TypeError, match="the uniform's config must be a dict, got list"):
        pretrained.check_uniform_config([])
