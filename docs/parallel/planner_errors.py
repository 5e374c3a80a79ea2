"""The bundled planner as a detector of wrong tokens (docs/parallel.md, "Why the planner
does not pay"): ddpd.eval.detection.error_detection on held-out text at several
corruption fractions, written as a CSV and printed as a table.

    python docs/parallel/planner_errors.py --data data/wiki.txt --out docs/parallel/planner-errors.csv
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from ddpd.checkpoint import load_bundle
from ddpd.eval.detection import error_detection
from ddpd.eval.heldout import heldout_sequences
from ddpd.eval.report import markdown_table, write_csv
from ddpd.pretrained import default_bundle
from ddpd.process import get_schedule
from ddpd.training.data import tokenizer_from_config


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the corpus; its test split is scored")
    parser.add_argument("--bundle", help="a planner/ + mask denoiser/ bundle (default: the bundled text8 pair)")
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    planner, denoiser, configs = load_bundle(args.bundle or default_bundle())
    config = configs["denoiser"]
    x1 = heldout_sequences(args.data, tokenizer_from_config(config["tokenizer"]), config["model"]["max_seq_len"],
                           num_sequences=args.sequences)
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        rows = [dataclasses.asdict(error_detection(planner.eval(), denoiser.eval(), x1, fraction, config["mask_id"],
                                                   get_schedule(config["schedule"]), config["vocab_size"], generator))
                for fraction in args.fractions]
    write_csv(rows, args.out)
    columns = [(name, name, "d" if isinstance(value, int) else ".3f") for name, value in rows[0].items()]
    print(markdown_table(rows, columns))


if __name__ == "__main__":
    main()
