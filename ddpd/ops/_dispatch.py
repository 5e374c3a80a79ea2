"""How a call of a ddpd op reaches its kernel: straight to it when nothing traces the
call, through the registered custom op otherwise; the C++ kernels of ddpd._C for CPU
tensors; launch grids sized from the device; the limits every op shares. What a launch
through Triton's binder costs: docs/performance.md, History.
"""
from __future__ import annotations

import functools
import importlib
from typing import Optional

import torch
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ddpd.ops import _ext
from ddpd.validation import transformed

MAX_WIDTH = 2**30  # bound on D and V: columns of a row stay below 2**31
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROGRAMS_PER_SM = 4  # Triton grids aim at this many programs per multiprocessor
INTERPRETER_MULTIPROCESSORS = 4  # CPU tensors (the interpreter): a few splits, so they are tested


def check_width(name: str, size: int) -> None:
    """Check a row width (D or V) against the bound every op shares.

    Args:
        name: what the width is, for the message.
        size: the width.

    Raises:
        ValueError: size outside [1, MAX_WIDTH).
    """
    if not 1 <= size < MAX_WIDTH:
        raise ValueError(f"{name} must be in [1, {MAX_WIDTH}), got {size}")


MAX_GRID_X = 2**31 - 1  # CUDA's largest grid x dimension


def flat_grid(name: str, rows: int, width: int, block: int) -> tuple:
    """The 1-d grid of a kernel that runs one program per `block` columns of each row, on
    the x axis (the only one past 65535 programs).

    Args:
        name: the input's name, for the message.
        rows: rows of the input.
        width: columns a row.
        block: columns a program.

    Returns:
        (programs,).

    Raises:
        ValueError: more programs than CUDA's x axis takes (about 2**41 elements at
            1024 columns a program): split the call.
    """
    programs = rows * -(-width // block)
    if programs > MAX_GRID_X:
        raise ValueError(f"{name} of {rows} rows x {width} columns needs {programs} programs of {block} columns, "
                         f"above CUDA's {MAX_GRID_X} on one grid axis: split it into smaller calls")
    return (programs,)


def contiguous(*tensors: Optional[torch.Tensor]) -> tuple:
    """Each tensor made contiguous (None stays None): the kernels index rows as
    row * width, so strided noise, row ids or exclusions would be misread. Detached
    too: a draw has no gradient, and an output computed from a tensor that requires
    one (noise, a temperature) would otherwise require one through a kernel without
    a backward.

    Args:
        *tensors: tensors or None.

    Returns:
        A tuple of the detached, contiguous tensors (None where None).
    """
    return tuple(None if t is None else t.detach().contiguous() for t in tensors)


def device_ids(ids: tuple, device: torch.device) -> torch.Tensor:
    """Long tensor of `ids` (one unused 0 if empty) on device; cached, so repeated
    calls (and CUDA graph captures after a warm-up call) copy nothing. (Traced by
    torch.compile, the ids become a constant of the graph instead.)

    Args:
        ids: a tuple of ints.
        device: the device of the tensor.

    Returns:
        Long[max(len(ids), 1)].
    """
    if torch.compiler.is_compiling():
        return torch.tensor(ids if ids else [0], dtype=torch.int64, device=device)
    return _cached_ids(ids, device)


@functools.lru_cache(maxsize=64)
def _cached_ids(ids: tuple, device: torch.device) -> torch.Tensor:
    return torch.tensor(ids if ids else [0], dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=8)
def unused_output(device: torch.device) -> torch.Tensor:
    """An empty float32 tensor on device, which eager calls pass their kernels for the outputs
    they do not ask for (the kernels never write it) and then drop.

    Args:
        device: the device of the tensor.

    Returns:
        The shared empty tensor of that device.
    """
    return torch.empty(0, dtype=torch.float32, device=device)


@functools.cache
def kernels(op: str):
    """The Triton kernel module of `op` (ddpd.kernels.<op>), imported on first use: importing
    Triton is not free, and CPU-only calls never need it. Cached: an import statement is a
    per-call cost.

    Args:
        op: the op's name.

    Returns:
        The module.
    """
    return importlib.import_module(f"ddpd.kernels.{op}")


# id(kernel) -> (kernel, {(device, argument classes, meta): (compiled kernel, constexprs)}), or (kernel, None)
# for a kernel that launch() leaves to Triton
_compiled: dict = {}


def launch(kernel, grid: tuple, *args, **meta) -> None:
    """kernel[grid](*args, **meta), with args the kernel's runtime arguments in order and meta
    its constexprs and launch options (num_warps, ...), minus most of Triton's per-launch cost.

    Triton's launch binds the arguments, specialises each one, builds a cache key from them
    and re-checks the globals the kernel read, which costs more than the kernel takes at
    small shapes (docs/performance.md, History). Here the first launch of each kernel,
    device, meta and argument classes goes through Triton and keeps the compiled kernel it
    returns; later ones launch that kernel directly. The classes (ddpd._C.launch_key,
    csrc/launch_key.cpp) are at least as fine as Triton's specialisation, so equal classes
    mean the same compiled kernel. Triton's own launch runs every launch under
    TRITON_INTERPRET (nothing is compiled), when JITFunction.run is replaced (a tool
    recording launches) and when ddpd._C cannot be loaded (the first launch loads it,
    compiling it where it was not built, as the first CPU call of an op does).

    Args:
        kernel: a triton.jit kernel.
        grid: the launch grid.
        *args: the kernel's runtime arguments, in order.
        **meta: its constexprs and launch options, by name.

    Raises:
        TypeError: a runtime argument passed by name, or a constexpr by position.
    """
    # by id: a JITFunction hashes its source key, a per-launch cost; the entry holds the kernel,
    # so no other object can take over its id
    owner, cached = _compiled.get(id(kernel), (None, None))
    if owner is not kernel:  # first sight of this kernel: compiled or interpreted?
        cached = {} if hasattr(kernel, "device_caches") and _launch_key() else None
        _compiled[id(kernel)] = (kernel, cached)
    classes = cached is not None and _tritons_run(type(kernel).run) and _launch_key()(args)
    if not classes:  # also an argument launch_key does not classify: Triton decides
        kernel[grid](*args, **meta)
        return
    key = (_triton_driver().active.get_current_device(), classes, *meta.items())
    entry = cached.get(key)
    if entry is None:
        constexprs = _constexpr_values(kernel, args, meta)
        compiled = kernel[grid](*args, **meta)
        if compiled is not None:
            cached[key] = (compiled, constexprs)
        return
    compiled, constexprs = entry
    compiled[grid + _ONES[len(grid)]](*args, *constexprs)


@functools.cache
def _launch_key():
    """ddpd._C.launch_key, or None where ddpd._C does not load (launch() then leaves every
    launch to Triton)."""
    try:
        return _ext.load().launch_key
    except Exception:  # no compiler, a failed build: the ops still run, at Triton's launch cost
        return None


_ONES = ((1, 1, 1), (1, 1), (1,), ())  # a grid's missing dimensions


@functools.cache
def _triton_driver():
    """triton.runtime.driver, imported once (an import statement is a per-launch cost)."""
    from triton.runtime import driver

    return driver


_triton_run = None  # Triton's JITFunction.run, once seen


def _tritons_run(run) -> bool:
    """Whether run is Triton's own launch, not a replacement (a tool recording the launches):
    a replacement sees every launch, so none goes around it.

    Args:
        run: the `run` attribute of a kernel's class.

    Returns:
        True when `run` is triton.runtime.jit's JITFunction.run.
    """
    global _triton_run
    if run is _triton_run:
        return True
    if getattr(run, "__module__", None) == "triton.runtime.jit" and run.__qualname__ == "JITFunction.run":
        _triton_run = run
        return True
    return False


def _constexpr_values(kernel, args: tuple, meta: dict) -> tuple:
    """The values of the kernel's parameters after args (its constexprs, from meta or their
    defaults), in order: a compiled kernel takes every parameter, and Triton's binder fills
    these in. Refuses a runtime argument passed by name (launch() would key it by value) and
    a constexpr passed by position (keyed by its class only, it would reuse another value's
    kernel)."""
    given, rest = kernel.params[:len(args)], kernel.params[len(args):]
    if any(p.is_constexpr for p in given) or any(not p.is_constexpr for p in rest):
        raise TypeError(f"launch({kernel.fn.__name__}): pass the runtime arguments by position and only them, "
                        f"then the constexprs by name")
    return tuple(meta[p.name] if p.name in meta else p.default for p in rest)


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports: torch's CUDA wheels for Linux ship it, other installs may not
    (the networks then keep their torch code where they would call a ddpd kernel).

    Returns:
        True when `import triton` succeeds.
    """
    try:
        importlib.import_module("triton")
    except Exception:  # ImportError, or a broken install failing in its own way
        return False
    return True


@functools.lru_cache(maxsize=8)
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (what the launch grids are sized for).

    Args:
        device: the device.

    Returns:
        Its multiprocessors; INTERPRETER_MULTIPROCESSORS for a CPU device (the interpreter).
    """
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    return torch.cuda.get_device_properties(device).multi_processor_count


def eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a call can go straight to its kernel instead of through the registered
    custom op: nothing traces it (torch.compile, make_fx, fake or functional tensors,
    jit tracing, torch-function modes) and its tensors are plain tensors. The custom-op
    dispatch costs more than most kernels at small shapes (docs/performance.md, History);
    tracing needs it (the fake kernel, the schema), eager calls do not.

    Args:
        *tensors: the call's tensors, or None.

    Returns:
        True for an eager call.
    """
    if (torch.compiler.is_compiling() or (torch._C._len_torch_dispatch_stack() and not _only_watchers())
            or (torch._C._is_torch_function_mode_enabled() and not _only_device_modes()) or torch._C._is_tracing()):
        return False
    for t in tensors:  # a plain loop: a generator is a per-call cost here
        if t is not None and type(t) is not torch.Tensor:
            return False
    return True


class Watcher(TorchDispatchMode):
    """A dispatch mode that only looks at the ops that run (ddpd.sampling.graphs' replay guard):
    it traces nothing, so a call under it goes straight to its kernel as without it, and
    torch.compile'd code keeps running compiled."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Whether Dynamo leaves compiled code compiled under the mode (torch's hook).

        Returns:
            True: the mode watches the compiled artifact's ops, not its tracing.
        """
        return True


def _only_watchers() -> bool:
    """Whether every dispatch mode on the stack is a Watcher."""
    return all(isinstance(mode, Watcher) for mode in _get_current_dispatch_mode_stack())


def _only_device_modes() -> bool:
    """Whether every torch-function mode on the stack is a default device (`with
    torch.device(...)`, torch.set_default_device): such a mode traces nothing, and an eager
    call under it keeps its host-side checks."""
    return all(isinstance(torch._C._get_function_stack_at(i), DeviceContext)
               for i in range(torch._C._len_torch_function_stack()))


def cpu_ops():
    """torch.ops.ddpd with the CPU kernels of ddpd._C loaded.

    Returns:
        The torch.ops.ddpd namespace.
    """
    return _ext.ops()


_cpu_kernels: dict = {}


def cpu_kernel(name: str):
    """The C++ kernel torch.ops.ddpd.<name>.default, looked up once: the per-call path
    of the sampling ops (a lookup through the op namespace is a per-call cost).

    Args:
        name: the operator's name, e.g. "bernoulli_cpu".

    Returns:
        The OpOverload.
    """
    kernel = _cpu_kernels.get(name)
    if kernel is None:
        kernel = _cpu_kernels[name] = getattr(cpu_ops(), name).default
    return kernel


def needs_grad(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether an output computed from these tensors needs a gradient: the networks' own
    kernels (rotary, norm) have no backward, their torch references do.

    Args:
        *tensors: tensors, or None.

    Returns:
        True when grad is enabled and one of them requires a gradient.
    """
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def refuse_transforms(op: str, *tensors) -> None:
    """Refuse a call whose input a torch.func transform (vmap, grad, ...) wraps: under vmap
    every slice would be row 0 of its own batch and draw from the same row streams (a
    batch of identical draws), so the ops refuse rather than return that. One C call per
    tensor. (torch.compile traces no functorch wrappers: nothing to check there.)

    Args:
        op: the op's name, for the message.
        *tensors: the call's tensors (other values are ignored).

    Raises:
        ValueError: a transform wraps an input.
    """
    if torch.compiler.is_compiling():
        return
    if transformed(*tensors):
        raise ValueError(
                f"ddpd.ops.{op} does not run under torch.func transforms (vmap, grad): under vmap every slice "
                "would draw from the same row streams. Pass the batch as rows instead (sample_categorical and "
                "sample_from_hidden take any leading shape; give distinct row_ids for distinct streams)")
