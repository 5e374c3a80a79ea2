"""Writing evaluation results: CSV, JSON and Markdown tables; matplotlib for plots (optional).

Rows are flat dicts; a column spec is (key, header, format) with a format such as
'.4f' for numbers, or '' to print the value as it is. Every file is written atomically
(ddpd.files: a temporary beside it, renamed over it when complete), so a full disk or
an interruption leaves the previous report as it was, never a truncated one. The files
written inside a `one_set()` block (a sweep's CSV, Markdown and plot) are published
together at its end (ddpd.files.FileSet), so they never mix two runs.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Optional

from torch import Tensor

from ddpd import files
from ddpd.validation import MissingExtra

Column = tuple[str, str, str]
PLOT_HINT = "matplotlib is not installed; install it with: pip install 'ddpd[eval]'"


class MissingDependency(MissingExtra):
    """An optional dependency of ddpd.eval (matplotlib, for plots) is not installed."""


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend, or MissingDependency.

    Returns:
        The matplotlib.pyplot module.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency(PLOT_HINT) from None
    return plt


def _cell(value, fmt: str) -> str:
    if value is None or value == "":
        return ""
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value).replace("|", "\\|")  # a run directory may hold one; unescaped it ends the cell


def markdown_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """A GitHub Markdown table of `rows` with the given columns.

    Args:
        rows: the rows.
        columns: the columns (key, header, format).

    Returns:
        The table.
    """
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict], path: str) -> None:
    """All rows with the union of their keys as columns, in first-seen order.

    Args:
        rows: the rows.
        path: the CSV file to write (atomically).

    Raises:
        OutputError: the file cannot be written.
    """
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    write_text(buffer.getvalue(), path)


_SET: Optional[files.FileSet] = None  # the set being written, inside one_set()


@contextmanager
def one_set() -> Iterator[None]:
    """Every report written inside the block (write_text, write_csv, write_json,
    save_figure) goes to a temporary, and all are renamed into place together when the
    block ends (ddpd.files.FileSet: a writer killed between the renames leaves a journal
    that the next writer of these files finishes); if the block raises, none is. One
    set at a time (a block inside another adds to the outer set).

    Yields:
        None; reports written inside the block join the set.
    """
    global _SET
    if _SET is not None:
        yield
        return
    _SET = files.FileSet()
    try:
        yield
        _SET.publish()
    finally:
        _SET.discard()
        _SET = None


def write_text(text: str, path: str) -> None:
    """Write a report's text to `path` atomically (in the current set, inside one_set).

    Args:
        text: the content.
        path: the file.

    Raises:
        OutputError: the file cannot be written.
    """
    _parent(path)
    if _SET is not None:
        _SET.open(path).write(text)
    else:
        files.write_text(path, text)


def save_figure(fig, path: str, **kwargs) -> None:
    """fig.savefig to `path` atomically, then close the figure, written or not: pyplot keeps
    every figure it opened until closed (a sweep plotted in a loop held them all).

    Args:
        fig: a matplotlib figure.
        path: the image file.
        **kwargs: passed to fig.savefig.

    Raises:
        OutputError: the file cannot be written.
    """
    try:
        _parent(path)
        image = io.BytesIO()  # the whole image first: a savefig that fails writes nothing
        fig.savefig(image, format=os.path.splitext(path)[1][1:] or "png", **kwargs)
        if _SET is not None:
            _SET.open(path, binary=True).write(image.getvalue())
        else:
            files.write_bytes(path, image.getvalue())
    finally:
        pyplot().close(fig)


def write_json(data, path: str) -> None:
    """Write `data` as indented JSON to `path` atomically (in the current set, inside one_set).
    A NaN or infinite float (the standard error of one sample) is written as null: JSON has
    no NaN, and strict readers refuse Python's.

    Args:
        data: a JSON-serialisable value.
        path: the file.

    Raises:
        OutputError: the file cannot be written.
    """
    write_text(json.dumps(_finite_or_null(data), indent=2, allow_nan=False) + "\n", path)


def _finite_or_null(data):
    """data with every non-finite float replaced by None, through dicts, lists and tuples."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite_or_null(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_null(value) for value in data]
    return data


def _parent(path: str) -> None:
    files.make_parents(path, os.path.dirname(os.path.abspath(path)))


def mean_and_se(values: Tensor) -> tuple[float, float]:
    """Mean and standard error of the mean of a 1-D tensor (se NaN for fewer than two values:
    one sample says nothing of the spread, and a 0 would pass for certainty).

    Args:
        values: a 1-D tensor.

    Returns:
        (mean, standard error).
    """
    values = values.double().flatten()
    if values.numel() < 2:
        return float(values.mean()), math.nan
    return float(values.mean()), float(values.std() / values.numel() ** 0.5)
