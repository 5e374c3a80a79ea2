"""compact_fixed and scatter_back: the C++ kernels against their torch references and
the round trip compact_fixed -> scatter_back, for random batch sizes, capacities and
active patterns (none, all, any), several dtypes and trailing shapes."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from ddpd.ops.compact import compact_fixed, compact_fixed_reference, scatter_back, scatter_back_reference
from hang_guard import HANG_GUARD_SECONDS
from oracles.devices import MISMATCHES, fake_tensors, moved

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]
TRAILING = [(), (1,), (3,), (2, 5), (4, 1, 3)]


def make(rows: int, trailing: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-100, 100, (rows, *trailing), generator=g)
    if dtype == torch.bool:
        return values > 0
    if dtype == torch.uint8:
        return values.abs().to(dtype)
    return values.to(dtype)


@st.composite
def batches(draw):
    rows = draw(st.integers(0, 40))
    pattern = draw(st.sampled_from(["none", "all", "random"]))
    if pattern == "random":
        flags = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    else:
        flags = [pattern == "all"] * rows
    active = torch.tensor(flags, dtype=torch.bool).reshape(rows)
    specs = draw(st.lists(st.tuples(st.sampled_from(DTYPES), st.sampled_from(TRAILING)), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**16))
    tensors = [make(rows, trailing, dtype, seed + i) for i, (dtype, trailing) in enumerate(specs)]
    if draw(st.booleans()) and tensors[0].dim() >= 2:
        tensors[0] = tensors[0].transpose(-1, -2).contiguous().transpose(-1, -2)  # non-contiguous rows
    return active, tensors


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(0, 45))
def test_compact_fixed_matches_reference_and_round_trips(batch, capacity):
    active, tensors = batch
    packed, index, count = compact_fixed(active, capacity, *tensors)
    ref_packed, ref_index, ref_count = compact_fixed_reference(active, capacity, *tensors)
    assert torch.equal(index, ref_index)
    assert count.dim() == 0 and count.dtype == torch.int64 and int(count) == int(ref_count) == int(active.sum())
    assert_same(packed, ref_packed)
    kept = min(capacity, int(active.sum()))
    assert torch.equal(index[:kept], torch.arange(active.shape[0])[active][:kept])
    assert bool((index[kept:] == -1).all())
    for p in packed:
        assert not p[kept:].any()  # padding rows are zero
    for t, p in zip(tensors, packed):
        fast, ref = t.clone().zero_(), t.clone().zero_()
        scatter_back(index, p, fast)
        scatter_back_reference(index, p, ref)
        assert torch.equal(fast, ref)
        written = torch.zeros(active.shape[0], dtype=torch.bool)
        written[index[:kept]] = True
        assert torch.equal(fast[written], t[written]) and not fast[~written].any()


def test_scatter_back_into_noncontiguous_out():
    x = torch.arange(24.0).view(6, 4)
    active = torch.tensor([True, False, True, True, False, False])
    (packed,), index, _ = compact_fixed(active, 6, x)
    out = torch.zeros(4, 6).t()  # [6, 4], not contiguous
    scatter_back(index, packed, out)
    assert torch.equal(out[active], x[active]) and not out[~active].any()


@pytest.mark.parametrize("write", [scatter_back, scatter_back_reference])
def test_scatter_back_refuses_an_out_whose_rows_share_memory(write):
    out = torch.zeros(1, 3).expand(4, 3)  # one row seen four times: a write to one is a write to all
    with pytest.raises(ValueError, match="share memory"):
        write(torch.tensor([0, 2]), torch.ones(2, 3), out)
    assert not out.any()


@pytest.mark.parametrize("write", [scatter_back, scatter_back_reference])
@pytest.mark.parametrize("out", [torch.zeros(1, 3).expand(2, 3), torch.zeros(2, 1).expand(2, 3)])
def test_scatter_back_refuses_an_out_expanded_to_two(write, out):
    """An expanded dimension of size 2 shares memory as one of size 4 does (rows or columns)."""
    with pytest.raises(ValueError, match="share memory"):
        write(torch.tensor([1, 0]), torch.ones(2, 3), out)
    assert not out.any()


@pytest.mark.parametrize("write", [scatter_back, scatter_back_reference])
def test_scatter_back_writes_an_out_whose_stride_is_zero_only_on_a_dimension_of_one(write):
    """A stride of 0 on a dimension of size 1 shares no memory: such an out is written."""
    out = torch.zeros(3).as_strided((3, 1), (1, 0))
    write(torch.tensor([2, 0]), torch.tensor([[5.0], [7.0]]), out)
    assert out.flatten().tolist() == [7.0, 0.0, 5.0]


def test_scatter_back_tells_autograd_that_out_was_written():
    """out saved for a backward and then written by the kernel: the backward refuses the
    stale value, as after any in-place torch op, instead of a wrong gradient."""
    weight = torch.ones(3, requires_grad=True)
    out = torch.zeros(3)
    loss = (weight * out).sum()
    version = out._version
    scatter_back(torch.tensor([1]), torch.ones(1), out)
    assert out._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _aliased(how: str, order: str):
    """(index, packed, out) with packed a view of out's memory from its row 8 on, and the
    rows out should hold afterwards (the reference, on a copy of packed)."""
    rows = 4096
    out = torch.arange(rows * 64.0).view(rows, 64)
    if how == "from_numpy":  # two storages over one numpy array: no shared storage object
        memory = out.numpy()
        out, packed = torch.from_numpy(memory), torch.from_numpy(memory[8:])
    else:
        packed = out[8:]
    index = torch.arange(rows - 8) if order == "shifted" else torch.arange(rows - 9, -1, -1)
    want = scatter_back_reference(index, packed.clone(), out.clone())
    return index, packed, out, want


@pytest.mark.parametrize("order", ["shifted", "reversed"])  # shifted goes wrong in threads, reversed in any
@pytest.mark.parametrize("how", ["eager", "compiled", "from_numpy"])
def test_scatter_back_reads_a_packed_that_shares_memory_with_out_before_writing(how, order):
    index, packed, out, want = _aliased(how, order)
    if how == "compiled":  # a traced call reaches the kernel through the custom op
        torch.compile(lambda i, o: scatter_back(i, o[8:], o), backend="eager", fullgraph=True)(index, out)
    else:
        scatter_back(index, packed, out)
    assert torch.equal(out, want)


def test_scatter_back_skips_negative_entries_anywhere():
    index = torch.tensor([-1, 0, 1, -2, -1, 3, 4, -1])
    packed = torch.arange(16).view(8, 2)
    fast, ref = torch.full((5, 2), -7), torch.full((5, 2), -7)
    scatter_back(index, packed, fast)
    scatter_back_reference(index, packed, ref)
    assert torch.equal(fast, ref)
    assert fast.tolist() == [[2, 3], [4, 5], [-7, -7], [10, 11], [12, 13]]


def test_scatter_back_into_an_inference_tensor_is_refused_outside_inference_mode():
    """torch refuses an in-place write to an inference tensor outside inference mode; the
    kernel path would write it anyway, so such an out goes to torch's own write and error."""
    with torch.inference_mode():
        out = torch.zeros(4, 2)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        scatter_back(torch.tensor([2, -1]), torch.ones(2, 2), out)
    with torch.inference_mode():
        scatter_back(torch.tensor([2, -1]), torch.ones(2, 2), out)
    assert out.tolist() == [[0, 0], [0, 0], [1, 1], [0, 0]]


def test_compact_fixed_without_tensors_and_large_rows():
    active = torch.rand(256, generator=torch.Generator().manual_seed(0)) < 0.5
    n = int(active.sum())
    packed, index, count = compact_fixed(active, 256)
    assert packed == () and int(count) == n and torch.equal(index[:n], active.nonzero().flatten())
    x = torch.randint(0, 50257, (256, 1024))
    (packed,), index, _ = compact_fixed(active, n, x)
    assert torch.equal(packed, x[active])


@pytest.mark.parametrize("threads", [1, 2])
def test_byte_split_over_threads_matches_reference(threads):
    # Rows of 8000, 4000, 4099 and 4 bytes: the byte ranges of the threads start and
    # end inside rows and runs, and padding is split along with the copies.
    g = torch.Generator().manual_seed(3)
    active = torch.rand(300, generator=g) < 0.6
    tensors = [torch.randint(-2**40, 2**40, (300, 1000), generator=g), torch.randn(300, 1000, generator=g),
               torch.randint(-128, 128, (300, 4099), generator=g).to(torch.int8), torch.randn(300, generator=g)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fixed = [compact_fixed(active, capacity, *tensors) for capacity in (100, 300)]
        outs = [torch.zeros_like(t) for t in tensors]
        scatter_back(fixed[1][1], fixed[1][0], outs)
    finally:
        torch.set_num_threads(previous)
    for capacity, (fixed_packed, fixed_index, _) in zip((100, 300), fixed):
        ref_packed, ref_index, _ = compact_fixed_reference(active, capacity, *tensors)
        assert torch.equal(fixed_index, ref_index)
        assert_same(fixed_packed, ref_packed)
    for t, out in zip(tensors, outs):
        assert torch.equal(out[active], t[active]) and not out[~active].any()


ALL3, INDEX2 = torch.ones(3, dtype=torch.bool), torch.zeros(2, dtype=torch.int64)  # argument-error cases


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: compact_fixed(torch.ones(3), 3, torch.ones(3)), ValueError, "active must be a 1-D bool"),
        (lambda: compact_fixed(torch.ones(3, 1, dtype=torch.bool), 3, torch.ones(3)), ValueError,
         "active must be a 1-D bool"),
        (lambda: compact_fixed_reference(torch.ones(1, 3, dtype=torch.bool), 3, torch.ones(1)), ValueError,
         "active must be a 1-D bool"),
        (lambda: compact_fixed([True], 1, torch.ones(1)), TypeError, "active must be a torch.Tensor"),
        (lambda: compact_fixed(torch.tensor(True), 1, torch.ones(1)), ValueError,
         r"^active must be a 1-D bool tensor, got torch.bool of shape \(\)$"),
        (lambda: compact_fixed_reference(torch.tensor(True), 1), ValueError,
         r"^active must be a 1-D bool tensor, got torch.bool of shape \(\)$"),
        (lambda: compact_fixed(ALL3, 3, torch.tensor(1.0)), ValueError, r"tensors\[0\]"),
        (lambda: compact_fixed(ALL3, 3, [1, 2, 3]), TypeError, r"tensors\[0\] must be a torch.Tensor"),
        (lambda: compact_fixed(ALL3, 3, torch.ones(3), torch.ones(3, device="meta")), ValueError,
         r"^tensors\[1\] must be on the device of active \(cpu\), got meta$"),
        (lambda: compact_fixed(ALL3, 3, torch.ones(3).to_sparse()), ValueError, r"tensors\[0\] must be a dense tensor"),
        (lambda: compact_fixed(ALL3, 2, torch.ones(4)), ValueError, r"tensors\[0\] must be a dense tensor with 3 rows"),
        (lambda: compact_fixed(ALL3, 2, torch.ones(2)), ValueError, r"tensors\[0\] must be a dense tensor with 3 rows"),
        (lambda: compact_fixed_reference(torch.tensor([True, False, False]), 2, torch.ones(2)), ValueError,
         r"tensors\[0\] must be a dense tensor with 3 rows"),  # fewer rows than active, though index fits them
        (lambda: compact_fixed(ALL3, 2, torch.ones(3), "x"), TypeError, r"tensors\[1\] must be a torch.Tensor"),
        (lambda: compact_fixed(ALL3), TypeError, "missing 1 required positional argument: 'capacity'"),
        (lambda: compact_fixed(ALL3, -1), ValueError, "capacity must be >= 0"),
        (lambda: compact_fixed(ALL3, 2.0), TypeError, "capacity must be an int"),
        (lambda: compact_fixed(ALL3, 2**63, torch.ones(3)), ValueError,
         r"^capacity must be < 2\*\*63, got 9223372036854775808$"),
        (lambda: compact_fixed_reference(ALL3, 2**63), ValueError,
         r"^capacity must be < 2\*\*63, got 9223372036854775808$"),
        (lambda: compact_fixed(ALL3, True, torch.ones(3)), TypeError, "capacity must be an int, got bool"),
        (lambda: scatter_back([0, 1], torch.ones(2), torch.ones(3)), TypeError, "index must be a torch.Tensor"),
        (lambda: scatter_back(INDEX2, ["x"], [torch.ones(3)]), TypeError, r"packed\[0\] and out\[0\] must be tensors"),
        (lambda: scatter_back(INDEX2, [torch.ones(2)], [None]), TypeError, r"packed\[0\] and out\[0\] must be tensors"),
        (lambda: scatter_back(torch.zeros(2, dtype=torch.int32), torch.ones(2), torch.ones(3)), ValueError,
         "index must be a 1-D int64"),
        (lambda: scatter_back(torch.zeros(2, 1, dtype=torch.int64), torch.ones(2), torch.ones(3)), ValueError,
         "index must be a 1-D int64"),
        (lambda: scatter_back(INDEX2, torch.ones(3), torch.ones(3)), ValueError, r"packed\[0\] must have shape"),
        (lambda: scatter_back(INDEX2, torch.ones(2, 2), torch.ones(3, 3)), ValueError, r"packed\[0\] must have shape"),
        (lambda: scatter_back(INDEX2, torch.ones(2), torch.tensor(1.0)), ValueError, r"packed\[0\] must have shape"),
        (lambda: scatter_back(INDEX2, torch.ones(2), torch.ones(3, dtype=torch.float64)), ValueError, "dtype"),
        (lambda: scatter_back(INDEX2, torch.ones(2, device="meta"), torch.ones(3)), ValueError,
         r"^packed\[0\] must be on the device of index \(cpu\), got meta$"),
        (lambda: scatter_back(INDEX2, torch.ones(2), torch.ones(3, device="meta")), ValueError,
         r"^out\[0\] must be on the device of index \(cpu\), got meta$"),
        (lambda: scatter_back(torch.tensor([0, 3]), torch.ones(2), torch.ones(3)), ValueError,
         r"index values must be < out.shape\[0\] = 3"),
        (lambda: scatter_back(torch.tensor([0, 4]), [torch.ones(2)] * 2, [torch.ones(5), torch.ones(3)]), ValueError,
         r"index values must be < out.shape\[0\] = 3"),  # the shortest out
        (lambda: scatter_back(torch.tensor([3, 0, -1]), torch.ones(3), torch.ones(3)), ValueError,
         r"^index values must be < out.shape\[0\] = 3, got 3$"),  # the largest entry, wherever it is
        (lambda: scatter_back_reference(torch.tensor([3, 0, -1]), torch.ones(3), torch.ones(3)), ValueError,
         r"^index values must be < out.shape\[0\] = 3, got 3$"),
        (lambda: scatter_back(torch.tensor([0, 1]), torch.ones(2), [torch.ones(3)]), TypeError,
         "both be tensors or both be sequences"),
        (lambda: scatter_back(torch.tensor([0, 1]), [torch.ones(2)], [torch.ones(3), torch.ones(3)]), ValueError,
         "same length"),
    ],
)
def test_argument_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("op", [compact_fixed, compact_fixed_reference])
def test_a_tensor_on_another_device_than_active_is_refused(op, like, other):
    """A tensor to pack on another device than active: the op's own ValueError, naming the tensor,
    active and both devices (it said "must be on cpu like active", naming no device it got). Fake
    tensors stand in for a GPU."""
    with fake_tensors(like):
        tensors = (torch.ones(3), torch.ones(3, 2, device=other))
        with pytest.raises(ValueError, match=rf"^tensors\[1\] must be on the device of active \({like}\), "
                                             rf"got {other}$"):
            op(torch.ones(3, dtype=torch.bool), 2, *tensors)


@pytest.mark.parametrize("like, other", MISMATCHES)
@pytest.mark.parametrize("name", ["packed", "out"])
@pytest.mark.parametrize("op", [scatter_back, scatter_back_reference])
def test_packed_or_out_on_another_device_than_index_is_refused(op, name, like, other):
    """packed[i] or out[i] on another device than index: the op's own ValueError, naming that
    tensor, index and both devices (it named packed and out together and not the device it got).
    Fake tensors stand in for a GPU."""
    with fake_tensors(like):
        given = dict(packed=[torch.ones(2), torch.ones(2)], out=[torch.ones(3), torch.ones(3)])
        given[name][1] = moved(given[name][1], other)
        with pytest.raises(ValueError, match=rf"^{name}\[1\] must be on the device of index \({like}\), "
                                             rf"got {other}$"):
            op(torch.zeros(2, dtype=torch.int64), given["packed"], given["out"])


def test_a_kernel_error_that_is_no_argument_error_is_raised_as_it_is():
    """compact_fixed checks the rows only when the kernel fails: an error the rows do not
    explain (a capacity whose rows cannot be sized) comes out unchanged, as from the reference."""
    for fn in (compact_fixed, compact_fixed_reference):
        with pytest.raises(RuntimeError, match="Storage size calculation overflowed"):
            fn(ALL3, 2**62, torch.ones(3))


def test_a_device_without_kernels_runs_the_references(monkeypatch):
    """Where ddpd._C has no kernels for the device (CUDA tensors of a build without the CUDA
    toolkit) both ops run their references: the same packed rows, index, count and writes."""
    from ddpd.ops import _ext, compact

    active, x = torch.tensor([False, True, True, False, True]), torch.arange(10.0).reshape(5, 2)
    want = compact_fixed(active, 4, x)
    index = torch.tensor([4, -1, 0])
    out_want = scatter_back(index, x[:3] + 100, x.clone())
    monkeypatch.setattr(compact, "_kernels", {})
    monkeypatch.setattr(_ext, "ops_for", lambda device: None)
    got = compact_fixed(active, 4, x)
    assert_same(got.tensors, want.tensors)
    assert torch.equal(got.index, want.index) and torch.equal(got.count, want.count)
    assert torch.equal(scatter_back(index, x[:3] + 100, x.clone()), out_want)
    assert compact._kernels == {"cpu": None}


def test_vmap_is_refused_with_a_clear_error():
    """A kernel cannot read vmap's batched tensors: both ops refuse them by name."""
    active, x = torch.ones(4, 3, dtype=torch.bool), torch.randn(4, 3, 2)
    with pytest.raises(ValueError, match="ddpd.ops.compact_fixed does not run under torch.func transforms"):
        torch.vmap(lambda a: compact_fixed(a, 2, x[0]).index)(active)
    with pytest.raises(ValueError, match="ddpd.ops.compact_fixed does not run under torch.func transforms"):
        torch.vmap(lambda t: compact_fixed(active[0], 2, t).index)(x)
    with pytest.raises(ValueError, match="ddpd.ops.scatter_back does not run under torch.func transforms"):
        torch.vmap(lambda p: scatter_back(torch.tensor([2, 0, 1]), p, torch.zeros(3, 2)))(x)
    with pytest.raises(ValueError, match="ddpd.ops.scatter_back does not run under torch.func transforms"):
        torch.vmap(lambda p: scatter_back(torch.tensor([2, 0, 1]), [p], [torch.zeros(3, 2)]))(x)
    for wrap in (lambda t: t, lambda t: [t]):  # out alone batched: torch's "Batching rule not implemented"
        with pytest.raises(ValueError, match="ddpd.ops.scatter_back does not run under torch.func transforms"):
            torch.vmap(lambda o: scatter_back(torch.tensor([2, 0, 1]), wrap(torch.ones(3, 2)), wrap(o)))(x.clone())


def test_scatter_back_with_no_tensors_returns_them_and_reads_no_out_row_count():
    """Empty sequences for packed and out: nothing to write and no out to bound the index by,
    so any index is accepted and out comes back as given."""
    for write in (scatter_back, scatter_back_reference):
        packed, out = [], []
        assert write(torch.tensor([0, 5]), packed, out) is out and out == []


def test_a_tensor_that_requires_grad_takes_the_kernels_when_grad_is_disabled(monkeypatch):
    """Only a call autograd must see (grad enabled and a tensor that requires grad) runs the
    references: under no_grad such tensors go to the kernels like any other."""
    from ddpd.ops import compact

    def refused(*args):
        raise AssertionError("the reference ran")

    x = torch.arange(8.0).reshape(4, 2).requires_grad_()
    active = torch.tensor([False, True, True, False])
    monkeypatch.setattr(compact, "compact_fixed_reference", refused)
    monkeypatch.setattr(compact, "scatter_back_reference", refused)
    with torch.no_grad():
        (packed,), index, count = compact_fixed(active, 3, x)
        out = torch.zeros(4, 2, requires_grad=True)
        scatter_back(index, packed, out)
    assert packed.tolist() == [[2, 3], [4, 5], [0, 0]] and index.tolist() == [1, 2, -1] and int(count) == 2
    assert out.tolist() == [[0, 0], [2, 3], [4, 5], [0, 0]]
    with pytest.raises(AssertionError, match="the reference ran"):
        compact_fixed(active, 3, x)


def test_scatter_back_checks_its_index_under_a_mode_that_traces_nothing():
    """A flop counter traces nothing: an index past out is still refused, not skipped."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        with pytest.raises(ValueError, match=r"index values must be < out.shape\[0\] = 3"):
            scatter_back(torch.tensor([0, 3]), torch.ones(2), torch.ones(3))


@pytest.mark.gpu
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(1)
    active = torch.rand(256, generator=g) < 0.4
    x, t = torch.randint(0, 50257, (256, 1024), generator=g), torch.rand(256, generator=g)
    h = torch.randn(256, 3, 5, generator=g).half()
    for capacity in (0, 50, 300):
        fast = compact_fixed(active.cuda(), capacity, x.cuda(), t.cuda(), h.cuda())
        ref = compact_fixed(active, capacity, x, t, h)
        assert torch.equal(fast[1].cpu(), ref[1]) and int(fast[2]) == int(ref[2])
        assert all(torch.equal(a.cpu(), b) for a, b in zip(fast[0], ref[0]))
        out = torch.zeros_like(x).cuda()
        scatter_back(fast[1], fast[0][0], out)
        assert torch.equal(out.cpu(), scatter_back(ref[1], ref[0][0], torch.zeros_like(x)))


@pytest.mark.gpu
def test_cuda_scatter_back_reads_a_packed_that_shares_memory_with_out_before_writing():
    index, _, out, want = _aliased("eager", "reversed")
    out = out.cuda()
    scatter_back(index.cuda(), out[8:], out)
    assert torch.equal(out.cpu(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("on_host", ["index", "packed"])
def test_cuda_scatter_back_kernel_refuses_a_tensor_on_the_host(on_host):
    """The op called directly (no Python checks): any CUDA tensor sends the call to the CUDA
    kernel, which must not hand a host pointer to the device."""
    tensors = {"index": torch.tensor([1, 0]), "packed": torch.ones(2, 3)}
    tensors = {name: t if name == on_host else t.cuda() for name, t in tensors.items()}
    out = torch.zeros(2, 3, device="cuda")
    with pytest.raises(RuntimeError, match="scatter_back: index and packed must be on cuda:0 like out"):
        torch.ops.ddpd.scatter_back(tensors["index"], tensors["packed"], out)


@pytest.mark.gpu
def test_cuda_compact_fixed_and_scatter_back_do_not_synchronise():
    active = (torch.arange(512, device="cuda") % 3) == 0
    x = torch.randn(512, 64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        (packed,), index, count = compact_fixed(active, 256, x)
        scatter_back(index, packed, torch.zeros_like(x))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_opcheck_and_compile():
    """compact_fixed and scatter_back are custom ops with fake kernels: opcheck passes and a
    compiled compaction round trip (no data-dependent guard, no lock) equals the eager one."""
    g = torch.Generator().manual_seed(5)
    active = torch.rand(40, generator=g) < 0.5
    x, t = torch.randn(40, 3, generator=g), torch.randint(0, 9, (40,), generator=g)
    torch.library.opcheck(torch.ops.ddpd.compact_fixed.default, (active, 25, [x, t]))
    packed, index, _ = compact_fixed(active, 25, x)
    torch.library.opcheck(torch.ops.ddpd.scatter_back.default, (index, packed[0], torch.zeros_like(x)))

    def round_trip(flags, a, b):
        (pa, pb), idx, count = compact_fixed(flags, 25, a, b)
        out_a, out_b = torch.zeros_like(a), torch.zeros_like(b)
        scatter_back(idx, (pa * 2, pb + 1), (out_a, out_b))
        return out_a, out_b, count

    compiled = torch.compile(round_trip, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(active, x, t), round_trip(active, x, t)):
        assert torch.equal(got, want)


@pytest.mark.integration
def test_the_ops_exist_in_a_fresh_process_after_importing_ddpd_ops():
    """The custom ops are defined in Python at import: no eager call needs to load the
    extension first for torch.ops.ddpd.compact_fixed to exist (or to trace it)."""
    import subprocess
    import sys

    script = ("import torch, ddpd.ops\n"
              "for name in ('compact_fixed', 'scatter_back', 'multinomial', 'sample_categorical', 'bernoulli'):\n"
              "    assert hasattr(torch.ops.ddpd, name), name\n"
              "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.parametrize("op", [compact_fixed, compact_fixed_reference])
def test_a_numpy_integer_capacity_compacts_as_an_int_does(op):
    """A numpy capacity (a row count computed with numpy) was refused as not an int."""
    active = torch.tensor([True, False, True, True])
    got, want = op(active, np.int64(3), torch.arange(4.0)), op(active, 3, torch.arange(4.0))
    assert torch.equal(got.tensors[0], want.tensors[0]) and torch.equal(got.index, want.index)
    assert torch.equal(got.count, want.count)
    with pytest.raises(TypeError, match="^capacity must be an int, got float32"):
        op(active, np.float32(3))


def test_the_scatter_back_kernel_refuses_an_index_past_out_by_itself():
    """The kernel range-checks the index itself (torch.ops.ddpd.scatter_back_kernel skips
    the op's check): an entry past out is refused by position and value, one at out's last
    row is written."""
    from ddpd.ops import _ext

    kernel = _ext.ops_for(torch.device("cpu")).scatter_back_kernel
    out = torch.zeros(3, 2)
    with pytest.raises(RuntimeError, match=r"scatter_back: index\[2\] = 3 is out of range for out with 3 rows"):
        kernel(torch.tensor([1, 2, 3]), torch.ones(3, 2), out)
    kernel(torch.tensor([-1, 2]), torch.ones(2, 2), out)
    assert out.tolist() == [[0, 0], [0, 0], [1, 1]]


def test_the_compact_fixed_kernel_refuses_a_negative_capacity_by_itself():
    from ddpd.ops import _ext

    kernel = _ext.ops_for(torch.device("cpu")).compact_fixed_kernel
    with pytest.raises(RuntimeError, match="compact_fixed: capacity must be >= 0, got -1"):
        kernel(torch.ones(3, dtype=torch.bool), -1, [torch.ones(3)])
    packed, index, count = kernel(torch.ones(3, dtype=torch.bool), 0, [torch.ones(3)])
    assert packed[0].shape == (0,) and index.shape == (0,) and int(count) == 3
