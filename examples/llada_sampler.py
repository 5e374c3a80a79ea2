"""A LLaDA-style sampler with low-confidence remasking, written against ddpd.ops, beside
its plain-torch version.

The loop of LLaDA's `generate` (ML-GSAI/LLaDA, generate.py): the answer starts all-mask
after the prompt, is decoded block by block, and at each step the k most confident of the
denoiser's proposals at the masked positions are written.

- `llada_ddpd`: one ddpd.ops.sample_categorical call a step draws the proposals at the
  block's masked positions and returns their confidence from the same pass;
- `llada_plain`: the same loop in plain torch, drawing with ddpd.ops.reference.categorical
  from the same counter-based uniforms: the same tokens from the same noise.

docs/examples.md has the options (remasking, rank_by, cfg_scale, attention_mask) and the
precision notes.  Run: python examples/llada_sampler.py"""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Iterator
from typing import Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tiny_networks import TinyDenoiser  # noqa: E402

from ddpd.ops import DrawControls, noise_width, philox_uniform, reference, sample_categorical  # noqa: E402
from ddpd.validation import check_choice, check_float, check_int, check_shape, check_tensor  # noqa: E402

REMASKING = ("low_confidence", "random")
RANK_BY = ("model", "draw")


def check_options(prompt: torch.Tensor, answer: int, steps: int, temperature: float, block_length: Optional[int],
                  cfg_scale: float, remasking: str, rank_by: str, attention_mask: Optional[torch.Tensor]) -> int:
    """Validate the arguments of both loops; returns the block length (default: the answer)."""
    check_tensor("prompt", prompt, (torch.int64, torch.int32), dim=2)  # [B, prompt length] token ids
    block_length = answer if block_length is None else block_length
    for name, value in (("answer", answer), ("steps", steps), ("block_length", block_length)):
        check_int(name, value, 1)
    if answer % block_length:
        raise ValueError(f"block_length must divide answer ({answer}), got {block_length}")
    if steps % (answer // block_length):
        raise ValueError(f"steps must be a multiple of the number of blocks ({answer // block_length}), got {steps}")
    check_float("temperature", temperature, 0.0)
    check_float("cfg_scale", cfg_scale, 0.0)
    check_choice("remasking", remasking, REMASKING)
    check_choice("rank_by", rank_by, RANK_BY)
    if attention_mask is not None:
        check_shape("attention_mask", attention_mask, tuple(prompt.shape))
        # an additive mask (0: a token, -inf: padding) read as 0/1 would swap tokens and padding
        if not ((attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError("attention_mask must hold only 0 and 1 (or False and True), 0 marking padding")
    return block_length


def transfer_counts(answer: int, steps: int) -> list[int]:
    """Positions written at each step: answer // steps, one more in the first answer % steps."""
    return [answer // steps + (i < answer % steps) for i in range(steps)]


def schedule(prompt_length: int, answer: int, steps: int, block_length: int) -> Iterator[tuple[int, int, slice]]:
    """(step, positions to write, the block's columns) for each step, block after block."""
    blocks = answer // block_length
    for b in range(blocks):
        start = prompt_length + b * block_length
        for j, k in enumerate(transfer_counts(block_length, steps // blocks)):
            yield b * (steps // blocks) + j, k, slice(start, start + block_length)


def start(net: TinyDenoiser, prompt: torch.Tensor, answer: int, attention_mask: Optional[torch.Tensor]):
    """The all-mask answer after the prompt, the attention mask over both (None: no padding)."""
    x = torch.cat([prompt, torch.full((prompt.shape[0], answer), net.mask_id, device=prompt.device)], 1)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask.bool(), attention_mask.new_ones(prompt.shape[0], answer).bool()], 1)
    return x, attention_mask


def denoiser_logits(net, x: torch.Tensor, prompt_length: int, cfg_scale: float,
                    attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The network's logits [B, L, V], guided as LLaDA guides them when cfg_scale > 0."""
    def call(tokens, mask):
        return net(tokens) if mask is None else net(tokens, mask)

    if cfg_scale == 0:
        return call(x, attention_mask)
    unconditional = x.clone()
    unconditional[:, :prompt_length] = net.mask_id  # padding too, as LLaDA masks every prompt position
    both = call(torch.cat([x, unconditional]), None if attention_mask is None else attention_mask.repeat(2, 1))
    conditional, unconditional = both.chunk(2)
    return unconditional + (cfg_scale + 1) * (conditional - unconditional)


def write_most_confident(x: torch.Tensor, proposal: torch.Tensor, confidence: torch.Tensor, k: int) -> torch.Tensor:
    """x with the k positions of highest confidence per row (-inf: not a candidate) set to their proposal."""
    chosen = confidence.topk(k, dim=1).indices
    return x.scatter(1, chosen, proposal.gather(1, chosen))


def block_candidates(x: torch.Tensor, mask_id: int, block: slice) -> torch.Tensor:
    """Bool[B, L]: the masked positions of the current block, the only ones a step may write."""
    in_block = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
    in_block[block] = True
    return (x == mask_id) & in_block


@torch.no_grad()
def llada_ddpd(net: TinyDenoiser, prompt: torch.Tensor, answer: int, steps: int, temperature: float = 0.0,
               seed: int = 0, *, block_length: Optional[int] = None, cfg_scale: float = 0.0,
               remasking: str = "low_confidence", rank_by: str = "model",
               attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    block_length = check_options(prompt, answer, steps, temperature, block_length, cfg_scale, remasking, rank_by,
                                 attention_mask)
    x, attention_mask = start(net, prompt, answer, attention_mask)
    rows = torch.arange(x.numel(), device=x.device).view(x.shape)  # one stream per position
    # the op's confidence is that of the law it draws from: LLaDA's rule at temperature 0, or on request
    own_confidence = remasking == "low_confidence" and (temperature == 0 or rank_by == "draw")
    for i, k, block in schedule(prompt.shape[1], answer, steps, block_length):
        candidates = block_candidates(x, net.mask_id, block)
        logits = denoiser_logits(net, x, prompt.shape[1], cfg_scale, attention_mask)[candidates]  # [n, V]
        drawn = sample_categorical(logits, controls=DrawControls(temperature=temperature),
                                   confidence="prob" if own_confidence else None, seed=seed, offset=2 * i,
                                   row_ids=rows[candidates])
        if own_confidence:
            score = drawn.confidence
        elif remasking == "random":
            score = philox_uniform(seed, 2 * i + 1, rows[candidates], 1)[:, 0]
        else:  # LLaDA's rule at temperature > 0: the drawn token's probability at temperature 1
            logits = logits.float()
            score = (logits.gather(1, drawn.tokens[:, None])[:, 0] - logits.logsumexp(1)).exp()
        proposal = x.masked_scatter(candidates, drawn.tokens)
        confidence = torch.full(x.shape, float("-inf"), device=x.device).masked_scatter(candidates, score)
        x = write_most_confident(x, proposal, confidence, k)
    return x


@torch.no_grad()
def llada_plain(net: TinyDenoiser, prompt: torch.Tensor, answer: int, steps: int, temperature: float = 0.0,
                seed: int = 0, *, block_length: Optional[int] = None, cfg_scale: float = 0.0,
                remasking: str = "low_confidence", rank_by: str = "model",
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    block_length = check_options(prompt, answer, steps, temperature, block_length, cfg_scale, remasking, rank_by,
                                 attention_mask)
    x, attention_mask = start(net, prompt, answer, attention_mask)
    rows = torch.arange(x.numel(), device=x.device)
    for i, k, block in schedule(prompt.shape[1], answer, steps, block_length):
        logits = denoiser_logits(net, x, prompt.shape[1], cfg_scale, attention_mask)
        vocab = logits.shape[-1]
        if temperature == 0:
            proposal = logits.argmax(-1)
        else:
            noise = philox_uniform(seed, 2 * i, rows, noise_width(vocab))
            proposal = reference.categorical(logits.reshape(-1, vocab), temperature, noise).tokens.view(x.shape)
        if remasking == "random":
            confidence = philox_uniform(seed, 2 * i + 1, rows, 1).view(x.shape)
        else:
            tempered = rank_by == "draw" and temperature > 0
            probs = torch.softmax(logits.float() / (temperature if tempered else 1.0), -1)
            confidence = probs.gather(-1, proposal[..., None]).squeeze(-1)
        confidence = confidence.masked_fill(~block_candidates(x, net.mask_id, block), float("-inf"))
        x = write_most_confident(x, proposal, confidence, k)
    return x


def main() -> None:
    # --help: this docstring
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    vocab, prompt_length, answer, steps = 50, 4, 12, 6
    net = TinyDenoiser(vocab, prompt_length + answer)
    prompt = torch.randint(0, vocab, (3, prompt_length), generator=torch.Generator().manual_seed(0))
    for temperature, options in ((0.0, {}), (0.7, dict(block_length=4, cfg_scale=0.5))):
        fused = llada_ddpd(net, prompt, answer, steps, temperature, seed=2, **options)
        plain = llada_plain(net, prompt, answer, steps, temperature, seed=2, **options)
        print(f"temperature {temperature} {options}: same tokens: {torch.equal(fused, plain)}")
        print(fused)


if __name__ == "__main__":
    main()
