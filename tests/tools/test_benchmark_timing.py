"""ddpd/testing/timing.py, the benchmarks' timer: an eager call's time holds its host cost,
whatever the device does meanwhile. No real clock decides a test: time.perf_counter and
the device are simulated."""
import pytest
import torch

from ddpd.testing import timing


class FakeClock:
    """time.perf_counter and time.sleep of a simulated host, and a simulated device that runs
    each launched kernel after the one before (torch.cuda.synchronize waits for it)."""

    def __init__(self):
        self.now = 0.0
        self.device_free = 0.0
        self.syncs = 0

    def perf_counter(self) -> float:
        return self.now

    def host(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, seconds: float) -> None:
        self.device_free = max(self.now, self.device_free) + seconds

    def synchronize(self) -> None:
        self.syncs += 1
        self.now = max(self.now, self.device_free)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    return fake


def call(clock: FakeClock, host: float, kernel: float):
    def fn():
        clock.host(host)  # the Python work and the launch
        clock.launch(kernel)

    return fn


@pytest.mark.parametrize("cuda", [False, True])
def test_an_eager_call_counts_its_host_cost(clock, cuda):
    """A call whose host work outlasts its kernel costs its host time a call."""
    seconds = timing.eager_seconds(call(clock, host=40e-6, kernel=10e-6), cuda)
    assert seconds == pytest.approx(40e-6, rel=0.01)


def test_an_eager_call_counts_its_device_time_on_cuda(clock):
    """A kernel longer than its launch: the device's time is what a loop of calls takes, and
    the device is synchronised before the clock stops."""
    seconds = timing.eager_seconds(call(clock, host=5e-6, kernel=30e-6), cuda=True)
    assert seconds == pytest.approx(30e-6, rel=0.05) and clock.syncs > 0


def test_eager_seconds_rejects_a_budget_below_one_call(clock):
    with pytest.raises(ValueError, match="rep_ms"):
        timing.eager_seconds(call(clock, 1e-6, 1e-6), False, rep_ms=0)
