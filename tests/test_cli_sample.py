"""ddpd-sample end to end with tiny randomly initialised models saved as checkpoints."""
import json
import os
import subprocess
import sys

import pytest
import torch

from ddpd.checkpoint import save_bundle, save_checkpoint
from ddpd.cli.sample import main
from ddpd.models import build_model, config_for
from oracles.fixtures import single_thread  # noqa: F401  (autouse)

V, D = 27, 8  # text8 alphabet, short sequences
TINY = dict(d_model=16, n_layers=1, n_heads=2)


def _model(kind: str, seed: int):
    torch.manual_seed(seed)
    config = config_for(kind, V, D, **TINY)
    model = build_model(kind, config)
    return model, {"kind": kind, "model": config.to_dict(), "tokenizer": {"name": "text8"}, "schedule": "linear"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    paths = {}
    for i, kind in enumerate(("planner", "mask-denoiser", "uniform-denoiser", "uniform")):
        paths[kind] = str(root / kind)
        save_checkpoint(paths[kind], *_model(kind, i))
    planner, planner_config = _model("planner", 0)
    denoiser, denoiser_config = _model("mask-denoiser", 1)
    paths["bundle"] = str(root / "bundle")
    save_bundle(paths["bundle"], planner, planner_config, denoiser, denoiser_config)
    return paths


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_bundle_ddpd_writes_jsonl(ckpts, tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    code, stdout, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], "--steps", "12", "--num-samples", "5",
                                   "--batch-size", "2", "--seed", "3", "--out", str(out), "--option", "A+B+C")
    assert code == 0, stderr
    records = read_jsonl(out)
    assert [r["index"] for r in records] == list(range(5))
    for r in records:
        assert len(r["tokens"]) == D and all(0 <= t < V for t in r["tokens"])
        assert r["text"] == "".join(" abcdefghijklmnopqrstuvwxyz"[t] for t in r["tokens"])
        assert r["steps"] == 12 and r["stop_step"] == 12  # option B runs the whole budget
    assert stdout.splitlines() == [r["text"] for r in records]
    assert "samples/s" in stderr and "planner 36 " in stderr  # 3 batches x 12 steps


def test_samples_do_not_depend_on_batch_size(ckpts, tmp_path, capsys):
    outs = []
    for batch in ("1", "4"):
        out = tmp_path / f"b{batch}.jsonl"
        code, _, err = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", ckpts["uniform-denoiser"],
                               "--num-samples", "4", "--batch-size", batch, "--steps", "6", "--out", str(out),
                               "--stop", "budget", "--quiet")
        assert code == 0, err
        outs.append([r["tokens"] for r in read_jsonl(out)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("argv", [
    ["--sampler", "ddpd", "--clock", "exact", "--steps", "40"],
    ["--sampler", "ddpd", "--k", "3", "--parallel-steps", "2", "--temperature", "0.8", "--temperature-end", "0.2"],
    ["--sampler", "tau-leaping", "--steps", "5"],
])
def test_planner_and_denoiser_samplers(ckpts, capsys, argv):
    code, stdout, stderr = run_cli(capsys, "--planner", ckpts["planner"], "--denoiser", ckpts["mask-denoiser"],
                                   "--num-samples", "3", *argv)
    assert code == 0, stderr
    assert len(stdout.splitlines()) == 3 and all(len(line) == D for line in stdout.splitlines())


@pytest.mark.parametrize("kind,argv", [
    ("mask-denoiser", ["--sampler", "tau-leaping", "--eta", "2", "--steps", "10"]),
    ("mask-denoiser", ["--sampler", "maskgit", "--steps", "4", "--choice-temperature", "1"]),
    ("uniform", ["--sampler", "tau-leaping", "--steps", "6"]),
    ("uniform", ["--sampler", "ddpd", "--option", "A", "--eps", "0.5", "--steps", "6"]),
])
def test_single_model_samplers(ckpts, tmp_path, capsys, kind, argv):
    out = tmp_path / "s.jsonl"
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts[kind], "--num-samples", "3", "--out", str(out), "--quiet",
                              "--length", "5", *argv)
    assert code == 0, stderr
    assert all(len(r["tokens"]) == 5 for r in read_jsonl(out))


@pytest.mark.parametrize("argv,message", [
    (["--steps", "0"], "steps"),
    (["--num-samples", "0"], "--num-samples"),
    (["--option", "AZ"], "--option"),
    (["--eps", "2"], "eps"),
    (["--length", "99"], "--length"),
    (["--device", "tpu"], "--device"),
    (["--sampler", "maskgit"], "maskgit needs one mask-denoiser"),
    (["--clock", "exact", "--stop", "eps"], "stop"),
])
def test_bad_arguments_fail_in_one_line(ckpts, capsys, argv, message):
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts["bundle"], *argv)
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1 and message in stderr and "Traceback" not in stderr


def test_missing_and_corrupt_checkpoints(ckpts, tmp_path, capsys, monkeypatch):
    code, _, stderr = run_cli(capsys, "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 1 and "not found" in stderr and len(stderr.strip().splitlines()) == 1
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    code, _, stderr = run_cli(capsys, "--checkpoint", str(broken))
    assert code == 1 and "config.json" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = run_cli(capsys, "--checkpoint", ckpts["planner"])
    assert code == 2 and "planner only" in stderr
    # No model argument and no bundled default (whether or not the package ships one).
    monkeypatch.setenv("DDPD_PRETRAINED_DIR", str(tmp_path / "no-bundle"))
    code, _, stderr = run_cli(capsys)
    assert code == 2 and "--checkpoint" in stderr


def test_truncated_weights_fail_cleanly(ckpts, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(ckpts["mask-denoiser"], copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, stderr = run_cli(capsys, "--checkpoint", str(copy), "--sampler", "maskgit")
    assert code == 1 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr


def test_argparse_errors_are_one_line():
    proc = subprocess.run([sys.executable, "-m", "ddpd.cli.sample", "--sampler", "gibbs"], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--sampler" in proc.stderr



@pytest.mark.parametrize("fused", [[], ["--fused"]])
def test_progress_bar_ticks_once_per_denoiser_pass(ckpts, monkeypatch, capsys, fused):
    import tqdm.auto

    bars = []

    class Recorder(tqdm.auto.tqdm):
        """Counts the ticks (update calls) and where the bar ended."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": False})
            self.ticks, self.disabled_by_cli = 0, kwargs.get("disable") is True
            bars.append(self)

        def update(self, n=1):
            self.ticks += 1
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    argv = ["--checkpoint", ckpts["bundle"], "--steps", "12", "--num-samples", "4", "--batch-size", "2", "--quiet"]
    assert main(argv + ["--option", "A+B", *fused]) == 0  # option B: every batch runs its 12 steps
    bar = bars.pop()
    assert (bar.total, bar.n, bar.ticks) == (24, 24, 24 + 2)  # 24 denoiser passes, then one advance per batch
    assert not bar.disabled_by_cli
    assert main(argv + ["--option", "A", "--eps", "0.9", *fused]) == 0  # option A may stop before the budget
    bar = bars.pop()
    assert bar.n == 24 and bar.ticks <= 24 + 2
    assert main(argv + ["--no-progress", *fused]) == 0
    assert bars.pop().disabled_by_cli
    capsys.readouterr()
