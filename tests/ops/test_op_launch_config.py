"""The GPU grids of every op at the benchmarked shapes (and the sampler's
planner shapes), computed on the CPU by the launch-configuration code the ops run,
for a 132-SM device (an H100 SXM): the pass that reads the input has at least one
program per multiprocessor wherever there are 64 rows or more.

The per-row finishing passes (sample_categorical's and sample_from_hidden's tile race
over a few hundred statistics, multinomial's sequential draws) have one program per
row by design: what they read per row is bounded (asserted below), not the input.
A row of a single tile (V <= 256) is one program's whole work: 64 such rows are 64
programs of a few hundred elements, nothing to split."""
import re
import types

import pytest
import torch

from ddpd.ops import _dispatch, _ext
from ddpd.ops.bernoulli import BLOCK as BERNOULLI_BLOCK, bernoulli_grid
from ddpd.ops.norm import norm_launch
from ddpd.ops.rng import PHILOX_BLOCK
from ddpd.ops.rotary import rotary_launch
from ddpd.ops.sample_categorical import TILE, categorical_launch, n_tiles
from ddpd.ops.sample_from_hidden import WIDE_H, head_launch, head_logits_grid

SMS = 132  # H100 SXM; an H200 has the same count
GPT2, LLAMA3 = 50257, 128256


def programs(grid) -> int:
    total = 1
    for size in grid:
        total *= size
    return total


@pytest.mark.parametrize("rows,vocab", [(1, GPT2), (64, GPT2), (256, GPT2), (1024, GPT2), (4096, 27), (64, LLAMA3),
                                        (8, 1000)])
def test_sample_categorical_grids_fill_the_device(rows, vocab):
    launch = categorical_launch(rows, vocab, SMS)
    streaming = launch.stats_grid or launch.finish_grid  # one tile: the finish pass reads the row
    if rows >= 64:
        assert programs(streaming) >= SMS, (rows, vocab, launch)
    if rows == 1 and vocab == GPT2:
        assert launch.tiles_per_split == 1 and programs(streaming) == n_tiles(vocab)  # one tile per program
    # every tile is covered exactly once
    tiles = n_tiles(vocab)
    assert launch.splits * launch.tiles_per_split >= tiles > (launch.splits - 1) * launch.tiles_per_split
    # the finish pass reads two floats per tile and one float32 tile of logits per row: a
    # small part of a row even in 16 bits
    assert launch.finish_grid == (rows,)
    if vocab >= GPT2:
        assert 8 * tiles + 4 * TILE < 2 * vocab / 8


@pytest.mark.parametrize("rows,width,vocab,element_size", [(1, 768, GPT2, 2), (64, 768, GPT2, 2),
                                                           (256, 768, GPT2, 2), (64, 4096, LLAMA3, 2),
                                                           (64, 256, GPT2, 4), (4096, 256, 28, 4),
                                                           (64, WIDE_H, GPT2, 2), (16, 256, 2 * TILE, 4)])
def test_sample_from_hidden_grids_fill_the_device(rows, width, vocab, element_size):
    launch = head_launch(rows, width, vocab, element_size, SMS)
    if rows >= 64:
        assert programs(launch.tiles_grid) >= SMS, launch
    row_blocks, splits = launch.tiles_grid
    assert row_blocks * launch.block_n >= rows > (row_blocks - 1) * launch.block_n
    assert splits * launch.tiles_per_split >= n_tiles(vocab) > (splits - 1) * launch.tiles_per_split
    assert head_logits_grid(launch, vocab) == (row_blocks * n_tiles(vocab),)  # a program a (row block, tile)
    assert width % launch.block_h == 0  # full slices of H at these shapes
    assert launch.block_h == (64 if element_size == 2 else 32), launch
    # wide row blocks (head_launch says why), none wider than the rows
    wide_or_f32 = width >= WIDE_H or element_size == 4
    widest = 64 if wide_or_f32 else 32
    assert launch.block_n == max(16, min(widest, 1 << (rows - 1).bit_length())) or (
        launch.block_n < widest and -(-rows // (2 * launch.block_n)) * n_tiles(vocab) < SMS), launch
    assert launch.num_warps == (8 if wide_or_f32 or rows > 64 else 4), launch
    assert launch.num_stages == (4 if width >= WIDE_H and element_size == 2 else 3), launch
    assert (launch.finish_grid is None) == (vocab <= TILE)


@pytest.mark.parametrize("rows,n,replacement", [(64, GPT2, False), (64, GPT2, True), (512, GPT2, False),
                                                (4096, 27, False), (64, LLAMA3, False), (1, GPT2, True),
                                                (64, 27, True), (2**24, 64, False), (7, 65, False)])
def test_multinomial_grids_fill_the_device(rows, n, replacement):
    _ext.load()
    inline, splits, sum_blocks, draw_blocks, draw_threads, shared, short = torch.ops.ddpd.multinomial_launch(
        rows, n, replacement, SMS)
    chunks = -(-n // 64)
    assert bool(short) == (chunks == 1)
    if short:  # rows of one chunk: a thread a row, one launch
        assert inline and 1 <= draw_threads <= 256 and draw_blocks == -(-rows // draw_threads)
        # a row's draws are one chain in one thread: fewer rows than multiprocessors cannot use
        # them all, and then each row gets one to itself
        assert draw_blocks >= min(rows, SMS)
        streaming = max(draw_blocks, SMS) if rows < SMS else draw_blocks
    elif inline:  # rows of up to 32 chunks: eight rows per block, one launch
        assert chunks <= 32 and draw_threads == 256 and draw_blocks == -(-rows // 8)
        streaming = draw_blocks
    else:
        assert sum_blocks == rows * splits and draw_blocks == rows and draw_threads == 32
        streaming = sum_blocks
    if rows >= 64:
        assert streaming >= SMS, (rows, n, splits, sum_blocks, draw_blocks)
    if (rows, n) == (64, GPT2):
        assert shared  # the draw state of a GPT-2 row sits in shared memory


def within_cuda_limits(grid) -> bool:
    """A CUDA grid: up to 2**31 - 1 blocks on x, 65535 on y and z."""
    return 1 <= len(grid) <= 3 and grid[0] <= 2**31 - 1 and all(size <= 65535 for size in grid[1:])


@pytest.mark.parametrize("rows,vocab", [(1, 2**30 - 1), (2**20, 151936), (2**24, 27), (3, 70_000_000)])
def test_every_grid_launches_at_the_largest_shapes_the_ops_accept(rows, vocab):
    """Vocabularies and widths up to 2**30 - 1 are accepted: no grid axis may pass CUDA's limits
    there (bernoulli's column blocks and the logits GEMM's tiles sat on a y axis, capped at
    65535: D over 67M or V over 16.7M failed to launch)."""
    launch = categorical_launch(rows, vocab, SMS)
    assert all(within_cuda_limits(g) for g in (launch.stats_grid, launch.finish_grid) if g)
    for block_n_rows in (rows, 64):
        head = head_launch(block_n_rows, 4096, vocab, 2, SMS)
        assert within_cuda_limits(head.tiles_grid) and within_cuda_limits(head_logits_grid(head, vocab))
        assert head.finish_grid is None or within_cuda_limits(head.finish_grid)
    assert within_cuda_limits(bernoulli_grid(rows, vocab))
    assert bernoulli_grid(rows, vocab)[0] * BERNOULLI_BLOCK >= rows * vocab  # every column covered


def test_a_flat_grid_past_cudas_x_axis_is_refused_before_launching():
    """bernoulli and philox_uniform run a program per 1024 columns of a row on the x axis:
    past 2**31 - 1 programs (p of [2**31, 1], 8 GiB in float32) the launch would fail."""
    assert bernoulli_grid(2**31 - 1, 1) == (2**31 - 1,)
    with pytest.raises(ValueError, match=r"p of 2147483648 rows x 1 columns needs 2147483648 programs"):
        bernoulli_grid(2**31, 1)
    with pytest.raises(ValueError, match="split it into smaller calls"):
        _dispatch.flat_grid("the uniforms", 2**21, 2**20 + 1, PHILOX_BLOCK)


def test_row_widths_are_checked_in_one_to_max_width():
    """check_width's bounds, both ends: a row of no columns reaches no kernel (planner_mask's
    C++ kernel divides by D: a floating point exception would end the process)."""
    from ddpd.ops import norm, planner_mask

    for size in (1, _dispatch.MAX_WIDTH - 1):
        _dispatch.check_width("V", size)
    for size in (0, _dispatch.MAX_WIDTH):
        with pytest.raises(ValueError, match=rf"V must be in \[1, {_dispatch.MAX_WIDTH}\), got {size}"):
            _dispatch.check_width("V", size)
    with pytest.raises(ValueError, match=r"D \(logits.shape\[1\]\) must be in \[1, "):
        planner_mask(torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.int64), None, 5, seed=0)
    with pytest.raises(ValueError, match="x's last dimension must be in"):
        norm(torch.zeros(2, 0), torch.ones(0), torch.zeros(0), 1e-5)


@pytest.mark.parametrize("batch,heads,length,head_dim", [(64, 4, 256, 64), (512, 4, 256, 64), (16, 12, 1024, 64)])
def test_rotary_grids_fill_the_device(batch, heads, length, head_dim):
    """The rotation of q at the sampling benchmarks' shapes (the bundled model at batches 64
    and 512, the GPT-2-size pair): a program per multiprocessor at least, every position once."""
    grid, block_l, block_half = rotary_launch(batch, heads, length, head_dim // 2)
    blocks = grid[0] // (batch * heads)
    assert len(grid) == 1 and programs(grid) >= SMS and grid[0] == batch * heads * blocks
    assert block_half >= head_dim // 2 and blocks * block_l >= length > (blocks - 1) * block_l


@pytest.mark.parametrize("batch,length,width", [(64, 256, 256), (512, 256, 256), (16, 1024, 768), (1, 256, 4096)])
def test_norm_grids_fill_the_device(batch, length, width):
    """The networks' norms at the sampling benchmarks' shapes (and a long row of a large
    model at batch 1): a program per multiprocessor at least, every row once, a whole row
    in each program."""
    rows = batch * length
    grid, block_rows, block_w, num_warps = norm_launch(rows, width)
    assert len(grid) == 1 and programs(grid) >= SMS and within_cuda_limits(grid)
    assert grid[0] * block_rows >= rows > (grid[0] - 1) * block_rows and block_w >= width
    assert num_warps * 32 * 32 >= block_rows * block_w  # at most 32 values a thread


def test_a_flat_grid_rounds_a_partial_block_of_each_row_up_to_a_program():
    """A program per started block of every row: a row's last, partial block still gets one."""
    assert _dispatch.flat_grid("p", 3, 1025, 1024) == (6,)
    assert _dispatch.flat_grid("p", 3, 1024, 1024) == (3,)
    assert _dispatch.flat_grid("p", 1, 1, 1024) == (1,)


def test_device_ids_are_cached_long_tensors_with_one_unused_zero_when_empty():
    """The kernels read at least one id and index with int64; a repeated call copies nothing."""
    cpu = torch.device("cpu")
    ids = _dispatch.device_ids((3, 1, 4), cpu)
    assert ids.dtype == torch.int64 and ids.tolist() == [3, 1, 4] and ids.device == cpu
    assert _dispatch.device_ids((3, 1, 4), cpu) is ids
    empty = _dispatch.device_ids((), cpu)
    assert empty.dtype == torch.int64 and empty.tolist() == [0]


def test_the_unused_output_is_one_empty_float32_tensor_a_device():
    unused = _dispatch.unused_output(torch.device("cpu"))
    assert unused.dtype == torch.float32 and unused.numel() == 0 and unused.device.type == "cpu"
    assert _dispatch.unused_output(torch.device("cpu")) is unused


def test_contiguous_detaches_and_packs_tensors_and_keeps_none():
    x = torch.arange(12.0, requires_grad=True).reshape(3, 4)
    strided = x.t()
    packed, none = _dispatch.contiguous(strided, None)
    assert none is None and packed.is_contiguous() and not packed.requires_grad
    assert torch.equal(packed, strided.detach())


def test_cpu_devices_get_the_interpreters_multiprocessor_count():
    """CPU tensors run Triton's interpreter: no CUDA properties to read, a few splits instead.
    Only a CUDA device is asked for its own count (a meta device has none)."""
    assert _dispatch.multiprocessors(torch.device("cpu")) == _dispatch.INTERPRETER_MULTIPROCESSORS == 4
    assert _dispatch.multiprocessors(torch.device("meta")) == 4


def test_needs_grad_only_when_grad_is_enabled_and_an_input_requires_it():
    plain, leaf = torch.ones(2), torch.ones(2, requires_grad=True)
    assert _dispatch.needs_grad(None, plain, leaf)
    assert not _dispatch.needs_grad(None, plain)
    assert not _dispatch.needs_grad()
    with torch.no_grad():
        assert not _dispatch.needs_grad(leaf)


def test_eager_calls_skip_none_and_refuse_tensor_subclasses():
    """Only plain tensors go straight to a kernel; a Parameter (a subclass) goes through the custom op."""
    assert _dispatch.eager(None, torch.ones(1), None)
    assert not _dispatch.eager(torch.ones(1), torch.nn.Parameter(torch.ones(1)))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_calls_under_a_default_device_stay_eager_and_jit_traced_calls_do_not():
    with torch.device("cpu"):
        assert _dispatch.eager(torch.ones(1))
    seen = []
    torch.jit.trace(lambda x: seen.append(_dispatch.eager(x)) or x + 1, torch.ones(1), check_trace=False)
    assert seen == [False]


def test_triton_is_unavailable_when_its_import_fails(monkeypatch):
    """Any failure of the import (a broken install raises its own errors) means no Triton."""
    def broken(name):
        raise RuntimeError(f"{name} is broken")

    monkeypatch.setattr(_dispatch.importlib, "import_module", broken)
    assert _dispatch.triton_available.__wrapped__() is False
    monkeypatch.undo()
    assert _dispatch.triton_available.__wrapped__() is True


def test_only_tritons_own_jit_run_counts_as_tritons_launch():
    """A replaced JITFunction.run (a tool recording launches) must see every launch."""
    from triton.runtime.jit import JITFunction

    def run(*args, **kwargs):
        return JITFunction.run(*args, **kwargs)

    assert _dispatch._tritons_run(JITFunction.run)
    assert not _dispatch._tritons_run(run)
    run.__module__ = "triton.runtime.jit"
    assert not _dispatch._tritons_run(run)


def test_cpu_kernels_are_looked_up_once_by_name():
    kernel = _dispatch.cpu_kernel("bernoulli_cpu")
    assert kernel is torch.ops.ddpd.bernoulli_cpu.default
    assert _dispatch.cpu_kernel("bernoulli_cpu") is kernel


def test_transformed_inputs_are_refused_with_the_ops_name():
    x = torch.ones(2, 3)

    def call(row):
        _dispatch.refuse_transforms("compact_fixed", row, 5)
        return row

    message = ("ddpd.ops.compact_fixed does not run under torch.func transforms (vmap, grad): under vmap every "
               "slice would draw from the same row streams. Pass the batch as rows instead (sample_categorical "
               "and sample_from_hidden take any leading shape; give distinct row_ids for distinct streams)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        torch.func.vmap(call)(x)
    _dispatch.refuse_transforms("compact_fixed", x, None, 5)


class _Param:
    def __init__(self, name, is_constexpr, default=None):
        self.name, self.is_constexpr, self.default = name, is_constexpr, default


class _Kernel:
    """What _constexpr_values reads of a triton.jit kernel: its parameters and its function's name."""

    def __init__(self, *params):
        self.params = params
        self.fn = types.SimpleNamespace(__name__="draw_kernel")


def test_constexpr_values_come_from_meta_else_their_defaults_in_order():
    kernel = _Kernel(_Param("x", False), _Param("n", False), _Param("BLOCK", True, 64), _Param("EVEN", True, False))
    assert _dispatch._constexpr_values(kernel, (1, 2), {"EVEN": True, "num_warps": 4}) == (64, True)
    assert _dispatch._constexpr_values(kernel, (1, 2), {"BLOCK": 128}) == (128, False)


def test_a_constexpr_by_position_or_a_runtime_argument_by_name_is_refused():
    kernel = _Kernel(_Param("x", False), _Param("n", False), _Param("BLOCK", True, 64))
    for args in ((1,), (1, 2, 64)):
        with pytest.raises(TypeError, match=r"launch\(draw_kernel\): pass the runtime arguments by position"):
            _dispatch._constexpr_values(kernel, args, {})


class _JitKernel(_Kernel):
    """A kernel launch() treats as compiled by Triton: it records what each launch passes."""

    def __init__(self, calls, compiles=True):
        super().__init__(_Param("x", False), _Param("n", False), _Param("BLOCK", True, 64), _Param("EVEN", True, False))
        self.device_caches, self.calls, self.compiles = {}, calls, compiles

    def __getitem__(self, grid):
        def through_triton(*args, **meta):
            self.calls.append(("triton", grid, args, meta))
            if self.compiles:
                return _Compiled(self.calls)
            return None
        return through_triton


class _Compiled:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("cached", grid, args))


@pytest.fixture
def device_0(monkeypatch):
    """Triton's driver as launch() reads it: the current device is 0 (no GPU needed)."""
    driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0))
    monkeypatch.setattr(_dispatch, "_triton_driver", lambda: driver)


def test_launches_after_the_first_take_the_compiled_kernel_with_every_argument(monkeypatch, device_0):
    """The first launch of each (argument classes, meta) goes through Triton; later ones pass the
    compiled kernel a 3-d grid and the constexprs after the runtime arguments."""
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    calls = []
    kernel, x = _JitKernel(calls), torch.ones(4)
    for _ in range(2):
        _dispatch.launch(kernel, (3,), x, 5, BLOCK=128, num_warps=4)
    _dispatch.launch(kernel, (3, 2), x, 5, BLOCK=128, num_warps=4)
    _dispatch.launch(kernel, (3,), x, 5, BLOCK=64, num_warps=4)  # other meta: Triton again
    _dispatch.launch(kernel, (3,), x, 1, BLOCK=128, num_warps=4)  # 1 is its own class: Triton again
    assert calls == [("triton", (3,), (x, 5), {"BLOCK": 128, "num_warps": 4}),
                     ("cached", (3, 1, 1), (x, 5, 128, False)),
                     ("cached", (3, 2, 1), (x, 5, 128, False)),
                     ("triton", (3,), (x, 5), {"BLOCK": 64, "num_warps": 4}),
                     ("triton", (3,), (x, 1), {"BLOCK": 128, "num_warps": 4})]


def test_kernels_triton_does_not_return_or_whose_run_is_replaced_always_go_through_triton(monkeypatch, device_0):
    from triton.runtime.jit import JITFunction

    calls = []
    monkeypatch.setattr(_JitKernel, "run", lambda *args, **kwargs: None, raising=False)
    replaced = _JitKernel(calls)
    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    uncompiled = _JitKernel(calls, compiles=False)
    x = torch.ones(4)
    for kernel in (uncompiled, uncompiled):
        _dispatch.launch(kernel, (2,), x, 5)
    assert [call[0] for call in calls] == ["triton", "triton"]
    monkeypatch.setattr(_JitKernel, "run", lambda *args, **kwargs: None, raising=False)
    calls[:] = []
    for kernel in (replaced, replaced):
        _dispatch.launch(kernel, (2,), x, 5)
    assert [call[0] for call in calls] == ["triton", "triton"]


def test_without_the_cpp_extension_every_launch_goes_through_triton(monkeypatch):
    """A failed build of ddpd._C leaves the ops running, at Triton's launch cost."""
    from triton.runtime.jit import JITFunction

    def failed_build():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(_dispatch._ext, "load", failed_build)
    assert _dispatch._launch_key.__wrapped__() is None
    monkeypatch.setattr(_dispatch, "_launch_key", lambda: None)
    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    calls = []
    kernel = _JitKernel(calls)
    for _ in range(2):
        _dispatch.launch(kernel, (2,), torch.ones(4), 5)
    assert [call[0] for call in calls] == ["triton", "triton"]


def test_a_launch_on_another_device_goes_through_triton_again(monkeypatch):
    """The compiled kernel of one device is not launched on another: the current device is
    part of what a compiled launch is kept under."""
    from triton.runtime.jit import JITFunction

    current = [0]
    driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: current[0]))
    monkeypatch.setattr(_dispatch, "_triton_driver", lambda: driver)
    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    calls = []
    kernel, x = _JitKernel(calls), torch.ones(4)
    for device in (0, 1, 0, 1):
        current[0] = device
        _dispatch.launch(kernel, (2,), x, 5)
    assert [call[0] for call in calls] == ["triton", "triton", "cached", "cached"]


def test_a_default_device_with_another_torch_function_mode_is_not_eager():
    """Only default devices leave a call eager: any other torch-function mode on the stack,
    above or below one, sends it through the custom op."""
    class Passing(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with torch.device("cpu"), Passing():
        assert not _dispatch.eager(torch.ones(1))
    with Passing(), torch.device("cpu"):
        assert not _dispatch.eager(torch.ones(1))
    with torch.device("cpu"), torch.device("cpu"):
        assert _dispatch.eager(torch.ones(1))


@pytest.mark.parametrize("rows", [256, 1024, 4096])
def test_the_heads_splits_aim_at_four_programs_per_multiprocessor(rows):
    """Where the vocabulary has tiles to spare, head_launch splits each row block's tiles so the
    device gets PROGRAMS_PER_SM (4) programs a multiprocessor, rounded up to whole splits."""
    assert _dispatch.PROGRAMS_PER_SM == 4
    launch = head_launch(rows, 768, GPT2, 2, SMS)
    row_blocks, splits = launch.tiles_grid
    assert splits < n_tiles(GPT2)
    assert splits == -(-4 * SMS // row_blocks), launch


def test_compiled_code_stays_compiled_under_a_watcher():
    """A Watcher traces nothing: torch.compile'd code called under one still compiles and runs
    its graph instead of falling back to eager code."""
    from torch._dynamo.testing import CompileCounter

    class Watching(_dispatch.Watcher):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(lambda x: x * 2 + 1, backend=counter)
    with Watching():
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert counter.frame_count == 1


def test_traced_device_ids_are_long_with_one_unused_zero_when_empty():
    """Under torch.compile the ids become a constant of the graph, with the eager call's form."""
    cpu = torch.device("cpu")
    torch._dynamo.reset()
    for ids, want in (((), [0]), ((3, 1), [3, 1])):
        got = torch.compile(lambda: _dispatch.device_ids(ids, cpu), fullgraph=True, backend="eager")()
        assert got.dtype == torch.int64 and got.tolist() == want


def test_a_flat_grid_refusal_names_the_shape_the_block_and_cudas_limit():
    message = (r"the uniforms of 2097152 rows x 1048577 columns needs 4297064448 programs of 512 columns, "
               r"above CUDA's 2147483647 on one grid axis: split it into smaller calls")
    with pytest.raises(ValueError, match=f"^{message}$"):
        _dispatch.flat_grid("the uniforms", 2**21, 2**20 + 1, 512)


def test_a_three_dimensional_grid_reaches_the_compiled_kernel_unchanged(monkeypatch, device_0):
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    calls = []
    kernel, x = _JitKernel(calls), torch.ones(4)
    for _ in range(2):
        _dispatch.launch(kernel, (3, 2, 2), x, 5)
    assert calls[1] == ("cached", (3, 2, 2), (x, 5, 64, False))


def test_a_kernel_without_tritons_device_caches_always_goes_through_triton(monkeypatch, device_0):
    """Only a compiled Triton kernel (one with device caches) has a compiled kernel to keep."""
    from triton.runtime.jit import JITFunction

    monkeypatch.setattr(_JitKernel, "run", JITFunction.run, raising=False)
    calls = []
    kernel = _JitKernel(calls)
    del kernel.device_caches
    for _ in range(2):
        _dispatch.launch(kernel, (2,), torch.ones(4), 5)
    assert [call[0] for call in calls] == ["triton", "triton"]


@pytest.mark.parametrize("rows,vocab,multiprocessors", [(1, 5 * TILE, 1), (16, 7 * TILE, 2), (40, 11 * TILE, 3),
                                                        (1, GPT2, 5)])
def test_the_heads_splits_cover_every_tile_once_with_none_left_empty(rows, vocab, multiprocessors):
    """Where the aimed-at splits do not divide the tiles, head_launch rounds their count back
    to what the tiles per split need: each split has tiles (5 tiles aimed at 4 splits: 3 of 2)."""
    launch = head_launch(rows, 64, vocab, 4, multiprocessors)
    _, splits = launch.tiles_grid
    tiles = n_tiles(vocab)
    assert splits * launch.tiles_per_split >= tiles > (splits - 1) * launch.tiles_per_split, launch
    if (rows, vocab) == (1, 5 * TILE):
        assert (splits, launch.tiles_per_split) == (3, 2)


@pytest.mark.parametrize("width,element_size,block_h", [(1, 4, 16), (16, 4, 16), (16, 2, 16), (17, 4, 32),
                                                        (24, 2, 32), (40, 2, 64)])
def test_the_heads_h_slices_stay_as_narrow_as_a_narrow_row(width, element_size, block_h):
    """H slices of 16 (the dot's least) for rows of up to 16 elements, else the row to a power of
    two, capped at 64 (16-bit) or 32 (float32)."""
    assert head_launch(8, width, GPT2, element_size, SMS).block_h == block_h
