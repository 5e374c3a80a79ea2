"""Where a corpus comes from: a local file, a name (`books`, `text8`) or `hf:NAME[:CONFIG]`.

Imports neither torch nor the rest of ddpd, so that ddpd-train and ddpd-eval can refuse a
--data that names nothing before they import torch (seconds on a busy machine).
ddpd.training.data reads the corpora; it re-exports these names.
"""
from __future__ import annotations

import os

# Corpora by name. text8 on the Hugging Face hub holds the standard 90 M / 5 M / 5 M
# split of the 100 M characters as three one-row splits: joined in order they are
# text8 itself, and ddpd.training.data.SPLIT_FRACTIONS then give back the standard split.
HUB_TEXT8 = "afmck/text8"
CORPUS_NAMES = {"books": "the text8-format public-domain books shipped with ddpd (198 k characters)",
                "text8": f"the full text8 (100 M characters), downloaded with `datasets` from {HUB_TEXT8}"}
LABELLED_SUFFIX = ".jsonl"  # a labelled corpus: {"text", "label"} per line


def resolve_source(source: str, recorded: bool = False) -> str:
    """The canonical form of a corpus source: `hf:NAME[:CONFIG]` as given, an existing
    file as its absolute path (a file named `text8` in the working directory, as
    `unzip text8.zip` makes, before the corpus of that name), else a corpus name of
    CORPUS_NAMES as given. Raises FileNotFoundError for anything else (naming the corpora
    that need no file), and ValueError for an `hf:` without a name.

    Args:
        source: a file path, a corpus name or `hf:NAME[:CONFIG]`.
        recorded: `source` is a canonical form this function returned before (a
            checkpoint's): a corpus name is then that corpus, whatever the working
            directory holds (a file's form is absolute).

    Returns:
        The canonical source string.

    Raises:
        TypeError: `source` is not a str or os.PathLike.
        FileNotFoundError: neither a file nor a known corpus.
        ValueError: an `hf:` source without a name.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"data source must be a path, a corpus name or 'hf:NAME', got {type(source).__name__}")
    source = os.fspath(source)
    if source.startswith("hf:"):
        if not source[3:].partition(":")[0]:
            raise ValueError(f"data source 'hf:NAME[:CONFIG]' needs a dataset name, got {source!r}")
        return source
    if recorded and source in CORPUS_NAMES:
        return source
    if os.path.exists(source):
        return os.path.abspath(source)
    if source in CORPUS_NAMES:
        return source
    names = "; ".join(f"{name}: {what}" for name, what in CORPUS_NAMES.items())
    raise FileNotFoundError(f"no such file: {source} (corpora that need no file: {names}; "
                            "or hf:NAME[:CONFIG] for a Hugging Face dataset)")


def is_labelled(source: str) -> bool:
    """Whether the corpus at `source` is a labelled one (a .jsonl file).

    Args:
        source: a corpus source.

    Returns:
        True for a .jsonl source.
    """
    return os.fspath(source).endswith(LABELLED_SUFFIX)
