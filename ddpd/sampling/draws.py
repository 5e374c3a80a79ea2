"""The random draws of a sampler step, made two ways: the reference run and the fused run.

Every sampler is written once (ddpd.sampling.gillespie, tau_leaping, maskgit) against the
`Draws` interface below; a run is handed `ReferenceDraws` (plain torch, the ops' references,
full denoiser logits) or `FusedDraws` (the ddpd.ops kernels, no host synchronisation inside a
step). From a counter-based source (PhiloxNoise) both draw the same positions and tokens.

Methods (B rows in the batch, `rows` their row ids): plan (positions, sum_d p(z^d = N | x_t),
the stop flag; with `mask_id` the masked sequence), tokens_at, tokens_everywhere, rows_with.

docs/sampling.md, section "Internals: reference and fused draws", says when the two runs agree
token for token and when only in law.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ddpd.ops import planner_select, planner_select_mask, reference, sample_categorical, sample_from_hidden
from ddpd.ops.rng import philox_kernel_runs
from ddpd.ops.sample_categorical import TILE, noise_width
from ddpd.sampling.batch import Condition, FusedBatch, RunningBatch, has_head
from ddpd.sampling.graphs import StepGraphs, step_graphs
from ddpd.sampling.noise import MASK, SELECT, TOKEN, NoiseSource, PhiloxNoise
from ddpd.sampling.options import Execution, Truncation


@dataclass
class Plan:
    """The plan of a step: positions Long[B, k], sum_p Float[B], stop Bool[B]; for a mask
    denoiser also the masked sequence Long[B, D] and the mask count Long[B]; with `order` K
    (a commit policy) the planner's first K picks Long[B, K] from the same uniforms, of which
    positions are the first k."""

    positions: Tensor
    sum_p: Tensor
    stop: Tensor
    masked: Optional[Tensor] = None
    count: Optional[Tensor] = None
    order: Optional[Tensor] = None


class Draws:
    """The interface both runs implement (see the module docstring)."""

    def __init__(self, noise: NoiseSource, execution: Execution, dtype: torch.dtype = torch.float32,
                 truncation: Truncation = Truncation()):
        self.noise, self.execution, self.dtype = noise, execution, dtype
        self.controls = truncation.controls()  # top_k / top_p / min_p of every token draw

    def batch(self, x0: Tensor, state: Optional[dict] = None, condition: Optional[Condition] = None) -> RunningBatch:
        """The running batch of a run starting at x0, its networks run in `dtype`.

        Args:
            x0: Long[B, D] the first state.
            state: per-row state tensors to carry with the rows (see ddpd.sampling.batch), or None.
            condition: the class Condition of a guided run, or None.

        Returns:
            A RunningBatch (FusedBatch for a fused run).
        """
        raise NotImplementedError

    def plan(self, step: int, logits: Tensor, rows: Tensor, k: int, selection: str, eps: float,
             x: Optional[Tensor] = None, mask_id: Optional[int] = None, order: int = 0) -> Plan:
        """The step's plan (see Plan).

        Args:
            step: the step index.
            logits: Float[B, D] planner logits.
            rows: Long[B] the rows' ids.
            k: positions to choose a row.
            selection: "sigmoid" or "softmax" (DDPDOptions.selection).
            eps: the stop threshold.
            x: Long[B, D] the sequences, to mask (with mask_id).
            mask_id: the mask token, or None for no mask.
            order: order > k also returns the planner's first `order` picks.

        Returns:
            The Plan.
        """
        raise NotImplementedError

    def rows_with(self, flags: Tensor) -> Optional[Tensor]:
        """Which rows a pass must include when only some rows draw.

        Args:
            flags: Bool[B], the rows that draw.

        Returns:
            Long row indices, or None for all rows.
        """
        raise NotImplementedError

    def graphs(self, batch: RunningBatch, run) -> Optional[StepGraphs]:
        """The CUDA graphs that replay the steps between stop checks, or None (eager steps).

        Args:
            batch: the running batch.
            run: the run's checked settings.

        Returns:
            The StepGraphs, or None.
        """
        return None

    def categorical(self, step: int, rows: Tensor, logits: Tensor, per_row: int, temperature: float,
                    exclude: Optional[Tensor] = None, confidence: bool = False):
        """One draw per row of logits from the TOKEN stream, truncated as the run's Truncation says.

        Args:
            step: the step index.
            rows: Long row ids.
            logits: Float[N, V], N = len(rows) * per_row, the draws of a row consecutive.
            per_row: draws a row.
            temperature: a number, or Float[N] one per draw; 0 is the argmax.
            exclude: Long[N], a token never drawn in each draw, or None.
            confidence: also return the probability of each drawn token under the law it was drawn
                from (the ops' confidence="prob").

        Returns:
            Long[N] the tokens, or (tokens, Float[N] confidences) with confidence.
        """
        raise NotImplementedError

    def tokens_at(self, batch: RunningBatch, denoiser: Callable, step: int, x_in: Tensor, t: Tensor,
                  positions: Tensor, rows: Tensor, vocab_size: int, temperature: float,
                  used: Optional[Tensor] = None, confidence: bool = False):
        """A token at each of positions from denoiser(x_in, t).

        Args:
            batch: the running batch, which runs and counts the pass.
            denoiser: the denoiser network.
            step: the step index.
            x_in: Long[B, D] the denoiser's input.
            t: Float[B] the times.
            positions: Long[B, k] the positions to draw.
            rows: Long[B] the rows' ids.
            vocab_size: V.
            temperature: a number, or Float[B * k] one per draw.
            used: Bool[B], the rows whose tokens the step keeps, or None for all.
            confidence: as in categorical.

        Returns:
            Long[B, k] the tokens, or (tokens, confidences) both [B, k] with confidence.
        """
        logits = batch.denoiser(denoiser, x_in, t, vocab_size, rows=rows, used=used)
        return self.tokens_from(step, rows, logits, positions, temperature, confidence)

    def tokens_from(self, step: int, rows: Tensor, logits: Tensor, positions: Tensor, temperature: float,
                    confidence: bool = False):
        """A token at each of positions from the logits at those positions.

        Args:
            step: the step index.
            rows: Long[B] the rows' ids.
            logits: Float[B, D, V].
            positions: Long[B, k] the positions to draw.
            temperature: a number, or Float[B * k] one per draw.
            confidence: as in categorical.

        Returns:
            Long[B, k] the tokens, or (tokens, confidences) both [B, k] with confidence.
        """
        n, k = positions.shape
        vocab = logits.shape[-1]
        picked = logits.gather(1, positions[..., None].expand(-1, -1, vocab)).reshape(n * k, vocab)
        out = self.categorical(step, rows, picked, k, temperature, confidence=confidence)
        return (out[0].view(n, k), out[1].view(n, k)) if confidence else out.view(n, k)

    def tokens_everywhere(self, step: int, rows: Tensor, logits: Tensor, temperature: float,
                          exclude: Optional[Tensor] = None) -> Tensor:
        """A token at every position of the logits (the baselines).

        Args:
            step: the step index.
            rows: Long[B] the rows' ids.
            logits: Float[B, D, V].
            temperature: a number, or Float[B * D] one per draw.
            exclude: Long[B, D], a token never drawn at each position, or None.

        Returns:
            Long[B, D].
        """
        n, length, vocab = logits.shape
        flat_exclude = None if exclude is None else exclude.reshape(-1)
        return self.categorical(step, rows, logits.reshape(n * length, vocab), length, temperature,
                                flat_exclude).view(n, length)

    def _token_noise(self, step: int, rows: Tensor, per_row: int, vocab_size: int) -> Tensor:
        """The TOKEN uniforms of `per_row` draws in each row, Float[len(rows) * per_row, noise_width(V)].

        A draw over V tokens reads W = token_noise_width(V) uniforms of its row (column j
        drives token j, column V + t tile t); a single tile needs no tile uniform, so it is
        padded with one that takes part in a race of one.
        """
        width = token_noise_width(vocab_size)
        u = self.noise.uniform(step, TOKEN, rows, per_row * width).view(-1, width)
        if width < noise_width(vocab_size):
            u = torch.cat([u, torch.full_like(u[:, :1], 0.5)], 1)
        return u


# Uniforms of the TOKEN stream made at once when several draws a row read them (FusedDraws):
# torch's Philox peaks at ~130 bytes a uniform, philox_uniform's CUDA kernel at ~12 (the
# uniform, its column, the padded copy)
TOKEN_CHUNK = 2**22
TOKEN_CHUNK_CUDA = 2**26


def token_noise_width(vocab_size: int) -> int:
    """Uniforms one categorical draw over vocab_size tokens reads from its row of the TOKEN stream:
    V for a single tile (no tile race), V + n_tiles above (the layout of ddpd.ops.sample_categorical).

    Args:
        vocab_size: V.

    Returns:
        The number of uniforms.
    """
    return vocab_size if vocab_size <= TILE else noise_width(vocab_size)


class ReferenceDraws(Draws):
    """Plain torch: explicit uniforms into the ops' torch references; full denoiser logits."""

    def batch(self, x0: Tensor, state: Optional[dict] = None, condition: Optional[Condition] = None) -> RunningBatch:
        """A RunningBatch (rows leave the step they stop).

        Args:
            As Draws.batch.

        Returns:
            The RunningBatch.
        """
        return RunningBatch(x0, state, condition, self.dtype)

    def plan(self, step, logits, rows, k, selection, eps, x=None, mask_id=None, order=0) -> Plan:
        """The plan from the torch references, with uniforms from the SELECT and MASK streams.

        Args:
            As Draws.plan.

        Returns:
            The Plan.
        """
        length = logits.shape[1]
        u = self.noise.uniform(step, SELECT, rows, length)
        if mask_id is None:
            plan = Plan(*reference.planner_select(logits, max(k, order), selection, eps=eps, noise=u))
            return _ordered(plan, k, order)
        u_mask = self.noise.uniform(step, MASK, rows, length)
        positions, sum_p, stop, masked, _, count = reference.planner_select_mask(
            logits, x, mask_id, k, selection, eps=eps, noise=u, mask_noise=u_mask)
        ranked = reference.planner_select(logits, order, selection, eps=eps, noise=u)[0] if order > k else None
        return Plan(positions, sum_p, stop, masked, count, ranked)

    def rows_with(self, flags: Tensor) -> Optional[Tensor]:
        """The rows that draw (a host synchronisation).

        Args:
            flags: Bool[B], the rows that draw.

        Returns:
            Long row indices.
        """
        return flags.nonzero().flatten()

    def categorical(self, step, rows, logits, per_row, temperature, exclude=None, confidence=False):
        """The draws by the torch reference of sample_categorical, from explicit TOKEN uniforms.

        Args:
            As Draws.categorical.

        Returns:
            As Draws.categorical.
        """
        u = self._token_noise(step, rows, per_row, logits.shape[1])
        out = reference.sample_categorical(logits, temperature, exclude_per_row=exclude, noise=u,
                                           confidence="prob" if confidence else None, **self.controls)
        return (out.tokens, out.confidence) if confidence else out.tokens


class FusedDraws(Draws):
    """The ddpd.ops kernels; uniforms generated in the kernels from a PhiloxNoise source."""

    def __init__(self, noise: NoiseSource, execution: Execution, dtype: torch.dtype = torch.float32,
                 truncation: Truncation = Truncation()):
        super().__init__(noise, execution, dtype, truncation)
        self.philox = isinstance(noise, PhiloxNoise)

    def batch(self, x0: Tensor, state: Optional[dict] = None, condition: Optional[Condition] = None) -> RunningBatch:
        """A FusedBatch (stops recorded on the device, finished rows leave at stop checks).

        Args:
            As Draws.batch.

        Returns:
            The FusedBatch.
        """
        return FusedBatch(x0, state, condition, self.dtype, self.execution.sync_every, self.execution.compaction)

    def plan(self, step, logits, rows, k, selection, eps, x=None, mask_id=None, order=0) -> Plan:
        """The plan from the ops' kernels: the uniforms generated in the kernels from a PhiloxNoise
        source, else drawn from the source and passed as explicit noise.

        Args:
            As Draws.plan.

        Returns:
            The Plan.
        """
        length = logits.shape[1]
        if self.philox:
            stream = self.noise.counters(step, SELECT, rows)
        else:
            stream = dict(noise=self.noise.uniform(step, SELECT, rows, length))
        if mask_id is None:
            return _ordered(Plan(*planner_select(logits, max(k, order), selection, eps=eps, **stream)), k, order)
        ranked = planner_select(logits, order, selection, eps=eps, **stream)[0] if order > k else None
        if self.philox:
            stream["mask_offset"] = self.noise.counters(step, MASK, rows)["offset"]
        else:
            stream["mask_noise"] = self.noise.uniform(step, MASK, rows, length)
        positions, sum_p, stop, masked, _, count = planner_select_mask(logits, x, mask_id, k, selection, eps=eps,
                                                                       **stream)
        return Plan(positions, sum_p, stop, masked, count, ranked)

    def rows_with(self, flags: Tensor) -> Optional[Tensor]:
        """None: every row runs, as which rows draw is not known on the host without a sync.

        Args:
            flags: Bool[B], the rows that draw (unused).
        """
        return None  # every row runs: which rows draw is not known on the host without a sync

    def graphs(self, batch: RunningBatch, run) -> Optional[StepGraphs]:
        """The CUDA graphs of the run (step_graphs), or None where its steps run eagerly.

        Args:
            As Draws.graphs.

        Returns:
            As Draws.graphs.
        """
        return step_graphs(batch, run, self.execution, self.philox)

    def categorical(self, step, rows, logits, per_row, temperature, exclude=None, confidence=False):
        """The draws by ddpd.ops.sample_categorical; several draws a row read their uniforms in
        chunks (_token_chunks).

        Args:
            As Draws.categorical.

        Returns:
            As Draws.categorical.
        """
        wanted = dict(confidence="prob") if confidence else {}
        if per_row == 1 or not self.philox:
            stream = self._token_stream(step, rows, per_row, logits.shape[1])
            out = sample_categorical(logits, temperature, exclude_per_row=exclude, **self.controls, **wanted,
                                     **stream)
            return (out.tokens, out.confidence) if confidence else out.tokens
        parts = [sample_categorical(logits[first:last], _part(temperature, first, last), **self.controls, **wanted,
                                    noise=noise, exclude_per_row=_part(exclude, first, last))
                 for first, last, noise in self._token_chunks(step, rows, per_row, logits.shape[1])]
        tokens = torch.cat([part.tokens for part in parts])
        return (tokens, torch.cat([part.confidence for part in parts])) if confidence else tokens

    def _token_chunks(self, step: int, rows: Tensor, per_row: int, vocab_size: int):
        """(first, last, noise) over the draws of `rows` (per_row each, consecutive): the
        uniforms of draws first .. last - 1, at most TOKEN_CHUNK (TOKEN_CHUNK_CUDA) of them. A
        sampling kernel cannot start a draw at column j * W of its row's stream, so several
        draws a row (every position of MaskGIT and tau-leaping) read explicit uniforms: all
        at once, a GPT-2-size batch needed ~100 GB."""
        width = token_noise_width(vocab_size)
        draws = max(1, (TOKEN_CHUNK_CUDA if philox_kernel_runs(rows) else TOKEN_CHUNK) // width)  # per chunk
        pad = width < noise_width(vocab_size)
        whole_rows = max(1, draws // per_row)
        for r in range(0, len(rows), whole_rows):
            rows_here = rows[r:r + whole_rows]
            spans = [(0, per_row)] if per_row <= draws else \
                [(j, min(per_row, j + draws)) for j in range(0, per_row, draws)]
            for j0, j1 in spans:
                u = self.noise.columns(step, TOKEN, rows_here, j0 * width, (j1 - j0) * width).view(-1, width)
                if pad:
                    u = torch.cat([u, torch.full_like(u[:, :1], 0.5)], 1)
                first = r * per_row + j0
                yield first, first + len(rows_here) * (j1 - j0), u

    def tokens_at(self, batch, denoiser, step, x_in, t, positions, rows, vocab_size, temperature,
                  used=None, confidence=False):
        """With hidden(x, t) and an nn.Linear head, the head runs at the B * k chosen positions only
        (sample_from_hidden); otherwise as Draws.tokens_at.

        Args:
            As Draws.tokens_at.

        Returns:
            As Draws.tokens_at.
        """
        if not has_head(denoiser):
            return super().tokens_at(batch, denoiser, step, x_in, t, positions, rows, vocab_size, temperature, used,
                                     confidence)
        n, k = positions.shape
        h = batch.hidden(denoiser, x_in, t, vocab_size, rows=rows, used=used)
        picked = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1])).reshape(n * k, -1)
        head = denoiser.head
        out = sample_from_hidden(picked, head.weight, head.bias, temperature, **self.controls,
                                 **(dict(confidence="prob") if confidence else {}),
                                 **self._token_stream(step, rows, k, vocab_size))
        return (out.tokens.view(n, k), out.confidence.view(n, k)) if confidence else out.tokens.view(n, k)

    def _token_stream(self, step: int, rows: Tensor, per_row: int, vocab_size: int) -> dict:
        if self.philox and per_row == 1:
            return self.noise.counters(step, TOKEN, rows)
        return dict(noise=self._token_noise(step, rows, per_row, vocab_size))


def _part(value, first: int, last: int):
    """Draws first .. last - 1 of a per-draw tensor; a number (or None) applies to every draw."""
    return value[first:last] if isinstance(value, Tensor) else value


def _ordered(plan: Plan, k: int, order: int) -> Plan:
    """A plan whose selection drew max(k, order) positions: the first k are its positions, all
    of them its order (when order > k)."""
    if order <= k:
        return plan
    plan.order, plan.positions = plan.positions, plan.positions[:, :k]
    return plan


def make_draws(noise: NoiseSource, execution: Execution, dtype: torch.dtype = torch.float32,
               truncation: Truncation = Truncation()) -> Draws:
    """The strategy of a run: fused or reference as `execution` says.

    Args:
        noise: the run's noise source.
        execution: the run's Execution.
        dtype: the dtype the networks run in.
        truncation: the run's Truncation of every token draw.

    Returns:
        A FusedDraws or a ReferenceDraws.
    """
    return (FusedDraws if execution.fused else ReferenceDraws)(noise, execution, dtype, truncation)
