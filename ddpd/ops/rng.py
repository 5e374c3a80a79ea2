"""Counter-based random numbers shared by every ddpd op: the torch reference of the Philox
stream, the Gumbel transform every path applies to it, and the randomness arguments of the ops.

Each uniform is a pure function of (seed, offset, row id, column) (Philox4x32-10, in (0, 1]),
so a row keeps its stream whatever the batch; the C++ (csrc/rng.h) and Triton
(kernels/rng.py) paths reproduce these bits exactly. Every op takes explicit uniforms
(`noise`) or (seed, offset) (ints or int64 tensors read by the kernels) with per-row ids, or a
torch.Generator; `noise = philox_uniform(seed, offset, row_ids, width)` reproduces a seeded call,
except multinomial's: its draws take 48-bit uniforms from pairs of columns, which
ddpd.ops.multinomial.draw_uniforms returns.
The stream, 64-bit row ids and the arguments: docs/ops/rng.md.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Optional, Union

import torch

from ddpd.ops import _dispatch, _ext
from ddpd.validation import check_same_device, check_shape, check_tensor, transformed, values_checkable

BELOW_ONE = 1.0 - 2.0**-24  # largest float32 under 1
PHILOX_BLOCK = 1024  # columns per program of philox_uniform's Triton kernel
_MASK32 = 0xFFFFFFFF
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
_ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of a * b for a 32-bit constant a and uint32 values
    held in int64. b is split in 16-bit halves so no product overflows int64."""
    b_lo = b & 0xFFFF
    b_hi = b >> 16
    p_lo = a * b_lo  # < 2**48
    p_hi = a * b_hi  # < 2**48
    mid = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    lo = mid & _MASK32
    hi = (p_hi >> 16) + (mid >> 32)
    return hi & _MASK32, lo


def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on int64 tensors holding uint32 values (broadcasting).

    Args:
        c0: the first counter word.
        c1: the second counter word.
        c2: the third counter word.
        c3: the fourth counter word.
        k0: the first key word, an int or such a tensor.
        k1: the second key word, likewise.

    Returns:
        (c0, c1, c2, c3) the four output words.
    """
    for _ in range(_ROUNDS):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def row_key(seed, rows: torch.Tensor) -> tuple:
    """Philox key words (k0, k1) of each row id: the seed's words below 2**32, the derived key
    of docs/ops/rng.md.

    Args:
        seed: an int, or an int64 0-d tensor holding its bits.
        rows: int64 tensor of row ids (holding uint64 bits).

    Returns:
        (k0, k1), ints or int64 tensors shaped like rows.
    """
    seed_lo, seed_hi = seed & _MASK32, (seed >> 32) & _MASK32
    row_hi = (rows >> 32) & _MASK32
    # One extra evaluation per row (not per column). Skipped where no row needs it, when
    # that costs no host sync and no trace guards on it (values_checkable): most ids are small.
    if values_checkable(rows) and not bool(row_hi.any()):
        return seed_lo, seed_hi
    ones = torch.full_like(row_hi, _MASK32)
    d0, d1, _, _ = philox4x32(row_hi, ones, ones, ones, seed_lo, seed_hi)
    return torch.where(row_hi != 0, d0, seed_lo), torch.where(row_hi != 0, d1, seed_hi)


def philox_words(seed, offset, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """First Philox output word (uint32 in int64) for row ids rows [N] x columns cols [M].

    Args:
        seed: an int, or an int64 0-d tensor on the rows' device holding its bits.
        offset: like seed.
        rows: Long[N] row ids.
        cols: Long[M] columns.

    Returns:
        Int64[N, M] the words.
    """
    rows = rows[:, None]
    k0, k1 = row_key(seed, rows)
    c0 = (cols & _MASK32)[None, :]
    c1 = rows & _MASK32
    zero = torch.zeros_like(c1)
    c2 = zero + (offset & _MASK32)
    c3 = zero + ((offset >> 32) & _MASK32)
    w, _, _, _ = philox4x32(c0, c1, c2, c3, k0, k1)
    return w.expand(rows.shape[0], cols.numel())


def check_uint64(name: str, value) -> int:
    """A seed or offset given as a number: an int in [0, 2**64), or any integer with
    __index__ such as numpy's (a bool is refused), as a Python int. Callers take tensors first
    (a tensor of one int has __index__ too, but its value is read on the device).

    Args:
        name: the argument's name, for the message.
        value: the value given.

    Returns:
        `value` as an int.

    Raises:
        TypeError: not an integer, or a bool.
        ValueError: out of range.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if not 0 <= value < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2**64), got {value}")
    return value


def check_seed(seed, offset) -> tuple:
    """Validate a seed and an offset: integers in [0, 2**64) (check_uint64), or int64 tensors
    of one element (their bits).

    Args:
        seed: the seed given.
        offset: the offset given.

    Returns:
        (seed, offset), a number as a Python int, a tensor as given.

    Raises:
        TypeError: either is not an integer, or a tensor of another dtype or size.
        ValueError: either is out of range.
    """
    checked = []
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.int64 or value.numel() != 1:
                raise TypeError(f"{name} must be an int in [0, 2**64) or an int64 tensor of one element, got "
                                f"{value.dtype} of shape {tuple(value.shape)}")
            checked.append(value)
        else:
            checked.append(check_uint64(name, value))
    return tuple(checked)


def philox_uniform(
    seed,
    offset,
    rows: Union[torch.Tensor, Sequence[int]],
    cols: Union[torch.Tensor, int],
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Uniforms in (0, 1] from (seed, offset, row id, column) (docs/ops/rng.md). CUDA tensors
    run ddpd.kernels.rng (a torch Philox costs some 600 kernel launches and ~130 bytes a
    uniform at its peak); CPU tensors whose columns are a run within [0, 2**32) run ddpd._C's
    vector Philox once the extension is loaded (ddpd.ops.load_extension, or any fused op);
    others the torch reference philox_uniform_reference. Every path gives the same bits.

    Args:
        seed: int in [0, 2**64) or an int64 tensor of one element holding its bits.
        offset: like seed.
        rows: row ids, Long[N] or ints (64-bit: an id >= 2**63 is an int below 2**64 or the
            negative int64 of its bits).
        cols: the number of columns M (an int, numpy's or a 0-d integer tensor; columns
            0..M-1) or Long[M] (32-bit: the counter's column word; column c + 2**32 is column c).
        device: the device of the result when rows is not a tensor.

    Returns:
        Float32[N, M].

    Raises:
        TypeError: a seed or offset tensor not int64 of one element, rows or cols a tensor of
            floats or bools, or cols a bool or a float.
        ValueError: a seed or offset out of range, a row id outside [-2**63, 2**64), a
            negative number of columns, or rows / cols not 1-D.
    """
    counted = _column_count(cols) is not None  # columns 0 .. cols - 1: a run by construction
    seed, offset, rows, cols = _philox_arguments(seed, offset, rows, cols, device)
    if philox_kernel_runs(rows, cols, seed, offset):
        return philox_uniform_triton(seed, offset, rows, cols)
    # ddpd._C only once loaded: this op never builds it
    first = _column_run(cols, counted) if rows.is_cpu and _ext.loaded() and _direct(rows, cols, seed, offset) else None
    if first is not None:
        counters = (int(v) if isinstance(v, torch.Tensor) else as_int64(v) for v in (seed, offset))
        return _dispatch.cpu_kernel("philox_uniforms_cpu")(*counters, rows.contiguous(), first, cols.numel(), "best")
    return _uniforms(seed, offset, rows, cols)


def _column_run(cols: torch.Tensor, counted: bool) -> Optional[int]:
    """first where cols are the run first .. first + M - 1 within [0, 2**32), the columns
    ddpd._C's Philox computes (csrc/cpu/uniforms.cpp); else None."""
    n = cols.numel()
    first = 0 if counted or not n else int(cols[0])
    if first < 0 or first + n > 2**32 or not (counted or torch.equal(cols, torch.arange(first, first + n))):
        return None
    return first


def philox_uniform_reference(seed, offset, rows: Union[torch.Tensor, Sequence[int]], cols: Union[torch.Tensor, int],
                             device: Optional[torch.device] = None) -> torch.Tensor:
    """Plain torch version of philox_uniform, written for clarity, on every device.

    Args:
        As philox_uniform.

    Returns:
        As philox_uniform.

    Raises:
        As philox_uniform.
    """
    return _uniforms(*_philox_arguments(seed, offset, rows, cols, device))


def _uniforms(seed, offset, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The torch Philox's uniforms of checked arguments (_philox_arguments)."""
    return ((philox_words(seed, offset, rows, cols) >> 8).to(torch.float32) + 0.5) * (2.0**-24)


def _philox_arguments(seed, offset, rows, cols, device) -> tuple:
    """philox_uniform's arguments checked: (seed, offset) as ints or 0-d tensors on the rows'
    device, rows Long[N], cols Long[M]."""
    seed, offset = check_seed(seed, offset)
    for name, ids in (("rows", rows), ("cols", cols)):  # a float id was truncated to another row's
        if isinstance(ids, torch.Tensor) and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool):
            raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")
    rows = torch.as_tensor(rows, dtype=torch.int64, device=device) if isinstance(rows, torch.Tensor) else \
        _ids("rows", rows, device)
    count = _column_count(cols)
    if count is not None:
        if count < 0:
            raise ValueError(f"cols must be >= 0 (the number of columns), got {count}")
        cols = torch.arange(count, dtype=torch.int64, device=rows.device)
    elif not isinstance(cols, torch.Tensor) and not hasattr(cols, "__iter__"):  # a float count: not "a sequence"
        raise TypeError(f"cols must be a number of columns (an int) or the columns (an integer tensor or a "
                        f"sequence of ints), got {cols!r}")
    cols = cols.to(rows.device, torch.int64) if isinstance(cols, torch.Tensor) else _ids("cols", cols, rows.device)
    if rows.dim() != 1 or cols.dim() != 1:
        raise ValueError(f"rows and cols must be 1-D, got shapes {tuple(rows.shape)} and {tuple(cols.shape)}")
    seed, offset = (v.reshape(()).to(rows.device) if isinstance(v, torch.Tensor) else v for v in (seed, offset))
    return seed, offset, rows, cols


def _ids(name: str, ids, device) -> torch.Tensor:
    """Ids given as a sequence of ints, as Long[N]: an int in [2**63, 2**64) as the int64 of its
    bits; a float id refused (torch would truncate it to another id)."""
    try:
        given = torch.as_tensor(ids, device=device)
    except (OverflowError, ValueError, RuntimeError, TypeError):  # an int beyond int64, or numpy's
        given = None  # uint64 in a list: torch cannot unpack it; operator.index can
    if given is not None and given.numel() == 0:
        return given.to(torch.int64)
    if given is not None and not (given.is_floating_point() or given.is_complex() or given.dtype == torch.bool):
        return given.to(torch.int64)
    try:
        values = [operator.index(r) for r in ids]
    except TypeError:
        raise TypeError(f"{name} must be an integer tensor or a sequence of ints, got {ids!r}") from None
    for r in values:
        if not -2**63 <= r < 2**64:
            raise ValueError(f"{name} must hold ids in [-2**63, 2**64), got {r}")
    return torch.as_tensor([as_int64(r) for r in values], dtype=torch.int64, device=device)


def _column_count(cols) -> Optional[int]:
    """cols as a number of columns when it is an integer scalar (an int, numpy's, a 0-d
    integer tensor); None for columns given one by one."""
    if isinstance(cols, bool):
        raise TypeError("cols must be a number of columns or a tensor of columns, got bool")
    if isinstance(cols, int):
        return cols
    if isinstance(cols, torch.Tensor) and cols.dim() != 0:
        return None
    try:
        return operator.index(cols)
    except TypeError:  # a sequence of columns, or a 0-d tensor of floats (refused with the columns)
        return None


def philox_kernel_runs(rows: torch.Tensor, *others) -> bool:
    """Whether philox_uniform runs its Triton kernel for these arguments: CUDA tensors, Triton
    installed, nothing traced (torch.compile fuses the torch Philox) or wrapped by a transform.

    Args:
        rows: the row ids.
        *others: the call's other arguments.

    Returns:
        True for the kernel.
    """
    return rows.is_cuda and _dispatch.triton_available() and _direct(rows, *others)


def _direct(rows: torch.Tensor, *others) -> bool:
    """Whether philox_uniform may call a kernel: nothing traces the call (torch.compile fuses the
    torch Philox) and no transform wraps its arguments."""
    return _dispatch.eager(rows) and not transformed(rows, *others)


def philox_uniform_triton(seed, offset, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Launch ddpd.kernels.rng.philox_uniform_kernel (CUDA tensors; CPU tensors under
    TRITON_INTERPRET=1).

    Args:
        seed: an int in [0, 2**64), or an int64 0-d tensor on rows' device holding its bits.
        offset: like seed.
        rows: Long[N] row ids.
        cols: Long[M] columns, on rows' device.

    Returns:
        Float32[N, M].

    Raises:
        ValueError: more blocks of PHILOX_BLOCK columns than one CUDA grid axis takes.
    """
    kernel = _dispatch.kernels("rng").philox_uniform_kernel
    rows, cols = rows.contiguous(), cols.contiguous()
    grid = _dispatch.flat_grid("the uniforms", rows.numel(), cols.numel(), PHILOX_BLOCK)  # before allocating
    out = torch.empty(rows.numel(), cols.numel(), dtype=torch.float32, device=rows.device)
    if out.numel():
        seed_t, offset_t = (v if isinstance(v, torch.Tensor) else None for v in (seed, offset))
        seed, offset = (0 if isinstance(v, torch.Tensor) else v for v in (seed, offset))
        _dispatch.launch(kernel, grid, rows, cols, cols.numel(),
                         *split32(seed), *split32(offset), seed_t, offset_t, out, BLOCK=PHILOX_BLOCK)
    return out


def seed_from_generator(generator: Optional[torch.Generator]) -> tuple[int, int]:
    """Draw a (seed, offset) pair from a torch.Generator (or the global one), on the
    generator's device (torch refuses a CUDA generator's draw on the CPU).

    Args:
        generator: the generator, or None for torch's global one.

    Returns:
        (seed, offset), ints in [0, 2**62).
    """
    device = generator.device if generator is not None else None
    # one call and one tolist: indexing the tensor twice costs an unseeded op call more host time
    seed, offset = torch.randint(0, 2**62, (2,), generator=generator, dtype=torch.int64, device=device).tolist()
    return seed, offset


def gumbel(u: torch.Tensor) -> torch.Tensor:
    """-log(-log u). float32 rounds the top Philox uniform to 1.0, which would give
    +inf: every path clamps u to the largest float32 below 1 first.

    Args:
        u: uniforms in (0, 1].

    Returns:
        The Gumbel variables, shaped like u.
    """
    return -torch.log(-torch.log(u.clamp(max=BELOW_ONE)))


def happens(u: torch.Tensor, p) -> torch.Tensor:
    """Bernoulli(p) events from uniforms in (0, 1]: min(u, BELOW_ONE) < p, as ddpd.ops.bernoulli
    draws them. A plain u < p would miss an event of probability 1 where u is the top grid value
    (1.0 in float32, one uniform in 2**24): a last step's jump that must clear every mask, or a
    planner sure of noise.

    Args:
        u: uniforms in (0, 1].
        p: probabilities in [0, 1], a tensor broadcasting with u or a number.

    Returns:
        Bool, shaped like u (broadcast with p).
    """
    return u.clamp(max=BELOW_ONE) < p


# ---------------------------------------------------------------- the ops' arguments


def resolve_stream(noise: Optional[torch.Tensor], noise_shape: tuple, like: torch.Tensor, seed, offset,
                   generator: Optional[torch.Generator], row_ids: Optional[torch.Tensor], like_name: str) -> tuple:
    """Validate the randomness arguments of a sampling op.

    With `noise` (float32 uniforms in (0, 1] of shape noise_shape) seed, offset,
    generator and row_ids must be left unset. Without it, see resolve_seed.

    Args:
        noise: the op's explicit uniforms, or None.
        noise_shape: the shape noise must have; its first dimension is the rows.
        like: the op's input, whose device noise, row_ids and tensor counters must share.
        seed, offset, generator, row_ids: the op's arguments of these names.
        like_name: the input's argument name (logits, p, ...), for the device messages.

    Returns:
        The counters (seed, offset, seed_tensor, offset_tensor) as resolve_seed returns
        them; (0, 0, None, None) with noise.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: noise beside a stream argument, or a shape, device or value out of range.
    """
    if noise is not None:
        check_noise_alone(seed, offset, generator, row_ids)
        check_tensor("noise", noise, (torch.float32,), len(noise_shape))
        check_shape("noise", noise, noise_shape)
        check_same_device("noise", noise, like, like_name)
        return 0, 0, None, None
    return resolve_seed(seed, offset, generator, row_ids, noise_shape[0], like, like_name)


def flat_row_ids(row_ids: Optional[torch.Tensor], lead: tuple) -> Optional[torch.Tensor]:
    """row_ids (int64, one id per row of the leading shape `lead`) checked and flattened.

    Args:
        row_ids: the op's `row_ids`, or None.
        lead: the leading shape of the op's input.

    Returns:
        Long[prod(lead)], or None when row_ids is None.

    Raises:
        TypeError: row_ids is not an int64 tensor.
        ValueError: row_ids does not have the shape `lead`.
    """
    if row_ids is None:
        return None
    check_tensor("row_ids", row_ids, (torch.int64,))
    if tuple(row_ids.shape) != lead:
        raise ValueError(f"row_ids must have the leading shape {lead} (one id per row), got {tuple(row_ids.shape)}")
    return row_ids.reshape(math.prod(lead))


def check_noise_values(noise: Optional[torch.Tensor], name: str = "noise") -> None:
    """Explicit noise must hold float32 uniforms in (0, 1]: 0 would give a Gumbel variable of
    -inf, NaN no order at all, and uniforms of another dtype are other draws than the ops
    make. The references check the values on CPU, as the C++ kernels do.

    Args:
        noise: the explicit uniforms, or None.
        name: the argument's name, for the message.

    Raises:
        TypeError: noise is not float32.
        ValueError: a CPU value outside (0, 1].
    """
    if noise is not None and noise.dtype != torch.float32:
        raise TypeError(f"{name} must have dtype torch.float32, got {noise.dtype}")
    if noise is None or not noise.is_cpu or noise.numel() == 0:
        return
    bad = ~((noise > 0) & (noise <= 1))
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} values must be uniforms in (0, 1], got {float(noise[row, column])} at row {row}, "
                         f"column {column}")


def check_noise_alone(seed, offset, generator, row_ids) -> None:
    """Explicit noise replaces the stream: no seed, offset, generator or row_ids with it.

    Args:
        seed, offset, generator, row_ids: the op's arguments of these names.

    Raises:
        ValueError: any of them is set.
    """
    if seed is not None or generator is not None or row_ids is not None or not is_zero(offset):
        raise ValueError("pass either noise or seed/offset/generator/row_ids, not both")


def is_zero(offset) -> bool:
    """Whether `offset` is the default 0 (a tensor never is: its value is on the device).

    Args:
        offset: an offset as given to an op.

    Returns:
        True for a non-tensor equal to 0.
    """
    return not isinstance(offset, torch.Tensor) and offset == 0


def check_counter(name: str, value, like: torch.Tensor, like_name: str) -> tuple:
    """A seed or offset: an integer in [0, 2**64) (check_uint64), or an int64 tensor of one
    element on like's device whose value (read by the kernels, never on the host) holds the
    uint64 bits.

    Args:
        name: the argument's name, for the message.
        value: the value given.
        like: the op's input, whose device a tensor must share.
        like_name: the input's argument name, for the device message.

    Returns:
        (int64 bit pattern, None) or (0, the tensor as 0-d); a SymInt traced by torch.compile
        is passed through as (value, None).

    Raises:
        TypeError: not an integer (check_uint64), or a tensor of another dtype or size.
        ValueError: an int out of range, or a tensor on another device.
    """
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64 or value.numel() != 1:
            raise TypeError(f"{name} must be an int or an int64 tensor of one element, got {value.dtype} of shape "
                            f"{tuple(value.shape)}")
        check_same_device(name, value, like, like_name)
        return 0, value.detach().reshape(())
    if isinstance(value, torch.SymInt):  # traced by torch.compile: an int whose value is not known here
        return value, None
    return as_int64(check_uint64(name, value)), None


def resolve_seed(seed, offset, generator: Optional[torch.Generator], row_ids: Optional[torch.Tensor], rows: int,
                 like: torch.Tensor, like_name: str) -> tuple:
    """Validate a counter-based stream and return its counters. A missing seed is drawn
    together with the offset from `generator` (or torch's default generator).

    Args:
        seed: an int, an int64 tensor of one element, or None.
        offset: likewise; must be 0 when seed is None.
        generator: the torch.Generator to draw a missing seed from, or None.
        row_ids: Long[rows] on like's device, or None.
        rows: rows of the op's input.
        like: the op's input.
        like_name: its argument name, for the device messages.

    Returns:
        (seed, offset, seed_tensor, offset_tensor): each of seed and offset either an int64
        bit pattern with tensor None, or 0 with an int64 0-d tensor on like's device that
        the kernels read.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an offset without a seed, a seed beside a generator, or a shape, device
            or value out of range.
    """
    if row_ids is not None:
        check_tensor("row_ids", row_ids, (torch.int64,), 1)
        check_shape("row_ids", row_ids, (rows,))
        check_same_device("row_ids", row_ids, like, like_name)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if seed is None:
        if not is_zero(offset):
            raise ValueError(f"offset needs an explicit seed (it is drawn with the seed otherwise), got {offset}")
        if torch.compiler.is_compiling():
            return traced_seed(generator, like)
        seed, offset = seed_from_generator(generator)
    elif generator is not None:
        raise ValueError("pass either seed or generator, not both")
    seed, seed_t = check_counter("seed", seed, like, like_name)
    offset, offset_t = check_counter("offset", offset, like, like_name)
    return seed, offset, seed_t, offset_t


def traced_seed(generator: Optional[torch.Generator], like: torch.Tensor) -> tuple:
    """The counters of a call without seed under torch.compile: a (seed, offset) pair
    drawn from torch's global generator as tensors on like's device (an int would need
    the value on the host; the kernels read the tensors). torch.compile cannot trace a
    torch.Generator argument.

    Args:
        generator: must be None.
        like: the op's input.

    Returns:
        (0, 0, seed_tensor, offset_tensor).

    Raises:
        TypeError: a generator is given.
    """
    if generator is not None:
        raise TypeError("generator= cannot be traced by torch.compile: pass seed= (an int, or an int64 tensor "
                        "advanced between calls) inside compiled code")
    draws = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=like.device)
    return 0, 0, draws[0], draws[1]


def as_int64(value: int) -> int:
    """The uint64 `value` as the int64 with the same bits (torch op schemas carry int64).

    Args:
        value: an int in [0, 2**64).

    Returns:
        The int in [-2**63, 2**63).
    """
    return value - 2**64 if value >= 2**63 else value


def split32(value: int) -> tuple[int, int]:
    """(low, high) 32-bit words of the uint64 whose bits the int64 `value` holds, each as
    the int32 of its bits: every seed and offset then reaches a Triton kernel as two int32
    arguments (a word at or above 2**31 as a Python int would make it an int64 argument, and
    another compiled variant); the kernels read the words as uint32.

    Args:
        value: an int64 bit pattern.

    Returns:
        (low, high), ints in [-2**31, 2**31).
    """
    # (w ^ 2**31) - 2**31: the uint32 w as the int32 of its bits, without a generator (a
    # per-call cost: every seeded launch splits two counters)
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000, (((value >> 32) & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def counter_value(value: int, tensor: Optional[torch.Tensor]):
    """The uint64 value of a counter from resolve_seed: the int, or the tensor itself (int64
    bits; the torch Philox reads it on its device).

    Args:
        value: the counter's int64 bit pattern.
        tensor: the counter's tensor, or None.

    Returns:
        The tensor when given, else value as a uint64 int.
    """
    return tensor if tensor is not None else value & (2**64 - 1)


def stream_noise(counters: tuple, row_ids: Optional[torch.Tensor], rows: int, width: int,
                 device: torch.device) -> torch.Tensor:
    """The uniforms a seeded call reads, as explicit noise.

    Args:
        counters: (seed, offset, seed_tensor, offset_tensor) as resolve_stream returns them.
        row_ids: Long[rows] stream ids, or None for 0..rows-1.
        rows: rows of the call.
        width: uniforms a row.
        device: the device of the result when row_ids is None.

    Returns:
        Float32[rows, width].
    """
    seed, offset, seed_t, offset_t = counters
    ids = row_ids if row_ids is not None else torch.arange(rows, device=device)
    # the torch Philox on every device: the references draw apart from the kernels they check
    return philox_uniform_reference(counter_value(seed, seed_t), counter_value(offset, offset_t), ids, width)
