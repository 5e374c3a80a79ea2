"""The fused DDPD sampler: Algorithm 1 (alg:sampling) with the per-step work done by ddpd.ops.

Same sampler as `ddpd.sampling.gillespie` with clock='planner' (the reference,
readable spec); a step of the fused path

1. runs the planner on the rows in the batch and hands its logits to
   ddpd.ops.planner_select (uniform denoiser) or planner_select_mask (mask
   denoiser), which in one pass return the positions to denoise (k without
   replacement, Gumbel-top-k on sigmoid or softmax weights, prop:self-loop-jumps),
   sum_d p(z^d = N | x_t) for the time estimate t = alpha^{-1}(1 - sum_p / D)
   ('Adaptive Time Correction'), the stop flag of option A (every p < eps) and,
   for the mask denoiser, the mask z of prop:draw_with_maskD with its count;
2. with stop='eps', records the stops; every `sync_every`-th step the batch reads
   them on the host (the loop's only synchronisation) and finished rows leave it
   (ddpd.sampling.fused_batch), before the denoiser runs;
3. runs the denoiser's backbone on the (masked) sequence and draws the new tokens
   at the chosen positions only (ddpd.sampling.fused_draws.draw_at: the output head
   at those positions, or gathered logits rows for a plain callable);
4. writes the tokens, leaving unchanged the positions of zero weight and the rows
   that stopped since the last check.

Given the same noise source, it chooses the positions and tokens the reference
chooses. There is no Python branch on a device value and no .item() inside a step.
"""
from __future__ import annotations

from typing import Callable

import torch

from ddpd.sampling.common import SampleResult
from ddpd.sampling.fused_batch import FusedBatch
from ddpd.sampling.fused_draws import OpDraws, draw_at


@torch.no_grad()
def fused_planner_clock(planner: Callable, denoiser: Callable, batch: FusedBatch, draws: OpDraws, opts,
                        denoiser_type: str, mask_id: int, vocab_size: int) -> SampleResult:
    """The planner-clock loop of ddpd_sample(fused=True); opts: its checked options."""
    length = opts.length
    stop_eps = opts.stop == "eps"
    for i in range(opts.steps):
        logits = batch.planner(planner, batch.x)
        k = opts.positions_per_step(i)
        if denoiser_type == "mask":
            positions, sum_p, stop, masked, _, count = draws.plan_mask(i, logits, batch.x, mask_id, batch.rows, k,
                                                                       opts.selection, opts.eps)
        else:
            positions, sum_p, stop = draws.plan(i, logits, batch.rows, k, opts.selection, opts.eps)
            masked = count = None
        if stop_eps:
            logits, positions, sum_p, masked, count = batch.finish(stop, i, logits, positions, sum_p, masked, count)
            if batch.finished:
                break
        if denoiser_type == "mask":
            x_in, t = masked, opts.schedule.inverse(1.0 - count.float() / length)
        else:
            x_in, t = batch.x, opts.schedule.inverse((1.0 - sum_p / length).clamp(0.0, 1.0))
        tokens = draw_at(batch, denoiser, x_in, t, positions, vocab_size, opts.temperature(i),
                         draws.tokens(i, batch.rows, k, vocab_size))
        # Zero-weight positions (drawn only when fewer than k had weight) change nothing.
        change = logits.gather(1, positions) > float("-inf")
        if stop_eps:
            change &= batch.running()[:, None]
        batch.x = batch.x.scatter(1, positions, torch.where(change, tokens, batch.x.gather(1, positions)))
    return batch.result(opts.steps)
