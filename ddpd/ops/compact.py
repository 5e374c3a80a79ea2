"""compact_fixed / scatter_back: finished rows leave the batch, results go back.

The adaptive Gillespie sampler (Algorithm `alg:sampling`) stops a row as soon as the planner
says it is clean; packing the running rows to the front (into a fixed capacity, so nothing
waits for the device) lets each step run the networks on those rows only, and scatter_back
writes packed rows back to their places. Calls that autograd must see take the references.
CPU and CUDA tensors run the kernels of ddpd._C.
The contract of both ops: docs/ops/compact.md.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import torch

from ddpd.ops import _dispatch, _ext
from ddpd.ops.results import Compacted
from ddpd.validation import check_int, check_same_device, values_checkable


def _check_active(active) -> torch.Tensor:
    if not isinstance(active, torch.Tensor):
        raise TypeError(f"active must be a torch.Tensor, got {type(active).__name__}")
    if active.dtype != torch.bool or active.dim() != 1:
        raise ValueError(f"active must be a 1-D bool tensor, got {active.dtype} of shape {tuple(active.shape)}")
    return active


def _check_rows(active: torch.Tensor, tensors) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided or t.dim() == 0 or t.shape[0] != active.shape[0]:
            raise ValueError(
                f"tensors[{i}] must be a dense tensor with {active.shape[0]} rows (like active), "
                f"got {t.layout} of shape {tuple(t.shape)}"
            )
        check_same_device(f"tensors[{i}]", t, active, "active")


_kernels: dict = {}  # device type -> torch.ops.ddpd, or None where ddpd._C has no kernels for it


def _kernels_for(active: torch.Tensor):
    """_ext.ops_for(active.device), looked up once per device type: compact runs once
    per sampling step, where the lookup would cost a tenth of a small compaction."""
    kind = active.device.type
    if kind not in _kernels:
        _kernels[kind] = _ext.ops_for(active.device)
    return _kernels[kind]


def _check_capacity(capacity) -> int:
    capacity = check_int("capacity", capacity, 0)
    if capacity >= 2**63:  # the kernels' int64: torch's own refusal names no argument
        raise ValueError(f"capacity must be < 2**63, got {capacity}")
    return capacity


def compact_fixed_reference(active, capacity: int,
                            *tensors: torch.Tensor) -> Compacted:
    """Plain torch version of compact_fixed, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.compact_fixed.

    Returns:
        What ddpd.ops.compact_fixed returns (Compacted).

    Raises:
        What ddpd.ops.compact_fixed raises.
    """
    active = _check_active(active)
    capacity = _check_capacity(capacity)
    _check_rows(active, tensors)
    count = active.sum()
    # Stable sort puts the active rows first, in order; no count leaves the device.
    order = torch.sort((~active).to(torch.uint8), stable=True).indices
    index = torch.full((capacity,), -1, dtype=torch.int64, device=active.device)
    kept = min(capacity, active.shape[0])
    slots = torch.arange(kept, device=active.device)
    index[:kept] = torch.where(slots < count, order[:kept], -1)
    packed = []
    for t in tensors:
        rows = t.new_zeros((capacity,) + tuple(t.shape[1:]))
        taken = index >= 0
        rows[taken] = t[index[taken]]
        packed.append(rows)
    return Compacted(tuple(packed), index, count)


def _compact_fixed_impl(active, capacity: int, tensors) -> tuple[list, torch.Tensor, torch.Tensor]:
    """The kernel behind the op: ddpd._C on CPU and CUDA; the reference where the
    extension has no kernels for the device."""
    ops = _kernels_for(active)
    if ops is None:
        packed, index, count = compact_fixed_reference(active, capacity, *tensors)
    else:
        packed, index, count = ops.compact_fixed_kernel(active, capacity, tensors)
    return list(packed), index, count


@torch.library.custom_op("ddpd::compact_fixed", mutates_args=())
def _compact_fixed_op(active: torch.Tensor, capacity: int,
                      tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    return _compact_fixed_impl(active, capacity, tensors)


@_compact_fixed_op.register_fake
def _(active, capacity, tensors):
    packed = [t.new_empty((capacity,) + tuple(t.shape[1:])) for t in tensors]
    return packed, active.new_empty(capacity, dtype=torch.int64), active.new_empty((), dtype=torch.int64)


def _for_autograd(*tensors: torch.Tensor) -> bool:
    """Whether autograd must see the call: the kernels have no backward and do not tell
    autograd about their writes, so such a call takes the reference (plain torch, which
    differentiates, and refuses in-place writes that would corrupt a gradient)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def compact_fixed(active, capacity: int, *tensors: torch.Tensor) -> Compacted:
    """Pack the active rows of each tensor into `capacity` rows, without waiting for the device.

    Args:
        active: Bool[B] the rows to keep.
        capacity: rows of the outputs, >= 0.
        *tensors: tensors of B rows (any dtype, any trailing shape) on active's device.

    Returns:
        Compacted(tensors: tuple of [capacity, ...] packed rows, the first active rows in
        order, zeros past count; index Long[capacity] their source rows, -1 past count;
        count Long[] the number of active rows, which may exceed capacity).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a capacity outside [0, 2**63), or a tensor of another number of rows or device.
    """
    _dispatch.refuse_transforms("compact_fixed", active, *tensors)
    capacity = _check_capacity(capacity)
    if _for_autograd(*tensors):
        return compact_fixed_reference(active, capacity, *tensors)
    if not _dispatch.eager(_check_active(active), *tensors):
        _check_rows(active, tensors)
        packed, index, count = _compact_fixed_op(active, capacity, list(tensors))
        return Compacted(tuple(packed), index, count)
    try:  # the kernel checks the rows itself: a valid call pays for those checks once
        packed, index, count = _compact_fixed_impl(active, capacity, tensors)
    except (RuntimeError, TypeError):
        _check_rows(active, tensors)
        raise
    return Compacted(tuple(packed), index, count)


def _pairs(packed, out) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(packed, torch.Tensor) and isinstance(out, torch.Tensor):
        return [(packed, out)]
    if isinstance(packed, torch.Tensor) or isinstance(out, torch.Tensor):
        raise TypeError("packed and out must both be tensors or both be sequences of tensors")
    if len(packed) != len(out):
        raise ValueError(f"packed and out must have the same length, got {len(packed)} and {len(out)}")
    return list(zip(packed, out))


def _check_scatter(index, packed, out) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"index must be a torch.Tensor, got {type(index).__name__}")
    if index.dtype != torch.int64 or index.dim() != 1:
        raise ValueError(f"index must be a 1-D int64 tensor, got {index.dtype} of shape {tuple(index.shape)}")
    pairs = _pairs(packed, out)
    for i, (p, o) in enumerate(pairs):
        if not isinstance(p, torch.Tensor) or not isinstance(o, torch.Tensor):
            raise TypeError(f"packed[{i}] and out[{i}] must be tensors")
        if p.dim() == 0 or p.shape[0] != index.shape[0] or o.dim() != p.dim() or o.shape[1:] != p.shape[1:]:
            raise ValueError(
                f"packed[{i}] must have shape ({index.shape[0]}, *out.shape[1:]) with out[{i}] of shape "
                f"{tuple(o.shape)}, got {tuple(p.shape)}"
            )
        if p.dtype != o.dtype:
            raise ValueError(f"packed[{i}] must have the dtype of out[{i}] ({o.dtype}), got {p.dtype}")
        check_same_device(f"packed[{i}]", p, index, "index")
        check_same_device(f"out[{i}]", o, index, "index")
        if any(stride == 0 and size > 1 for stride, size in zip(o.stride(), o.shape)):
            raise ValueError(f"out[{i}] has elements that share memory (an expanded tensor): clone it first")
    # On CUDA this check would wait for the device, under tracing guard on data: there the
    # kernel skips an index past out when it runs.
    if values_checkable(index):
        high = int(index.max())
        rows = min(o.shape[0] for _, o in pairs) if pairs else high + 1
        if high >= rows:
            raise ValueError(f"index values must be < out.shape[0] = {rows}, got {high}")
    return pairs


def scatter_back_reference(index, packed, out):
    """Plain torch version of scatter_back, written for clarity: the same results from the same uniforms.

    Args:
        The arguments of ddpd.ops.scatter_back.

    Returns:
        What ddpd.ops.scatter_back returns (out).

    Raises:
        What ddpd.ops.scatter_back raises.
    """
    for p, o in _check_scatter(index, packed, out):
        taken = index >= 0
        o[index[taken]] = p[taken]
    return out


def _scatter_back_impl(index: torch.Tensor, packed: torch.Tensor, out: torch.Tensor) -> None:
    ops = _kernels_for(index)
    if ops is None:
        scatter_back_reference(index, packed, out)
    else:
        ops.scatter_back_kernel(index, packed, out)


@torch.library.custom_op("ddpd::scatter_back", mutates_args=("out",))
def _scatter_back_op(index: torch.Tensor, packed: torch.Tensor, out: torch.Tensor) -> None:
    _scatter_back_impl(index, packed, out)


@_scatter_back_op.register_fake
def _(index, packed, out):
    return None


def scatter_back(index, packed: Union[torch.Tensor, Sequence[torch.Tensor]],
                 out: Union[torch.Tensor, Sequence[torch.Tensor]]):
    """Write packed rows back in place: out[index[i]] = packed[i] wherever index[i] >= 0.

    Args:
        index: Long[C] as compact_fixed returns it (-1: skipped); entries < out.shape[0]
            (checked on CPU) and distinct (not checked: a repeated entry leaves its row
            unspecified).
        packed: a tensor [C, ...] or a sequence of them.
        out: a tensor [B, ...] or a sequence of them, matching packed; packed may share
            memory with out.

    Returns:
        out.

    Raises:
        TypeError: index not a tensor, or packed and out not both tensors or both
            sequences of tensors.
        ValueError: a wrong dtype (index not int64, packed not of out's dtype), a shape or
            device mismatch, an out whose elements share memory, or an index out of range
            (CPU).
    """
    # out too: a batched out alone reached the kernel, which has no batching rule
    given = [t for arg in (packed, out) for t in (arg if isinstance(arg, (list, tuple)) else [arg])]
    _dispatch.refuse_transforms("scatter_back", index, *given)
    pairs = _check_scatter(index, packed, out)
    eager = _dispatch.eager(index, *(t for pair in pairs for t in pair))
    for p, o in pairs:
        if not eager:  # traced: the op's schema declares the write
            _scatter_back_op(index, p, o)
        elif _for_autograd(p, o) or (o.is_inference() and not torch.is_inference_mode_enabled()):
            scatter_back_reference(index, p, o)  # torch's own checks and errors
        else:  # the kernels copy a packed that shares memory with out before writing
            _scatter_back_impl(index, p, o)
            torch.autograd.graph.increment_version(o)  # what an in-place torch op tells autograd
    return out
