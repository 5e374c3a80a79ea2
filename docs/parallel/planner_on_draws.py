"""Does the planner pay once it is trained on a parallel decoder's mistakes? (docs/parallel.md,
"Why the planner does not pay"): fine-tunes the bundled planner on a mix of its own
corruption and the mask denoiser's parallel draws, and scores it as a detector of wrong
tokens (ddpd.eval.detection.error_detection) before and after, written as a CSV.

A training sequence is corrupted as the planner's objective does (uniform noise at a share
1 - alpha_t of the positions, label noise); then, in 3 rows of 4, a share f ~ U(0, 1) of the
positions left clean is masked with the noise and drawn at once from the mask denoiser,
labelled noise where the draw differs from the text: the sampler's state under a commit
policy, unwritten positions noise and written ones the denoiser's draws.

    python docs/parallel/planner_on_draws.py --data data/wiki.txt --steps 1200 \\
        --out docs/parallel/planner-on-draws.csv --bundle-out runs/planner-on-draws
"""
from __future__ import annotations

import argparse

import torch

from ddpd.checkpoint import load_bundle, save_bundle
from ddpd.cli.common import OneLineParser, float_type, int_type, open_fraction, positive_int
from ddpd.eval.detection import detection_rows, detection_table, parallel_draws
from ddpd.eval.heldout import pick_chunks
from ddpd.eval.report import write_csv
from ddpd.pretrained import default_bundle
from ddpd.process import corrupt, get_schedule
from ddpd.training.data import RandomCrops, load_splits, tokenizer_from_config
from ddpd.training.losses import planner_loss

DRAWN_ROWS = 0.75  # the other rows keep the paper's corruption alone, which Algorithm 1 relies on


def draws_corruption(denoiser, x1, config, generator):
    """(x, wrong): x1 under uniform noise and parallel draws; wrong is the planner's target."""
    schedule, vocab = get_schedule(config["schedule"]), config["vocab_size"]
    t = torch.rand(x1.shape[0], generator=generator)
    x, noise = corrupt(x1, t, schedule, "uniform", vocab, generator=generator)
    share = torch.rand(x1.shape[0], 1, generator=generator) * (torch.rand(x1.shape[0], 1, generator=generator)
                                                                < DRAWN_ROWS)
    drawn = ~noise & (torch.rand(x1.shape, generator=generator) < share)
    tokens, _ = parallel_draws(denoiser, x1, noise | drawn, config["mask_id"], schedule, vocab, generator)
    x = torch.where(drawn, tokens, x)
    return x, noise | (drawn & (tokens != x1))


def scored(planner, denoiser, test, config, args, steps):
    """The planner's detection rows after `steps` steps; the same corruption at every call (args.seed)."""
    planner.eval()
    rows = detection_rows(planner, denoiser, test, args.fractions, config["mask_id"], get_schedule(config["schedule"]),
                          config["vocab_size"], args.seed)
    planner.train()
    return [{"steps": steps, **row} for row in rows]


def main(argv=None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the corpus: trained on its train split, scored on its test")
    parser.add_argument("--bundle", help="a planner/ + mask denoiser/ bundle (default: the bundled text8 pair)")
    parser.add_argument("--steps", type=positive_int, default=1200, help="optimizer steps (default 1200)")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--lr", type=float_type, default=3e-4, help="constant AdamW learning rate (default 3e-4)")
    parser.add_argument("--sequences", type=positive_int, default=256, help="test sequences scored (default 256)")
    parser.add_argument("--fractions", type=open_fraction, nargs="+", default=[0.1, 0.3, 0.5, 0.7],
                        help="shares of the positions corrupted, each in (0, 1) (default 0.1 0.3 0.5 0.7)")
    parser.add_argument("--seed", type=int_type, default=0)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--out", required=True, help="the CSV to write")
    parser.add_argument("--bundle-out", help="write the fine-tuned planner and the denoiser as a bundle here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    planner, denoiser, configs = load_bundle(args.bundle or default_bundle())
    stored = next(planner.parameters()).dtype
    planner, denoiser, config = planner.float(), denoiser.float().eval().requires_grad_(False), configs["denoiser"]
    splits = load_splits(args.data, tokenizer_from_config(config["tokenizer"]))
    seq_len = config["model"]["max_seq_len"]
    test = pick_chunks(splits["test"], seq_len, args.sequences)
    rows = scored(planner, denoiser, test, config, args, 0)
    crops = RandomCrops(splits["train"], seq_len, args.batch_size, seed=args.seed)
    generator = torch.Generator().manual_seed(args.seed + 1)
    optimizer = torch.optim.AdamW(planner.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    for step in range(1, args.steps + 1):
        x, wrong = draws_corruption(denoiser, next(crops), config, generator)
        loss = planner_loss(planner(x), wrong)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(planner.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 100 == 0:
            print(f"step {step}: loss {sum(losses[-100:]) / 100:.4f}", flush=True)
    rows += scored(planner, denoiser, test, config, args, args.steps)
    write_csv(rows, args.out)
    if args.bundle_out:
        planner_config = {key: value for key, value in configs["planner"].items() if key != "sha256"}
        denoiser_config = {key: value for key, value in config.items() if key != "sha256"}
        save_bundle(args.bundle_out, planner.to(stored), planner_config, denoiser.to(stored), denoiser_config)
    print(detection_table(rows))


if __name__ == "__main__":
    main()
