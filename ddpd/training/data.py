"""Corpora and tokenizers for training ddpd models.

- `Text8Tokenizer` (27 symbols) and `GPT2Tokenizer` (BPE from a shipped, checksummed
  ranks file, never fetched);
- `load_text` / `encode_corpus` / `split_tokens`: one token stream split by position
  into train / validation / test (90 / 5 / 5); `fingerprint` identifies its text;
- `load_labelled`: a `.jsonl` of {"text", "label"} records, split within each class;
- `RandomCrops`: seeded training batches whose generator state a checkpoint saves;
- `chunk`: non-overlapping fixed-length chunks, for evaluation.

docs/training.md ("Corpora and tokenizers") has the details."""
from __future__ import annotations

import base64
import hashlib
import json
import numbers
import operator
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Union

import torch
from torch import Tensor

from ddpd.assets import BOOKS, GPT2_RANKS
from ddpd.training.sources import (  # noqa: F401  (re-exported)
    CORPUS_NAMES,
    HUB_TEXT8,
    LABELLED_SUFFIX,
    is_labelled,
    resolve_source,
)
from ddpd.validation import check_int, require_extra

TEXT8_ALPHABET = " abcdefghijklmnopqrstuvwxyz"
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.9, 0.05, 0.05)


class CorpusTextError(ValueError):
    """A corpus file whose text is not UTF-8 or is empty, that the tokenizer cannot encode, or (a
    labelled corpus) with a line that is not a record or no record: the content of the input
    itself is wrong (the message names it), not a setting it does not fit."""


_NOT_TEXT8 = re.compile(r"[^ a-z]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_TEXT8_TABLE = bytes.maketrans(TEXT8_ALPHABET.encode("ascii"), bytes(range(len(TEXT8_ALPHABET))))


def _check_ids(ids: Iterable[int], vocab_size: int, owner: str) -> list:
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    for i, token in enumerate(ids):
        # numbers.Integral: numpy's integers (a numpy array's items) too, not bools or floats
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"{owner}.decode: ids[{i}] must be an int, got {type(token).__name__} {token!r}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"{owner}.decode: ids[{i}] must be in [0, {vocab_size}), got {token}")
        ids[i] = operator.index(token)  # tiktoken takes Python ints only
    return ids


class Text8Tokenizer:
    """Characters of the text8 alphabet: ' ' -> 0, 'a' -> 1, ..., 'z' -> 26."""

    vocab_size = len(TEXT8_ALPHABET)

    def encode(self, text: str) -> list:
        """The ids of `text`: space 0, a-z 1-26.

        Args:
            text: text8 characters only.

        Returns:
            A list of ints.

        Raises:
            TypeError: `text` is not a str.
            ValueError: a character outside the alphabet (named with its position).
        """
        return list(self._ids(text))

    def encode_tensor(self, text: str) -> Tensor:
        """encode() as a Long tensor, without a Python list (text8 has 100 M characters).

        Args:
            text: text8 characters only.

        Returns:
            Long[len(text)].

        Raises:
            TypeError: `text` is not a str.
            ValueError: a character outside the alphabet.
        """
        ids = self._ids(text)
        if not ids:  # frombuffer refuses an empty buffer
            return torch.empty(0, dtype=torch.long)
        return torch.frombuffer(bytearray(ids), dtype=torch.uint8).long()

    def _ids(self, text: str) -> bytes:
        if not isinstance(text, str):
            raise TypeError(f"Text8Tokenizer.encode: text must be str, got {type(text).__name__}")
        bad = _NOT_TEXT8.search(text)
        if bad is not None:
            count = len(_NOT_TEXT8.findall(text))
            char = bad.group()
            raise ValueError(
                f"Text8Tokenizer.encode: text must contain only space and a-z (text8 format), got "
                f"{char!r} (U+{ord(char):04X}) at position {bad.start()}; {count} such character(s) in total")
        return text.encode("ascii").translate(_TEXT8_TABLE)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids.

        Args:
            ids: ints in [0, 27) (numpy's integers too: a numpy array).

        Returns:
            The text.

        Raises:
            TypeError, ValueError: an id that is not an int in range.
        """
        return "".join(TEXT8_ALPHABET[i] for i in _check_ids(ids, self.vocab_size, "Text8Tokenizer"))

    def to_config(self) -> dict:
        """What a checkpoint records of the tokenizer (tokenizer_from_config reads it).

        Returns:
            {"name": "text8"}.
        """
        return {"name": "text8"}

    def __repr__(self) -> str:
        return "Text8Tokenizer()"


def read_gpt2_ranks(name: str, path: str) -> bytes:
    """The bytes of a GPT-2 .tiktoken ranks file, checked against GPT2_SHA256.

    Args:
        name: what the error calls the file (an argument or setting).
        path: the file.

    Returns:
        Its bytes.

    Raises:
        ValueError: the file holds other bytes, naming both digests.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read()
    actual = hashlib.sha256(data).hexdigest()
    if actual != GPT2_SHA256:
        raise ValueError(f"{name} {path} is not the GPT-2 ranks file: its sha256 is {actual}, expected {GPT2_SHA256}")
    return data


def _ranks(data: bytes) -> dict[bytes, int]:
    """token -> rank of a .tiktoken file's `base64 rank` lines, parsed as tiktoken's loader does,
    without the file cache that keeps a copy of every path it reads in $TMPDIR/data-gym-cache."""
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


class GPT2Tokenizer:
    """GPT-2 BPE (r50k_base) from a .tiktoken ranks file: by default the one shipped
    with ddpd (ddpd.assets.GPT2_RANKS); '<|endoftext|>' in text is encoded as ordinary
    text, so corpora cannot inject the special token."""

    def __init__(self, path: Optional[str] = None):
        tiktoken = require_extra("tiktoken", "gpt2", "the GPT-2 tokenizer")
        if path is None:
            path = GPT2_RANKS
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"GPT2Tokenizer: path must be a file path, got {type(path).__name__}")
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GPT2Tokenizer: tiktoken ranks file not found: {path}")
        ranks = _ranks(read_gpt2_ranks("GPT2Tokenizer: path", path))
        self.path = path
        self._encoding = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                           special_tokens={GPT2_EOT: len(ranks)})
        self.vocab_size = self._encoding.n_vocab

    def encode(self, text: str) -> list:
        """The GPT-2 BPE ids of `text`.

        Args:
            text: Unicode text.

        Returns:
            A list of ints.

        Raises:
            TypeError: `text` is not a str.
            ValueError: `text` holds a lone surrogate.
        """
        if not isinstance(text, str):
            raise TypeError(f"GPT2Tokenizer.encode: text must be str, got {type(text).__name__}")
        bad = _SURROGATE.search(text)
        if bad is not None:  # tiktoken would encode it as U+FFFD: a silent change of the text
            raise ValueError(f"GPT2Tokenizer.encode: text must be Unicode text, got a lone surrogate "
                             f"U+{ord(bad.group()):04X} at position {bad.start()} (undecodable bytes?)")
        return self._encoding.encode_ordinary(text)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids.

        Args:
            ids: ints in [0, 50257) (numpy's integers too: a numpy array).

        Returns:
            The text.

        Raises:
            TypeError, ValueError: an id that is not an int in range.
        """
        return self._encoding.decode(_check_ids(ids, self.vocab_size, "GPT2Tokenizer"), errors="replace")

    def to_config(self) -> dict:
        # No path: every valid ranks file is byte for byte the shipped one (the sha256).
        """What a checkpoint records of the tokenizer (tokenizer_from_config reads it).

        Returns:
            {"name": "gpt2", "sha256": the ranks file's digest}.
        """
        return {"name": "gpt2", "sha256": GPT2_SHA256}

    def __repr__(self) -> str:
        return f"GPT2Tokenizer({self.path!r})"


def tokenizer_from_config(config: dict):
    """The tokenizer described by `to_config()` output (as stored in checkpoints).

    Args:
        config: a to_config() dict.

    Returns:
        A Text8Tokenizer or GPT2Tokenizer.

    Raises:
        TypeError: `config` is not a dict.
        ValueError: an unknown name, or a GPT-2 ranks file of another digest.
    """
    return Text8Tokenizer() if check_tokenizer_config(config) == "text8" else GPT2Tokenizer()


def check_tokenizer_config(config: dict) -> str:
    """The name of the tokenizer a `to_config()` dict describes, checked as tokenizer_from_config
    checks it, without building the tokenizer (GPT-2's reads its ranks file).

    Args:
        config: a to_config() dict.

    Returns:
        "text8" or "gpt2".

    Raises:
        TypeError: `config` is not a dict.
        ValueError: an unknown name, or a GPT-2 ranks file of another digest.
    """
    if not isinstance(config, dict):
        raise TypeError(f"tokenizer config must be a dict, got {type(config).__name__}")
    name = config.get("name")
    if name == "gpt2":
        # Every valid ranks file is byte for byte the shipped one, so a path recorded by an
        # older version is not needed; a recorded sha256 must be that file's.
        digest = config.get("sha256", GPT2_SHA256)
        if digest != GPT2_SHA256:
            raise ValueError(f"tokenizer config records a GPT-2 ranks file of sha256 {str(digest)[:64]}, not "
                             f"{GPT2_SHA256} (the GPT-2 vocabulary ddpd reads)")
    elif name != "text8":
        raise ValueError(f"tokenizer config 'name' must be 'text8' or 'gpt2', got {name!r}")
    return name


def load_text(source: str, recorded: bool = False) -> str:
    """The text of a corpus (see resolve_source): a local UTF-8 text file (read whole;
    one final line break is dropped), `books` (the shipped file), `text8`, or
    `hf:NAME[:CONFIG]`, the "text" column of a Hugging Face dataset's train split joined
    by line breaks (through `datasets`, the `ddpd[hf]` extra; needs a network or a local
    datasets cache). Local files need no `datasets` and write no cache.

    Args:
        source: a file path, "books", "text8" or `hf:NAME[:CONFIG]`.
        recorded: `source` is resolve_source's canonical form (as resolve_source's).

    Returns:
        The text.

    Raises:
        FileNotFoundError: no such file or corpus.
        IsADirectoryError: `source` is a directory.
        CorpusTextError: a file that is not UTF-8 or is empty (a ValueError).
        ValueError: a dataset that cannot be loaded.
    """
    source = resolve_source(source, recorded)
    if source.startswith("hf:"):
        return _load_hub_text(source[3:])
    if source == "text8":
        return _load_hub_text(HUB_TEXT8, splits=SPLITS, joiner="")
    return _read_text_file(str(BOOKS) if source == "books" else source)


def _read_text_file(path: str) -> str:
    if os.path.isdir(path):
        raise IsADirectoryError(f"data {path} is a directory, not a text file")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusTextError(f"data file {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset "
                         f"{err.start})") from None
    text = text[:-1] if text.endswith("\n") else text
    if not text:  # a pipe or device: ddpd-train and ddpd-eval refuse an empty regular file before reading it
        raise CorpusTextError(f"data file {path} is empty")
    return text


def fingerprint(text: str) -> dict:
    """What identifies a corpus: its length in characters and the sha256 of its UTF-8 text.

    Args:
        text: the corpus.

    Returns:
        {"chars": int, "sha256": hex str}.
    """
    return {"chars": len(text), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def _load_hub_text(name: str, splits: Sequence[str] = ("train",), joiner: str = "\n") -> str:
    repo, _, config = name.partition(":")
    require_extra("datasets", "hf", f"the Hugging Face dataset {repo!r}")
    parts = []
    for split in splits:
        try:
            rows = _load_dataset_quietly(repo, config or None, split=split)
        except Exception as err:  # datasets raises many kinds (offline, missing, bad config)
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"could not load the Hugging Face dataset {name!r} (split {split}; downloading it "
                             f"needs a network connection, or a datasets cache that holds it): {reason}") from None
        if "text" not in rows.column_names:
            raise ValueError(f"Hugging Face dataset {name!r} has no 'text' column (columns: {rows.column_names})")
        parts.append(joiner.join(rows["text"]))
    text = joiner.join(parts)
    if not text:
        raise ValueError(f"Hugging Face dataset {name!r} holds no text")
    return text


def _load_dataset_quietly(*args, **kwargs):
    """datasets.load_dataset without progress bars or the hub's retry warnings (a
    failure is reported once, in one line, by the caller)."""
    import logging

    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        return datasets.load_dataset(*args, **kwargs)
    finally:
        hub_log.setLevel(level)
        if shown:
            datasets.enable_progress_bars()


def encode_corpus(text: str, tokenizer, where: Optional[str] = None) -> Tensor:
    """The whole text as one Long[N] token stream; text the tokenizer refuses is a
    ValueError that starts with `where` ("data FILE"), when given.

    Args:
        text: the corpus.
        tokenizer: a Text8Tokenizer or GPT2Tokenizer.
        where: the prefix of an error message, or None.

    Returns:
        Long[N] token ids.

    Raises:
        CorpusTextError: text the tokenizer cannot encode, `where` given (a ValueError).
        ValueError: text the tokenizer cannot encode, without `where`.
    """
    try:
        if hasattr(tokenizer, "encode_tensor"):
            return tokenizer.encode_tensor(text)
        return torch.tensor(tokenizer.encode(text), dtype=torch.long)
    except ValueError as err:
        if where is None:
            raise
        raise CorpusTextError(f"{where}: {str(err).split(': ', 1)[-1]}") from None  # without the tokenizer's name


def split_tokens(tokens: Tensor, fractions: Sequence[float] = SPLIT_FRACTIONS) -> dict[str, Tensor]:
    """Split a Long[N] stream by position into {'train', 'validation', 'test'}:
    the first fractions[0] of the tokens, the next fractions[1], the rest.

    Args:
        tokens: Long[N] token stream.
        fractions: three positive fractions summing to 1.

    Returns:
        {"train", "validation", "test"} -> Long tensors.

    Raises:
        ValueError: `tokens` is not 1-D, or bad fractions.
    """
    if not isinstance(tokens, Tensor) or tokens.dim() != 1:
        raise ValueError(f"tokens must be a 1-D tensor, got {type(tokens).__name__} "
                         f"{tuple(getattr(tokens, 'shape', ()))}")
    _check_fractions(fractions)
    train_end, validation_end = _split_ends(tokens.numel(), fractions)
    return {"train": tokens[:train_end], "validation": tokens[train_end:validation_end],
            "test": tokens[validation_end:]}


def _check_fractions(fractions: Sequence[float]) -> None:
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three positive numbers summing to 1, got {tuple(fractions)}")


def _split_ends(n: int, fractions: Sequence[float]) -> tuple[int, int]:
    """The ends of the train and validation parts of n items: floor(n f) in exact arithmetic
    on the fractions as written (in floats 90 * 0.7 is 62.99..., and 0.7 + 0.2 is 0.899...)."""
    train = Fraction(fractions[0]).limit_denominator(10**9)
    validation = train + Fraction(fractions[1]).limit_denominator(10**9)
    return int(n * train), int(n * validation)


def load_splits(source: str, tokenizer, fractions: Sequence[float] = SPLIT_FRACTIONS,
                text: Optional[str] = None) -> dict[str, Tensor]:
    """Load, tokenize and split a plain-text corpus (see `load_text`, `split_tokens`).

    Args:
        source: a plain-text corpus (see load_text).
        tokenizer: a Text8Tokenizer or GPT2Tokenizer.
        fractions: three positive fractions summing to 1.
        text: the corpus's text if already read (load_text(source)), else None.

    Returns:
        {"train", "validation", "test"} -> Long tensors.

    Raises:
        ValueError: a labelled corpus, or as load_text and encode_corpus.
        FileNotFoundError: as load_text.
    """
    if is_labelled(source):
        raise ValueError(f"data {source} is a labelled corpus ({LABELLED_SUFFIX}); this reads plain text")
    text = load_text(source) if text is None else text
    return split_tokens(encode_corpus(text, tokenizer, f"data {source}"), fractions)


# ---------------------------------------------------------------- labelled corpora


@dataclass
class Records:
    """Records in one Long[N] token stream: record r is tokens[starts[r] : starts[r] + lengths[r]],
    of class labels[r] (labels None: records without labels, e.g. a labelled corpus used
    for an unconditional model). A plain corpus is one record."""

    tokens: Tensor
    starts: Tensor
    lengths: Tensor
    labels: Optional[Tensor] = None

    @classmethod
    def stream(cls, tokens: Tensor) -> Records:
        """A plain token stream as one record.

        Args:
            tokens: Long[N] token stream.

        Returns:
            Records holding one unlabelled record.
        """
        return cls(tokens, torch.zeros(1, dtype=torch.long), torch.tensor([tokens.numel()]))

    def windows(self, seq_len: int) -> Tensor:
        """Long[R]: the windows of seq_len tokens within each record.

        Args:
            seq_len: the window length.

        Returns:
            Long[R], the start of every window that lies within one record.
        """
        return (self.lengths - seq_len + 1).clamp(min=0)

    def select(self, index: Tensor) -> Records:
        """The records `index` (Long), in that order, as a stream of their own.

        Args:
            index: Long record indices.

        Returns:
            The selected Records.
        """
        pieces = [self.tokens[s:s + n] for s, n in zip(self.starts[index].tolist(), self.lengths[index].tolist())]
        lengths = self.lengths[index]
        starts = torch.cumsum(lengths, 0) - lengths
        tokens = torch.cat(pieces) if pieces else self.tokens[:0]
        return Records(tokens, starts, lengths, None if self.labels is None else self.labels[index])

    def split(self, fractions: Sequence[float] = SPLIT_FRACTIONS) -> dict[str, Records]:
        """{'train', 'validation', 'test'}: the records of each class split by position
        (within the class, in corpus order) by `fractions`.

        Args:
            fractions: three positive fractions summing to 1.

        Returns:
            {"train", "validation", "test"} -> Records.
        """
        _check_fractions(fractions)
        labels = self.labels if self.labels is not None else torch.zeros_like(self.lengths)
        parts: dict[str, list[Tensor]] = {name: [] for name in SPLITS}
        for label in torch.unique(labels).tolist():
            index = torch.nonzero(labels == label).flatten()
            n = index.numel()
            ends = (*_split_ends(n, fractions), n)
            for name, begin, end in zip(SPLITS, (0,) + ends[:2], ends):
                parts[name].append(index[begin:end])
        return {name: self.select(torch.sort(torch.cat(index)).values) for name, index in parts.items()}


def _without_repeated_keys(pairs) -> dict:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:  # json.loads would keep the last silently
        raise ValueError(f"the key {repeated[0]!r} appears more than once")
    return dict(pairs)


def load_labelled(source: str, tokenizer, text: Optional[str] = None) -> Records:
    """The labelled corpus at `source` (a .jsonl file; `text`: its content, if already read)
    as Records. ValueError naming the line for anything but {"text": str, "label": int >= 0};
    a byte-order mark at the start is skipped.

    Args:
        source: the .jsonl file.
        tokenizer: a Text8Tokenizer or GPT2Tokenizer.
        text: the file's content if already read, else None.

    Returns:
        The Records.

    Raises:
        CorpusTextError: a line that is not such an object, text the tokenizer cannot encode, or no
            record (a ValueError).
    """
    text = load_text(source) if text is None else text
    text = text[1:] if text.startswith("\ufeff") else text  # an editor's byte-order mark, which JSON readers may skip
    pieces, labels = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"data {source} line {number}"
        try:
            record = json.loads(line, object_pairs_hook=_without_repeated_keys)
        except json.JSONDecodeError as err:
            raise CorpusTextError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
        except (ValueError, RecursionError) as err:  # an integer of > 4300 digits, nesting too deep
            cause = "nested too deeply" if isinstance(err, RecursionError) else err
            raise CorpusTextError(f"{where}: not JSON ({cause})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise CorpusTextError(f"{where}: expected an object {{\"text\": str, \"label\": int}}, "
                                  f"got {line[:60]!r}")
        if not record["text"]:
            raise CorpusTextError(f"{where}: 'text' is empty (a record needs text to train on)")
        label = record.get("label")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < 2**63:
            # repr: a label written as a string, "0", read "got 0"
            raise CorpusTextError(f"{where}: 'label' must be an int in [0, 2**63) (a class id), got {label!r:.40}")
        pieces.append(encode_corpus(record["text"], tokenizer, where))
        labels.append(label)
    if not pieces:
        raise CorpusTextError(f"data {source} holds no record (only blank lines)")
    lengths = torch.tensor([p.numel() for p in pieces], dtype=torch.long)
    return Records(torch.cat(pieces), torch.cumsum(lengths, 0) - lengths, lengths,
                   torch.tensor(labels, dtype=torch.long))


def chunk(tokens: Tensor, seq_len: int) -> Tensor:
    """Non-overlapping Long[N // seq_len, seq_len] chunks; the remainder is dropped.

    Args:
        tokens: Long[N] token stream.
        seq_len: the chunk length.

    Returns:
        Long[N // seq_len, seq_len].

    Raises:
        TypeError, ValueError: `seq_len` is not an int >= 1 (numpy's integers are ints).
    """
    seq_len = check_int("seq_len", seq_len, 1)
    n = tokens.numel() // seq_len
    return tokens[: n * seq_len].reshape(n, seq_len)


class RandomCrops:
    """Endless Long[batch_size, seq_len] batches cut from `tokens` at offsets drawn
    uniformly from [0, N - seq_len] with a private generator seeded by `seed`. Given
    `Records`, the windows lie within one record each, drawn uniformly over all of them;
    records with labels give (tokens, labels Long[batch_size]) batches.

    `state_dict()` / `load_state_dict()` capture the generator, so a restored
    sampler continues with exactly the batches the original would have produced.
    """

    def __init__(self, tokens: Union[Tensor, Records], seq_len: int, batch_size: int, seed: int):
        seq_len, batch_size = check_int("seq_len", seq_len, 1), check_int("batch_size", batch_size, 1)
        if isinstance(tokens, Tensor) and tokens.dim() == 1:
            tokens = Records.stream(tokens)
        if not isinstance(tokens, Records):
            got = f"shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must be a 1-D tensor or Records, got {got}")  # "Tensor" named no fault
        self.records = tokens
        self.windows = torch.cumsum(tokens.windows(seq_len), 0)  # windows in records 0 .. r
        if not self.windows.numel() or int(self.windows[-1]) < 1:
            longest = int(tokens.lengths.max()) if tokens.lengths.numel() else 0
            raise ValueError(f"seq_len must be <= the number of tokens of a record ({longest}), got {seq_len}")
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.batches = 0
        self._window = torch.arange(seq_len)

    def __iter__(self) -> RandomCrops:
        return self

    def __next__(self) -> Union[Tensor, tuple[Tensor, Tensor]]:
        # window w of the corpus: record r with windows[r - 1] <= w < windows[r], offset w - windows[r - 1]
        window = torch.randint(0, int(self.windows[-1]), (self.batch_size,), generator=self.generator)
        record = torch.searchsorted(self.windows, window, right=True)
        before = self.windows[record] - self.records.windows(self.seq_len)[record]
        starts = self.records.starts[record] + window - before
        self.batches += 1
        x = self.records.tokens[starts[:, None] + self._window]
        return x if self.records.labels is None else (x, self.records.labels[record])

    def state_dict(self) -> dict[str, object]:
        """The generator state a checkpoint saves, so that a resumed run draws the same batches.

        Returns:
            {"generator": its state, "batches": batches drawn so far}.
        """
        return {"generator": self.generator.get_state(), "batches": self.batches}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore a state_dict() of this sampler.

        Args:
            state: a state_dict() output.
        """
        self.generator.set_state(state["generator"])
        self.batches = int(state["batches"])


def evenly_spaced(n: int, k: int) -> Tensor:
    """Long[k]: k of the indices 0..n-1 (k <= n) evenly spaced from first to last,
    round(i (n - 1) / (k - 1)) with ties to even, in integers: a float32 linspace rounds
    past n - 1 (an index out of range) and repeats indices beyond 2**24.

    Args:
        n: the number of indices to pick from.
        k: how many to pick, at most n.

    Returns:
        Long[k].
    """
    if k == 1:
        return torch.zeros(1, dtype=torch.long)
    num = torch.arange(k, dtype=torch.long) * (n - 1)
    q, r = num // (k - 1), num % (k - 1)
    up = (2 * r > k - 1) | ((2 * r == k - 1) & (q % 2 == 1))
    return q + up.long()


def evaluation_batches(tokens: Union[Tensor, Records], seq_len: int, batch_size: int,
                       max_batches: int) -> tuple:
    """Up to `max_batches` Long[<=batch_size, seq_len] batches of chunks picked evenly
    across `tokens`, the same on every call (a fixed evaluation set). Given Records, the
    chunks are those of each record, and with labels each batch is (chunks, labels).

    Args:
        tokens: Long[N] token stream or Records.
        seq_len: the chunk length.
        batch_size: the most chunks a batch.
        max_batches: the most batches.

    Returns:
        A tuple of batches: Long tensors, or (chunks, labels) pairs for labelled Records.

    Raises:
        TypeError, ValueError: `seq_len`, `batch_size` or `max_batches` is not an int >= 1.
        ValueError: no record holds `seq_len` tokens.
    """
    seq_len = check_int("seq_len", seq_len, 1)  # else a division by zero or a negative range in torch
    max_batches = check_int("max_batches", max_batches, 1)
    batch_size = check_int("batch_size", batch_size, 1)
    records = tokens if isinstance(tokens, Records) else Records.stream(tokens)
    counts = records.lengths // seq_len
    starts = torch.cat([torch.zeros(0, dtype=torch.long)] +
                       [s + seq_len * torch.arange(n) for s, n in zip(records.starts.tolist(), counts.tolist())])
    if starts.numel() == 0:
        longest = int(records.lengths.max()) if records.lengths.numel() else 0
        raise ValueError(f"seq_len must be <= the number of evaluation tokens of a record ({longest}), got {seq_len}")
    wanted = min(starts.numel(), max_batches * batch_size)
    picked = evenly_spaced(starts.numel(), wanted)
    chunks = records.tokens[starts[picked][:, None] + torch.arange(seq_len)]
    if records.labels is None:
        return tuple(chunks.split(batch_size))
    labels = torch.repeat_interleave(records.labels, counts)[picked]
    return tuple(zip(chunks.split(batch_size), labels.split(batch_size)))
