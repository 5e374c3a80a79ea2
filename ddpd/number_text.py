"""Numbers as a user writes them on a command line or in a policy spec.

`read_number` is int() or float() less the spellings a user hardly means: Python reads
`1_0` as 10 and ` 64` as 64, so a stray underscore or space in `--steps 1_0` would run
ten steps without a word. Exponents (`1e3`), signs, `inf` and `nan` read as before.
Lowest layer: imports nothing from ddpd and no torch (the tools parse before importing it).
docs/cli.md ("Threads, signals, errors") has the details."""
from __future__ import annotations

from typing import Union

REFUSED = "a number has no underscores or spaces"


def read_number(kind: type, text: str) -> Union[int, float]:
    """`kind(text)`, refusing an underscore or whitespace anywhere in `text`.

    Args:
        kind: int or float.
        text: the number as written.

    Returns:
        The number.

    Raises:
        ValueError: `text` is not a number of that kind, or holds an underscore or
            whitespace (the message then ends with REFUSED).
    """
    if "_" in text or any(ch.isspace() for ch in text):
        raise ValueError(f"{text!r}: {REFUSED}")
    return kind(text)


def refusal(err: ValueError) -> str:
    """The reason to add to a "must be a number" message: ': ' + REFUSED where read_number
    refused the text, '' where the text is no number at all.

    Args:
        err: read_number's error.

    Returns:
        The suffix.
    """
    return f": {REFUSED}" if str(err).endswith(REFUSED) else ""
