"""Checkpoints: round trip, atomic replacement, corrupt and foreign directories, bundles."""
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

import ddpd.checkpoint as ckpt
from ddpd.checkpoint import (
    CheckpointError,
    load_bundle,
    load_model,
    load_train_state,
    read_config,
    save_bundle,
    save_checkpoint,
)
from ddpd.models import build_model, config_for

KINDS = ("planner", "mask-denoiser", "uniform-denoiser", "uniform", "ar")


def tiny(kind, seed=0, d_model=32):
    torch.manual_seed(seed)
    config = config_for(kind, 27, 16, d_model=d_model, n_layers=1, n_heads=2)
    return build_model(kind, config), {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"},
                                       "schedule": "linear"}


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def inputs(kind):
    x = torch.randint(0, 27, (2, 16), generator=torch.Generator().manual_seed(1))
    return (x,) if kind in ("planner", "ar") else (x, torch.tensor([0.2, 0.7]))


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_kind(tmp_path, kind):
    model, config = tiny(kind)
    save_checkpoint(tmp_path / "c", model, {**config, "note": "kept"})
    loaded, loaded_config = load_model(tmp_path / "c")
    assert type(loaded) is type(model) and not loaded.training
    assert same_weights(model, loaded)
    assert loaded_config["note"] == "kept" and loaded_config["model"] == config["model"]
    model.eval()
    assert torch.equal(model(*inputs(kind)), loaded(*inputs(kind)))
    assert sorted(os.listdir(tmp_path)) == ["c"]  # no temporary left behind


def test_train_state_round_trip(tmp_path):
    model, config = tiny("planner")
    tensors = {"optim.0.exp_avg": torch.randn(3, 4), "rng": torch.get_rng_state()}
    meta = {"step": 7, "history": [{"step": 5, "val_loss": 0.5}]}
    save_checkpoint(tmp_path / "c", model, config, (tensors, meta))
    got_tensors, got_meta = load_train_state(tmp_path / "c")
    assert got_meta == meta
    assert got_tensors.keys() == tensors.keys() and all(torch.equal(got_tensors[k], tensors[k]) for k in tensors)


def test_a_train_state_without_tensors_round_trips(tmp_path):
    """Its tensors file is a bare header (no data after it), which a load reads as such."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config, ({}, {"step": 3}))
    assert load_train_state(tmp_path / "c") == ({}, {"step": 3})


def test_replacing_a_checkpoint(tmp_path):
    first, config = tiny("planner", seed=0)
    second, _ = tiny("planner", seed=1)
    save_checkpoint(tmp_path / "c", first, config, ({"a": torch.ones(2)}, {"step": 1}))
    save_checkpoint(tmp_path / "c", second, config)
    assert same_weights(load_model(tmp_path / "c")[0], second)
    assert not os.path.exists(tmp_path / "c" / "train_state.json")  # the whole directory was replaced
    assert sorted(os.listdir(tmp_path)) == ["c"]


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch, failure):
    first, config = tiny("planner", seed=0)
    save_checkpoint(tmp_path / "c", first, config, ({"a": torch.ones(2)}, {"step": 1}))
    second, _ = tiny("planner", seed=1)

    def half_write(file, data):
        with open(file, "wb") as f:
            f.write(data[:100])
        if file.endswith("train_state.safetensors"):
            raise failure

    monkeypatch.setattr(ckpt, "_write_file", half_write)
    with pytest.raises(type(failure)) as info:
        save_checkpoint(tmp_path / "c", second, config, ({"a": torch.zeros(2)}, {"step": 2}))
    if isinstance(failure, OSError):  # one line naming the checkpoint, not the temporary
        assert str(info.value) == f"cannot write {tmp_path / 'c'}: disk full"
    assert same_weights(load_model(tmp_path / "c")[0], first)
    assert load_train_state(tmp_path / "c")[1] == {"step": 1}
    assert sorted(os.listdir(tmp_path)) == ["c"]


@pytest.mark.integration
def test_killed_writer_keeps_previous_checkpoint(tmp_path):
    """A process killed (no cleanup at all) mid-write leaves only a stray temporary,
    which the next save removes."""
    first, config = tiny("planner", seed=0)
    save_checkpoint(tmp_path / "c", first, config)
    script = textwrap.dedent(f"""
        import os, torch
        import ddpd.checkpoint as ckpt
        from ddpd.models import build_model, config_for
        def die(file, data):
            open(file, "wb").write(b"partial")
            os._exit(9)
        ckpt._write_file = die
        model = build_model("planner", config_for("planner", 27, 16, d_model=32, n_layers=1, n_heads=2))
        ckpt.save_checkpoint({str(tmp_path / "c")!r}, model, {config!r}, ({{"a": torch.ones(1)}}, {{}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 9, result.stderr
    assert same_weights(load_model(tmp_path / "c")[0], first)
    assert len(os.listdir(tmp_path)) == 2  # the checkpoint and the abandoned temporary
    save_checkpoint(tmp_path / "c", first, config)
    assert os.listdir(tmp_path) == ["c"]  # the next save removed it (its process is gone)


def test_corrupt_checkpoints_raise_checkpoint_error(tmp_path):
    model, config = tiny("planner")
    good = tmp_path / "good"
    save_checkpoint(good, model, config)

    def copy(name):
        target = tmp_path / name
        target.mkdir()
        for f in os.listdir(good):
            (target / f).write_bytes((good / f).read_bytes())
        return target

    truncated = copy("truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    flipped = copy("flipped")
    data = bytearray((flipped / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (flipped / "model.safetensors").write_bytes(bytes(data))
    no_weights = copy("no_weights")
    os.remove(no_weights / "model.safetensors")
    bad_json = copy("bad_json")
    (bad_json / "config.json").write_text("{not json")
    bad_kind = copy("bad_kind")
    (bad_kind / "config.json").write_text(json.dumps({**config, "kind": "gan"}))
    cases = {truncated: "corrupt", flipped: "corrupt", no_weights: "missing model.safetensors",
             bad_json: "not valid JSON", bad_kind: "'kind' must be one of", tmp_path / "absent": "not found",
             tmp_path: "missing config.json"}
    for path, message in cases.items():
        with pytest.raises(CheckpointError, match=message):
            load_model(path)
    with pytest.raises(CheckpointError, match="no training state"):
        load_train_state(good)


def test_weights_that_do_not_match_the_config(tmp_path):
    model, config = tiny("planner", d_model=32)
    save_checkpoint(tmp_path / "c", model, config)
    stored = read_config(tmp_path / "c")
    stored["model"]["d_model"] = 64
    stored.pop("sha256")
    (tmp_path / "c" / "config.json").write_text(json.dumps(stored))
    with pytest.raises(CheckpointError, match="does not match config.json"):
        load_model(tmp_path / "c")
    stored["model"]["n_heads"] = 3
    (tmp_path / "c" / "config.json").write_text(json.dumps(stored))
    with pytest.raises(CheckpointError, match="does not describe a valid model"):
        load_model(tmp_path / "c")
    stored["model"].update(n_heads=4, out_dim=5)  # a valid transformer, but no planner has 5 outputs
    (tmp_path / "c" / "config.json").write_text(json.dumps(stored))
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'c'}: config.json does not describe a valid "
                                              "planner model: config.out_dim"):
        load_model(tmp_path / "c")


def test_refuses_to_replace_unrelated_directory(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("precious")
    model, config = tiny("planner")
    with pytest.raises(CheckpointError, match="refusing to replace"):
        save_checkpoint(tmp_path / "notes", model, config)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        save_checkpoint(tmp_path / "file", model, config)


def test_an_empty_directory_is_a_destination_a_save_fills(tmp_path):
    model, config = tiny("planner")
    (tmp_path / "c").mkdir()
    save_checkpoint(tmp_path / "c", model, config)
    assert sorted(os.listdir(tmp_path / "c")) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("data", [b'{"kind": "planner", "model": {}}', b'{"kind": "gpt2", "sha256": {}}',
                                  b"{not json", b"\xff{}",
                                  b'{"kind": "planner", "sha256": {}}' + b" " * ckpt.MAX_CONFIG_BYTES],
                         ids=["no sha256", "other kind", "not JSON", "not UTF-8", "too long"])
def test_a_config_json_a_save_did_not_write_is_not_replaced(tmp_path, data):
    """A ddpd kind without digests, digests of another kind, a config.json that does not parse
    or is longer than any a save writes: not a checkpoint, refused in one line."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_bytes(data)
    with pytest.raises(CheckpointError, match="not a ddpd checkpoint"):
        save_checkpoint(tmp_path / "c", *tiny("planner"))
    assert os.listdir(tmp_path / "c") == ["config.json"]


def test_a_dangling_link_named_config_json_is_named_as_the_reason(tmp_path):
    """A config.json that is a link to nothing is still a config.json a save did not write:
    the refusal names it, not a directory without one."""
    (tmp_path / "c").mkdir()
    os.symlink(tmp_path / "nowhere.json", tmp_path / "c" / "config.json")
    with pytest.raises(CheckpointError, match=r"not a ddpd checkpoint \(its config.json records no ddpd kind"):
        save_checkpoint(tmp_path / "c", *tiny("planner"))
    assert os.listdir(tmp_path / "c") == ["config.json"]


def test_a_bundle_needs_both_checkpoints_to_be_replaced(tmp_path):
    """A directory with a ddpd planner/ beside a user's own denoiser/ is not a bundle."""
    planner, planner_config = tiny("planner")
    save_checkpoint(tmp_path / "b" / "planner", planner, planner_config)
    (tmp_path / "b" / "denoiser").mkdir()
    (tmp_path / "b" / "denoiser" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="neither empty nor a ddpd checkpoint"):
        save_bundle(tmp_path / "b", planner, planner_config, *tiny("mask-denoiser"))
    assert (tmp_path / "b" / "denoiser" / "notes.txt").read_text() == "mine"


def hf_model_folder(path):
    """A directory of another library's model: a config.json that is not a ddpd checkpoint's."""
    path.mkdir()
    files = {"config.json": '{"model_type": "gpt2", "vocab_size": 50257}', "model.safetensors": "weights",
             "tokenizer.json": "{}"}
    for name, text in files.items():
        (path / name).write_text(text)
    return files


def test_a_foreign_config_json_is_not_a_checkpoint_to_replace(tmp_path):
    """Any directory holding a config.json was replaced as a checkpoint: a save over a
    Hugging Face model folder overwrote its model.safetensors."""
    files = hf_model_folder(tmp_path / "hf")
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    with pytest.raises(CheckpointError, match=f"refusing to replace {tmp_path / 'hf'}: not a ddpd checkpoint"):
        save_checkpoint(tmp_path / "hf", planner, planner_config)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for role in ("planner", "denoiser"):
        hf_model_folder(bundle / role)
    with pytest.raises(CheckpointError, match=f"refusing to replace {bundle}: it is neither empty"):
        save_bundle(bundle, planner, planner_config, denoiser, denoiser_config)
    for folder in (tmp_path / "hf", bundle / "planner", bundle / "denoiser"):
        assert {name: (folder / name).read_text() for name in files} == files
    save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)
    save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)  # a ddpd bundle is replaced


def test_a_checkpoint_the_process_stands_in_is_not_replaced(tmp_path, monkeypatch):
    """A re-save of the checkpoint in the working directory (`--out .`) left the process in a
    deleted directory."""
    from ddpd.files import OutputError

    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    monkeypatch.chdir(tmp_path / "c")
    with pytest.raises(OutputError, match="is the working directory or holds it"):
        save_checkpoint(".", model, config)
    assert os.path.samefile(os.getcwd(), tmp_path / "c") and load_model(".")[1]["kind"] == "planner"


def test_save_bundle_refuses_networks_that_cannot_sample_together(tmp_path):
    """A 50257-symbol planner and a 27-symbol denoiser were written as a bundle, which the tools
    then loaded and ran (ddpd-eval frontier to the end)."""
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    torch.manual_seed(0)
    wide = config_for("planner", 50257, 16, d_model=32, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="the planner's vocabulary is 50257, the denoiser's 27"):
        save_bundle(tmp_path / "a", build_model("planner", wide), {**planner_config, "model": wide.to_dict()},
                    denoiser, denoiser_config)
    with pytest.raises(ValueError, match="the planner's tokenizer is \\{'name': 'gpt2'\\}, the denoiser's"):
        save_bundle(tmp_path / "b", planner, {**planner_config, "tokenizer": {"name": "gpt2"}},
                    denoiser, denoiser_config)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_empty_path_is_refused_and_the_working_directory_kept(tmp_path, monkeypatch):
    """An empty path once passed the check (it does not exist) and was then written as the
    working directory: `python -m ddpd.pretrained P D --dest ''` replaced everything in it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "precious.txt").write_text("keep")
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    for save in (lambda: save_checkpoint("", planner, planner_config),
                 lambda: save_bundle("", planner, planner_config, denoiser, denoiser_config)):
        with pytest.raises(CheckpointError, match="checkpoint path is empty"):
            save()
    assert sorted(os.listdir(tmp_path)) == ["precious.txt"]


def test_a_save_keeps_the_users_files_beside_the_checkpoint(tmp_path):
    """A save replaces the checkpoint's own files, not notes, logs or samples a user keeps in
    the directory (they were deleted at the next save)."""
    first, config = tiny("planner", seed=0)
    second, _ = tiny("planner", seed=1)
    save_checkpoint(tmp_path / "c", first, config, ({"a": torch.ones(2)}, {"step": 1}))
    (tmp_path / "c" / "NOTES.txt").write_text("lr 1e-3 diverged")
    (tmp_path / "c" / "logs").mkdir()
    (tmp_path / "c" / "logs" / "run.log").write_text("step 1")
    save_checkpoint(tmp_path / "c", second, config)
    assert same_weights(load_model(tmp_path / "c")[0], second)
    assert not os.path.exists(tmp_path / "c" / "train_state.json")  # the checkpoint's own files are replaced
    assert (tmp_path / "c" / "NOTES.txt").read_text() == "lr 1e-3 diverged"
    assert (tmp_path / "c" / "logs" / "run.log").read_text() == "step 1"
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    save_bundle(tmp_path / "b", first, config, denoiser, denoiser_config)
    (tmp_path / "b" / "samples.jsonl").write_text("{}\n")
    save_bundle(tmp_path / "b", second, config, denoiser, denoiser_config)
    assert (tmp_path / "b" / "samples.jsonl").read_text() == "{}\n"
    assert sorted(os.listdir(tmp_path)) == ["b", "c"]


def test_a_link_to_a_directory_kept_beside_the_checkpoint_stays_a_link(tmp_path):
    model, config = tiny("planner")
    (tmp_path / "data").mkdir()
    save_checkpoint(tmp_path / "c", model, config)
    os.symlink(tmp_path / "data", tmp_path / "c" / "data")
    save_checkpoint(tmp_path / "c", model, config)
    assert os.readlink(tmp_path / "c" / "data") == str(tmp_path / "data")


def test_the_users_files_are_copied_where_they_cannot_be_linked(tmp_path, monkeypatch):
    """A file system without hard links (or one across devices) gets copies."""
    import errno

    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    (tmp_path / "c" / "NOTES.txt").write_text("mine")

    def refused(src, dst):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(ckpt.os, "link", refused)
    save_checkpoint(tmp_path / "c", model, config)
    assert (tmp_path / "c" / "NOTES.txt").read_text() == "mine"


def test_links_kept_beside_the_checkpoint_stay_links_where_files_cannot_be_linked(tmp_path, monkeypatch):
    """Links are made again, never linked or copied: a copy would follow them (a link to a
    file became a copy of it, a dead link failed the save)."""
    import errno

    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    (tmp_path / "NOTES.txt").write_text("mine")
    os.symlink(tmp_path / "NOTES.txt", tmp_path / "c" / "notes")
    os.symlink("gone.log", tmp_path / "c" / "latest.log")

    def refused(src, dst):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(ckpt.os, "link", refused)
    save_checkpoint(tmp_path / "c", model, config)
    assert os.readlink(tmp_path / "c" / "notes") == str(tmp_path / "NOTES.txt")
    assert os.readlink(tmp_path / "c" / "latest.log") == "gone.log"


@pytest.mark.parametrize("kept", ["dead link", "fifo"])
def test_a_dead_link_or_a_fifo_kept_beside_the_checkpoint_lets_every_save_through(tmp_path, kept):
    """A save flushed every entry of its new directory by opening it: a dead symbolic link a
    user kept there failed every later save, a FIFO made it wait forever."""
    import threading

    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    entry = tmp_path / "c" / "latest.log"
    os.symlink("gone.log", entry) if kept == "dead link" else os.mkfifo(entry)
    outcome = []

    def saves():
        for _ in range(2):
            save_checkpoint(tmp_path / "c", model, config)
        outcome.append("saved")

    worker = threading.Thread(target=saves, daemon=True)
    worker.start()
    worker.join(timeout=30)  # a guard against the hang, not a measure of speed
    assert outcome == ["saved"]
    mode = os.lstat(entry).st_mode
    assert os.readlink(entry) == "gone.log" if kept == "dead link" else stat.S_ISFIFO(mode)
    load_model(tmp_path / "c")


def test_a_checkpoint_saved_through_a_symbolic_link_replaces_its_target(tmp_path):
    """runs/latest -> runs/2026-11-26: every save replaces the target and keeps the link
    (the swap used to exchange the link itself and then fail to delete it)."""
    model, config = tiny("planner")
    (tmp_path / "runs").mkdir()
    save_checkpoint(tmp_path / "runs" / "day1", model, config)
    os.symlink("day1", tmp_path / "runs" / "latest")
    for _ in range(2):
        save_checkpoint(tmp_path / "runs" / "latest", model, config)
    assert os.readlink(tmp_path / "runs" / "latest") == "day1"
    assert sorted(os.listdir(tmp_path / "runs")) == ["day1", "latest"]
    load_model(tmp_path / "runs" / "latest")


def test_a_bundle_and_a_checkpoint_never_replace_each_other(tmp_path):
    """`python -m ddpd.pretrained ... --dest` naming a training checkpoint replaced it (and its
    optimizer state) with a bundle."""
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    save_checkpoint(tmp_path / "c", planner, planner_config, ({"a": torch.ones(2)}, {"step": 1}))
    with pytest.raises(CheckpointError, match="holds a ddpd checkpoint, not a bundle"):
        save_bundle(tmp_path / "c", planner, planner_config, denoiser, denoiser_config)
    save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)
    with pytest.raises(CheckpointError, match="holds a ddpd bundle, not a checkpoint"):
        save_checkpoint(tmp_path / "b", planner, planner_config)
    assert os.path.exists(tmp_path / "c" / "train_state.json") and os.path.isdir(tmp_path / "b" / "planner")


def test_a_bundle_never_replaces_training_checkpoints_side_by_side(tmp_path):
    """R/planner and R/denoiser written by ddpd-train counted as a bundle at R: a save_bundle
    there dropped their optimizer state."""
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    save_checkpoint(tmp_path / "planner", planner, planner_config)
    save_checkpoint(tmp_path / "denoiser", denoiser, denoiser_config, ({"a": torch.ones(2)}, {"step": 1}))
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'denoiser'} holds a training checkpoint"):
        save_bundle(tmp_path, planner, planner_config, denoiser, denoiser_config)
    assert os.path.exists(tmp_path / "denoiser" / "train_state.json")


def test_a_checkpoint_keeping_a_training_checkpoint_in_its_planner_folder_is_replaced(tmp_path):
    """Only a bundle's planner/ and denoiser/ are its own checkpoints: in a checkpoint's
    directory they are a user's files, kept as they are by a save that replaces it."""
    first, config = tiny("planner", seed=0)
    second, _ = tiny("planner", seed=1)
    save_checkpoint(tmp_path / "c", first, config)
    save_checkpoint(tmp_path / "c" / "planner", first, config, ({"a": torch.ones(2)}, {"step": 1}))
    save_checkpoint(tmp_path / "c", second, config)
    assert same_weights(load_model(tmp_path / "c")[0], second)
    assert load_train_state(tmp_path / "c" / "planner")[1] == {"step": 1}


def test_a_checkpoint_with_half_its_training_state_has_one_and_fails_to_load_it(tmp_path):
    """has_train_state looks for train_state.json: a checkpoint that lost its tensors file is
    a training checkpoint whose state load_train_state refuses, naming the file."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config, ({"a": torch.ones(2)}, {"step": 1}))
    os.remove(tmp_path / "c" / "train_state.safetensors")
    assert ckpt.has_train_state(tmp_path / "c")
    with pytest.raises(CheckpointError, match="train_state.safetensors"):
        load_train_state(tmp_path / "c")
    save_checkpoint(tmp_path / "w", model, config)
    assert not ckpt.has_train_state(tmp_path / "w")
    (tmp_path / "w" / "train_state.json").mkdir()  # a directory of that name is no state file
    assert not ckpt.has_train_state(tmp_path / "w")


def test_save_validates_before_writing(tmp_path):
    model, config = tiny("planner")
    other, _ = tiny("planner", d_model=64)
    with pytest.raises(ValueError, match="must describe the model"):
        save_checkpoint(tmp_path / "c", other, config)
    with pytest.raises(ValueError, match="JSON"):
        save_checkpoint(tmp_path / "c", model, config, ({}, {"bad": object()}))
    with pytest.raises(ValueError, match="train_state meta must be JSON-serialisable: Out of range float"):
        save_checkpoint(tmp_path / "c", model, config, ({}, {"loss": float("nan")}))  # JSON has no NaN
    with pytest.raises(TypeError, match="torch.Tensor"):
        save_checkpoint(tmp_path / "c", model, config, ({"x": [1.0]}, {}))
    with pytest.raises(ValueError, match="'kind'"):
        save_checkpoint(tmp_path / "c", model, {"model": config["model"]})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("model, config, train_state, error, message", [
    ("model", None, None, TypeError, "save_checkpoint: model must be a torch.nn.Module, got str"),
    (None, [1], None, TypeError, "save_checkpoint: config must be a dict, got list"),
    (None, {"model": [1]}, None, ValueError, "'model' must be a dict of TransformerConfig fields, got \\[1\\]"),
    (None, {"extra": object()}, None, ValueError, "checkpoint config must be JSON-serialisable: Object of type object"),
    (None, None, ["a"], TypeError, "train_state must be a \\(dict of tensors, dict\\) pair, got list"),
    (None, None, ({}, {}, {}), TypeError, "train_state must be a \\(dict of tensors, dict\\) pair, got tuple"),
    (None, None, [{}, {}], TypeError, "train_state must be a \\(dict of tensors, dict\\) pair, got list"),
], ids=["model", "config type", "model fields", "config JSON", "train_state", "train_state triple",
        "train_state list pair"])
def test_a_save_names_the_argument_of_the_wrong_type(tmp_path, model, config, train_state, error, message):
    """A save given a malformed argument refuses it by name before anything is written."""
    good, good_config = tiny("planner")
    if isinstance(config, dict):
        config = {**good_config, **config}
    with pytest.raises(error, match=message):
        save_checkpoint(tmp_path / "c", good if model is None else model, config or good_config, train_state)
    assert os.listdir(tmp_path) == []


def test_a_network_of_no_ddpd_kind_saves_under_its_configs_kind(tmp_path):
    """Only a ddpd network's own kind is checked: a user's module holding the same tensors saves."""
    model, config = tiny("planner")
    plain = torch.nn.Module()
    for name, child in model.named_children():
        plain.add_module(name, child)
    assert plain.state_dict().keys() == model.state_dict().keys()
    save_checkpoint(tmp_path / "c", plain, config)
    assert same_weights(load_model(tmp_path / "c")[0], model)


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_saved_as_another_kind_is_refused_before_anything_is_replaced(tmp_path, kind):
    """uniform-denoiser and uniform have the same weights: saved as the other, one would load
    silently as the other network; the other pairs would no longer load at all."""
    model, config = tiny(kind)
    save_checkpoint(tmp_path / "c", model, config)
    before = read_config(tmp_path / "c")
    for other in KINDS:
        if other != kind:
            with pytest.raises(ValueError, match=f"must be the model's kind '{kind}', got '{other}'"):
                save_checkpoint(tmp_path / "c", model, {**config, "kind": other})
    assert read_config(tmp_path / "c") == before and type(load_model(tmp_path / "c")[0]) is type(model)


def test_save_bundle_checks_each_model_against_its_config(tmp_path):
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("uniform-denoiser", seed=2)
    short = {**planner_config, "model": {**planner_config["model"], "max_seq_len": 4}}
    with pytest.raises(ValueError, match=r"save_bundle: planner: config\['model'\] must describe the model"):
        save_bundle(tmp_path / "b", planner, short, denoiser, denoiser_config)
    with pytest.raises(ValueError, match=r"save_bundle: denoiser: config\['kind'\] must be the model's kind"):
        save_bundle(tmp_path / "b", planner, planner_config, denoiser, {**denoiser_config, "kind": "mask-denoiser"})
    assert os.listdir(tmp_path) == []


def test_weights_file_is_plain_safetensors(tmp_path):
    model, config = tiny("mask-denoiser")
    save_checkpoint(tmp_path / "c", model, config)
    tensors = load_file(tmp_path / "c" / "model.safetensors")
    assert tensors.keys() == model.state_dict().keys()


def test_bundle_round_trip(tmp_path):
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)
    got_planner, got_denoiser, configs = load_bundle(tmp_path / "b")
    assert same_weights(got_planner, planner) and same_weights(got_denoiser, denoiser)
    assert configs["planner"]["kind"] == "planner" and configs["denoiser"]["kind"] == "mask-denoiser"
    save_bundle(tmp_path / "b", planner, planner_config, planner_denoiser := tiny("uniform", seed=3)[0],
                tiny("uniform")[1])  # a bundle may replace a bundle
    assert same_weights(load_bundle(tmp_path / "b")[1], planner_denoiser)


def test_bundle_errors(tmp_path):
    planner, planner_config = tiny("planner")
    denoiser, denoiser_config = tiny("uniform-denoiser")
    with pytest.raises(ValueError, match="planner config: kind"):
        save_bundle(tmp_path / "b", denoiser, denoiser_config, denoiser, denoiser_config)
    with pytest.raises(ValueError, match="denoiser config: kind"):
        save_bundle(tmp_path / "b", planner, planner_config, planner, planner_config)
    save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)
    save_checkpoint(tmp_path / "b" / "denoiser", planner, planner_config)  # a planner where the denoiser goes
    with pytest.raises(CheckpointError, match="denoiser config: kind"):
        load_bundle(tmp_path / "b")
    save_checkpoint(tmp_path / "b" / "denoiser", denoiser, denoiser_config)
    save_checkpoint(tmp_path / "b" / "planner", denoiser, denoiser_config)  # a denoiser where the planner goes
    with pytest.raises(CheckpointError, match="planner config: kind"):
        load_bundle(tmp_path / "b")
    with pytest.raises(CheckpointError, match="bundle directory not found"):
        load_bundle(tmp_path / "missing")
    (tmp_path / "half").mkdir()
    save_checkpoint(tmp_path / "half" / "planner", planner, planner_config)
    with pytest.raises(CheckpointError, match="denoiser"):
        load_bundle(tmp_path / "half")


@pytest.mark.parametrize("load", [load_model, ckpt.load_checkpoint, load_bundle])
def test_a_load_checks_its_arguments_before_reading(tmp_path, load):
    """An unknown device failed after every file was read and hashed, with torch's
    RuntimeError ("gpu") or an AssertionError (CUDA absent); a bundle path of another
    type was "not found"."""
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N, got 'gpu'"):
        load(tmp_path / "missing", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load(tmp_path / "missing", device="cuda")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        load(123)


# ---------------------------------------------------------------- hostile and damaged files


def _saved(tmp_path, kind="planner", name="c", **kwargs):
    model, config = tiny(kind, **kwargs)
    save_checkpoint(tmp_path / name, model, config, ({"moment": torch.ones(3)}, {"step": 1}))
    return tmp_path / name


def _rewrite_config(path, change):
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


def _no_hashing(monkeypatch):
    """Hashing a file must not happen before its header was checked against the config."""
    def refuse(*args):
        raise AssertionError("hashed before the header was checked")

    monkeypatch.setattr(ckpt.hashlib, "sha256", refuse)


def _one_line(err):
    return len(str(err).splitlines()) == 1


def test_a_flipped_bit_is_refused(tmp_path):
    path = _saved(tmp_path)
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-7] ^= 0x04
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt \\(sha256"):
        load_model(path)


@pytest.mark.parametrize("name", ["model.safetensors", "train_state.safetensors", "train_state.json"])
def test_a_file_without_a_recorded_digest_is_refused(tmp_path, name):
    """A config.json that records no sha256 for a file must not load it unverified."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config, ({"rng": torch.get_rng_state()}, {"step": 1}))
    stored = read_config(tmp_path / "c")
    del stored["sha256"][name]
    (tmp_path / "c" / "config.json").write_text(json.dumps(stored))
    load = load_train_state if name.startswith("train_state") else load_model
    with pytest.raises(CheckpointError, match=f"records no sha256 for {name}") as err:
        load(tmp_path / "c")
    assert _one_line(err.value)


def test_a_config_of_a_huge_model_is_refused_before_any_allocation(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    _rewrite_config(path, lambda c: c["model"].update(d_model=65536, n_layers=100000, n_heads=256))
    _no_hashing(monkeypatch)
    built = []
    monkeypatch.setattr("ddpd.models.build_model", lambda *a: built.append(a))
    with pytest.raises(CheckpointError, match="100000 layers") as info:
        load_model(path)
    assert built == [] and _one_line(info.value)


def test_a_config_with_one_layer_more_than_the_file_has_tensors_is_refused_unbuilt(tmp_path, monkeypatch):
    """Every layer holds a tensor: one layer past the file's tensor count is refused from the
    counts alone, naming both, before a network is built to compare against."""
    path = _saved(tmp_path)
    count = len(load_file(path / "model.safetensors"))
    _rewrite_config(path, lambda c: c["model"].update(n_layers=count + 1))
    monkeypatch.setattr("ddpd.models.factory.build_skeleton", lambda *a: pytest.fail("built a network"))
    with pytest.raises(CheckpointError, match=f"config.json has {count + 1} layers, the file {count} tensors"):
        load_model(path)


def test_a_config_whose_tensors_cannot_exist_is_one_line(tmp_path, monkeypatch):
    """d_model 10**12: its tensors overflow even on the meta device (a raw RuntimeError)."""
    path = _saved(tmp_path)
    _rewrite_config(path, lambda c: c["model"].update(d_model=10**12, n_heads=1))
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match="does not describe a valid planner model") as info:
        load_model(path)
    assert _one_line(info.value) and str(path) in str(info.value)


def test_a_sparse_huge_weights_file_is_refused_before_hashing(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    os.truncate(path / "model.safetensors", 200 << 30)  # 200 GiB, sparse: no disk used
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match="the file has 214748364800") as info:
        load_model(path)
    assert _one_line(info.value)


def test_a_config_with_the_wrong_vocabulary_names_the_tensor(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    _rewrite_config(path, lambda c: c["model"].update(vocab_size=51))
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match="backbone.embed.weight has shape \\[27, 32\\] in the file, "
                                              "\\[51, 32\\] by config.json") as info:
        load_model(path)
    assert _one_line(info.value)


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "config.json is not valid JSON"),
    ('{"kind": "planner", "model": {}, "sha256": ["a"]}', "'sha256' must map file names"),
    ('{"kind": "planner", "model": {}, "sha256": {"model.safetensors": "abc"}}', "'sha256' must map file names"),
    ('{"kind": "planner", "model": {"d_model": ' + "9" * 5000 + "}}", "config.json is not valid JSON"),
    ('{"kind": "planner", "model": {"d_model": "wide"}}', "does not describe a valid model"),
    ("x" * (2 << 20), "more than the"),
])
def test_crafted_configs_give_one_line_naming_the_file(tmp_path, text, message):
    path = _saved(tmp_path)
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=message) as info:
        load_model(path)
    assert _one_line(info.value) and str(path) in str(info.value)


def test_non_finite_weights_are_refused(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    path = _saved(tmp_path)
    tensors = load_file(path / "model.safetensors")
    tensors["head.weight"][0, 0] = float("nan")
    save_file(tensors, path / "model.safetensors")
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    _rewrite_config(path, lambda c: c["sha256"].update({"model.safetensors": digest}))
    with pytest.raises(CheckpointError, match="NaN or infinite weights in head.weight; the model cannot be used"):
        load_model(path)


def test_non_finite_weights_in_several_tensors_name_the_first_and_count_the_rest(tmp_path):
    model, config = tiny("planner", seed=1)
    with torch.no_grad():
        model.head.weight.fill_(float("inf"))
        model.head.bias.fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"NaN or infinite weights in head\.\w+ \(and 1 more\); the model"):
        save_checkpoint(str(tmp_path / "ckpt"), model, config)


def test_weights_with_a_metadata_entry_load(tmp_path):
    """safetensors' save_file(..., metadata=...) writes a __metadata__ entry, which is no tensor."""
    import hashlib

    from safetensors.torch import save_file

    path = _saved(tmp_path)
    model = load_model(path)[0]
    save_file(load_file(path / "model.safetensors"), path / "model.safetensors", metadata={"format": "pt"})
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    _rewrite_config(path, lambda c: c["sha256"].update({"model.safetensors": digest}))
    assert same_weights(load_model(path)[0], model)
    _craft_state(path, {"__metadata__": {"format": "pt"}})
    assert load_train_state(path) == ({}, {"step": 1})


@pytest.mark.parametrize("spoil, message", [
    (lambda model: model.double(), "stored as F64; weights are stored as F32, F16, BF16"),
    (lambda model: model.head.weight.data.fill_(float("nan")), "NaN or infinite weights in head.weight"),
    (lambda model: model.add_module("extra", torch.nn.Linear(2, 2)), "unexpected \\['extra.bias'"),
    (lambda model: model.to("meta"), "on the meta device and holds no values"),
], ids=["float64", "nan", "extra module", "meta"])
def test_a_save_refuses_weights_a_load_would_refuse(tmp_path, spoil, message):
    """They were written over the last good checkpoint, which then no longer loaded."""
    path = _saved(tmp_path)
    before = (path / "model.safetensors").read_bytes()
    model, config = tiny("planner", seed=1)
    spoil(model)
    with pytest.raises(CheckpointError, match=message) as info:
        save_checkpoint(path, model, config)
    assert _one_line(info.value) and (path / "model.safetensors").read_bytes() == before
    with pytest.raises(CheckpointError, match=message):
        save_bundle(tmp_path / "b", model, config, *tiny("mask-denoiser"))
    assert sorted(os.listdir(tmp_path)) == ["c"]


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:100], "corrupt"),
    (lambda data: (1 << 62).to_bytes(8, "little") + data[8:], "header claims"),
    (lambda data: data[:8] + b"[" + data[9:], "not valid JSON"),
])
def test_crafted_headers_are_refused(tmp_path, damage, message):
    path = _saved(tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as info:
        load_model(path)
    assert _one_line(info.value)


def _craft_state(path, header, data=b"", meta=None):
    """A hostile training state: crafted files, their digests recorded in config.json."""
    import hashlib

    blob = json.dumps(header).encode()
    files = {"train_state.safetensors": len(blob).to_bytes(8, "little") + blob + data}
    if meta is not None:
        files["train_state.json"] = meta.encode()
    for name, raw in files.items():
        (path / name).write_bytes(raw)
        _rewrite_config(path, lambda c: c["sha256"].update({name: hashlib.sha256(raw).hexdigest()}))


@pytest.mark.parametrize("header, data, message", [
    ({"m": {"dtype": "F32", "shape": [-3], "data_offsets": [12, 0]}}, b"", "header entry 'm' is malformed"),
    ({"m": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, bytes(4), "header entry 'm' is malformed"),
    ({"m": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12, 12]}}, bytes(12), "header entry 'm' is malformed"),
    ({"m": {"dtype": "F32", "shape": [1], "data_offsets": [False, 4]}}, bytes(4), "header entry 'm' is malformed"),
    ({"m": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, bytes(12),
     r"tensor 'm' has 12 bytes for its shape \[2\]"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
      "b": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}, bytes(12), "its tensors overlap or leave gaps"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12), "its tensors overlap or leave gaps"),
], ids=["negative size", "bool size", "three offsets", "bool offset", "bytes for shape",
                                 "overlap", "gap"])
def test_a_crafted_training_state_header_is_refused_naming_the_fault(tmp_path, header, data, message):
    path = _saved(tmp_path)
    _craft_state(path, header, data)
    with pytest.raises(CheckpointError, match=f"train_state.safetensors is corrupt \\({message}") as info:
        load_train_state(path)
    assert _one_line(info.value)


def test_a_training_state_header_listing_its_tensors_out_of_file_order_loads(tmp_path):
    """The entries of a header may come in any order: their offsets, sorted, must tile the
    data, not the offsets in the order the header lists them."""
    path = _saved(tmp_path)
    data = torch.tensor([1.0], dtype=torch.float32).numpy().tobytes() + torch.tensor([2.0]).numpy().tobytes()
    _craft_state(path, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, data, meta='{"step": 1}')
    tensors, meta = load_train_state(path)
    assert meta == {"step": 1}
    assert torch.equal(tensors["a"], torch.tensor([2.0])) and torch.equal(tensors["b"], torch.tensor([1.0]))


def test_a_checkpoint_path_that_is_a_link_loop_is_refused_in_one_line(tmp_path):
    """An open of the directory that fails for another reason than a missing or non-directory
    path (here a link to itself) is a CheckpointError giving the system's reason."""
    os.symlink(tmp_path / "c", tmp_path / "c")
    with pytest.raises(CheckpointError, match=f"^checkpoint {tmp_path / 'c'}: cannot open it: ") as info:
        load_model(tmp_path / "c")
    assert _one_line(info.value)


def test_a_checkpoint_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "c").write_text("x")
    with pytest.raises(CheckpointError, match=f"^checkpoint path is not a directory: {tmp_path / 'c'}$"):
        load_model(tmp_path / "c")


@pytest.mark.parametrize("size", [3, 7])  # 7: one byte short of the 8-byte length field
def test_a_weights_file_shorter_than_its_length_field_is_refused(tmp_path, size):
    path = _saved(tmp_path)
    (path / "model.safetensors").write_bytes(b"abcdefg"[:size])
    with pytest.raises(CheckpointError, match=rf"model.safetensors is corrupt \(only {size} bytes\)$"):
        load_model(path)


@pytest.mark.parametrize("header, data, message", [
    ([1], b"", r"is corrupt \(its header is not a JSON object\)$"),
    ({"__metadata__": {"a": 1}, "m": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4),
     "is corrupt: .*expected a string"),
], ids=["list header", "metadata of numbers"])
def test_a_training_state_header_safetensors_refuses_is_one_line(tmp_path, header, data, message):
    """Headers that pass the checks on the tensors' entries but that safetensors cannot read
    (its metadata must map strings to strings) are a CheckpointError, not safetensors' error."""
    path = _saved(tmp_path)
    _craft_state(path, header, data)
    with pytest.raises(CheckpointError, match=f"train_state.safetensors {message}") as info:
        load_train_state(path)
    assert _one_line(info.value)


def test_weights_load_where_the_platform_has_no_preadv(tmp_path, monkeypatch):
    """macOS before 11 and Windows lack os.preadv: the files are read with os.pread."""
    path = _saved(tmp_path)
    expected = load_model(path)[0]
    monkeypatch.delattr(os, "preadv", raising=False)
    reads = []
    pread = os.pread
    monkeypatch.setattr(os, "pread", lambda *args: reads.append(args[1]) or pread(*args))
    assert same_weights(load_model(path)[0], expected) and reads


def test_a_config_json_of_the_largest_size_read_loads(tmp_path):
    path = _saved(tmp_path)
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text + " " * (ckpt.MAX_CONFIG_BYTES - len(text)))
    load_model(path)
    ckpt.ensure_replaceable(path)  # and a checkpoint a save replaces
    (path / "config.json").write_text(text + " " * (ckpt.MAX_CONFIG_BYTES - len(text) + 1))
    with pytest.raises(CheckpointError, match=f"config.json takes {ckpt.MAX_CONFIG_BYTES + 1} bytes, more than"):
        load_model(path)


def test_a_training_state_meta_that_is_not_an_object_is_refused(tmp_path):
    path = _saved(tmp_path)
    _craft_state(path, {}, meta="[1]")
    with pytest.raises(CheckpointError, match="train_state.json must hold a JSON object, got list"):
        load_train_state(path)


_WRITER = textwrap.dedent("""
    import sys, torch
    from ddpd.checkpoint import save_checkpoint
    from ddpd.models import build_model, config_for
    config = config_for("planner", 27, 16, d_model=32, n_layers=1, n_heads=2)
    model = build_model("planner", config)
    meta = {"kind": "planner", "model": config.to_dict()}
    for i in range(1, 10**9):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float(i))
        save_checkpoint(sys.argv[1], model, meta, ({"marker": torch.tensor([i])}, {"step": i}))
        if i == 1:
            print("saved", flush=True)
""")


@pytest.mark.integration
def test_reads_during_saves_are_consistent(tmp_path):
    """A process saves a checkpoint in a loop (weights all equal to the save's number,
    train state step = the same number) while this one loads it: every load succeeds
    and weights and train state come from the same save."""
    path = tmp_path / "c"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "saved"
        seen = set()
        for _ in range(300):
            checkpoint = ckpt.load_checkpoint(path, train_state=True)
            tensors, meta = checkpoint.train_state
            value = float(checkpoint.model.head.weight[0, 0].detach())
            assert value == meta["step"] == int(tensors["marker"][0])
            seen.add(meta["step"])
        assert len(seen) > 1, "the writer did not save during the reads"
    finally:
        writer.kill()
        writer.wait()


@pytest.mark.parametrize("what", ["checkpoint", "bundle"])
def test_a_directory_replaced_just_after_it_was_opened_is_read_again(tmp_path, monkeypatch, what):
    """The descriptor then names the deleted previous version, without files (a checkpoint's)
    or subdirectories (a bundle's): the read is restarted on the new version, not refused as
    a checkpoint missing its config.json."""
    planner, planner_config = tiny("planner", seed=1)
    denoiser, denoiser_config = tiny("mask-denoiser", seed=2)
    new_planner, _ = tiny("planner", seed=3)
    if what == "checkpoint":
        save_checkpoint(tmp_path / "c", planner, planner_config)
        opens, resave = "c", lambda: save_checkpoint(tmp_path / "c", new_planner, planner_config)
    else:
        save_bundle(tmp_path / "b", planner, planner_config, denoiser, denoiser_config)
        opens, resave = "planner", lambda: save_bundle(tmp_path / "b", new_planner, planner_config, denoiser,
                                                       denoiser_config)
    real, saved = os.open, []

    def open_then_save(file, flags, *args, **kwargs):
        if flags & os.O_DIRECTORY and os.path.basename(os.fspath(file)) == opens and not saved:
            saved.append(file)
            fd = real(file, flags, *args, **kwargs) if what == "checkpoint" else None
            resave()
            return fd if fd is not None else real(file, flags, *args, **kwargs)
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(ckpt.os, "open", open_then_save)
    model = load_model(tmp_path / "c")[0] if what == "checkpoint" else load_bundle(tmp_path / "b")[0]
    assert saved and same_weights(model, new_planner)


def test_a_checkpoint_whose_every_file_was_opened_is_read_though_replaced_meanwhile(tmp_path, monkeypatch):
    """With all four files open the read holds one whole version: it goes on with it, not
    restarted (nor refused) because a writer replaced the directory in the meantime."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config, ({"moment": torch.ones(3)}, {"step": 4}))
    monkeypatch.setattr(ckpt._Reader, "replaced", lambda self: True)
    checkpoint = ckpt.load_checkpoint(tmp_path / "c", train_state=True)
    assert same_weights(checkpoint.model, model) and checkpoint.train_state[1] == {"step": 4}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_directory_replaced_at_every_open_is_refused_after_twenty_reads(tmp_path, monkeypatch):
    """A writer saving in a tight loop replaces the directory after each of the reader's opens:
    the read restarts 20 times, then says so in one line, every descriptor closed."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)  # two files: each open finds a replaced directory
    real, opened = os.open, []
    monkeypatch.setattr(ckpt.os, "open", lambda file, flags, *args, **kwargs: opened.append(os.fspath(file)) or
                        real(file, flags, *args, **kwargs))
    monkeypatch.setattr(ckpt._Reader, "replaced", lambda self: True)
    descriptors = len(os.listdir("/proc/self/fd"))
    with pytest.raises(CheckpointError) as info:
        load_model(tmp_path / "c")
    assert str(info.value) == (f"checkpoint {tmp_path / 'c'}: it was replaced 20 times while being opened; "
                               "is a writer saving it in a tight loop?")
    assert opened.count(str(tmp_path / "c")) == 20 and len(os.listdir("/proc/self/fd")) == descriptors


def test_a_fifo_in_place_of_a_file_is_refused_without_waiting(tmp_path):
    """Opening a FIFO for reading waits for a writer: a crafted checkpoint hung the tools."""
    import threading

    path = _saved(tmp_path)
    os.remove(path / "model.safetensors")
    os.mkfifo(path / "model.safetensors")
    outcome = []

    def load():
        try:
            load_model(path)
        except CheckpointError as err:
            outcome.append(str(err))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert outcome == [f"checkpoint {path}: model.safetensors is not a regular file"]


def test_a_directory_or_a_link_loop_in_place_of_a_file_is_named(tmp_path):
    """A directory opens for reading (only writing it is EISDIR) and is named by its mode; a
    file that cannot be opened (a link to itself) says why."""
    path = _saved(tmp_path)
    os.remove(path / "model.safetensors")
    os.mkdir(path / "model.safetensors")
    with pytest.raises(CheckpointError, match="^checkpoint .*: model.safetensors is a directory$"):
        load_model(path)
    os.rmdir(path / "model.safetensors")
    os.symlink("model.safetensors", path / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: Too many levels of symbolic links$"):
        load_model(path)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_a_refused_open_closes_what_it_opened(tmp_path, what):
    """A weights file refused while the files were being opened left config.json's
    descriptor open: 100 loads leaked 100 descriptors."""
    path = _saved(tmp_path)
    os.remove(path / "model.safetensors")
    os.mkdir(path / "model.safetensors") if what == "directory" else os.mkfifo(path / "model.safetensors")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        with pytest.raises(CheckpointError, match="model.safetensors is"):
            load_model(path)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_bundle_load_closes_the_descriptors_of_its_two_checkpoints(tmp_path):
    save_bundle(tmp_path / "b", *tiny("planner"), *tiny("mask-denoiser", seed=2))
    load_bundle(tmp_path / "b")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        load_bundle(tmp_path / "b")
    assert len(os.listdir("/proc/self/fd")) == before


def test_weights_of_a_type_weights_are_not_stored_in_name_the_types(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    path = _saved(tmp_path)
    tensors = load_file(path / "model.safetensors")
    save_file({k: v.double() for k, v in tensors.items()}, path / "model.safetensors")
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match="is stored as F64; weights are stored as F32, F16, BF16") as info:
        load_model(path)  # it said "F64, not a floating type"
    assert _one_line(info.value)


@pytest.mark.integration
def test_a_load_builds_no_initialised_network_to_check_the_weights(tmp_path):
    """The network the header is checked against was built on the meta device with its
    initialisers and rotary tables, whose arithmetic there imports torch._dynamo, triton and
    sympy: seconds of every first load, and C++ into which a signal's exception was thrown
    (ddpd-train --resume ended in SIGABRT)."""
    path = _saved(tmp_path, "mask-denoiser")
    script = ("import sys; from ddpd.checkpoint import load_model; load_model(sys.argv[1]); "
              "print([m for m in ('torch._dynamo', 'triton', 'sympy') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_the_skeleton_of_a_network_has_its_tensors_without_values(kind):
    from ddpd.models.factory import build_skeleton

    model, config = tiny(kind)
    skeleton = build_skeleton(kind, config_for(kind, 27, 16, d_model=32, n_layers=1, n_heads=2))
    shapes = {name: (t.shape, t.dtype) for name, t in model.state_dict().items()}
    assert {name: (t.shape, t.dtype) for name, t in skeleton.state_dict().items()} == shapes
    assert [(b.shape, b.dtype) for b in skeleton.buffers()] == [(b.shape, b.dtype) for b in model.buffers()]
    assert all(t.is_meta for t in skeleton.state_dict().values())


def test_a_config_asking_for_huge_buffers_is_refused_before_they_exist(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    _rewrite_config(path, lambda c: c["model"].update(max_seq_len=10**10))  # rotary tables of 640 GB
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match="bytes of buffers \\(max_seq_len 10000000000\\)") as info:
        load_model(path)
    assert _one_line(info.value)


def test_buffers_of_exactly_the_limit_are_built_and_one_byte_past_it_refused(tmp_path, monkeypatch):
    path = _saved(tmp_path)
    size = sum(b.numel() * b.element_size() for b in tiny("planner")[0].buffers())
    assert size > 0
    monkeypatch.setattr(ckpt, "MAX_BUFFER_BYTES", size)
    assert load_model(path)[1]["kind"] == "planner"
    monkeypatch.setattr(ckpt, "MAX_BUFFER_BYTES", size - 1)
    with pytest.raises(CheckpointError, match=f"describes a network with {size} bytes of buffers"):
        load_model(path)


class _Stop(Exception):
    pass


@pytest.mark.integration
def test_a_signal_during_a_load_is_raised_when_the_load_is_done(tmp_path, monkeypatch):
    """A handler's exception raised wherever the load was cut it, in an import whose C++
    calls back into Python too: it waits for the load's end."""
    import signal

    path = _saved(tmp_path)
    events = []
    read_weights = ckpt._read_weights

    def signalled_while_reading(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        events.append("signalled")
        tensors = read_weights(*args)
        events.append("read")
        return tensors

    def stop(signum, frame):
        events.append("handled")
        raise _Stop()

    monkeypatch.setattr(ckpt, "_read_weights", signalled_while_reading)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(_Stop):
            load_model(path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert events == ["signalled", "read", "handled"]
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_save_digests_the_settings_a_resume_takes(tmp_path):
    """config.json had no digest of its own: a resume took edited settings for the run's."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, {**config, "training": {"lr": 0.003}, "settings_sha256": "stale"})
    stored = read_config(tmp_path / "c")
    assert stored["settings_sha256"] == ckpt.settings_digest(stored) != "stale"
    assert ckpt.resume_settings(tmp_path / "c", stored) == {"lr": 0.003}
    stored["training"]["lr"] = 0.002
    with pytest.raises(CheckpointError, match="config.json's settings differ from their settings_sha256"):
        ckpt.resume_settings(tmp_path / "c", stored)
    stored.pop("settings_sha256")
    with pytest.raises(CheckpointError, match="config.json records no settings_sha256, so the settings"):
        ckpt.resume_settings(tmp_path / "c", stored)


@pytest.mark.parametrize("config", [None, "config.json", [("training", {})]])
def test_resume_settings_names_a_config_that_is_no_dict(tmp_path, config):
    """None raised AttributeError: 'NoneType' object has no attribute 'get'."""
    with pytest.raises(TypeError) as err:
        ckpt.resume_settings(tmp_path / "c", config)
    assert str(err.value) == ("resume_settings: config must be the checkpoint's config dict (read_config), "
                              f"got {type(config).__name__}")


@pytest.mark.parametrize("edit", [lambda c: c["model"].update(n_heads=1),
                                  lambda c: c["training"].update(lr=0.002)], ids=["n_heads", "lr"])
def test_a_load_refuses_settings_that_differ_from_their_digest(tmp_path, edit):
    """Only the weights were checked against config.json: n_heads 1 for 2 fits the same
    weights and loaded, computing another attention."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, {**config, "training": {"n_heads": 2, "lr": 0.003}})
    _rewrite_config(tmp_path / "c", edit)
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'c'}: config.json's settings differ from "
                                              r"their settings_sha256 \(edited or corrupt\)$"):
        load_model(tmp_path / "c")


def test_a_bundle_refuses_an_edited_n_heads(tmp_path):
    save_bundle(tmp_path / "b", *tiny("planner"), *tiny("mask-denoiser", seed=1))
    _rewrite_config(tmp_path / "b" / "denoiser", lambda c: c["model"].update(n_heads=1))
    with pytest.raises(CheckpointError, match="denoiser: config.json's settings differ from their settings_sha256"):
        load_bundle(tmp_path / "b")


def test_a_null_settings_digest_loads_as_none_and_gives_no_settings_to_resume(tmp_path):
    """A settings_sha256 of null is no digest (as resume_settings reads it): the checkpoint
    loads as an older one does, checked against its training section, and a resume from
    it is refused for want of a digest, not for settings that differ."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, {**config, "training": {"d_model": 32}})
    _rewrite_config(tmp_path / "c", lambda c: c.update(settings_sha256=None))
    loaded, loaded_config = load_model(tmp_path / "c")
    assert same_weights(loaded, model)
    with pytest.raises(CheckpointError, match="records no settings_sha256"):
        ckpt.resume_settings(tmp_path / "c", loaded_config)


@pytest.mark.parametrize("field", ["d_model", "n_layers", "n_heads"])
def test_a_config_without_a_digest_must_describe_the_network_it_trained(tmp_path, field):
    """Older saves (the shipped bundle's) record no settings digest: their training section
    still names the network's shape, which an edited model section must keep."""
    model, config = tiny("planner")
    trained = {"d_model": 32, "n_layers": 1, "n_heads": 2, "lr": 0.003}
    save_checkpoint(tmp_path / "c", model, {**config, "training": trained})
    _rewrite_config(tmp_path / "c", lambda c: c.pop("settings_sha256"))
    load_model(tmp_path / "c")  # the same shape: loads
    _rewrite_config(tmp_path / "c", lambda c: c["training"].update({field: 4}))
    with pytest.raises(CheckpointError, match=f"checkpoint {tmp_path / 'c'}: config.json's model has {field} "
                                              f"{trained[field]}, its training section {4} \\(edited or corrupt\\)$"):
        load_model(tmp_path / "c")
    _rewrite_config(tmp_path / "c", lambda c: c.pop("training"))
    load_model(tmp_path / "c")  # nothing to compare with
    _rewrite_config(tmp_path / "c", lambda c: c.update(training=[4]))
    with pytest.raises(CheckpointError, match=r"config.json's training is \[4\], not an object$"):
        load_model(tmp_path / "c")


def test_a_training_state_of_tensors_sharing_memory_round_trips(tmp_path):
    """Optimizer state may hold views of one tensor: each is saved as its own values."""
    moment = torch.arange(6.0)
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config, ({"moment": moment, "head": moment[:2], "same": moment}, {}))
    tensors, _ = load_train_state(tmp_path / "c")
    assert all(torch.equal(tensors[name], value) for name, value in
               (("moment", moment), ("head", moment[:2]), ("same", moment)))


def test_bytes_after_the_tensors_are_refused_before_hashing(tmp_path, monkeypatch):
    """A weights file longer than its header describes is refused naming both sizes, unhashed."""
    path = _saved(tmp_path)
    size = os.path.getsize(path / "model.safetensors")
    with open(path / "model.safetensors", "ab") as f:
        f.write(b"\0")
    _no_hashing(monkeypatch)
    with pytest.raises(CheckpointError, match=f"its header describes {size} bytes, the file has {size + 1}$"):
        load_model(path)


def test_a_training_checkpoint_losing_a_file_to_its_replacement_is_read_again(tmp_path, monkeypatch):
    """A version being deleted shows three of four files: the read restarts on the new one."""
    model, config = tiny("planner", seed=1)
    new_model, _ = tiny("planner", seed=3)
    save_checkpoint(tmp_path / "c", model, config, ({"step": torch.tensor([1])}, {"step": 1}))
    real, saved = os.open, []

    def replace_then_miss(file, flags, *args, **kwargs):
        if file == ckpt.STATE_TENSORS and not saved:
            saved.append(file)
            save_checkpoint(tmp_path / "c", new_model, config, ({"step": torch.tensor([2])}, {"step": 2}))
            raise FileNotFoundError(file)
        return real(file, flags, *args, **kwargs)

    monkeypatch.setattr(ckpt.os, "open", replace_then_miss)
    checkpoint = ckpt.load_checkpoint(tmp_path / "c", train_state=True)
    assert saved and same_weights(checkpoint.model, new_model) and checkpoint.train_state[1] == {"step": 2}


def test_a_config_json_rewritten_with_sorted_keys_loads(tmp_path):
    """The settings digest is over sorted keys: reordering config.json's keys is no edit."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, {**config, "training": {"lr": 0.003, "batch_size": 8}})
    text = (tmp_path / "c" / "config.json").read_text()
    (tmp_path / "c" / "config.json").write_text(json.dumps(json.loads(text), sort_keys=True, indent=4))
    load_model(tmp_path / "c")
    assert ckpt.resume_settings(tmp_path / "c", read_config(tmp_path / "c")) == {"lr": 0.003, "batch_size": 8}


def test_settings_with_integer_keys_load_as_saved(tmp_path):
    """Integer keys read back as strings, sorted otherwise ("10" < "2"): they still verify."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, {**config, "training": {"decay_at": {2: 0.1, 10: 0.01}}})
    load_model(tmp_path / "c")
    assert ckpt.resume_settings(tmp_path / "c", read_config(tmp_path / "c")) == {"decay_at": {"2": 0.1, "10": 0.01}}


def test_a_link_to_a_directory_inside_a_kept_directory_stays_a_link(tmp_path):
    """Links inside a user's kept directory stay links: a loop (latest -> ..) is not followed."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    (tmp_path / "c" / "runs").mkdir()
    os.symlink("..", tmp_path / "c" / "runs" / "latest")
    save_checkpoint(tmp_path / "c", model, config)
    assert os.readlink(tmp_path / "c" / "runs" / "latest") == ".."


def test_weights_read_in_short_reads_load(tmp_path, monkeypatch):
    """A short read (Linux caps one at 2 GiB) is continued where it stopped."""
    path = _saved(tmp_path)
    expected = load_model(path)[0]
    pread_into = ckpt._pread_into
    monkeypatch.setattr(ckpt, "_pread_into", lambda fd, view, offset: pread_into(fd, view[:4099], offset))
    assert same_weights(load_model(path)[0], expected)


@pytest.mark.parametrize("training", [[], "", 0, False])
def test_a_training_section_that_is_an_empty_non_object_is_refused(training):
    """Only an absent or null section reads as no settings: an empty list, string, zero or
    false is a damaged section, refused like any other that is not an object."""
    assert ckpt.training_settings("c", {}) == {} and ckpt.training_settings("c", {"training": None}) == {}
    with pytest.raises(CheckpointError, match="^checkpoint c: config.json's training is .*, not an object$"):
        ckpt.training_settings("c", {"training": training})


def test_a_checkpoint_saved_without_training_state_says_so_on_resume(tmp_path):
    """Resuming from a weights-only checkpoint names the missing training state."""
    model, config = tiny("planner")
    save_checkpoint(tmp_path / "c", model, config)
    with pytest.raises(CheckpointError, match=r"no training state to resume from \(train_state.json missing\)$"):
        load_train_state(tmp_path / "c")


def test_a_fifo_in_place_of_config_json_is_refused_without_waiting(tmp_path):
    """Opening a FIFO for reading waits for a writer: a save into such a directory hung."""
    import threading

    (tmp_path / "c").mkdir()
    os.mkfifo(tmp_path / "c" / "config.json")
    outcome = []

    def check():
        try:
            ckpt.ensure_replaceable(tmp_path / "c")
        except CheckpointError as err:
            outcome.append(str(err))

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert outcome == [f"refusing to replace {tmp_path / 'c'}: not a ddpd checkpoint (its config.json records "
                       "no ddpd kind and sha256)"]


def test_a_directory_without_config_json_is_named_as_no_checkpoint(tmp_path):
    """Pointing a load at an empty or unrelated directory says it is no (complete) checkpoint."""
    (tmp_path / "c").mkdir()
    with pytest.raises(CheckpointError, match=r"missing config.json \(not a ddpd checkpoint, or never completed\)$"):
        load_model(tmp_path / "c")
