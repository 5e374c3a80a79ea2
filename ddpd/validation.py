"""Argument checks shared by the public entry points of every layer, whether a check may
read a tensor's values (readable: not while traced), where warnings point (caller_level),
and a float's text that never loses it (float_text).

Errors name the argument, what was expected and what was given.
Lowest layer: imports nothing from ddpd.
"""
from __future__ import annotations

import numbers
import operator
import sys
from collections.abc import Sequence
from typing import Callable, Optional

import torch


def check_int(name: str, value, minimum: int, maximum: Optional[int] = None) -> int:
    """Check an int argument: a Python int or another integer scalar (numpy's integers).

    Args:
        name: the argument's name, for the message.
        value: the value given.
        minimum: the least value allowed.
        maximum: the largest value allowed, or None.

    Returns:
        `value` as a Python int, which JSON, hashing and torch's int arguments take.

    Raises:
        TypeError: not an integer scalar (a bool, a float, a tensor or an array are refused).
        ValueError: out of range.
    """
    # numbers.Integral: numpy registers its integers there, not its bool, arrays or floats (nor torch tensors)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = operator.index(value)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_float(name: str, value, minimum: float, maximum: float = float("inf"),
                open_min: bool = False, open_max: bool = False) -> float:
    """Check a real-number argument.

    Args:
        name: the argument's name, for the message.
        value: the value given (an int or float).
        minimum: the lower bound.
        maximum: the upper bound.
        open_min: exclude the lower bound.
        open_max: exclude the upper bound.

    Returns:
        `value` as a float.

    Raises:
        TypeError: not a number.
        ValueError: out of range, or NaN.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers too
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    interval = f"{'(' if open_min else '['}{minimum}, {maximum}{')' if open_max else ']'}"
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range
        raise ValueError(f"{name} must be in {interval}, got an int of {int(value).bit_length()} bits") from None
    low_ok = value > minimum if open_min else value >= minimum
    high_ok = value < maximum if open_max else value <= maximum
    if not (low_ok and high_ok) or value != value:
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """Check a bool argument.

    Args:
        name: the argument's name, for the message.
        value: the value given.

    Returns:
        `value`.

    Raises:
        TypeError: not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_choice(name: str, value, choices: Sequence[str]) -> str:
    """Check an argument that takes one of a few strings.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        choices: the allowed values.

    Returns:
        `value`.

    Raises:
        TypeError: not a str.
        ValueError: not one of `choices`.
    """
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {tuple(choices)}, got {type(value).__name__} {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def float_text(value: float) -> str:
    """A float as a name part: short (`:g`) where that reads back exactly, else its repr, so
    that two values never share a name (`:g` gives 1e+06 for 1000000 and 1000001).

    Args:
        value: the float (an int or str is returned as str()).

    Returns:
        The text.
    """
    if isinstance(value, float):
        return f"{value:g}" if float(f"{value:g}") == value else repr(float(value))  # numpy 2: np.float64(...)
    return str(value)


def check_callable(name: str, value) -> Callable:
    """Check a callable argument.

    Args:
        name: the argument's name, for the message.
        value: the value given.

    Returns:
        `value`.

    Raises:
        TypeError: not callable.
    """
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def check_tensor(name: str, value, dtypes: Sequence[torch.dtype], dim: Optional[int] = None) -> torch.Tensor:
    """TypeError/ValueError unless `value` is a dense tensor of one of `dtypes` with `dim`
    dims (any number when dim is None) on a cpu or cuda device.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        dtypes: the allowed dtypes.
        dim: the number of dimensions, or None for any.

    Returns:
        `value`.

    Raises:
        TypeError: not a dense tensor of an allowed dtype.
        ValueError: another number of dimensions, or another device type.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    if not (value.is_cpu or value.is_cuda):  # (device.type builds a device: 4x the time)
        raise ValueError(f"{name} must be on a cpu or cuda device, got {value.device}")
    if value.layout != torch.strided:  # the kernels read dense memory
        raise TypeError(f"{name} must be a dense tensor, got layout {value.layout}")
    return value


def check_shape(name: str, value: torch.Tensor, shape: tuple) -> None:
    """Check a tensor argument's shape.

    Args:
        name: the argument's name, for the message.
        value: the tensor.
        shape: the expected shape.

    Raises:
        ValueError: another shape.
    """
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")


def check_same_device(name: str, value: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    """Check that two tensor arguments are on the same device.

    Args:
        name: the argument's name, for the message.
        value: the tensor.
        like: the tensor it must sit beside.
        like_name: that tensor's name, for the message.

    Raises:
        ValueError: another device.
    """
    if value.device != like.device:
        raise ValueError(f"{name} must be on the device of {like_name} ({like.device}), got {value.device}")


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require_extra(module: str, extra: str, purpose: str):
    """The module `module`, or MissingExtra naming `pip install "ddpd[extra]"`.

    Args:
        module: the module to import.
        extra: the ddpd extra that installs it.
        purpose: what needs it, for the message.

    Returns:
        The imported module.

    Raises:
        MissingExtra: the module is not installed.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(f"{purpose} needs the {module} package, which is not installed: "
                           f"pip install \"ddpd[{extra}]\"") from None


def check_device(name: str, value, local_rank: Optional[int] = None):
    """torch.device for `value`: "auto" (CUDA if available, else CPU), "cpu", "cuda"
    or "cuda:N", or a torch.device of those; `local_rank` picks the GPU of a torchrun
    process.

    Args:
        name: the argument's name, for the message.
        value: "auto", "cpu", "cuda", "cuda:N" or a torch.device.
        local_rank: the torchrun process's GPU, or None.

    Returns:
        The torch.device.

    Raises:
        TypeError: neither a str nor a torch.device.
        ValueError: an unknown device, or CUDA asked for where there is none.
    """
    expected = "auto, cpu, cuda or cuda:N"
    if isinstance(value, torch.device):  # checked like its name: a meta device, or CUDA absent, is refused
        value = str(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {value}: CUDA is not available on this machine")
        if local_rank is not None:
            device = torch.device("cuda", local_rank)
    return device


def values_checkable(x: torch.Tensor) -> bool:
    """Whether a check may read x's values: a non-empty CPU tensor the host can read (see
    readable; on CUDA reading them would cost a host sync per call).

    Args:
        x: the tensor.

    Returns:
        True where its values may be read.
    """
    return x.is_cpu and x.numel() > 0 and readable(x)


def value_range(x: torch.Tensor) -> tuple:
    """The least and largest of x's values as Python numbers (NaN where any is), read detached:
    a tensor that requires grad (a Parameter) is read without autograd's warning.

    Args:
        x: a non-empty tensor whose values may be read (values_checkable).

    Returns:
        (min, max): ints for an integer tensor, floats for a floating one.
    """
    x = x.detach()
    return x.min().item(), x.max().item()


def readable(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether the host may read these tensors' values (a check, the valid flags): nothing
    traces the call (torch.compile, jit tracing, make_fx, fake or functional tensors) and
    no torch.func transform wraps them. Unlike eager(), other modes (a flop counter, a
    logger) do not count: they see the reads as ops, and their tensors hold values.

    Args:
        *tensors: the tensors to read, or None.

    Returns:
        True when their values can be read.
    """
    if torch.compiler.is_compiling() or torch._C._is_tracing() or _tracing_mode():
        return False
    for t in tensors:  # a Parameter holds values; subclasses (fake, functional) may not
        if t is not None and type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
            return False
    return not transformed(*tensors)


_TRACING_MODES = tuple(getattr(torch._C._TorchDispatchModeKey, key) for key in ("FAKE", "PROXY", "FUNCTIONAL"))


def _tracing_mode() -> bool:
    """Whether a dispatch mode that traces (make_fx's proxy, fake or functional tensors) is on."""
    return bool(torch._C._len_torch_dispatch_stack()) and any(
            torch._C._get_dispatch_mode(key) is not None for key in _TRACING_MODES)


def transformed(*values) -> bool:
    """Whether a torch.func transform (vmap, grad, ...) wraps one of the values that are
    tensors: a kernel cannot read such a tensor's storage, its torch reference can. Every
    call of an op pays for this check: outside every transform (no functorch interpreter on
    the stack, one C call) it answers without the loop over the arguments.

    Args:
        *values: the call's arguments, tensors or not.

    Returns:
        True when a functorch wrapper is among them.
    """
    if torch._C._functorch.peek_interpreter_stack() is None:
        return False
    for t in values:
        if isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t):
            return True
    return False


def caller_level() -> int:
    """The stacklevel of warnings.warn, called by the caller of this function, that names the
    first frame outside ddpd: the user's call, where Python's filters key the warning.

    Returns:
        The stacklevel.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] == "ddpd":
        frame, level = frame.f_back, level + 1
    return level
