"""Held-out sequences for evaluation: fixed-length chunks of a corpus split.

The corpus is split by position (90 / 5 / 5, ddpd.training.data) so that evaluation
never sees training text; the chunks are non-overlapping and, when fewer than all
are asked for, picked evenly across the split (the same ones on every call).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ddpd.eval.checks import check_choice, check_int, check_tensor
from ddpd.training.data import SPLITS, chunk, evenly_spaced, load_splits


def heldout_sequences(source: str, tokenizer, seq_len: int, split: str = "test",
                      num_sequences: Optional[int] = None, text: Optional[str] = None) -> Tensor:
    """Long[N, seq_len] chunks of `split` of the corpus at `source` (a text file or
    hf:NAME), N = num_sequences (default: every chunk).

    Args:
        source: a corpus source (see ddpd.training.load_text).
        tokenizer: the models' tokenizer.
        seq_len: the chunk length.
        split: "train", "validation" or "test".
        num_sequences: how many chunks; None: every chunk.
        text: the corpus's text if already read (load_text(source)), else None.

    Returns:
        Long[N, seq_len].

    Raises:
        ValueError: an unknown split, too few tokens, or as ddpd.training.load_splits.
    """
    check_choice("split", split, SPLITS)
    seq_len = check_int("seq_len", seq_len, 1)
    tokens = load_splits(source, tokenizer, text=text)[split]
    return pick_chunks(tokens, seq_len, num_sequences, what=f"the {split} split of {source}")


def pick_chunks(tokens: Tensor, seq_len: int, num_sequences: Optional[int] = None, what: str = "tokens") -> Tensor:
    """Up to num_sequences non-overlapping chunks of a Long[N] stream, evenly spaced.

    Args:
        tokens: Long[N] token stream.
        seq_len: the chunk length.
        num_sequences: how many chunks; None: every chunk.
        what: what the stream is, for the message.

    Returns:
        Long[n, seq_len].

    Raises:
        TypeError: tokens not a Long tensor.
        ValueError: tokens not 1-D, fewer tokens than one chunk, or than num_sequences chunks.
    """
    check_tensor("tokens", tokens, (torch.long,), 1)  # a [B, D] batch's rows were cut, not its tokens
    chunks = chunk(tokens, seq_len)
    if chunks.shape[0] == 0:
        raise ValueError(f"seq_len: {what} has {tokens.numel()} tokens, fewer than one sequence of {seq_len}")
    if num_sequences is None:
        return chunks
    num_sequences = check_int("num_sequences", num_sequences, 1)
    if num_sequences > chunks.shape[0]:
        raise ValueError(f"num_sequences: {what} holds {chunks.shape[0]} sequences of {seq_len} tokens, "
                         f"got num_sequences={num_sequences}")
    return chunks[evenly_spaced(chunks.shape[0], num_sequences)]
