"""ddpd-train: train a planner, a denoiser, a uniform model or an AR baseline.

    ddpd-train planner --data ../shared/data/text8-mini/wiki.txt --out runs/planner --steps 2000
    torchrun --nproc_per_node 2 -m ddpd.cli.train mask-denoiser --data ... --out ...
    ddpd-train planner --data ... --out runs/planner --resume     # continue a stopped run

--out is the checkpoint directory (model.safetensors + config.json + training state),
loadable with ddpd.checkpoint.load_model. With --resume, settings not given are taken
from the checkpoint; those given must match it (a resumed run is the same run).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from ddpd.training.trainer import KINDS, TOKENIZERS


class _OneLineParser(argparse.ArgumentParser):
    """Argument errors as a single line on stderr (exit status 2), no usage dump."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="ddpd-train", description=__doc__.split("\n\n")[0],
                            argument_default=argparse.SUPPRESS)
    parser.add_argument("kind", choices=KINDS, help="which network to train")
    parser.add_argument("--data", help="text file (text8 format for --tokenizer text8) or hf:NAME[:CONFIG]")
    parser.add_argument("--out", required=True, help="checkpoint directory to write (or resume)")
    parser.add_argument("--steps", type=int, help="optimizer steps in total (default 1000)")
    parser.add_argument("--max-time", dest="max_time", type=float, metavar="SECONDS",
                        help="stop after this many seconds of training (evaluation and checkpoints excluded), "
                             "with the learning-rate decay finished by then (default: no limit)")
    parser.add_argument("--batch-size", dest="batch_size", type=int, help="sequences per micro-batch and process")
    parser.add_argument("--seq-len", dest="seq_len", type=int, help="tokens per sequence (default 256)")
    parser.add_argument("--d-model", dest="d_model", type=int)
    parser.add_argument("--n-layers", dest="n_layers", type=int)
    parser.add_argument("--n-heads", dest="n_heads", type=int)
    parser.add_argument("--dropout", type=float)
    parser.add_argument("--lr", type=float, help="peak learning rate (default 3e-4)")
    parser.add_argument("--min-lr", dest="min_lr", type=float, help="final learning rate (default lr / 10)")
    parser.add_argument("--warmup", type=int, help="linear warmup steps (default 100)")
    parser.add_argument("--weight-decay", dest="weight_decay", type=float)
    parser.add_argument("--grad-accum", dest="grad_accum", type=int, help="micro-batches per optimizer step")
    parser.add_argument("--grad-clip", dest="grad_clip", type=float, help="max gradient norm, 0 = off")
    parser.add_argument("--ema", type=float, help="EMA decay of the saved weights, 0 = off")
    parser.add_argument("--eval-every", dest="eval_every", type=int, help="steps between validation losses")
    parser.add_argument("--eval-batches", dest="eval_batches", type=int, help="validation batches per evaluation")
    parser.add_argument("--save-every", dest="save_every", type=int, help="steps between checkpoints")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--tokenizer", choices=TOKENIZERS)
    parser.add_argument("--tiktoken", help="path of gpt2.tiktoken (with --tokenizer gpt2)")
    parser.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    parser.add_argument("--resume", action="store_true", default=False,
                        help="continue the run whose checkpoint is in --out, exactly where it stopped")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=True,
                        help="no progress bar (validation losses are still printed)")
    return parser


def _train_config(args: argparse.Namespace):
    from ddpd.checkpoint import read_config
    from ddpd.training.trainer import TrainConfig

    given = {k: v for k, v in vars(args).items() if k not in ("resume", "progress")}
    if args.resume:
        stored = dict(read_config(args.out).get("training", {}))
        for name in ("out", "device", "eval_every", "eval_batches", "save_every"):
            stored.pop(name, None)  # where and how it runs and reports may change
        return TrainConfig.from_dict({**stored, **given})
    if "data" not in given:
        raise ValueError("--data is required (the training corpus)")
    if not given["data"].startswith("hf:") and not os.path.isfile(given["data"]):
        raise FileNotFoundError(f"--data: no such file: {given['data']}")
    if "tiktoken" in given and not os.path.isfile(given["tiktoken"]):
        raise FileNotFoundError(f"--tiktoken: no such file: {given['tiktoken']}")
    return TrainConfig.from_dict(given)


def run(args: argparse.Namespace) -> None:
    from ddpd.models import count_parameters
    from ddpd.training.trainer import Trainer

    trainer = Trainer(_train_config(args), resume=args.resume, progress=args.progress, log=print)
    try:
        config = trainer.config
        trainer.log(f"{config.kind}: {count_parameters(trainer.model):,} parameters on {trainer.device}, "
                    f"{trainer.dist.world_size} process(es), step {trainer.step} of {config.steps}")
        trainer.train()
        last = trainer.history[-1] if trainer.history else {}
        trainer.log(f"done: step {trainer.step}, val loss {last.get('val_loss', float('nan')):.4f}, "
                    f"{trainer.tokens_per_second:,.0f} tokens/s, checkpoint {config.out}")
    finally:
        trainer.close()


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        print("ddpd-train: interrupted; continue from the last checkpoint with --resume", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, FloatingPointError) as err:  # CheckpointError is a ValueError
        print(f"ddpd-train: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
