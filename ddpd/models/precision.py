"""Running a network in bfloat16 or float16 for sampling.

    dtype = resolve_dtype("auto", device)           # bf16 on CUDA, float32 on CPU
    model = prepare_for_sampling(model, dtype, device)
    logits = model(x, t)                             # float32 logits, bf16 network

`prepare_for_sampling` casts parameters, the norms' to float32; buffers keep their dtype, and
norm statistics, rotary embeddings and time features stay float32, as do the logits
`forward` returns. `compile_for_sampling` then torch.compiles `forward` and `hidden`.
Training uses torch.autocast instead (ddpd.training). What stays float32 and why, and
the cost of compiling: docs/models.md ("Precision")."""
from __future__ import annotations

import inspect
from typing import Optional, Union

import torch
import torch.nn as nn

from ddpd.models.attention import warm_dispatch
from ddpd.models.backbone import LayerNorm, RMSNorm
from ddpd.validation import check_choice

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto",) + tuple(DTYPES)
# norms whose parameters and running statistics stay float32: ddpd's, and torch's (the
# BatchNorm and InstanceNorm family is _NormBase), which take bf16/fp16 inputs with them
FLOAT32_MODULES = (LayerNorm, RMSNorm, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase)


def _parse_device(device) -> Optional[torch.device]:
    """device as a torch.device (None stays None); torch's own errors ("Expected one of cpu, cuda,
    ...", "received an invalid combination of arguments") name no argument."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(f"device must be a str, an int or a torch.device, got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must name a torch device (cpu, cuda, cuda:N, ...), got {device!r}: {e}") from None


def resolve_dtype(dtype: Union[str, torch.dtype], device: Union[str, torch.device, None] = None) -> torch.dtype:
    """The torch dtype for a --dtype choice: "auto" is bfloat16 on CUDA and float32
    elsewhere; "float32", "bfloat16", "float16" (or those torch dtypes) as named.

    Args:
        dtype: "auto", "float32", "bfloat16", "float16" or one of those torch dtypes.
        device: the device the network will run on ("auto" depends on it); None: CPU.

    Returns:
        The torch dtype.

    Raises:
        TypeError: `dtype` is neither a str nor a torch.dtype, or `device` neither a str, an int nor
            a torch.device.
        ValueError: `dtype` is not one of the choices, or `device` names no torch device.
    """
    device = _parse_device(device)
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {tuple(DTYPES.values())}, got {dtype}")
        return dtype
    check_choice("dtype", dtype, DTYPE_CHOICES)
    if dtype != "auto":
        return DTYPES[dtype]
    device_type = device.type if device is not None else "cpu"
    return torch.bfloat16 if device_type == "cuda" else torch.float32


def prepare_for_sampling(model: nn.Module, dtype: Union[str, torch.dtype] = "auto",
                         device: Union[str, torch.device, None] = None) -> nn.Module:
    """Move `model` to `device` (default: where it is), set eval mode and
    requires_grad=False, and cast its floating-point parameters to `dtype` (a
    resolve_dtype choice; "auto" resolves for the target device), keeping buffers in their
    dtype (positions and schedules). The norms, ddpd's and torch's (LayerNorm, GroupNorm,
    RMSNorm, BatchNorm, InstanceNorm), keep their parameters and running statistics in
    float32 (also those of a model already cast by `.half()`). A network that mixes a
    float32 buffer into a cast matmul, or a cast input into a torch norm, runs under
    torch.autocast, as the samplers and adapters call it. Works in place on any
    nn.Module and returns it.

    Args:
        model: any nn.Module (a ddpd network or an adapter).
        dtype: a resolve_dtype choice.
        device: where to move the model; None leaves it where it is.

    Returns:
        `model` itself, prepared.

    Raises:
        TypeError: `model` is not an nn.Module, or `device` neither a str, an int nor a torch.device.
        ValueError: `dtype` is not a resolve_dtype choice, or `device` names no torch device.

    Example:
        >>> denoiser = prepare_for_sampling(denoiser, "bfloat16", "cuda")
        >>> logits = denoiser(x, t)  # float32 logits from a bf16 network
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected torch.nn.Module, got {type(model).__name__}")
    device = _parse_device(device)  # before the model moves
    if device is not None:
        model.to(device=device)
    else:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
    dtype = resolve_dtype(dtype, device)
    model.eval().requires_grad_(False)

    def cast_parameters(tensor: torch.Tensor) -> torch.Tensor:
        floating = isinstance(tensor, nn.Parameter) and tensor.is_floating_point()
        return tensor.to(dtype) if floating else tensor

    def float32(tensor: torch.Tensor) -> torch.Tensor:
        # a norm of a model already cast by .half() or .to(bf16) comes back to float32
        return tensor.to(torch.float32) if tensor.is_floating_point() else tensor

    for module in model.modules():
        # _apply visits this module's own parameters and buffers; buffers keep their dtype
        # (rotary frequencies, position tables, schedules: bf16 positions are off by whole radians)
        module._apply(float32 if isinstance(module, FLOAT32_MODULES) else cast_parameters, recurse=False)
    return model


# torch.compile backends compile_for_sampling takes: Inductor (fuses and compiles), and two
# that trace without compiling, to check a model for graph breaks quickly. Others that torch
# lists need packages it does not install (tvm, openxla) or capture CUDA graphs of their own
# (cudagraphs), which the fused samplers already do.
BACKENDS = ("inductor", "aot_eager", "eager")


def compile_backends() -> tuple:
    """The backends of BACKENDS this torch offers (compile_for_sampling's choices).

    Returns:
        The names of the torch.compile backends compile_for_sampling accepts here.
    """
    offered = torch.compiler.list_backends(exclude_tags=())
    return tuple(name for name in BACKENDS if name in offered)


class CompiledMethod:
    """A network's method torch.compiled for that network: calls the compiled function of
    its class with the network as `self`. Holds the network and the method's name, not a
    bound method, so a deep copy of the network computes with the copy's weights, and a
    pickled network compiles again when it is called after loading."""

    def __init__(self, model: nn.Module, name: str, backend: str):
        self.__setstate__({"model": model, "name": name, "backend": backend})

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        method = getattr(type(self.model), self.name)
        self.compiled = torch.compile(method, backend=self.backend)
        # inspect.signature reads this: a caller that checks how the method takes its
        # arguments (sampling's check_hidden) sees the method's, not __call__'s (*args, **kwargs)
        self.__signature__ = _bound_signature(method, self.model)

    def __getstate__(self) -> dict:
        return {"model": self.model, "name": self.name, "backend": self.backend}

    def __call__(self, *args, **kwargs):
        return self.compiled(self.model, *args, **kwargs)


def _bound_signature(method, model: nn.Module) -> Optional[inspect.Signature]:
    """The signature of `method` bound to `model` (without self), or None where it has none to read."""
    try:
        return inspect.signature(method.__get__(model, type(model)))
    except (TypeError, ValueError):
        return None


def compile_for_sampling(model: nn.Module, backend: Optional[str] = "inductor") -> nn.Module:
    """torch.compile the methods `forward` and, where the model has one, `hidden` of
    `model` with `backend` ("inductor"; "eager" or "aot_eager" trace without compiling,
    which finds graph breaks quickly); None leaves the model as it is. In place: the model
    gets CompiledMethod attributes; its parameters and state_dict are unchanged, and
    compiling again replaces the backend. Call it once the model is on its device: the
    attention dispatch's caches are filled for that device first (ddpd.models.attention).
    Pass the time t as a tensor: a Python number is compiled as a constant, once per value.

    Args:
        model: the network (an nn.Module with `forward` and perhaps `hidden`).
        backend: a name of compile_backends(), or None for no compilation.

    Returns:
        `model` itself, with compiled methods.

    Raises:
        TypeError: `model` is not an nn.Module.
        ValueError: `backend` is not one of compile_backends().
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected torch.nn.Module, got {type(model).__name__}")
    if backend is None:
        return model
    if not isinstance(backend, str) or backend not in compile_backends():
        raise ValueError(f"backend must be one of {compile_backends()}, got {backend!r}")
    warm_dispatch(next((p.device for p in model.parameters()), torch.device("cpu")))
    for name in ("hidden", "forward"):
        current = getattr(model, name, None)
        if isinstance(current, CompiledMethod) or (inspect.ismethod(current) and current.__self__ is model):
            setattr(model, name, CompiledMethod(model, name, backend))
    return model
