"""docs/text8/gpu_train.sh, the one GPU run that trains the text8 networks on a GPU: it runs
only where a GPU is lent, so its settings and its plan are checked here (quick), and its
whole dry run (SMOKE=1: every stage on the CPU with tiny networks) with -m slow."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "text8" / "gpu_train.sh"
BOOKS = ROOT / "ddpd" / "assets" / "books.txt"


def _data(tmp_path: Path) -> Path:
    """A stand-in for text8-mini: books.txt and wiki.txt cut from the shipped text8-format books."""
    text = BOOKS.read_text()
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "books.txt").write_text(text[:150_000])
    (data / "wiki.txt").write_text(text[150_000:].strip() + "\n")
    return data


def _run(tmp_path: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHON=sys.executable, DATA_DIR=str(_data(tmp_path)), RUNS=str(tmp_path / "runs"),
                RESULTS=str(tmp_path / "results"), TMPDIR=str(tmp_path))
    full.pop("OUT", None)
    full.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
def test_plan_trains_the_three_networks_within_the_budget(tmp_path):
    done = _run(tmp_path, "--plan", BUDGET_S="400", RESERVE_S="100")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines() if line.startswith("train ")}
    assert list(lines) == ["train planner", "train mask-denoiser", "train uniform"]
    for line in lines.values():  # the budget less the 60 s the plan allows the build, less the reserve
        assert "--max-time 240 " in line and f"--data {tmp_path}/runs/corpus.txt " in line
        assert "--resume" not in line and "--device cuda" in line  # a GPU run: no CPU fallback
    assert "--d-model 256 --n-layers 6" in lines["train planner"]
    assert "--d-model 256 --n-layers 8" in lines["train uniform"]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()  # ran nothing


@pytest.mark.integration
def test_plan_resumes_a_network_with_a_checkpoint(tmp_path):
    (tmp_path / "runs" / "planner").mkdir(parents=True)
    (tmp_path / "runs" / "planner" / "train_state.json").write_text("{}")
    done = _run(tmp_path, "--plan", NETWORKS="planner ar")
    assert done.returncode == 0, done.stderr
    planner = next(line for line in done.stdout.splitlines() if line.startswith("train planner:"))
    ar = next(line for line in done.stdout.splitlines() if line.startswith("train ar:"))
    # a resumed run takes its settings (--max-time included) from its checkpoint
    assert " planner --resume --out " in planner and "--max-time" not in planner
    assert "--max-time" in ar and "--resume" not in ar


@pytest.mark.integration
@pytest.mark.parametrize("env, message", [
    ({"BUDGET_S": "9 min"}, "BUDGET_S must be a whole number of seconds, got '9 min'"),
    ({"TRAIN_SECONDS": "0"}, "TRAIN_SECONDS must be a positive whole number of seconds, got '0'"),
    ({"ELBO_SEQUENCES": "-1"}, "ELBO_SEQUENCES must be a positive whole number, got '-1'"),
    ({"NETWORKS": "planner judge"}, "NETWORKS: unknown network 'judge'"),
    ({"NETWORKS": " "}, "NETWORKS names no network"),
    ({"DATA_DIR": "/nonexistent"}, "no /nonexistent/books.txt (copy text8-mini's books.txt there"),
    ({"DEVICE": "gpu"}, "DEVICE must be cuda, cpu or auto, got 'gpu'"),
    pytest.param({}, "no CUDA device (DEVICE=cpu trains these networks on the CPU)",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")),
])
def test_a_wrong_setting_stops_before_anything_runs(tmp_path, env, message):
    done = _run(tmp_path, **env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("gpu_train: ") and message in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.integration
def test_unknown_argument_is_refused(tmp_path):
    done = _run(tmp_path, "--dry")
    assert done.returncode == 2 and "unknown argument --dry" in done.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_run_trains_exports_evaluates_packs_and_resumes(tmp_path):
    """Every stage on the CPU (about 2-4 minutes on 2 cores), then a second run that continues
    the checkpoints with --resume; what a GPU run returns is packed under $OUT."""
    out = tmp_path / "out"
    out.mkdir()
    env = dict(SMOKE="1", TRAIN_SECONDS="3", OUT=str(out))
    done = _run(tmp_path, timeout=900, **env)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "FAILED" not in log and "Traceback" not in log and "SKIPPED" not in log
    results = tmp_path / "results"
    for name in ("training.md", "elbo-corpus.md", "elbo-wiki.md", "elbo-wiki-bundled.md", "samples.jsonl",
                 "samples-uniform.jsonl", "train-planner.log", "train-uniform.log", "gpu_train.log"):
        assert (results / name).is_file(), name
    assert "| uniform | " in (results / "elbo-corpus.md").read_text()
    assert {p.name for p in out.iterdir()} == {"gpu_train.log", "results.tar", "float16.tar.part-aa"}
    again = _run(tmp_path, timeout=900, **env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "train planner: " in again.stdout and " planner --resume " in again.stdout


@pytest.mark.integration
def test_the_default_budget_is_the_lease_plans(tmp_path):
    """Run as the lease plan runs it (docs/text8/README.md), the script keeps within its budget of
    480 s and trains what that budget leaves."""
    done = _run(tmp_path, "--plan")
    assert done.returncode == 0, done.stderr
    assert "# budget 480 s, reserve 170 s" in done.stdout
    assert all("--max-time 250 " in line for line in done.stdout.splitlines() if line.startswith("train "))


@pytest.mark.integration
@pytest.mark.parametrize("train_seconds, deadline", [(None, 363), ("400", 364), ("100", 213)])
def test_training_is_stopped_in_time_for_what_follows_it(tmp_path, train_seconds, deadline):
    """Late runs are stopped 2/3 of the reserve after --max-time, and never later than a third
    of the reserve before the budget's end: a TRAIN_SECONDS beyond what the budget leaves ran
    past it, and the call's timeout took the export and the evaluations."""
    env = {"TRAIN_SECONDS": train_seconds} if train_seconds else {}
    done = _run(tmp_path, "--plan", **env)
    assert done.returncode == 0, done.stderr
    assert f"# training stopped {deadline} s after its start at the latest" in done.stdout, done.stdout


# A stand-in for python on a CUDA machine (FAKE_GPU=0: on a CPU one): it answers the script's
# questions about the device, runs nothing of ddpd and records every call in calls.txt; where
# FAKE_INSTALLED=0, ddpd is not importable before the build.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >>"$FAKE_DIR/calls.txt"
case "$*" in
    *cuda.is_available*) exit $((1 - ${FAKE_GPU:-1})) ;;
    *get_device_name*) echo fake-gpu ;;
    *get_device_capability*) echo 9.0 ;;
    *"import ddpd.kernels, ddpd._C"*) exit $((1 - ${FAKE_INSTALLED:-1})) ;;
esac
exit 0
"""


@pytest.mark.integration
@pytest.mark.parametrize("gpu, installed, device, cuda", [
    ("1", "1", "cuda", True), ("1", "0", "cuda", True), ("0", "0", "auto", False), ("1", "1", "cpu", False)])
def test_the_build_requires_the_cuda_kernels_where_it_trains_on_a_gpu(tmp_path, gpu, installed, device, cuda):
    """Without its CUDA kernels ddpd._C leaves the ops to their torch references on the GPU: the
    build stage asks for them there (also of an installed ddpd), and only there (DEVICE=auto on a CPU)."""
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    done = _run(tmp_path, PYTHON=str(python), FAKE_DIR=str(tmp_path), FAKE_GPU=gpu, FAKE_INSTALLED=installed,
                DEVICE=device)
    assert "## build: done" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert ("-m ddpd.ops --cuda" in calls) == cuda and ("-m ddpd.ops" in calls) != cuda, calls
