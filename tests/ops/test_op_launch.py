"""ddpd.ops._dispatch.launch: a launch of a compiled kernel taken from its cache passes the
kernel what Triton's own launch passes, and the cache never hands a launch a kernel that
Triton would have specialised differently.

Without a GPU: in a child process (no TRITON_INTERPRET), Triton's driver and compiled
kernels are stubbed (ddpd.testing.launches); the stub records every launch's arguments
as the driver would receive them, from Triton's launch and from the cached kernel's.
"""
import itertools
import sys

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
