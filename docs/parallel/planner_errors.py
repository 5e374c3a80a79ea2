"""The bundled planner as a detector of wrong tokens (docs/parallel.md, "Why the planner
does not pay"): ddpd.eval.detection.error_detection on held-out text at several
corruption fractions, written as a CSV and printed as a table.

    python docs/parallel/planner_errors.py --data data/wiki.txt --out docs/parallel/planner-errors.csv
"""
from __future__ import annotations

import argparse

import torch

from ddpd.checkpoint import load_bundle
from ddpd.cli.common import OneLineParser, int_type, open_fraction, positive_int
from ddpd.eval.detection import detection_rows, detection_table
from ddpd.eval.heldout import heldout_sequences
from ddpd.eval.report import write_csv
from ddpd.pretrained import default_bundle
from ddpd.process import get_schedule
from ddpd.training.data import tokenizer_from_config


def main(argv=None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the corpus; its test split is scored")
    parser.add_argument("--bundle", help="a planner/ + mask denoiser/ bundle (default: the bundled text8 pair)")
    parser.add_argument("--sequences", type=positive_int, default=256)
    parser.add_argument("--fractions", type=open_fraction, nargs="+", default=[0.1, 0.3, 0.5, 0.7],
                        help="shares of the positions corrupted, each in (0, 1) (default 0.1 0.3 0.5 0.7)")
    parser.add_argument("--seed", type=int_type, default=0)
    parser.add_argument("--out", required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    planner, denoiser, configs = load_bundle(args.bundle or default_bundle())
    config = configs["denoiser"]
    x1 = heldout_sequences(args.data, tokenizer_from_config(config["tokenizer"]), config["model"]["max_seq_len"],
                           num_sequences=args.sequences)
    rows = detection_rows(planner.eval(), denoiser.eval(), x1, args.fractions, config["mask_id"],
                          get_schedule(config["schedule"]), config["vocab_size"], args.seed)
    write_csv(rows, args.out)
    print(detection_table(rows))


if __name__ == "__main__":
    main()
