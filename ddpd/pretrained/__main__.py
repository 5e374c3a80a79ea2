"""python -m ddpd.pretrained PLANNER DENOISER [--uniform DIR] --dest DIR [--dtype float16]: write a default bundle.

Copies the weights and configs of a planner and a mask-denoiser checkpoint (as
written by ddpd-train), and of a single uniform model with --uniform, into the bundle
directory --dest, after checking that they are
what the default of ddpd-sample must be (see ddpd.pretrained). Make it the default
with DDPD_PRETRAINED_DIR=DIR. The bundle shipped in the package is replaced only when
--dest names its directory (its previous version is then kept as text8.previous).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from ddpd.pretrained import BUNDLE_DIR, ENV_VAR, WEIGHT_DTYPES, bundle_bytes, install_bundle, is_packaged


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m ddpd.pretrained PLANNER DENOISER --dest DIR`: write a default bundle.

    Args:
        argv: the command line without the program name; None: sys.argv[1:].

    Returns:
        The exit status: 0; 2 for a bad command line (a --dest no bundle may replace, checkpoints
        that do not make a default bundle, a --dtype their weights overflow, a bundle over the
        size limit), 1 for a failure (a missing or damaged checkpoint, a write that fails), after
        a one-line error.
    """
    from ddpd.streams import Stdout, standard_streams

    standard_streams()
    # --dest is checked below, to name what it is for; the usage line shows it as required
    parser = argparse.ArgumentParser(prog="python -m ddpd.pretrained", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [-h] planner denoiser [--uniform DIR] --dest DIR "
                                           f"[--dtype {{{','.join(WEIGHT_DTYPES)}}}]")
    parser.add_argument("planner", help="planner checkpoint directory")
    parser.add_argument("denoiser", help="mask-denoiser checkpoint directory")
    parser.add_argument("--uniform", metavar="DIR",
                        help="a single uniform model's checkpoint directory, shipped beside the pair as uniform/ "
                             "(ddpd-sample --model uniform)")
    parser.add_argument("--dest", metavar="DIR", help=f"bundle directory to write (required; {BUNDLE_DIR} "
                                                      "replaces the shipped default, keeping its previous version)")
    parser.add_argument("--dtype", choices=WEIGHT_DTYPES, default="float32",
                        help="storage type of the weights (float16 halves the size; loaded as float32)")
    args = parser.parse_args(argv)
    if args.dest == "":
        print("python -m ddpd.pretrained: error: --dest must be a path, got ''", file=sys.stderr)
        return 2
    if args.dest is None:
        print(f"python -m ddpd.pretrained: error: --dest is required: the directory to write the bundle to (then "
              f"set {ENV_VAR} to it to make it the default; --dest {BUNDLE_DIR} replaces the bundle shipped in "
              "the package)", file=sys.stderr)
        return 2
    status = _install(args)
    if status:
        return status
    kept = f"; the previous bundle is in {BUNDLE_DIR.parent / (BUNDLE_DIR.name + '.previous')}" \
        if is_packaged(args.dest) else ""
    stdout = Stdout()
    stdout.print(f"wrote {args.dest} ({bundle_bytes(args.dest)} bytes){kept}")
    try:
        stdout.check("the bundle is written")
    except OSError as err:
        print(f"python -m ddpd.pretrained: error: {err}", file=sys.stderr)
        return 1
    return 0


def _install(args: argparse.Namespace) -> int:
    """install_bundle with its errors as the tools' exit statuses (docs/cli.md): what the command
    line asks for that cannot be (the --dest, the models, --dtype) 2, as ddpd-sample and ddpd-train
    give it; a missing or damaged checkpoint, or a failed write, 1. Returns 0 once written."""
    from ddpd.checkpoint import CheckpointError, ensure_replaceable
    from ddpd.files import OutputError

    try:  # install_bundle checks --dest too, but there its refusal is a damaged checkpoint's error class
        ensure_replaceable(args.dest, "bundle")
    except (CheckpointError, OutputError) as err:  # OutputError: --dest . (the working directory)
        return _error(err, 2)
    try:
        install_bundle(args.planner, args.denoiser, args.dest, args.dtype, uniform=args.uniform)
    except (CheckpointError, OSError) as err:
        return _error(err, 1)
    except ValueError as err:
        return _error(err, 2)
    return 0


def _error(err: BaseException, status: int) -> int:
    print(f"python -m ddpd.pretrained: error: {err}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
