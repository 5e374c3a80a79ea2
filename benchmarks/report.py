"""Write docs/performance.md's tables from the rows of benchmarks/results/<device>.jsonl.

A table lives between two comments in the Markdown, which name the device's rows file and,
optionally, one op:

    <!-- rows: nvidia-h200 -->
    ...the generated table...
    <!-- end rows: nvidia-h200 -->

Everything outside such blocks is prose and is left as it is. A rows file makes a table a
device (headed by its name where there are several), a line per case (op, shape, dtype,
params) and benchmark that timed it with plain-torch baselines ("torch: ..."): ddpd's
median, the fastest plain-torch code's and ddpd's speed-up over it (a CPU's table: the
speed-up only), for each mode the rows hold (eager; graph: CUDA-graph replay) against that
mode's fastest (named "eager / graph" where they differ), and the commit that measured it.
An op's table (`<!-- rows: nvidia-h200 ddpd_sample -->`) has one line per case and
baseline, whatever the baseline (for whole sampling runs: the other runs). Rows against
"related: ..." code (another job) follow a device's table in a table of their own.

    python benchmarks/report.py            # rewrite the tables
    python benchmarks/report.py --check    # exit 1 if a table is not what the rows give
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional

import rows as result_rows

DOC = result_rows.ROOT / "docs" / "performance.md"
BLOCK = re.compile(r"(<!-- rows: (?P<name>[a-z0-9-]+)(?: (?P<op>\w+))? -->\n)(?P<body>.*?)"
                   r"(<!-- end rows: (?P=name)(?: (?P=op))? -->)", re.S)
TORCH = "torch: "
RELATED = "related: "  # torch code for another job (ddpd.testing.baselines.RELATED): shown apart


def seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def fastest(candidates: list[dict]) -> Optional[dict]:
    """The row of the fastest plain-torch baseline among a case's rows of one mode."""
    torch_rows = [r for r in candidates if r["baseline"].startswith(TORCH)]
    return min(torch_rows, key=lambda r: r["baseline_median"]) if torch_rows else None


def table(rows: list[dict]) -> str:
    """The Markdown tables of a rows file: one a device, headed by its name where there are several."""
    devices = list(dict.fromkeys(r["device"] for r in rows))
    return "\n".join((f"{device}:\n\n" if len(devices) > 1 else "") + device_table([r for r in rows
                                                                                   if r["device"] == device])
                     for device in devices)


def timed_by(source: str) -> str:
    """The benchmark that timed a row, by its file's name."""
    return source.rsplit("/", 1)[-1]


def absolute(rows: list[dict]) -> bool:
    """Whether a table gives times: a GPU's rows, named by the device; a CPU's times depend on
    its load and neighbours, so its table gives the speed-ups only."""
    return not any(r["device"].startswith("CPU") for r in rows)


def markdown(head: list[str], lines: list[list[str]], times: list[int]) -> str:
    """A Markdown table of head and lines, less the columns at the indices times (if given)."""
    keep = [i for i in range(len(head)) if i not in times]
    made = ["| " + " | ".join(cells[i] for i in keep) + " |" for cells in [head, *lines]]
    return "\n".join([made[0], "|---" * len(keep) + "|", *made[1:]]) + "\n"


def device_table(rows: list[dict]) -> str:
    """The Markdown table of one device's rows (see the module docstring)."""
    modes = [mode for mode in ("eager", "graph") if any(r["mode"] == mode for r in rows)]
    cases: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        case = (r["op"], tuple(r["shape"]), r["dtype"], r["params"], timed_by(r["source"]))
        cases.setdefault(case, {}).setdefault(r["mode"], []).append(r)
    label = f" ({' / '.join(modes)})" if len(modes) > 1 else ""
    head = ["op", "shape", "dtype", "params", "timed by", f"ddpd{label}", "fastest torch code", f"its time{label}",
            f"speed-up{label}", "commit"]
    lines = []
    for (op, shape, dtype, params, source), by_mode in cases.items():
        best = {mode: fastest(by_mode.get(mode, [])) for mode in modes}
        if best[modes[0]] is None:
            continue
        ours = " / ".join(seconds(best[m]["median"]) if best[m] else "-" for m in modes)
        theirs = " / ".join(seconds(best[m]["baseline_median"]) if best[m] else "-" for m in modes)
        ratio = " / ".join(f"{best[m]['ratio']:.2f}x" if best[m] else "-" for m in modes)
        # each mode's own fastest: named once when the modes agree
        names = list(dict.fromkeys(best[m]["baseline"][len(TORCH):] for m in modes if best[m]))
        lines.append([f"`{op}`", " x ".join(map(str, shape)), dtype, params or "-", source, ours, " / ".join(names),
                      theirs, ratio, best[modes[0]]["commit"]])
    return markdown(head, lines, [] if absolute(rows) else [5, 7]) + related_table(rows)


def related_table(rows: list[dict]) -> str:
    """The rows against related torch code of another job, a line each, after a heading; ""
    if there are none."""
    related = [r for r in rows if r["baseline"].startswith(RELATED)]
    if not related:
        return ""
    head = ["op", "shape", "dtype", "params", "timed by", "mode", "ddpd", "related torch code", "its time", "ratio",
            "commit"]
    lines = [[f"`{r['op']}`", " x ".join(map(str, r["shape"])), r["dtype"], r["params"] or "-",
              timed_by(r["source"]), r["mode"], seconds(r["median"]), r["baseline"][len(RELATED):],
              seconds(r["baseline_median"]), f"{r['ratio']:.2f}x", r["commit"]] for r in related]
    return ("\nAgainst related torch code for another job (less work or other outputs: not the fastest "
            "torch code for ddpd's job):\n\n" + markdown(head, lines, [] if absolute(rows) else [6, 8]))


def op_table(rows: list[dict]) -> str:
    """The Markdown table of one op's rows: a line per case and baseline."""
    head = ["shape", "dtype", "params", "mode", "ddpd", "baseline", "its time", "speed-up", "commit"]
    lines = [[" x ".join(map(str, r["shape"])), r["dtype"], r["params"] or "-", r["mode"], seconds(r["median"]),
              r["baseline"], seconds(r["baseline_median"]), f"{r['ratio']:.2f}x", r["commit"]] for r in rows]
    return markdown(head, lines, [] if absolute(rows) else [4, 6])


def render(text: str, results: Path = result_rows.RESULTS) -> str:
    """text with every rows block regenerated from results/<name>.jsonl.

    Raises:
        FileNotFoundError: a block names a device whose rows file does not exist.
    """
    def block(match: re.Match) -> str:
        path = results / f"{match.group('name')}.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"a table names {path}, which does not exist")
        rows, op = result_rows.read(path), match.group("op")
        made = op_table([r for r in rows if r["op"] == op]) if op else table(rows)
        return match.group(1) + made + match.group(5)

    return BLOCK.sub(block, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from what its rows give")
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file (default %(default)s)")
    parser.add_argument("--results", type=Path, default=result_rows.RESULTS,
                        help="the folder of the <device>.jsonl files (default %(default)s)")
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    blocks = [" ".join(filter(None, m.group("name", "op"))) for m in BLOCK.finditer(text)]
    try:
        new = render(text, args.results)
    except FileNotFoundError as error:
        print(f"report: {error}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"report: the tables of {args.doc} are not those of the rows; run python benchmarks/report.py",
                  file=sys.stderr)
            return 1
        return 0
    args.doc.write_text(new)
    print(f"report: {len(blocks)} table(s) of {args.doc} written ({', '.join(blocks) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
