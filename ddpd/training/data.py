"""Corpora and tokenizers for training ddpd models.

- `Text8Tokenizer`: the 27-symbol text8 alphabet (space, a-z), the vocabulary of the
  paper's text8 experiments (S = 27; a mask denoiser adds the mask id 27 as input).
- `GPT2Tokenizer`: GPT-2 BPE (S = 50257) built from a local .tiktoken ranks file,
  checked against its known sha256, never fetched from the network.
- `load_text` / `encode_corpus` / `split_tokens`: a corpus is one token stream split
  by position into train / validation / test (90 / 5 / 5), so no evaluated text is
  ever trained on.
- `RandomCrops`: training batches of `seq_len` tokens cut at uniformly random
  offsets, drawn from a `torch.Generator` whose state is saved with a checkpoint so a
  resumed run sees exactly the batches it would have seen.
- `chunk`: non-overlapping fixed-length chunks, for evaluation.
"""
from __future__ import annotations

import os
import re
from typing import Dict, Iterable, Sequence, Tuple

import torch
from torch import Tensor

TEXT8_ALPHABET = " abcdefghijklmnopqrstuvwxyz"
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)

_NOT_TEXT8 = re.compile(r"[^ a-z]")
_TEXT8_TABLE = bytes.maketrans(TEXT8_ALPHABET.encode("ascii"), bytes(range(len(TEXT8_ALPHABET))))


def _check_ids(ids: Iterable[int], vocab_size: int, owner: str) -> list:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"{owner}.decode: ids[{i}] must be an int, got {type(token).__name__} {token!r}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"{owner}.decode: ids[{i}] must be in [0, {vocab_size}), got {token}")
    return ids


class Text8Tokenizer:
    """Characters of the text8 alphabet: ' ' -> 0, 'a' -> 1, ..., 'z' -> 26."""

    vocab_size = len(TEXT8_ALPHABET)

    def encode(self, text: str) -> list:
        if not isinstance(text, str):
            raise TypeError(f"Text8Tokenizer.encode: text must be str, got {type(text).__name__}")
        bad = _NOT_TEXT8.search(text)
        if bad is not None:
            count = len(_NOT_TEXT8.findall(text))
            char = bad.group()
            raise ValueError(
                f"Text8Tokenizer.encode: text must contain only space and a-z (text8 format), got "
                f"{char!r} (U+{ord(char):04X}) at position {bad.start()}; {count} such character(s) in total")
        return list(text.encode("ascii").translate(_TEXT8_TABLE))

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(TEXT8_ALPHABET[i] for i in _check_ids(ids, self.vocab_size, "Text8Tokenizer"))

    def to_config(self) -> dict:
        return {"name": "text8"}

    def __repr__(self) -> str:
        return "Text8Tokenizer()"


class GPT2Tokenizer:
    """GPT-2 BPE (r50k_base) from a local .tiktoken file; '<|endoftext|>' in text is
    encoded as ordinary text, so corpora cannot inject the special token."""

    def __init__(self, path: str):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"GPT2Tokenizer: path must be a file path, got {type(path).__name__}")
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GPT2Tokenizer: tiktoken ranks file not found: {path}")
        try:
            ranks = load_tiktoken_bpe(path, expected_hash=GPT2_SHA256)
        except ValueError as err:
            raise ValueError(f"GPT2Tokenizer: {path} is not the GPT-2 ranks file "
                             f"(expected sha256 {GPT2_SHA256}): {err}") from None
        self.path = path
        self._encoding = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                           special_tokens={GPT2_EOT: len(ranks)})
        self.vocab_size = self._encoding.n_vocab

    def encode(self, text: str) -> list:
        if not isinstance(text, str):
            raise TypeError(f"GPT2Tokenizer.encode: text must be str, got {type(text).__name__}")
        return self._encoding.encode_ordinary(text)

    def decode(self, ids: Iterable[int]) -> str:
        return self._encoding.decode(_check_ids(ids, self.vocab_size, "GPT2Tokenizer"), errors="replace")

    def to_config(self) -> dict:
        return {"name": "gpt2", "path": self.path, "sha256": GPT2_SHA256}

    def __repr__(self) -> str:
        return f"GPT2Tokenizer({self.path!r})"


def tokenizer_from_config(config: dict):
    """The tokenizer described by `to_config()` output (as stored in checkpoints)."""
    if not isinstance(config, dict):
        raise TypeError(f"tokenizer config must be a dict, got {type(config).__name__}")
    name = config.get("name")
    if name == "text8":
        return Text8Tokenizer()
    if name == "gpt2":
        if "path" not in config:
            raise ValueError("tokenizer config for 'gpt2' must give 'path' (the .tiktoken file)")
        return GPT2Tokenizer(config["path"])
    raise ValueError(f"tokenizer config 'name' must be 'text8' or 'gpt2', got {name!r}")


def load_text(source: str) -> str:
    """The text of a corpus: a local UTF-8 text file (read whole; one final line break
    is dropped), or `hf:NAME[:CONFIG]`, the "text" column of a Hugging Face
    dataset's train split joined by line breaks (through `datasets`; needs a network
    or a local datasets cache). Local files need no `datasets` and write no cache."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"data source must be a path or 'hf:NAME', got {type(source).__name__}")
    source = os.fspath(source)
    if source.startswith("hf:"):
        return _load_hub_text(source[3:])
    if not os.path.isfile(source):
        raise FileNotFoundError(f"data file not found: {source}")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    return text[:-1] if text.endswith("\n") else text


def _load_hub_text(name: str) -> str:
    repo, _, config = name.partition(":")
    if not repo:
        raise ValueError(f"data source 'hf:NAME[:CONFIG]' needs a dataset name, got 'hf:{name}'")
    try:
        rows = _load_dataset_quietly(repo, config or None, split="train")
    except Exception as err:  # datasets raises many kinds (offline, missing, bad config)
        raise ValueError(f"could not load Hugging Face dataset {name!r}: {err}") from None
    if "text" not in rows.column_names:
        raise ValueError(f"Hugging Face dataset {name!r} has no 'text' column (columns: {rows.column_names})")
    return "\n".join(rows["text"])


def _load_dataset_quietly(*args, **kwargs):
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(*args, **kwargs)
    finally:
        if shown:
            datasets.enable_progress_bars()


def encode_corpus(text: str, tokenizer) -> Tensor:
    """The whole text as one Long[N] token stream."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def split_tokens(tokens: Tensor, fractions: Sequence[float] = SPLIT_FRACTIONS) -> Dict[str, Tensor]:
    """Split a Long[N] stream by position into {'train', 'validation', 'test'}:
    the first fractions[0] of the tokens, the next fractions[1], the rest."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D tensor, got {type(tokens).__name__} "
                         f"{tuple(getattr(tokens, 'shape', ()))}")
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three positive numbers summing to 1, got {tuple(fractions)}")
    n = tokens.numel()
    train_end = int(n * fractions[0])
    validation_end = int(n * (fractions[0] + fractions[1]))
    return {"train": tokens[:train_end], "validation": tokens[train_end:validation_end],
            "test": tokens[validation_end:]}


def load_splits(source: str, tokenizer, fractions: Sequence[float] = SPLIT_FRACTIONS) -> Dict[str, Tensor]:
    """Load, tokenize and split a corpus (see `load_text`, `split_tokens`)."""
    return split_tokens(encode_corpus(load_text(source), tokenizer), fractions)


def chunk(tokens: Tensor, seq_len: int) -> Tensor:
    """Non-overlapping Long[N // seq_len, seq_len] chunks; the remainder is dropped."""
    _check_positive("seq_len", seq_len)
    n = tokens.numel() // seq_len
    return tokens[: n * seq_len].reshape(n, seq_len)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


class RandomCrops:
    """Endless Long[batch_size, seq_len] batches cut from `tokens` at offsets drawn
    uniformly from [0, N - seq_len] with a private generator seeded by `seed`.

    `state_dict()` / `load_state_dict()` capture the generator, so a restored
    sampler continues with exactly the batches the original would have produced.
    """

    def __init__(self, tokens: Tensor, seq_len: int, batch_size: int, seed: int):
        _check_positive("seq_len", seq_len)
        _check_positive("batch_size", batch_size)
        if not isinstance(tokens, Tensor) or tokens.dim() != 1:
            raise ValueError(f"tokens must be a 1-D tensor, got {type(tokens).__name__}")
        if tokens.numel() < seq_len:
            raise ValueError(f"seq_len must be <= the number of tokens ({tokens.numel()}), got {seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.batches = 0
        self._window = torch.arange(seq_len)

    def __iter__(self) -> "RandomCrops":
        return self

    def __next__(self) -> Tensor:
        starts = torch.randint(0, self.tokens.numel() - self.seq_len + 1, (self.batch_size,),
                               generator=self.generator)
        self.batches += 1
        return self.tokens[starts[:, None] + self._window]

    def state_dict(self) -> Dict[str, object]:
        return {"generator": self.generator.get_state(), "batches": self.batches}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        self.generator.set_state(state["generator"])
        self.batches = int(state["batches"])


def evaluation_batches(tokens: Tensor, seq_len: int, batch_size: int, max_batches: int) -> Tuple[Tensor, ...]:
    """Up to `max_batches` Long[<=batch_size, seq_len] batches of chunks picked evenly
    across `tokens`, the same on every call (a fixed evaluation set)."""
    _check_positive("max_batches", max_batches)
    _check_positive("batch_size", batch_size)
    chunks = chunk(tokens, seq_len)
    if chunks.shape[0] == 0:
        raise ValueError(f"seq_len must be <= the number of evaluation tokens ({tokens.numel()}), got {seq_len}")
    wanted = min(chunks.shape[0], max_batches * batch_size)
    picked = chunks[torch.linspace(0, chunks.shape[0] - 1, wanted).round().long()]
    return tuple(picked.split(batch_size))
