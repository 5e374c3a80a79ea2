"""Where the planner's ELBO gap comes from (docs/text8/README.md, "The planner's gap"): the
bundled mask denoiser's ELBO terms under three masks (the planner's, the one the bundled
uniform model implies through eq. corruption_prob, the true one), and each planner as a
detector of uniform noise (cross entropy and area under the ROC curve, by time).

    python docs/text8/planner_gap.py --data data/wiki.txt --out docs/text8/planner-gap.md
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from ddpd.checkpoint import load_bundle, load_model
from ddpd.cli.common import OneLineParser, int_type, positive_int
from ddpd.eval.detection import auc
from ddpd.eval.elbo import elbo_planned
from ddpd.eval.heldout import heldout_sequences
from ddpd.eval.report import markdown_table, write_text
from ddpd.pretrained import UNIFORM, default_bundle
from ddpd.process import corrupt, get_schedule, planner_log_prob_from_uniform
from ddpd.training.data import tokenizer_from_config

TIMES = (0.1, 0.3, 0.5, 0.7, 0.9)


def implied_planner(uniform, schedule: str):
    """The uniform model as a time-conditioned planner: logits of p(z^d = N | x_t)."""
    alpha = get_schedule(schedule).alpha

    def planner(x, t):
        log_p = planner_log_prob_from_uniform(torch.log_softmax(uniform(x, t).float(), -1), x, alpha(t))
        return log_p - torch.log1p(-log_p.exp().clamp(max=1 - 1e-6))
    return planner


def elbo_rows(planners: dict, denoiser, x1, vocab_size: int, schedule: str, seed: int) -> list[dict]:
    """The mask denoiser's ELBO terms (bits per token) under each planner's mask and the true one."""
    rows = []
    for name, (planner, timed, mask) in planners.items():
        terms = elbo_planned(planner, denoiser, x1, vocab_size, denoiser_type="mask", mask=mask,
                             time_conditioned_planner=timed, schedule=schedule, seed=seed)
        bits = {k: v.mean().item() for k, v in terms.bits().items()}
        rows.append({"mask": name, "planning": bits["planning"], "denoising": bits["denoising"],
                     "transitioning": bits["transitioning"], "elbo": bits["elbo"]})
    return rows


def detection_rows(planners: dict, x1, vocab_size: int, schedule: str, seed: int) -> list[dict]:
    """Each planner's cross entropy (nats per position) and AUC on uniform noise at TIMES."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for t in TIMES:
        times = torch.full((x1.shape[0],), t)
        x_t, z = corrupt(x1, times, schedule, "uniform", vocab_size, generator=generator)
        row = {"t": t, "noise share": z.float().mean().item()}
        for name, (planner, timed, _) in planners.items():
            logits = (planner(x_t, times) if timed else planner(x_t)).float()
            row[f"{name} CE"] = F.binary_cross_entropy_with_logits(logits, z.float()).item()
            row[f"{name} AUC"] = auc(logits.flatten(), z.flatten())
        rows.append(row)
    return rows


def _columns(rows: list[dict], label: str) -> list[tuple[str, str, str]]:
    return [(key, key, "" if key == label else ".4f") for key in rows[0]]


def main(argv=None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the corpus; its test split is scored")
    parser.add_argument("--bundle", help="a bundle with uniform/ beside its pair (default: the bundled text8 one)")
    parser.add_argument("--sequences", type=positive_int, default=64)
    parser.add_argument("--seed", type=int_type, default=0)
    parser.add_argument("--out", required=True, help="the Markdown file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    path = args.bundle or default_bundle(model=UNIFORM)
    planner, denoiser, configs = load_bundle(path)
    uniform, _ = load_model(f"{path}/{UNIFORM}")
    config = configs["denoiser"]
    x1 = heldout_sequences(args.data, tokenizer_from_config(config["tokenizer"]), config["model"]["max_seq_len"],
                           num_sequences=args.sequences)
    planners = {"planner": (planner.eval(), False, "planner"),
                "uniform model": (implied_planner(uniform.eval(), config["schedule"]), True, "planner")}
    with torch.no_grad():
        elbo = elbo_rows({**planners, "true": (planner, False, "true")}, denoiser.eval(), x1, config["vocab_size"],
                         config["schedule"], args.seed)
        detection = detection_rows(planners, x1, config["vocab_size"], config["schedule"], args.seed)
    text = (f"{args.sequences} test sequences of {args.data}, seed {args.seed}, 1 Monte-Carlo sample\n\n"
            "The mask denoiser's ELBO terms (bits per token) under each mask\n\n"
            f"{markdown_table(elbo, _columns(elbo, 'mask'))}\n"
            "Detecting uniform noise (cross entropy in nats per position, AUC)\n\n"
            f"{markdown_table(detection, _columns(detection, 't'))}")
    write_text(text, args.out)
    print(text)


if __name__ == "__main__":
    main()
