"""benchmarks/kernel_profile.py: one call of each kernel for Nsight Compute. Here, without a GPU
or a profiler: its cases, where it finds ncu, the command it runs and its dry run."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_profile  # noqa: E402


def test_the_small_cases_name_shapes_a_cpu_runs_in_a_moment():
    assert list(kernel_profile.cases("cpu", small=True)) == [
        "sample_categorical 4 x 700", "sample_categorical 8 x 700", "sample_categorical top_p 0.9 4 x 700",
        "sample_from_hidden 4 x 64 -> 900"]


def test_ncu_is_found_on_the_path_first_then_the_newest_install(monkeypatch):
    installed = {"/opt/nvidia/nsight-compute/*/ncu": ["/opt/nvidia/nsight-compute/2024.1/ncu",
                                                      "/opt/nvidia/nsight-compute/2025.2/ncu"],
                 "/usr/local/cuda*/bin/ncu": ["/usr/local/cuda-12.4/bin/ncu", "/usr/local/cuda-12.8/bin/ncu"]}
    monkeypatch.setattr(kernel_profile.glob, "glob", lambda pattern: installed[pattern])
    monkeypatch.setattr(kernel_profile.shutil, "which", lambda name: "/usr/bin/ncu" if name == "ncu" else None)
    assert kernel_profile.find_ncu() == "/usr/bin/ncu"
    monkeypatch.setattr(kernel_profile.shutil, "which", lambda name: None)
    assert kernel_profile.find_ncu() == "/opt/nvidia/nsight-compute/2025.2/ncu"
    installed["/opt/nvidia/nsight-compute/*/ncu"] = []
    assert kernel_profile.find_ncu() == "/usr/local/cuda-12.8/bin/ncu"
    installed["/usr/local/cuda*/bin/ncu"] = []
    assert kernel_profile.find_ncu() is None


def test_ncu_runs_this_script_with_the_clocks_left_alone_and_three_sections(monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "argv", ["kernel_profile.py", "--ncu"])
    monkeypatch.setattr(kernel_profile, "find_ncu", lambda: "/x/ncu")
    monkeypatch.setattr(kernel_profile.subprocess, "call", lambda argv: calls.append(argv) or 7)
    assert kernel_profile.main() == 7
    assert calls == [["/x/ncu", "--clock-control", "none", "--profile-from-start", "off", "--section",
                      "SpeedOfLight", "--section", "Occupancy", "--section", "WarpStateStats", sys.executable,
                      kernel_profile.__file__]]


def test_without_ncu_the_script_says_so_and_succeeds(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_profile.py", "--ncu"])
    monkeypatch.setattr(kernel_profile, "find_ncu", lambda: None)
    assert kernel_profile.main() == 0
    assert capsys.readouterr().out == "kernel_profile: Nsight Compute (ncu) is not installed here: no profile\n"


@pytest.mark.parametrize("argv", [[], ["--ncu", "--dry-run"]])
def test_a_dry_run_calls_each_case_twice_then_once_named_without_a_profiler(monkeypatch, capsys, argv):
    calls = []
    monkeypatch.setattr(sys, "argv", ["kernel_profile.py", "--dry-run", *argv])
    monkeypatch.setattr(kernel_profile, "find_ncu", lambda: pytest.fail("a dry run starts no profiler"))
    monkeypatch.setattr(kernel_profile, "cases", lambda device, small: {
        "a": lambda: calls.append(("a", device, small)), "b": lambda: calls.append(("b", device, small))})
    monkeypatch.setattr(kernel_profile.torch.cuda.profiler, "start", lambda: pytest.fail("no profiler on the CPU"))
    assert kernel_profile.main() == 0
    assert [name for name, _, _ in calls] == ["a", "a", "b", "b", "a", "b"]
    assert {(device, small) for _, device, small in calls} == {("cpu", True)}
    assert capsys.readouterr().out == "called: a\ncalled: b\n"


def test_without_cuda_and_without_dry_run_the_script_says_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kernel_profile.py"])
    monkeypatch.setattr(kernel_profile.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(kernel_profile, "cases", lambda device, small: pytest.fail("nothing to call"))
    assert kernel_profile.main() == 2
    assert capsys.readouterr() == ("", "kernel_profile: no CUDA device visible to torch (--dry-run checks this "
                                       "script)\n")
