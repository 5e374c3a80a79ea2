"""benchmarks/launch_cost.py: the Python side of each op's launches, timed on CPU tensors with
Triton's driver stubbed. No real clock decides a test: the timer and the launches are replaced."""
import contextlib
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import launch_cost  # noqa: E402


def test_a_time_per_call_is_in_microseconds_of_the_best_of_the_repeats(monkeypatch):
    seen = {}

    def best_per_call(*fns, **kwargs):
        seen.update(kwargs, fns=fns)
        return [2.5e-6, 9.0]

    monkeypatch.setattr(launch_cost, "best_per_call", best_per_call)
    fn = object()
    assert launch_cost.per_call_us(fn) == pytest.approx(2.5)
    assert seen == {"fns": (fn,), "calls": 2000, "repeats": 7, "warmup": 50}


def test_a_time_through_tritons_launch_is_taken_inside_it(monkeypatch):
    events = []

    @contextlib.contextmanager
    def tritons_launch():
        events.append("enter")
        yield
        events.append("exit")

    monkeypatch.setattr(launch_cost, "tritons_launch", tritons_launch)
    monkeypatch.setattr(launch_cost, "per_call_us", lambda fn: events.append(fn) or 3.0)
    assert launch_cost.through_tritons_launch("call") == 3.0
    assert events == ["enter", "call", "exit"]


@pytest.fixture
def stubbed(monkeypatch):
    """main with one op of one kernel: each timing calls its fn once and gives the next number."""
    monkeypatch.setattr(sys, "argv", ["launch_cost.py"])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    state = {"stubbed": 0, "threads": [], "launched": [], "op": 0, "via_triton": False}
    times = iter([1.25, 0.75, 20.0])  # the launch of each kernel, then the call

    def per_call_us(fn):
        fn()
        return 3.5 if state["via_triton"] else next(times)

    @contextlib.contextmanager
    def tritons_launch():
        state["via_triton"] = True
        yield
        state["via_triton"] = False

    class Kernel:
        def __init__(self, name):
            self.fn = types.SimpleNamespace(__name__=name)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: state["launched"].append((grid, args, kwargs, state["via_triton"]))

    def call():
        state["op"] += 1

    monkeypatch.setattr(launch_cost, "LAUNCHES", {"draw": lambda: call})
    monkeypatch.setattr(launch_cost, "record_launches",
                        lambda fn: [(Kernel("_draw_kernel"), (4, 1), {"x": "X", "n": 7}, {"BLOCK": 16}),
                                    (Kernel("_sum_kernel"), (2,), {}, {})])
    monkeypatch.setattr(launch_cost, "stub_triton", lambda: state.update(stubbed=state["stubbed"] + 1))
    monkeypatch.setattr(launch_cost, "tritons_launch", tritons_launch)
    monkeypatch.setattr(launch_cost, "per_call_us", per_call_us)
    monkeypatch.setattr(launch_cost.torch, "set_num_threads", lambda n: state["threads"].append(n))
    return state


def test_main_times_each_ops_call_its_call_via_triton_and_each_kernels_launch(stubbed, capsys):
    assert launch_cost.main() == 0
    head, columns, line = capsys.readouterr().out.splitlines()
    assert stubbed["stubbed"] == 1 and stubbed["threads"] == [1]  # one thread: the timings of a shared machine
    assert "best of 7 x 2000 calls" in head
    assert columns.split() == ["op", "call", "via", "Triton", "Triton's", "launch", "of", "each", "kernel"]
    assert line.split()[:5] == ["draw", "20.0", "us", "3.5", "us"]  # the call, then through Triton's launch
    assert line.endswith(" us   _draw_kernel 1.2 us, _sum_kernel 0.8 us")
    # each kernel is launched on its grid with its arguments in order, outside Triton's launch
    assert stubbed["launched"] == [((4, 1), ("X", 7), {"BLOCK": 16}, False), ((2,), (), {}, False)]
    assert stubbed["op"] == 2  # the call timed, then timed through Triton's launch


@pytest.mark.parametrize("value", ["1", " TRUE ", "on", "Yes"])
def test_main_refuses_to_run_under_the_interpreter(stubbed, monkeypatch, capsys, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert launch_cost.main() == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "launch_cost: TRITON_INTERPRET is set; run it without (unset TRITON_INTERPRET)\n"
    assert stubbed["stubbed"] == 0 and stubbed["op"] == 0


@pytest.mark.parametrize("value", ["0", "", "false"])
def test_main_runs_when_the_interpreter_is_off(stubbed, monkeypatch, capsys, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert launch_cost.main() == 0
    assert stubbed["op"] == 2
