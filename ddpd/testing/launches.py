"""The launches of the Triton ops, made on CPU tensors without a GPU.

Each `*_call` builder returns the launcher call an eager public call makes (the op's
`*_triton` function with its prepared arguments), at the GPU benchmarks' shapes by
default. `stub_triton` points Triton's driver at a stub that reports an sm_90 device and
each compiled kernel at one whose launch does nothing, so a launcher runs on CPU tensors
as on a GPU; `record_launches` records the kernels, grids and arguments a call launches.

Used by benchmarks/launch_cost.py (the Python side of a CUDA call), by
ddpd.testing.sm90 (the sm_90 binaries) and by the tests of the launch cache
(tests/ops/test_op_launch.py, tests/ops/test_op_compile_variants.py). Uses Triton's runtime
internals (driver.set_active, JITFunction.device_caches): another Triton version may need
this module changed, never the ops. Run it without TRITON_INTERPRET (the interpreter
would run every kernel for real).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

GPT2 = 50257


def sample_categorical_call(rows: int = 64, vocab: int = GPT2, dtype: torch.dtype = torch.bfloat16, seed: int = 1,
                            offset: int = 2, temperature: float = 1.0, **controls) -> Callable[[], object]:
    from ddpd.ops.sample_categorical import prepare_categorical, sample_categorical_triton

    logits = torch.empty(rows, vocab, dtype=dtype)
    call = prepare_categorical(logits, temperature, None, None, None, controls.get("top_k"), controls.get("top_p"),
                               controls.get("min_p"), False, None, seed, offset, None, None, None)
    return lambda: sample_categorical_triton(logits, *call.args(), eager=True)  # as an eager public call


def sample_from_hidden_call(rows: int = 64, width: int = 768, vocab: int = GPT2, seed: int = 1,
                            offset: int = 2, temperature: float = 1.0) -> Callable[[], object]:
    from ddpd.ops.sample_from_hidden import prepare_hidden, sample_from_hidden_triton

    hidden, weight = torch.empty(rows, width, dtype=torch.bfloat16), torch.empty(vocab, width, dtype=torch.bfloat16)
    call = prepare_hidden(hidden, weight, None, temperature, None, None, None, None, None, None, False, None, seed,
                          offset, None, None, None)
    c, (seed, offset, seed_t, offset_t) = call.controls, call.counters
    return lambda: sample_from_hidden_triton(hidden, weight, None, c.temperature, c.temperature_t, call.exclude_ids,
                                             call.exclude_per_row, call.allowed, call.noise, seed, offset,
                                             call.row_ids, seed_t, offset_t, call.logprob, call.confidence,
                                             eager=True)  # as an eager public call


def planner_call(rows: int = 64, length: int = 1024, with_mask: bool = False, seed: int = 1,
                 offset: int = 2) -> Callable[[], object]:
    """planner_select (with_mask: planner_select_mask, one launch for both)."""
    from ddpd.ops import rng
    from ddpd.ops.planner_select import planner_select_triton, resolve_pair

    logits = torch.empty(rows, length)
    if not with_mask:
        counters = rng.resolve_stream(None, (rows, length), logits, seed, offset, None, None, "logits")
        return lambda: planner_select_triton(logits, 1, False, 1.0, 0.01, None, counters, None)
    x = torch.zeros(rows, length, dtype=torch.long)
    counters, mask_counter = resolve_pair(None, None, logits, seed, offset, None, None, None)
    return lambda: planner_select_triton(logits, 1, False, 1.0, 0.01, None, counters, None,
                                         mask=(x, 27, None, mask_counter))


def planner_mask_call(rows: int = 64, length: int = 1024, seed: int = 1, offset: int = 2) -> Callable[[], object]:
    from ddpd.ops import rng
    from ddpd.ops.planner_mask import planner_mask_triton

    logits, x = torch.empty(rows, length), torch.zeros(rows, length, dtype=torch.long)
    counters = rng.resolve_stream(None, (rows, length), logits, seed, offset, None, None, "logits")
    positions = torch.zeros(rows, 1, dtype=torch.long)
    return lambda: planner_mask_triton(logits, x, positions, 27, None, counters, None)


def bernoulli_call(rows: int = 64, width: int = 1024, seed: int = 1, offset: int = 2) -> Callable[[], object]:
    from ddpd.ops import rng
    from ddpd.ops.bernoulli import bernoulli_triton

    p = torch.empty(rows, width)
    seed, offset, seed_t, offset_t = rng.resolve_stream(None, (rows, width), p, seed, offset, None, None, "p")
    return lambda: bernoulli_triton(p, None, seed, offset, None, seed_t, offset_t)


def norm_call(rows: int = 16 * 256, width: int = 768) -> Callable[[], object]:
    """The networks' LayerNorm over a batch of 16 sequences of 256 tokens. (At 64 sequences
    the CPU allocation of the 50 MB output would dominate: the C library maps memory that
    large anew each time, which CUDA's caching allocator does not.)"""
    from ddpd.ops.norm import norm_triton

    x, weight, bias = torch.empty(rows, width), torch.ones(width), torch.zeros(width)
    return lambda: norm_triton(x, weight, bias)


def rotary_call(batch: int = 64, heads: int = 12, length: int = 256, head_dim: int = 64) -> Callable[[], object]:
    """Rotary embedding of one attention input of the networks (bf16)."""
    from ddpd.ops.rotary import rotary_triton

    x = torch.empty(batch, heads, length, head_dim, dtype=torch.bfloat16)
    cos, sin = torch.empty(length, head_dim // 2), torch.empty(length, head_dim // 2)
    return lambda: rotary_triton(x, cos, sin)


LAUNCHES = {
    "sample_categorical": sample_categorical_call,
    "sample_categorical top_p": lambda: sample_categorical_call(top_p=0.9),
    # Llama 3's vocabulary: on a GPU its eager calls cost more host time than GPT-2's
    # (docs/performance.md); this tells whether the launcher is the cause
    "sample_categorical 128256": lambda: sample_categorical_call(vocab=128256),
    "sample_from_hidden": sample_from_hidden_call,
    "planner_select": planner_call,
    "planner_select_mask": lambda: planner_call(with_mask=True),
    "planner_mask": planner_mask_call,
    "bernoulli": bernoulli_call,
    "norm": norm_call,
    "rotary": rotary_call,
}


class _StubDriver:
    """What JITFunction.run asks of the driver: a device, a stream, an sm_90 target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


class _StubKernel:
    """A compiled kernel whose launch does nothing: what Triton's CompiledKernel does on the
    host (its __getitem__ launch, which ddpd.ops._dispatch.launch uses) up to the driver's call.
    on_run(*args) sees every launch's arguments, from Triton's launch and from __getitem__'s."""
    function, packed_metadata = 0, ()

    def __init__(self, on_run: Callable = lambda *args: None):
        self.run = on_run

    def launch_metadata(self, grid, stream, *args):
        return None

    def __getitem__(self, grid):
        from triton import knobs
        from triton.runtime import driver

        def runner(*args, stream=None):
            if stream is None:
                stream = driver.active.get_current_stream(driver.active.get_current_device())
            self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata,
                     self.launch_metadata(grid, stream, *args), knobs.runtime.launch_enter_hook,
                     knobs.runtime.launch_exit_hook, *args)

        return runner


def stub_triton(on_compile: Callable[[str], None] = lambda name: None,
                on_run: Callable = lambda *args: None) -> None:
    """Point Triton's launches at the stubs; the ops' launchers then run on CPU tensors
    as on a GPU. (Their grids are those of a CPU device, which changes the values of a few
    integer arguments, not the work of launching.) For the rest of the process.

    Args:
        on_compile: called with a kernel's name for every variant Triton would compile.
        on_run: called with the arguments of every launch of a compiled kernel.
    """
    import importlib

    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_StubDriver())
    for op in ("sample_categorical", "sample_from_hidden", "planner_select", "planner_mask", "bernoulli", "norm",
               "rotary"):
        for kernel in vars(importlib.import_module(f"ddpd.kernels.{op}")).values():
            if isinstance(kernel, JITFunction):
                kernel.device_caches[0]  # the binder, made once per device; it sets kernel.compile

                def compile_stub(*args, _name=kernel.fn.__name__, **kwargs):
                    on_compile(_name)
                    return _StubKernel(on_run)

                kernel.compile = compile_stub


def record_launches(call: Callable[[], object]) -> list:
    """The Triton launches a call makes; nothing is launched.

    Args:
        call: a launcher call (a `*_call` builder's result).

    Returns:
        A list of (kernel, grid, arguments by name, constexprs and options), one a launch.
    """
    from triton.runtime.jit import JITFunction

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, grid, dict(zip(self.arg_names, args)), kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        call()
    finally:
        JITFunction.run = original
    return launches


@contextlib.contextmanager
def tritons_launch():
    """A context in which every kernel is launched by Triton's JITFunction.run: it is put
    behind a wrapper, to which ddpd's launch defers every launch (one Python call more a
    kernel)."""
    from triton.runtime.jit import JITFunction

    tritons = JITFunction.run

    def run(self, *args, **kwargs):
        return tritons(self, *args, **kwargs)

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = tritons
