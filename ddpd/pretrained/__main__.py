"""python -m ddpd.pretrained PLANNER DENOISER [--dest DIR] [--dtype float16]: write the default bundle.

Copies the weights and configs of a planner and a mask-denoiser checkpoint (as
written by ddpd-train) into ddpd/pretrained/text8, or --dest, after checking that
they are what the default of ddpd-sample must be (see ddpd.pretrained).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from ddpd.pretrained import WEIGHT_DTYPES, bundle_bytes, install_bundle


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpd.pretrained", description=__doc__.split("\n\n")[0])
    parser.add_argument("planner", help="planner checkpoint directory")
    parser.add_argument("denoiser", help="mask-denoiser checkpoint directory")
    parser.add_argument("--dest", help="bundle directory to write (default: the packaged ddpd/pretrained/text8)")
    parser.add_argument("--dtype", choices=WEIGHT_DTYPES, default="float32",
                        help="storage type of the weights (float16 halves the size; loaded as float32)")
    args = parser.parse_args(argv)
    try:
        dest = install_bundle(args.planner, args.denoiser, args.dest, args.dtype)
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        print(f"python -m ddpd.pretrained: error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {dest} ({bundle_bytes(dest)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
