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


def steps(clock: FakeClock, seconds: list):
    """A call that takes the next of `seconds` of host time each time it runs; `ran` counts them."""
    durations = iter(seconds)

    def fn():
        fn.ran += 1
        clock.host(next(durations))

    fn.ran = 0
    return fn


class FakeEvent:
    """A CUDA event of the simulated device: it records when the work launched before it ends."""

    clock: FakeClock

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = None

    def record(self) -> None:
        self.at = max(self.clock.now, self.clock.device_free)

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event gives


def test_median_seconds_is_the_median_of_the_timed_calls_after_the_warmup(clock):
    fn = steps(clock, [100.0, 1.0, 9.0, 2.0])
    assert timing.median_seconds(fn) == 2.0 and fn.ran == 4


def test_median_seconds_makes_warmup_and_repeats_calls(clock):
    fn = steps(clock, [100.0, 100.0, 4.0, 1.0, 3.0, 2.0, 5.0])
    assert timing.median_seconds(fn, repeats=5, warmup=2) == 3.0 and fn.ran == 7


def test_median_seconds_without_warmup_times_the_first_call(clock):
    fn = steps(clock, [7.0])
    assert timing.median_seconds(fn, repeats=1, warmup=0) == 7.0 and fn.ran == 1


def test_median_seconds_of_an_even_count_is_the_mean_of_the_middle_two(clock):
    fn = steps(clock, [100.0, 1.0, 8.0, 2.0, 4.0])
    assert timing.median_seconds(fn, repeats=4) == 3.0


@pytest.mark.parametrize("repeats, warmup", [(0, 1), (3, -1)])
def test_median_seconds_rejects_no_timed_call_or_a_negative_warmup(clock, repeats, warmup):
    with pytest.raises(ValueError, match=f"repeats={repeats}, warmup={warmup}"):
        timing.median_seconds(steps(clock, [1.0] * 5), repeats=repeats, warmup=warmup)


def test_median_seconds_on_cuda_times_the_device_in_seconds(clock, monkeypatch):
    """CUDA events time the kernel, which outlasts the host's launch; the device is synchronised
    around every timed call, not around the warm-up."""
    FakeEvent.clock = clock
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    seconds = timing.median_seconds(call(clock, host=1e-3, kernel=4e-3), cuda=True, repeats=3, warmup=1)
    assert seconds == pytest.approx(5e-3) and clock.syncs == 6


def test_median_seconds_on_cuda_leaves_the_hosts_synchronisation_out(clock, monkeypatch):
    """A synchronisation that costs the host 1 ms once the device is idle: the end event is
    recorded before it, so the time is the call's 5 ms alone."""
    FakeEvent.clock = clock

    def synchronize():
        clock.synchronize()
        clock.host(1e-3)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    seconds = timing.median_seconds(call(clock, host=1e-3, kernel=4e-3), cuda=True, repeats=3, warmup=0)
    assert seconds == pytest.approx(5e-3)


def test_kernel_seconds_on_the_cpu_is_median_seconds_with_one_warmup_call(clock):
    fn = steps(clock, [100.0, 3.0, 1.0, 2.0])
    assert timing.kernel_seconds(fn, cuda=False) == 2.0 and fn.ran == 4


def test_kernel_seconds_on_cuda_is_do_benchs_median_in_seconds(monkeypatch):
    import triton.testing

    asked = {}

    def do_bench(fn, **kwargs):
        asked.update(kwargs, fn=fn)
        return 2.5  # milliseconds

    def work():
        pass

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    assert timing.kernel_seconds(work, cuda=True, rep_ms=40) == pytest.approx(2.5e-3)
    assert asked == {"fn": work, "warmup": 25, "rep": 40, "return_mode": "median"}
    timing.kernel_seconds(lambda: None, cuda=True)
    assert asked["rep"] == 100


@pytest.mark.parametrize("host, calls", [(1e-3, 20), (3e-3, 6), (1.0, 1), (1e-7, 1000), (0.0, 1000)])
def test_eager_seconds_fits_its_calls_per_timing_to_the_budget(clock, host, calls):
    """100 ms over 5 timings: 20 calls of 1 ms each, the whole calls that fit (6 of 3 ms), at
    least 1 and at most 1000 calls, and a call too fast to see still gets a finite count."""
    fn = steps(clock, [host] * 10000)
    seconds = timing.eager_seconds(fn, cuda=False, rep_ms=100, repeats=5)
    assert fn.ran == 3 + 1 + 5 * calls and seconds == pytest.approx(host)


def test_eager_seconds_gives_a_call_too_fast_to_see_the_most_calls_at_the_smallest_budget(clock):
    """1 ms over 5 timings is 200 us a timing: a call the clock cannot see still gets 1000."""
    fn = steps(clock, [0.0] * 10000)
    timing.eager_seconds(fn, cuda=False, rep_ms=1, repeats=5)
    assert fn.ran == 3 + 1 + 5 * 1000


def test_eager_seconds_shares_its_budget_among_its_timings(clock):
    """100 ms over 2 timings: 50 calls of 1 ms each."""
    fn = steps(clock, [1e-3] * 200)
    assert timing.eager_seconds(fn, cuda=False, rep_ms=100, repeats=2) == pytest.approx(1e-3)
    assert fn.ran == 3 + 1 + 2 * 50


def test_eager_seconds_budgets_100_ms_over_5_timings_by_default(clock):
    fn = steps(clock, [1e-3] * 200)
    assert timing.eager_seconds(fn, cuda=False) == pytest.approx(1e-3) and fn.ran == 3 + 1 + 5 * 20


def test_eager_seconds_on_cuda_sizes_its_timings_by_the_device_time_of_a_call(clock):
    """The probe call is synchronised too: 6 ms a call (1 ms launch, 5 ms kernel) fits 3 calls
    in each 20 ms timing, not the 20 its launch alone would."""
    launch = call(clock, host=1e-3, kernel=5e-3)
    ran = []

    def fn():
        ran.append(1)
        launch()

    seconds = timing.eager_seconds(fn, cuda=True, rep_ms=100, repeats=5)
    assert len(ran) == 3 + 1 + 5 * 3 and seconds == pytest.approx((1e-3 + 3 * 5e-3) / 3)


def test_eager_seconds_keeps_the_best_timing(clock):
    """Warm-up and the one probe call, then 5 timings of 1 call each (the probe's second
    overruns the budget): the fastest timing is the answer."""
    fn = steps(clock, [1.0, 1.0, 1.0, 1.0, 3.0, 2.0, 0.5, 4.0, 6.0])
    assert timing.eager_seconds(fn, cuda=False, rep_ms=100, repeats=5) == 0.5 and fn.ran == 9


def test_eager_seconds_on_the_cpu_never_synchronises_a_device(clock):
    timing.eager_seconds(call(clock, host=1e-3, kernel=0.0), cuda=False)
    assert clock.syncs == 0


@pytest.mark.parametrize("rep_ms, repeats", [(100, 0), (0, 5)])
def test_eager_seconds_rejects_no_timing(clock, rep_ms, repeats):
    with pytest.raises(ValueError, match=f"rep_ms={rep_ms}, repeats={repeats}"):
        timing.eager_seconds(call(clock, 1e-6, 1e-6), False, rep_ms=rep_ms, repeats=repeats)


def test_eager_seconds_takes_the_smallest_budget_and_one_timing(clock):
    fn = steps(clock, [1e-3] * 10)
    assert timing.eager_seconds(fn, cuda=False, rep_ms=1, repeats=1) == pytest.approx(1e-3) and fn.ran == 5


def test_best_per_call_warms_up_then_times_the_calls_in_alternation(clock):
    order = []
    a, b = (lambda: order.append("a")), (lambda: order.append("b"))
    timing.best_per_call(a, b, calls=2, repeats=2, warmup=1)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 2


def test_best_per_call_warms_up_each_call_twenty_times_by_default(clock):
    fn = steps(clock, [1.0] * 21)
    timing.best_per_call(fn, calls=1, repeats=1)
    assert fn.ran == 21


def test_best_per_call_gives_each_calls_best_time_per_call_in_order(clock):
    """Two timings of 2 calls each: a takes 3 + 5 then 1 + 1 seconds, b 4 + 4 then 8 + 2."""
    a = steps(clock, [3.0, 5.0, 1.0, 1.0])
    b = steps(clock, [4.0, 4.0, 8.0, 2.0])
    assert timing.best_per_call(a, b, calls=2, repeats=2, warmup=0) == [1.0, 4.0]


def test_best_per_call_counts_the_sync_inside_each_timing(clock):
    """The sync ends each timing before the clock stops, and runs once after the warm-up."""
    syncs = []

    def sync():
        syncs.append(clock.now)
        clock.host(6.0)

    fn = steps(clock, [1.0] * 10)
    assert timing.best_per_call(fn, calls=3, repeats=2, warmup=1, sync=sync) == [pytest.approx(3.0)]
    assert len(syncs) == 3


def test_best_per_call_waits_for_earlier_device_work_even_without_warmup(clock):
    """10 s of device work queued before: the one timing of a 1 s call starts after it."""
    clock.launch(10.0)
    fn = steps(clock, [1.0])
    assert timing.best_per_call(fn, calls=1, repeats=1, warmup=0, sync=clock.synchronize) == [1.0]


@pytest.mark.parametrize("calls, repeats", [(0, 1), (1, 0)])
def test_best_per_call_rejects_no_call_or_no_timing(clock, calls, repeats):
    with pytest.raises(ValueError, match=f"calls={calls}, repeats={repeats}"):
        timing.best_per_call(lambda: None, calls=calls, repeats=repeats)
