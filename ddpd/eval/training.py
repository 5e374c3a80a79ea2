"""What a set of training runs cost and reached: one row per ddpd-train checkpoint.

Read from the checkpoint alone (config.json and the training state's history), so the
table can be written wherever the runs finished: kind, directory, size, the micro-batch and
the sequences per optimizer step, steps done, the training seconds and throughput, and the
first, best and last validation losses. A
checkpoint kept without its training state (a bundle of ddpd.pretrained) gives its size,
settings and step only.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Optional

from ddpd.checkpoint import STATE_META, CheckpointError, load_train_state, read_config
from ddpd.eval.report import markdown_table

# the run's directory beside its kind: two runs of one kind are told apart; --batch-size is per
# micro-batch and process, an optimizer step sees it times --grad-accum times the processes
TRAINING_COLUMNS = (("kind", "Network", ""), ("run", "Run", ""), ("parameters", "Parameters", ","),
                    ("d_model", "d_model", ""), ("n_layers", "Layers", ""), ("n_heads", "Heads", ""),
                    ("dropout", "Dropout", ""), ("batch_size", "Micro-batch", ""),
                    ("step_sequences", "Sequences/step", ""), ("seq_len", "Length", ""),
                    ("lr", "Peak LR", "g"), ("step", "Steps", ""), ("train_seconds", "Train seconds", ".0f"),
                    ("tokens_per_s", "Tokens/s", ",.0f"), ("first_val_loss", "First val loss", ".4f"),
                    ("best_val_loss", "Best val loss", ".4f"), ("best_step", "at step", ""),
                    ("final_train_loss", "Final train loss", ".4f"), ("final_val_loss", "Final val loss", ".4f"))


def _parameters(path: str, config: dict) -> int:
    """The parameter count of the network config.json describes, built on the meta device:
    config.json carries no digest, and an edited one must not allocate what it says."""
    import torch

    from ddpd.models import build_model, count_parameters
    from ddpd.models.config import TransformerConfig

    try:
        with torch.device("meta"):
            return count_parameters(build_model(config["kind"], TransformerConfig.from_dict(config["model"])))
    except (TypeError, ValueError, RuntimeError, KeyError) as err:
        raise CheckpointError(f"checkpoint {path}: config.json does not describe a valid {config.get('kind')} "
                              f"model: {err}") from None


def _record(path: str) -> dict:
    """The training state's record; {} for a checkpoint that keeps its weights only (a
    bundle written by ddpd.pretrained): its row has no time or losses."""
    from ddpd.training.trainer import check_train_record

    if not os.path.exists(os.path.join(path, STATE_META)):
        return {}
    _, meta = load_train_state(path)
    check_train_record(path, meta)
    return meta


def training_row(path: str) -> dict:
    """The row of one checkpoint directory written by ddpd-train (or kept from one).

    Args:
        path: the checkpoint directory.

    Returns:
        The row: kind, the directory as given, size, steps, seconds, tokens/s and the losses
        (the first, best and last finite validation losses, the first and best with their steps).

    Raises:
        CheckpointError: not a checkpoint with a training record.
    """
    config = read_config(path)
    meta = _record(path)
    if not isinstance(config.get("training", {}), dict):
        raise CheckpointError(f"checkpoint {path}: config.json 'training' must be an object of ddpd-train "
                              f"settings, got {config['training']!r:.40}")
    training, history = {**config["model"], **config.get("training", {})}, meta.get("history", [])
    validated = [h for h in history if h.get("val_loss") is not None and math.isfinite(h["val_loss"])]
    best = min(validated, key=lambda h: h["val_loss"]) if validated else {}
    trained = [h for h in history if h.get("train_loss") is not None]
    seconds = meta.get("train_seconds")
    step = meta["step"] if meta else config.get("step")
    return {"kind": config["kind"], "run": os.fspath(path), "parameters": _parameters(path, config),
            **{k: training.get(k) for k in ("d_model", "n_layers", "n_heads", "dropout", "batch_size", "grad_accum",
                                              "seq_len", "lr", "steps", "max_time")},
            "processes": meta.get("world_size"),
            "step_sequences": _step_sequences(training.get("batch_size"), training.get("grad_accum"),
                                              meta.get("world_size")),
            "step": step if isinstance(step, int) else None, "train_seconds": seconds,
            "tokens_per_s": meta.get("train_tokens", 0) / seconds if seconds else None,
            # the first finite one: step 0's (the untrained network) unless that one was NaN or infinite
            "first_val_loss": validated[0]["val_loss"] if validated else None,
            "first_val_step": validated[0].get("step") if validated else None,
            "best_val_loss": best.get("val_loss"), "best_step": best.get("step"),
            "final_train_loss": trained[-1]["train_loss"] if trained else None,
            "final_val_loss": validated[-1]["val_loss"] if validated else None,
            "history": history}


def _step_sequences(*factors: object) -> Optional[int]:
    """The sequences of one optimizer step, batch_size x grad_accum x processes; None where the
    checkpoint records not all three (weights only keep no process count)."""
    if not all(isinstance(factor, int) and not isinstance(factor, bool) for factor in factors):
        return None
    return math.prod(factors)


def training_rows(paths: Sequence[str]) -> list[dict]:
    """The training_row of every checkpoint directory.

    Args:
        paths: the checkpoint directories.

    Returns:
        The rows, in the order of `paths`.
    """
    return [training_row(path) for path in paths]


def training_markdown(rows: Sequence[dict]) -> str:
    """training_rows as a Markdown table.

    Args:
        rows: training_rows.

    Returns:
        The table.
    """
    return markdown_table(rows, TRAINING_COLUMNS)
