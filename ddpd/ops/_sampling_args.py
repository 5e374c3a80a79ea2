"""Argument checks and randomness plumbing shared by the sampling ops
(planner_select, planner_mask, sample_categorical, sample_from_hidden, multinomial).

Every sampling op takes either explicit uniforms (`noise`) or a counter-based
stream: (seed, offset) from the caller or drawn from a torch.Generator, and
per-row ids (default 0..N-1) so a row keeps its stream whatever the batch.
Column c of explicit noise and column c of the Philox stream play the same role,
so `noise = philox_uniform(seed, offset, row_ids, width)` reproduces the seeded
call exactly. Draws that must be independent need distinct offsets (a sampler
uses one offset per kind of draw and step).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

import torch

from ddpd.ops.rng import philox_uniform, seed_from_generator

BELOW_ONE = 1.0 - 2.0**-24  # largest float32 under 1
MAX_WIDTH = 2**30  # bound on D and V: columns of a row stay below 2**31

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROGRAMS_PER_SM = 4  # Triton grids aim at this many programs per multiprocessor
INTERPRETER_MULTIPROCESSORS = 4  # CPU tensors (the interpreter): a few splits, so they are tested


def check_tensor(name: str, value, dtypes: Sequence[torch.dtype], dim: int) -> torch.Tensor:
    """TypeError/ValueError unless `value` is a tensor of one of `dtypes` with `dim` dims."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {value.dtype}")
    if value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    if value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be on a cpu or cuda device, got {value.device}")
    return value


def check_same_device(name: str, value: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    if value.device != like.device:
        raise ValueError(f"{name} must be on the device of {like_name} ({like.device}), got {value.device}")


def check_shape(name: str, value: torch.Tensor, shape: tuple) -> None:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")


def check_positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    return float(value)


def check_int(name: str, value, low: int, high: int) -> int:
    """TypeError/ValueError unless value is an int with low <= value < high."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value < high:
        raise ValueError(f"{name} must be in [{low}, {high}), got {value}")
    return value


def check_width(name: str, size: int) -> None:
    if not 1 <= size < MAX_WIDTH:
        raise ValueError(f"{name} must be in [1, {MAX_WIDTH}), got {size}")


def as_int64(value: int) -> int:
    """The uint64 `value` as the int64 with the same bits (torch op schemas carry int64)."""
    return value - 2**64 if value >= 2**63 else value


def resolve_stream(
    noise: Optional[torch.Tensor],
    noise_shape: tuple,
    like: torch.Tensor,
    seed,
    offset,
    generator: Optional[torch.Generator],
    row_ids: Optional[torch.Tensor],
) -> tuple:
    """Validate the randomness arguments; return the counters (seed, offset, seed_tensor,
    offset_tensor) of resolve_seed.

    With `noise` (float32 uniforms in (0, 1] of shape noise_shape) seed, generator
    and row_ids must be left unset. Without it, see resolve_seed.
    """
    if noise is not None:
        check_noise_alone(seed, offset, generator, row_ids)
        check_tensor("noise", noise, (torch.float32,), len(noise_shape))
        check_shape("noise", noise, noise_shape)
        check_same_device("noise", noise, like, "the input")
        return 0, 0, None, None
    return resolve_seed(seed, offset, generator, row_ids, noise_shape[0], like)


def check_noise_alone(seed, offset, generator, row_ids) -> None:
    """Explicit noise replaces the stream: no seed, offset, generator or row_ids with it."""
    if seed is not None or generator is not None or row_ids is not None or not is_zero(offset):
        raise ValueError("pass either noise or seed/offset/generator/row_ids, not both")


def is_zero(offset) -> bool:
    """Whether `offset` is the default 0 (a tensor never is: its value is on the device)."""
    return not isinstance(offset, torch.Tensor) and offset == 0


def check_counter(name: str, value, like: torch.Tensor) -> tuple:
    """A seed or offset: an int in [0, 2**64), or an int64 tensor of one element on like's
    device whose value (read by the kernels, never on the host) holds the uint64 bits.
    Returns (int64 bit pattern, None) or (0, the tensor as 0-d)."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64 or value.numel() != 1:
            raise TypeError(f"{name} must be an int or an int64 tensor of one element, got {value.dtype} of shape "
                            f"{tuple(value.shape)}")
        check_same_device(name, value, like, "the input")
        return 0, value.detach().reshape(())
    check_seed_int(name, value)
    return as_int64(value), None


def resolve_seed(seed, offset, generator: Optional[torch.Generator],
                 row_ids: Optional[torch.Tensor], rows: int, like: torch.Tensor) -> tuple:
    """Validate a counter-based stream; return its counters (seed, offset, seed_tensor,
    offset_tensor): each of seed and offset either an int64 bit pattern with tensor None,
    or 0 with an int64 0-d tensor on like's device that the kernels read.

    row_ids: Long[rows] on like's device, or None. A missing seed is drawn together
    with the offset from `generator` (or torch's default generator).
    """
    if row_ids is not None:
        check_tensor("row_ids", row_ids, (torch.int64,), 1)
        check_shape("row_ids", row_ids, (rows,))
        check_same_device("row_ids", row_ids, like, "the input")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if seed is None:
        if not is_zero(offset):
            raise ValueError(f"offset needs an explicit seed (it is drawn with the seed otherwise), got {offset}")
        seed, offset = seed_from_generator(generator)
    elif generator is not None:
        raise ValueError("pass either seed or generator, not both")
    (seed, seed_t), (offset, offset_t) = check_counter("seed", seed, like), check_counter("offset", offset, like)
    return seed, offset, seed_t, offset_t


def check_seed_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2**64) or an int64 tensor, got {value!r}")


def contiguous(*tensors: Optional[torch.Tensor]) -> tuple:
    """Each tensor made contiguous (None stays None): the kernels index rows as
    row * width, so strided noise, row ids or exclusions would be misread."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def split32(value: int) -> tuple[int, int]:
    """(low, high) 32-bit words of the uint64 whose bits the int64 `value` holds."""
    value &= 2**64 - 1
    return value & 0xFFFFFFFF, value >> 32


def counter_value(value: int, tensor: Optional[torch.Tensor]):
    """The uint64 value of a counter from resolve_seed: the int, or the tensor itself (int64
    bits; the torch Philox reads it on its device)."""
    return tensor if tensor is not None else value & (2**64 - 1)


def stream_noise(counters: tuple, row_ids: Optional[torch.Tensor], rows: int, width: int,
                 device: torch.device) -> torch.Tensor:
    """The uniforms a seeded call reads, as explicit noise Float[rows, width]
    (counters as returned by resolve_stream)."""
    seed, offset, seed_t, offset_t = counters
    ids = row_ids if row_ids is not None else torch.arange(rows, device=device)
    return philox_uniform(counter_value(seed, seed_t), counter_value(offset, offset_t), ids, width)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """-log(-log u). float32 rounds the top Philox uniform to 1.0, which would give
    +inf: every path clamps u to the largest float32 below 1 first."""
    return -torch.log(-torch.log(u.clamp(max=BELOW_ONE)))


@functools.lru_cache(maxsize=64)
def device_ids(ids: tuple, device: torch.device) -> torch.Tensor:
    """Long tensor of `ids` (one unused 0 if empty) on device; cached, so repeated
    calls (and CUDA graph captures after a warm-up call) copy nothing."""
    return torch.tensor(ids if ids else [0], dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=8)
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (what the launch grids are sized for)."""
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    return torch.cuda.get_device_properties(device).multi_processor_count


def eager(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a call can go straight to its kernel instead of through the registered
    custom op: nothing traces it (torch.compile, make_fx, fake or functional tensors,
    jit tracing, torch-function modes) and its tensors are plain tensors. The custom-op
    dispatch costs tens of microseconds a call; tracing needs it (the fake kernel, the
    schema), eager calls do not. A few hundred nanoseconds."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled() or torch._C._is_tracing()):
        return False
    return all(t is None or type(t) is torch.Tensor for t in tensors)


def cpu_ops():
    """torch.ops.ddpd with the CPU kernels of ddpd._C loaded."""
    from ddpd.ops import _ext

    _ext.load()
    return torch.ops.ddpd
