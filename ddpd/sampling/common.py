"""What every sampler shares: the checked settings of a run and the write of drawn tokens.

`setup` is the public boundary of every sampler: it checks the shape, step budget,
temperature, schedule, mask id, randomness and the option objects (ddpd.sampling.options),
and returns a `Run`; nothing below it checks again. `start` gives the first state of a run
(noise, with a prompt's given values); `write` puts drawn tokens in place; `subset` /
`expand` restrict a pass to some rows and put its results back; `run_steps` runs the steps
of the mask and tau-leaping loops, from CUDA graphs between stop checks in a fused run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.models.precision import resolve_dtype
from ddpd.process import Schedule, get_schedule, uniform_token
from ddpd.sampling.batch import Condition
from ddpd.sampling.draws import Draws, make_draws
from ddpd.sampling.noise import INIT, NoiseSource, make_noise
from ddpd.sampling.options import Execution, Guidance, Prompt, Temperature, Truncation, check_option, described
from ddpd.validation import check_device, check_int


@dataclass(frozen=True)
class Run:
    """The checked settings of one sampler call."""

    batch_size: int
    length: int
    vocab_size: int
    steps: int
    temperature: Temperature
    schedule: Schedule
    mask_id: Optional[int]
    noise: NoiseSource
    device: Optional[torch.device]
    x_init: Optional[Tensor] = None
    frozen: Optional[Tensor] = None
    condition: Optional[Condition] = None

    def temperature_at(self, step: int) -> float:
        """The temperature of a step (Temperature.at over the run's steps).

        Args:
            step: the step index.

        Returns:
            The temperature, a float.
        """
        return self.temperature.at(step, self.steps)


def setup(sampler: str, batch_size, length, vocab_size, *, steps, temperature, schedule, seed, generator, noise,
          device, prompt, guidance, truncation, execution, mask_id=None, masks: bool = False,
          planner: bool = False) -> tuple[Run, Draws]:
    """Check a sampler call (the keywords of the public samplers).

    Args:
        sampler: the sampler's name, for the messages.
        batch_size: B, an int >= 1.
        length: D, an int >= 1.
        vocab_size: V, an int >= 2.
        steps: the step budget, an int in [1, 2**61].
        temperature: a Temperature, or what Temperature(...) takes.
        schedule: a Schedule or its name (ddpd.process.get_schedule).
        seed: the sampler's `seed`.
        generator: the sampler's `generator`.
        noise: the sampler's `noise` source.
        device: the device of the run, or None.
        prompt: a Prompt, or None.
        guidance: a Guidance, or None.
        truncation: a Truncation.
        execution: an Execution.
        mask_id: the mask token (masks only: a ValueError otherwise; default vocab_size).
        masks: the sampler uses a mask id.
        planner: the sampler runs a planner network (Guidance.conditional_planner applies).

    Returns:
        (run, its Draws strategy).

    Raises:
        TypeError: an argument or option of the wrong type, or a conditional planner for a
            sampler without a planner.
        ValueError: a value out of range, or a prompt or labels that do not fit the batch.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    length = check_int("length", length, 1)
    vocab_size = check_int("vocab_size", vocab_size, 2)
    steps = check_int("steps", steps, 1, 2**61)  # noise offsets step * 8 + stream stay distinct mod 2**64
    if not isinstance(temperature, Temperature):
        temperature = Temperature(temperature)
    schedule = get_schedule(schedule)
    if masks:
        mask_id = vocab_size if mask_id is None else check_int("mask_id", mask_id, vocab_size)
    elif mask_id is not None:  # read nowhere: refused rather than ignored
        raise ValueError(f"mask_id is read with a mask denoiser only ({sampler} reads no mask token here), "
                         f"got {mask_id}")
    noise = make_noise(seed, generator, noise)
    if device is not None:
        device = check_device("device", device)
    check_option(sampler, "truncation", truncation, Truncation)
    check_option(sampler, "execution", execution, Execution)
    if check_option(sampler, "prompt", prompt, Prompt, optional=True) is not None:
        prompt = prompt.check(batch_size, length, vocab_size, device)  # None: it gives nothing
    condition = _condition(sampler, check_option(sampler, "guidance", guidance, Guidance, optional=True),
                           batch_size, device, planner)
    dtype = resolve_dtype(execution.dtype, device)
    x_init, frozen = (None, None) if prompt is None else (prompt.x_init, prompt.frozen)
    run = Run(batch_size, length, vocab_size, steps, temperature, schedule, mask_id, noise, device, x_init, frozen,
              condition)
    return run, make_draws(noise, execution, dtype, truncation)


def _condition(sampler: str, guidance: Optional[Guidance], batch_size: int, device, planner: bool):
    """The Condition (ddpd.sampling.batch) of a run's guidance, checked against the batch, or None."""
    if guidance is None:
        return None
    if guidance.conditional_planner and not planner:  # ignoring it would hide a mistake
        raise TypeError(f"{sampler}: Guidance.conditional_planner does not apply (this sampler runs no planner "
                        f"network)")
    if tuple(guidance.labels.shape) != (batch_size,):
        raise ValueError(f"labels must be a Long tensor of shape [{batch_size}], got {described(guidance.labels)}")
    labels = guidance.labels.to(device) if device is not None else guidance.labels
    return Condition(labels, guidance.scale, guidance.conditional_planner)


def start(run: Run, draws: Draws, masks: bool = False, **state: Tensor):
    """The running batch at the start of a run: x_0 ~ uniform over the vocabulary
    (p_noise^unif, from the INIT stream), or the all-mask sequence (masks=True), with the
    values x_init gives; in its state the given positions (if any) as "given" and the frozen
    ones as "frozen". A row the prompt freezes whole cannot change: it stops at step 0 and
    costs no pass.

    Args:
        run: the checked settings of the run.
        draws: the run's Draws strategy, which makes the batch.
        masks: start from the all-mask sequence.
        **state: per-row state tensors to carry with the rows.

    Returns:
        The running batch (RunningBatch or FusedBatch).
    """
    if masks:
        x0 = torch.full((run.batch_size, run.length), run.mask_id, dtype=torch.long, device=run.device)
    else:
        u = run.noise.uniform(0, INIT, torch.arange(run.batch_size, device=run.device), run.length)
        x0 = uniform_token(u, run.vocab_size)
    if run.x_init is not None:
        state["given"] = run.x_init.to(x0.device) >= 0
        x0 = torch.where(state["given"], run.x_init.to(x0.device), x0)
    if run.frozen is not None:
        state["frozen"] = run.frozen.to(x0.device)
    batch = draws.batch(x0, state, run.condition)
    if run.frozen is not None:
        batch.finish(batch.state["frozen"].all(-1), 0)
    return batch


def write(x: Tensor, positions: Tensor, tokens: Tensor, change: Tensor) -> Tensor:
    """x with tokens at positions where change, else unchanged.

    Args:
        x: Long[B, D] the sequences.
        positions: Long[B, k] the positions.
        tokens: Long[B, k] the tokens.
        change: Bool[B, k] which writes to make.

    Returns:
        Long[B, D], a new tensor.
    """
    return x.scatter(1, positions, torch.where(change, tokens, x.gather(1, positions)))


def subset(index: Optional[Tensor], *tensors: Tensor) -> tuple:
    """The rows `index` of each tensor (all rows when index is None).

    Args:
        index: the rows, or None.
        *tensors: the tensors.

    Returns:
        A tuple of the tensors' rows.
    """
    return tensors if index is None else tuple(t[index] for t in tensors)


def expand(index: Optional[Tensor], part: Tensor, full: Tensor) -> Tensor:
    """`full` with its rows `index` replaced by `part` (`part` itself when index is None).

    Args:
        index: the rows, or None.
        part: the rows' new values.
        full: the tensor of all rows.

    Returns:
        A new tensor (or `part`).
    """
    if index is None:
        return part
    full = full.clone()
    full[index] = part
    return full


def run_steps(run: Run, draws: Draws, batch, one_step: Callable, stops: bool,
              kind: Callable[[int], tuple] = lambda i: ()) -> None:
    """one_step(i, temperature, last, check, *kind(i)) for i = 0 .. T - 1 until every row has
    stopped: eagerly at the stop checks, at the last step and in the reference run, from the
    fused run's CUDA graphs in between (ddpd.sampling.graphs, a graph per kind). A step writes
    its results in place, and reads what depends on i from tensors (i is the graph's step
    tensor when replayed).

    Args:
        run: the run's checked settings.
        draws: the run's Draws.
        batch: the running batch.
        one_step: the step; check says whether it is a stop check (only when `stops`).
        stops: whether rows stop before the budget (stop checks are due).
        kind: what else step i needs that tells steps apart (a tuple of Python values; the DDPD
            loop's positions and planner pass), the key of its graph.
    """
    graphs = draws.graphs(batch, run)
    for i in range(run.steps):
        if batch.finished:
            return
        last, temperature, extra = i == run.steps - 1, run.temperature_at(i), kind(i)
        check = stops and batch.check_due(i)
        if graphs is None or check or last:
            one_step(i, temperature, last, check, *extra)
        else:
            graphs.run(extra, lambda step, temperature=temperature, extra=extra:
                       one_step(step, temperature, False, False, *extra), i)


def row(table: Tensor, i) -> Tensor:
    """Row i of a per-step table. A replayed step's i is the graph's 0-d step tensor, which
    plain indexing would read back to the host (illegal while a CUDA graph captures): it is
    selected on the device instead.

    Args:
        table: the table, one row a step.
        i: the step index, an int or a 0-d int64 tensor on the table's device.

    Returns:
        The row (a 0-d tensor for a table of one column per step).
    """
    return table[i] if isinstance(i, int) else table.index_select(0, i.view(1))[0]


def on_device(table: Tensor, device: torch.device) -> Tensor:
    """A per-step table built on the host, where a step reads its row: on CUDA copied from
    pinned memory without a host synchronisation.

    Args:
        table: the table, on the CPU.
        device: the run's device.

    Returns:
        The table on `device`.
    """
    if table.device == device:
        return table
    if device.type == "cuda" and table.device.type == "cpu":
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)
