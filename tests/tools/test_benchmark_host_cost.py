"""benchmarks/host_cost.py: each op's public call against the raw torch.ops call of the same
kernel on the same inputs, the added cost per call and its target. No real clock decides a
test: the timer is replaced by fixed numbers."""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_cost  # noqa: E402


def tensors(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for part in result for t in tensors(part)]
    return []


def test_each_public_call_and_its_raw_call_give_the_same_values_on_cpu():
    """The difference of their times is the wrapper's cost only if both run the same kernel on
    the same inputs (the raw draw may return empty extras after the public fields)."""
    table = host_cost.cases(torch.device("cpu"))
    assert len(table) == 11 and "sample_categorical 64x50257" not in table
    for name, (public, raw) in table.items():
        ours, theirs = tensors(public()), tensors(raw())
        assert ours and len(theirs) >= len(ours), name
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape, name
            if name != "sample_categorical unseeded":  # its seed is drawn from torch's generator
                assert torch.equal(a, b), name


def test_a_time_per_call_is_in_microseconds_of_the_best_of_the_repeats(monkeypatch):
    seen = {}

    def best_per_call(*fns, calls, repeats, sync):
        seen.update(fns=fns, calls=calls, repeats=repeats, sync=sync)
        return [3e-6, 1.5e-6]

    monkeypatch.setattr(host_cost, "best_per_call", best_per_call)
    public, raw, sync = (lambda: 1), (lambda: 2), (lambda: None)
    assert host_cost.per_call_us(public, raw, sync) == pytest.approx((3.0, 1.5))
    assert seen == dict(fns=(public, raw), calls=300, repeats=9, sync=sync)


def run_main(monkeypatch, capsys, argv: list, times: dict) -> tuple:
    threads = []
    monkeypatch.setattr(sys, "argv", ["host_cost.py", *argv])
    monkeypatch.setattr(host_cost.torch, "set_num_threads", threads.append)  # not this process's
    monkeypatch.setattr(host_cost, "per_call_us", lambda public, raw, sync: times.get(public, (5.0, 1.0)))
    monkeypatch.setattr(host_cost, "cases", lambda device: {name: (name, "raw") for name in times})
    code = host_cost.main()
    out, err = capsys.readouterr()
    return code, out, err, threads


def test_an_op_is_over_target_from_20_us_added(monkeypatch, capsys):
    times = {"under": (21.0, 1.5), "at": (22.0, 2.0), "cheap": (4.0, 3.0)}
    code, out, err, threads = run_main(monkeypatch, capsys, [], times)
    assert code == 0 and threads == [1], err
    lines = {line.split()[0]: line for line in out.splitlines()[2:-1]}
    assert lines["under"].split()[1:] == ["21.0us", "1.5us", "19.5us"]
    assert lines["at"].endswith("20.0us  over target") and "over target" not in lines["cheap"]
    assert out.splitlines()[0].endswith("best of 9 x 300 calls, target < 20 us")
    assert out.splitlines()[-1] == "largest added cost: 20.0 us"


def test_profile_names_an_op_of_the_table(monkeypatch, capsys):
    code, out, err, _ = run_main(monkeypatch, capsys, ["--profile", "nothing"], {"a": (2.0, 1.0), "b": (2.0, 1.0)})
    assert code == 2 and out == ""
    assert err.strip() == "host_cost: --profile must be one of a, b, got 'nothing'"


def test_cuda_without_a_device_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(host_cost.torch.cuda, "is_available", lambda: False)
    code, out, err, threads = run_main(monkeypatch, capsys, ["--cuda"], {"a": (2.0, 1.0)})
    assert code == 2 and out == "" and threads == [] and "no CUDA device" in err


def test_a_profile_counts_every_call_and_reports_per_call(monkeypatch, capsys):
    monkeypatch.setattr(host_cost, "CALLS", 5)
    monkeypatch.setattr(host_cost, "REPEATS", 2)
    calls, syncs = [], []
    host_cost.profile("op", lambda: calls.append(1), lambda: syncs.append(1), top=3)
    out = capsys.readouterr().out.splitlines()
    assert len(calls) == 10 and syncs == [1]
    assert out[0].startswith("profile of op (cProfile adds its own cost to every call): ")
    assert out[0].endswith(" us a call")
    assert 1 <= len(out) - 1 <= 3 and all(" us own " in line and " us with callees  " in line for line in out[1:])


def test_a_profile_lists_the_top_functions_by_their_own_time_per_call(monkeypatch, capsys):
    """cProfile's numbers are replaced: 10 calls, so a function's 20 us of its own is 2 us a call."""
    monkeypatch.setattr(host_cost, "CALLS", 5)
    monkeypatch.setattr(host_cost, "REPEATS", 2)
    stats = {("~", 0, "<built-in method a>"): (10, 10, 20e-6, 20e-6, {}),
             ("/x/site-packages/ddpd/ops/b.py", 7, "check"): (10, 10, 50e-6, 90e-6, {}),
             ("c.py", 3, "small"): (10, 10, 10e-6, 10e-6, {})}
    monkeypatch.setattr(host_cost.pstats, "Stats", lambda profiler: type("Stats", (), {"stats": stats})())
    host_cost.profile("op", lambda: None, lambda: None, top=2)
    assert capsys.readouterr().out.splitlines() == [
        "profile of op (cProfile adds its own cost to every call): 8.0 us a call",
        "      5.0 us own     9.0 us with callees  check (ddpd/ops/b.py:7)",
        "      2.0 us own     2.0 us with callees  <built-in method a>"]


def test_main_profiles_the_public_call_of_the_op(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(host_cost, "profile", lambda name, public, sync: seen.append((name, public)))
    code, out, err, _ = run_main(monkeypatch, capsys, ["--profile", "b"], {"a": (2.0, 1.0), "b": (2.0, 1.0)})
    assert code == 0 and seen == [("b", "b")], err
