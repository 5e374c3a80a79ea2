"""ddpd.ops._dispatch.launch: a launch of a compiled kernel taken from its cache passes the
kernel what Triton's own launch passes, and the cache never hands a launch a kernel that
Triton would have specialised differently.

Without a GPU: in a child process (no TRITON_INTERPRET), Triton's driver and compiled
kernels are stubbed (ddpd.testing.launches); the stub records every launch's arguments
as the driver would receive them, from Triton's launch and from the cached kernel's.
"""
import itertools
import sys
import types

import pytest
import torch

from ddpd.testing import launches as launch_cost
from hang_guard import run_compiled


@pytest.mark.integration
def test_cached_launches_pass_what_tritons_launch_passes():
    result = run_compiled(__file__, "same-arguments")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("ok ") == len(launch_cost.LAUNCHES), result.stdout


@pytest.mark.integration
def test_equal_launch_keys_mean_equal_triton_specialisations():
    result = run_compiled(__file__, "fineness")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert result.stdout.count("ok ") == len(launch_cost.LAUNCHES), result.stdout


@pytest.mark.integration
def test_misplaced_arguments_are_refused():
    result = run_compiled(__file__, "misplaced")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "ok" in result.stdout


def launch_key():
    from ddpd.ops import _ext

    return _ext.load().launch_key


def test_launch_key_classes():
    """Two bytes an argument: kind (a tensor's dtype) and flags (an int's equality to 1 and
    divisibility by 16, a pointer's low four bits); None for what it does not classify."""
    key = launch_key()
    x = torch.empty(8)
    assert key((None, True, 2.5)) == bytes([1, 0, 2, 0, 3, 0])
    int32, int64, uint64 = 4, 5, 6
    assert key((0, 1, 2, 16, -16)) == bytes([int32, 2, int32, 1, int32, 0, int32, 2, int32, 2])
    assert key((2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1)) == bytes(
        [int32, 0, int64, 2, int32, 2, int64, 0, int64, 0])
    assert key((2**63, 2**64 - 1)) == bytes([uint64, 2, uint64, 0])
    assert key((x,))[1] == 0 and key((x[1:],))[1] == 4 and key((x[2:],))[1] == 8
    assert key((x,))[0] != key((x.to(torch.bfloat16),))[0]
    assert key((torch.nn.Parameter(x),)) == key((x,))
    for unclassified in (2**64, -2**63 - 1, object(), "s", 1 + 2j, torch.int32):
        assert key((1, unclassified)) is None
    assert key(()) == b""
    with pytest.raises(TypeError, match="tuple"):
        key([1])


def launched(monkeypatch, module: str, launcher: str) -> list:
    """The arguments each call of ddpd.ops.<module>.<launcher> is given, the call doing nothing."""
    import importlib

    calls = []
    monkeypatch.setattr(importlib.import_module(f"ddpd.ops.{module}"), launcher,
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def test_launcher_calls_default_to_the_gpu_benchmarks_shapes(monkeypatch):
    assert launch_cost.GPT2 == 50257
    calls = launched(monkeypatch, "sample_categorical", "sample_categorical_triton")
    launch_cost.sample_categorical_call()()
    (logits, *_), kwargs = calls[0]
    assert (logits.shape, logits.dtype, kwargs) == ((64, 50257), torch.bfloat16, dict(eager=True))
    calls = launched(monkeypatch, "sample_from_hidden", "sample_from_hidden_triton")
    launch_cost.sample_from_hidden_call()()
    (hidden, weight, *_), kwargs = calls[0]
    assert (hidden.shape, weight.shape, hidden.dtype, weight.dtype) == ((64, 768), (50257, 768), torch.bfloat16,
                                                                        torch.bfloat16)
    assert kwargs == dict(eager=True)
    calls = launched(monkeypatch, "norm", "norm_triton")
    launch_cost.norm_call()()
    (x, weight, bias), _ = calls[0]
    assert x.shape == (4096, 768) and torch.equal(weight, torch.ones(768)) and torch.equal(bias, torch.zeros(768))
    assert x.dtype == torch.float32
    calls = launched(monkeypatch, "rotary", "rotary_triton")
    launch_cost.rotary_call()()
    (x, cos, sin), _ = calls[0]
    assert (x.shape, x.dtype, cos.shape, sin.shape) == ((64, 12, 256, 64), torch.bfloat16, (256, 32), (256, 32))
    assert cos.dtype == sin.dtype == torch.float32
    calls = launched(monkeypatch, "bernoulli", "bernoulli_triton")
    launch_cost.bernoulli_call(rows=3, width=5, seed=5, offset=7)()
    (p, noise, seed, offset, row_ids, _, _), _ = calls[0]
    assert p.shape == (3, 5) and (noise, seed, offset, row_ids) == (None, 5, 7, None)
    launch_cost.bernoulli_call()()
    (p, *_), _ = calls[1]
    assert (p.shape, p.dtype) == ((64, 1024), torch.float32)
    calls = launched(monkeypatch, "planner_select", "planner_select_triton")
    launch_cost.planner_call()()
    launch_cost.planner_call(with_mask=True)()
    assert [(args[0].shape, args[0].dtype) for args, _ in calls] == [((64, 1024), torch.float32)] * 2
    assert calls[1][1]["mask"][0].shape == (64, 1024)
    calls = launched(monkeypatch, "planner_mask", "planner_mask_triton")
    launch_cost.planner_mask_call()()
    (logits, x, positions, *_), _ = calls[0]
    assert (logits.shape, logits.dtype, x.shape, positions.shape) == ((64, 1024), torch.float32, (64, 1024), (64, 1))


def test_launcher_calls_pass_their_seed_and_offset(monkeypatch):
    calls = launched(monkeypatch, "sample_from_hidden", "sample_from_hidden_triton")
    launch_cost.sample_from_hidden_call(rows=2, width=4, vocab=8, seed=5, offset=7)()
    launch_cost.sample_from_hidden_call(rows=2, width=4, vocab=8, temperature=0.5)()
    (args, _), (tempered, _) = calls
    assert args[9:11] == (5, 7) and tempered[9:11] == (1, 2)  # the default seed and offset
    assert (args[3], tempered[3]) == (1.0, 0.5) and args[4] is None and tempered[4] is None  # a scalar temperature
    calls = launched(monkeypatch, "planner_select", "planner_select_triton")
    launch_cost.planner_call(rows=2, length=8, seed=5, offset=7)()
    launch_cost.planner_call(rows=2, length=8, with_mask=True, seed=5, offset=7)()
    (plain, _), (masked, masked_kwargs) = calls
    assert plain[6] == masked[6] == (5, 7, None, None)
    assert masked_kwargs["mask"][3] == (8, None)  # the mask's draw: the offset after the selection's
    calls = launched(monkeypatch, "planner_mask", "planner_mask_triton")
    launch_cost.planner_mask_call(rows=2, length=8, seed=5, offset=7)()
    (args, _), = calls
    assert args[5] == (5, 7, None, None)


def test_sampling_controls_reach_the_categorical_launch(monkeypatch):
    calls = launched(monkeypatch, "sample_categorical", "sample_categorical_triton")
    launch_cost.sample_categorical_call(rows=2, vocab=300, dtype=torch.float32)()
    launch_cost.sample_categorical_call(rows=2, vocab=300, dtype=torch.float32, top_k=5, top_p=0.9, min_p=0.05,
                                        temperature=0.5)()
    (plain, _), (controlled, _) = calls
    assert plain[0].shape == (2, 300) and plain[0].dtype == torch.float32
    assert (plain[1], plain[6], plain[8], plain[10]) == (1.0, 0, 1.0, float("-inf"))  # no top-k, top-p or min-p
    assert plain[13:15] == (1, 2)  # seed and offset
    assert plain[18] is False and plain[0].is_contiguous()  # no log-probability; rows as the model writes them
    assert controlled[6] == 5 and controlled[8] == pytest.approx(0.9)
    assert controlled[10] == pytest.approx(torch.log(torch.tensor(0.05)).item()) and controlled[1] == 0.5


def test_the_planner_calls_launch_one_kernel_with_or_without_the_mask(monkeypatch):
    calls = launched(monkeypatch, "planner_select", "planner_select_triton")
    launch_cost.planner_call(rows=2, length=8)()
    launch_cost.planner_call(rows=2, length=8, with_mask=True)()
    (plain, plain_kwargs), (masked, masked_kwargs) = calls
    assert plain[0].shape == (2, 8) and plain[1:6] == (1, False, 1.0, 0.01, None) and plain[7] is None
    assert plain_kwargs == {} and masked[1:6] == plain[1:6]
    x, mask_id, noise, _ = masked_kwargs["mask"]
    assert torch.equal(x, torch.zeros(2, 8, dtype=torch.long)) and (mask_id, noise) == (27, None)
    calls = launched(monkeypatch, "planner_mask", "planner_mask_triton")
    launch_cost.planner_mask_call(rows=2, length=8)()
    (logits, x, positions, mask_id, noise, _, row_ids), _ = calls[0]
    assert (logits.shape, x.shape, positions.shape, mask_id, noise, row_ids) == ((2, 8), (2, 8), (2, 1), 27, None,
                                                                                  None)
    assert (x.dtype, positions.dtype) == (torch.long, torch.long)


def test_each_named_launch_builds_its_call(monkeypatch):
    for name, builder in (("sample_categorical", "sample_categorical_call"),
                          ("sample_from_hidden", "sample_from_hidden_call"), ("planner_select", "planner_call"),
                          ("planner_mask", "planner_mask_call"), ("bernoulli", "bernoulli_call"),
                          ("norm", "norm_call"), ("rotary", "rotary_call")):
        assert launch_cost.LAUNCHES[name] is getattr(launch_cost, builder), name
    built = []
    for name in ("sample_categorical_call", "sample_from_hidden_call", "planner_call", "planner_mask_call",
                 "bernoulli_call", "norm_call", "rotary_call"):
        monkeypatch.setattr(launch_cost, name, lambda _name=name, **kwargs: built.append((_name, kwargs)))
    launch_cost.LAUNCHES["sample_categorical top_p"]()
    launch_cost.LAUNCHES["sample_categorical 128256"]()
    launch_cost.LAUNCHES["planner_select_mask"]()
    assert built == [("sample_categorical_call", dict(top_p=0.9)), ("sample_categorical_call", dict(vocab=128256)),
                     ("planner_call", dict(with_mask=True))]
    assert len(launch_cost.LAUNCHES) == 10


def test_records_launches_without_launching_and_puts_tritons_run_back():
    from triton.runtime.jit import JITFunction

    original = JITFunction.run
    kernel = types.SimpleNamespace(arg_names=["x", "n"])
    launches = launch_cost.record_launches(
        lambda: JITFunction.run(kernel, "x", 8, grid=(3, 1, 1), warmup=False, BLOCK=64, num_warps=4))
    assert launches == [(kernel, (3, 1, 1), dict(x="x", n=8), dict(BLOCK=64, num_warps=4))]
    assert JITFunction.run is original

    def fails():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError):
        launch_cost.record_launches(fails)
    assert JITFunction.run is original


def test_tritons_launch_passes_every_launch_to_tritons_run(monkeypatch):
    from triton.runtime.jit import JITFunction

    runs = []
    monkeypatch.setattr(JITFunction, "run", lambda self, *args, **kwargs: runs.append((self, args, kwargs)) or 5)
    tritons = JITFunction.run
    with launch_cost.tritons_launch():
        assert JITFunction.run is not tritons
        assert JITFunction.run("kernel", 1, 2, grid=(1,)) == 5
    assert runs == [("kernel", (1, 2), dict(grid=(1,)))] and JITFunction.run is tritons
    with pytest.raises(RuntimeError):
        with launch_cost.tritons_launch():
            raise RuntimeError("launch failed")
    assert JITFunction.run is tritons


def test_the_stubs_report_an_sm_90_device_and_hand_a_launch_what_the_driver_would_get(monkeypatch):
    from triton import knobs
    from triton.runtime import driver

    stub = launch_cost._StubDriver()
    target = stub.get_current_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 90, 32)
    assert stub.get_current_device() == 0 and stub.get_current_stream(0) == 0
    runs = []
    kernel = launch_cost._StubKernel(lambda *args: runs.append(args))
    kernel[(4, 2, 1)]("x", 7, stream=9)
    assert runs == [(4, 2, 1, 9, 0, (), None, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "x",
                     7)]

    class Driver(launch_cost._StubDriver):
        def get_current_stream(self, device):
            return 100 + device

    monkeypatch.setattr(driver, "_active", Driver())
    kernel[(1, 1, 1)]()
    assert runs[-1][3] == 100  # the current stream of the current device
    assert launch_cost._StubKernel().run(1, 2) is None


def test_stubbing_triton_makes_the_stub_the_active_driver(monkeypatch):
    import importlib

    from triton.runtime import driver

    monkeypatch.setattr(driver, "_active", driver._active)  # put back after the test
    # no kernels to stub: with a GPU they are the process's own, which must keep compiling
    monkeypatch.setattr(importlib, "import_module", lambda name: types.SimpleNamespace())
    launch_cost.stub_triton()
    assert isinstance(driver.active, launch_cost._StubDriver)


# ---- the child process -------------------------------------------------------------------

def as_driver_sees(run: tuple) -> tuple:
    """A recorded launch with each tensor as (dtype, shape, strides, alignment): the outputs
    are allocated anew by every call."""
    return tuple((a.dtype, tuple(a.shape), a.stride(), a.data_ptr() % 16) if isinstance(a, torch.Tensor) else a
                 for a in run)


def same_arguments() -> None:
    """Each op's launcher called twice, first through Triton's launch (JITFunction.run replaced by
    a wrapper, which launch() leaves every launch to), then through the cache: the driver sees
    the same launches, and the second call takes every kernel from the cache."""
    runs, cached = [], []
    launch_cost.stub_triton(on_run=lambda *args: runs.append(as_driver_sees(args)))
    getitem = launch_cost._StubKernel.__getitem__
    launch_cost._StubKernel.__getitem__ = lambda self, grid: cached.append(grid) or getitem(self, grid)
    for name, build in launch_cost.LAUNCHES.items():
        call = build()
        runs[:], cached[:] = [], []
        with launch_cost.tritons_launch():
            call()
        through_triton = list(runs)
        assert not cached, name
        runs[:] = []
        call()  # fills the cache: launch() through Triton, which compiles nothing new
        runs[:], cached[:] = [], []
        call()
        assert len(cached) == len(through_triton) > 0, (name, len(cached), len(through_triton))
        assert runs == through_triton, name
        print(f"ok {name}: {len(runs)} launches")


INTS = (0, 1, 2, 16, 17, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 + 16, 2**63 - 1, 2**63, 2**64 - 16)


def variants(value):
    """Values to put in place of one runtime argument: ints of every class, tensors of other
    alignments and dtypes."""
    if type(value) is int:
        return INTS
    if isinstance(value, torch.Tensor):
        base = torch.empty(value.numel() + 8, dtype=value.dtype)
        return (base[:value.numel()], base[1:value.numel() + 1], base[4:value.numel() + 4],
                torch.empty(value.shape, dtype=torch.float16 if value.dtype != torch.float16 else torch.float32))
    return (value,)


def fineness() -> None:
    """For every runtime argument of every launch, and for pairs of int arguments, each value of
    variants(): launches with equal launch_key classes get equal Triton cache keys (the
    specialisation its binder computes, under each kernel's do_not_specialize)."""
    try:
        from triton.runtime.jit import compute_cache_key
    except ImportError:  # Triton before 3.5 keys its cache as JITFunction.run does here
        def compute_cache_key(key_cache, specialization, options):
            return str(specialization) + str(options)

    launch_cost.stub_triton()
    key = launch_key()
    for name, build in launch_cost.LAUNCHES.items():
        checked = 0
        for kernel, _, args, meta in launch_cost.record_launches(build()):
            values = list(args.values())
            caches = kernel.device_caches[0]  # Triton 3.5 added a cache of keys: 5 entries, 4 before
            key_cache, binder = (caches[1] if len(caches) == 5 else {}), caches[-1]
            seen: dict = {}

            def check(changed):
                nonlocal checked
                ours = key(tuple(changed))
                if ours is None:
                    return
                _, specialisation, options = binder(*changed, **meta)
                theirs = compute_cache_key(key_cache, specialisation, options)
                assert seen.setdefault(ours, theirs) == theirs, (name, kernel.fn.__name__, changed)
                checked += 1

            check(values)
            for i, value in enumerate(values):
                for other in variants(value):
                    check(values[:i] + [other] + values[i + 1:])
            ints = [i for i, v in enumerate(values) if type(v) is int]
            for i, j in itertools.combinations(ints, 2):
                for a, b in itertools.product(INTS[:5], repeat=2):
                    changed = list(values)
                    changed[i], changed[j] = a, b
                    check(changed)
        assert checked > 0, name
        print(f"ok {name}: {checked} launches")


def misplaced() -> None:
    """A constexpr by position, or a runtime argument by name, is a TypeError before anything
    launches."""
    from ddpd.ops import _dispatch

    compiles = []
    launch_cost.stub_triton(on_compile=compiles.append)
    (kernel, grid, args, meta), = launch_cost.record_launches(launch_cost.bernoulli_call())
    values = list(args.values())
    first, *rest = meta.items()
    for wrong_args, wrong_meta in ((values + [first[1]], dict(rest)),
                                   (values[:-1], {kernel.arg_names[len(values) - 1]: values[-1], **meta})):
        try:
            _dispatch.launch(kernel, grid, *wrong_args, **wrong_meta)
        except TypeError as error:
            assert "by position" in str(error), error
        else:
            raise AssertionError(f"launch accepted {len(wrong_args)} positional and {list(wrong_meta)}")
    assert not compiles, compiles
    _dispatch.launch(kernel, grid, *values, **meta)
    assert compiles == [kernel.fn.__name__], compiles
    print("ok")


if __name__ == "__main__":
    {"same-arguments": same_arguments, "fineness": fineness, "misplaced": misplaced}[sys.argv[1]]()
