"""Where every random number of a sampler comes from.

A sampler never calls torch.rand itself: each step asks its noise source for a block of
uniforms, named by (step, stream, row ids, number of columns), so the fused run of a sampler
makes the same choices as the reference run from the same source. Each kind of draw of a step
has its own stream and Philox offset (`stream_offset`). Uniforms are in (0, 1].

- `PhiloxNoise(seed, offset)`: counter-based, batch-invariant; the default.
- `TorchNoise(generator)`: sequential torch.Generator draws on the same grid; not batch-invariant.

The Gumbel and exponential transforms are exported here too, so every consumer applies the same
formula. docs/sampling.md, section "Internals: noise", gives the grid and the guarantees.
"""
from __future__ import annotations

import operator
from typing import Optional, Protocol

import torch
from torch import Tensor

# gumbel and happens: the ops' own transforms, re-exported here so that both runs agree bit for bit
from ddpd.ops.rng import (  # noqa: F401
    BELOW_ONE,
    check_noise_values,
    check_seed,
    gumbel,
    happens,
    philox_uniform,
    seed_from_generator,
)

# One stream per kind of draw in a step; the offset of a draw is
# base + step * NUM_STREAMS + stream, so no two draws of a run share counters.
INIT = 0  # initial noise sequence x_0
SELECT = 1  # Gumbel noise choosing the positions to denoise
MASK = 2  # Bernoulli draws of z for the mask denoiser (prop:draw_with_maskD)
TOKEN = 3  # Gumbel noise of the categorical draws of new tokens
EVENT = 4  # per-position jump / unmask / remask events of tau-leaping
CLOCK = 5  # exponential holding times of the exact Gillespie clock
ACCEPT = 6  # thinning acceptance of the exact clock
CONFIDENCE = 7  # Gumbel noise on MaskGIT confidences
NUM_STREAMS = 8

_GRID = 2.0**-24  # the grid of philox_uniform: ((w >> 8) + 0.5) * 2**-24


class NoiseSource(Protocol):
    """Anything that hands out uniforms in (0, 1] (see the module docstring)."""

    def uniform(self, step: int, stream: int, rows: Tensor, cols: int) -> Tensor:
        """Uniforms for `rows` at (step, stream).

        Args:
            step: the step index.
            stream: the draw's stream (INIT, SELECT, MASK, ...).
            rows: Long row ids.
            cols: uniforms a row.

        Returns:
            Float32[len(rows), cols] in (0, 1].
        """
        ...


def stream_offset(base, step, stream: int):
    """The Philox offset of the draws of `stream` at `step` of a run whose base offset is `base`:
    base + step * NUM_STREAMS + stream (mod 2**64), distinct for every (step, stream).

    Args:
        base: an int, or an int64 tensor of one element (the bits of the uint64).
        step: an int, or an int64 tensor on a device (the step counter a CUDA graph advances).
        stream: the draw's stream.

    Returns:
        An int when base and step are ints; otherwise the same value as an int64 tensor (int64
        arithmetic wraps like uint64).
    """
    if isinstance(base, Tensor):
        return base.reshape(()) + (step * NUM_STREAMS + stream)
    if isinstance(step, Tensor):
        low = base - 2**64 if base >= 2**63 else base
        return step * NUM_STREAMS + (low + stream)
    return (base + step * NUM_STREAMS + stream) % 2**64


class PhiloxNoise:
    """Counter-based uniforms: deterministic in (seed, offset, step, stream, row, column).

    first_row is added to the sampler's row ids (0..B-1; row ids are 64-bit end to end, every
    bit enters Philox), so that a run split into
    batches draws sample i from row id i whatever the batch size.
    """

    def __init__(self, seed: int, offset: int = 0, first_row: int = 0):
        seed, offset = check_seed(seed, offset)  # numpy's integers as ints: offsets add in Python ints
        self.seed = seed
        self.offset = offset
        self.first_row = _first_row(first_row)

    def uniform(self, step: int, stream: int, rows: Tensor, cols: int) -> Tensor:
        """Uniforms for `rows` at (step, stream): columns 0 .. cols - 1 of the Philox stream.

        Args:
            step: the step index.
            stream: the draw's stream.
            rows: Long row ids (first_row is added).
            cols: uniforms a row.

        Returns:
            Float32[len(rows), cols] in (0, 1].
        """
        return self.columns(step, stream, rows, 0, cols)

    def columns(self, step: int, stream: int, rows: Tensor, first: int, count: int) -> Tensor:
        """Columns first .. first + count - 1 of uniform(step, stream, rows, .).

        Args:
            step: the step index.
            stream: the draw's stream.
            rows: Long row ids (first_row is added).
            first: the first column.
            count: the number of columns.

        Returns:
            Float32[len(rows), count].
        """
        cols = torch.arange(first, first + count, dtype=torch.int64, device=rows.device)
        return philox_uniform(self.seed, stream_offset(self.offset, step, stream), rows + self.first_row, cols,
                              device=rows.device)

    def counters(self, step, stream: int, rows: Tensor) -> dict:
        """The arguments that make a ddpd.ops sampling op generate, in its kernel, the uniforms
        uniform(step, stream, rows, .) returns.

        Args:
            step: an int, or an int64 tensor on the rows' device (then the offset is a tensor too).
            stream: the draw's stream.
            rows: Long row ids (first_row is added).

        Returns:
            A dict of seed, offset and row_ids, the ops' keywords.
        """
        return dict(seed=self.seed, offset=stream_offset(self.offset, step, stream), row_ids=rows + self.first_row)

    def __repr__(self) -> str:
        return f"PhiloxNoise(seed={self.seed}, offset={self.offset}, first_row={self.first_row})"


def _first_row(first_row) -> int:
    """first_row as an int in [0, 2**62) (numpy's integers too, as the seed takes them);
    ValueError otherwise."""
    try:
        value = None if isinstance(first_row, bool) else operator.index(first_row)
    except TypeError:
        value = None
    if value is None or not 0 <= value < 2**62:
        raise ValueError(f"first_row must be an int in [0, 2**62), got {first_row!r}")
    return value


class TorchNoise:
    """Uniforms on the same grid as PhiloxNoise, drawn in call order from a Generator."""

    def __init__(self, generator: Optional[torch.Generator] = None):
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator

    def uniform(self, step: int, stream: int, rows: Tensor, cols: int) -> Tensor:
        """Uniforms on the Philox grid, drawn in call order from the generator.

        Args:
            step: the step index (unused: the draws follow the call order).
            stream: the draw's stream (unused likewise).
            rows: Long row ids; their number and device shape the result.
            cols: uniforms a row.

        Returns:
            Float32[len(rows), cols] in (0, 1] on the rows' device.
        """
        device = self.generator.device if self.generator is not None else rows.device
        bits = torch.randint(0, 2**24, (rows.numel(), cols), generator=self.generator, device=device)
        return ((bits.to(torch.float32) + 0.5) * _GRID).to(rows.device)


class CheckedNoise:
    """A caller's own NoiseSource, its uniforms checked at each call: another shape, dtype or
    device failed deep in a draw, and a 0 gave an infinite clock or Gumbel variable that the
    reference run took silently (values are read on CPU only, as the ops read them)."""

    def __init__(self, source: NoiseSource):
        self.source = source

    def uniform(self, step: int, stream: int, rows: Tensor, cols: int) -> Tensor:
        """The source's uniforms for `rows` at (step, stream), checked.

        Args:
            step: the step index.
            stream: the draw's stream.
            rows: Long row ids.
            cols: uniforms a row.

        Returns:
            Float32[len(rows), cols] in (0, 1] on the rows' device.

        Raises:
            ValueError: another shape, dtype or device, or a CPU value outside (0, 1].
        """
        u = self.source.uniform(step, stream, rows, cols)
        shape = (rows.numel(), cols)
        if not isinstance(u, Tensor) or u.dtype != torch.float32 or tuple(u.shape) != shape \
                or u.device != rows.device:
            got = f"{u.dtype} of shape {tuple(u.shape)} on {u.device}" if isinstance(u, Tensor) else type(u).__name__
            raise ValueError(f"noise.uniform(step, stream, rows, cols) must return torch.float32 of shape {shape} "
                             f"on {rows.device}, got {got}")
        check_noise_values(u, "noise.uniform")
        return u


def make_noise(seed: Optional[int] = None, generator: Optional[torch.Generator] = None,
               noise: Optional[NoiseSource] = None) -> NoiseSource:
    """The noise source of a sampler call: at most one of seed, generator, noise.

    seed -> PhiloxNoise(seed); generator -> PhiloxNoise with (seed, offset) drawn from
    it; noise -> used as given; none -> PhiloxNoise drawn from torch's default generator.

    Args:
        seed: the sampler's `seed`, or None.
        generator: the sampler's `generator`, or None.
        noise: the sampler's `noise` source, or None.

    Returns:
        The NoiseSource (a source of the caller's own wrapped in CheckedNoise).

    Raises:
        ValueError: more than one of them is given, or a seed out of range.
        TypeError: a noise without a uniform method, or a generator that is not a torch.Generator.
    """
    given = [name for name, v in (("seed", seed), ("generator", generator), ("noise", noise)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"pass at most one of seed, generator, noise; got {', '.join(given)}")
    if noise is not None:
        if not callable(getattr(noise, "uniform", None)):
            raise TypeError(f"noise must have a uniform(step, stream, rows, cols) method, got {type(noise).__name__}")
        return noise if isinstance(noise, (PhiloxNoise, TorchNoise, CheckedNoise)) else CheckedNoise(noise)
    if seed is not None:
        return PhiloxNoise(seed)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return PhiloxNoise(*seed_from_generator(generator))


def exponential(u: Tensor) -> Tensor:
    """Standard exponential variables -log u from uniforms in (0, 1]; u is clamped
    below 1 as in gumbel, so the top grid value (1.0 in float32) gives a positive value, not 0.

    Args:
        u: uniforms in (0, 1].

    Returns:
        The exponential variables, shaped like u.
    """
    return -torch.log(u.clamp(max=BELOW_ONE))
