"""Likelihood evaluation on held-out text: the paper's tables 'ELBO terms computed on
the test set of text8' and 'Denoising performance in bits-per-character'.

`ModelSet` holds whichever networks are available; `elbo_methods` lists the rows
that can be computed from them:

    uniform                    single uniform model (DFM-Uni)
    planner+uniform-denoiser   planner + noise-conditioned uniform denoiser
    planner+mask-denoiser      planner + mask denoiser, the planner's mask (a bound)
    planner+mask-denoiser(true-mask)  the same given the true noise positions (a diagnostic)
    mask-diffusion             the mask denoiser alone, mask-diffusion ELBO (reference point)

`evaluate_elbo` / `evaluate_denoising` run them over sequences in batches, every
sequence with its own random stream (its index), so the numbers do not depend on the
batch size. Results are bits per token (bits per character on text8), as costs.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ddpd.eval.checks import check_callable, check_int
from ddpd.eval.denoising import DEFAULT_ALPHA, denoising_stats
from ddpd.eval.elbo import DEFAULT_T_MAX, TERMS, elbo_mask_diffusion, elbo_planned, elbo_uniform_model
from ddpd.eval.report import markdown_table, mean_and_se
from ddpd.process import Schedule

ELBO_COLUMNS = (("method", "Method", ""), ("rate_matching", "Rate matching (bits/token)", ".4f"),
                ("transitioning", "Transitioning (bits/token)", ".4f"), ("elbo", "Combined (bits/token)", ".4f"),
                ("elbo_se", "± s.e.", ".4f"), ("bound", "Bound", ""))
DENOISING_COLUMNS = (("denoiser", "Denoiser", ""), ("bits", "Denoising (bits/token)", ".4f"),
                     ("bits_se", "± s.e.", ".4f"), ("accuracy", "Accuracy", ".4f"), ("alpha", "alpha", "g"))


@dataclass
class ModelSet:
    """The networks to evaluate (callables with the signatures of ddpd.sampling); any may be None.

    Raises:
        TypeError: vocab_size or mask_id not an int, or a network given that is not callable.
        ValueError: vocab_size below 2 (every estimator needs two tokens), or mask_id below
            vocab_size (it would mask a token).
    """

    vocab_size: int
    planner: Optional[Callable] = None
    uniform_denoiser: Optional[Callable] = None
    mask_denoiser: Optional[Callable] = None
    uniform_model: Optional[Callable] = None
    mask_id: Optional[int] = None

    def __post_init__(self) -> None:
        # checked here, or a wrong field fails deep inside the estimator that first reads it
        self.vocab_size = check_int("vocab_size", self.vocab_size, 2)
        for name in ("planner", "uniform_denoiser", "mask_denoiser", "uniform_model"):
            if getattr(self, name) is not None:
                check_callable(name, getattr(self, name))
        if self.mask_id is not None:
            self.mask_id = check_int("mask_id", self.mask_id, self.vocab_size)


def _check_models(models) -> ModelSet:
    """models as a ModelSet; a dict of networks met an AttributeError on .vocab_size."""
    if not isinstance(models, ModelSet):
        raise TypeError(f"models must be a ModelSet (ddpd.eval.ModelSet(vocab_size, planner=..., ...)), "
                        f"got {type(models).__name__}")
    return models


def elbo_methods(models: ModelSet) -> dict[str, tuple]:
    """{name: (is_bound, estimator(x1, **kwargs) -> ElboTerms)} for the available models;
    is_bound: the row bounds a generative model's log-likelihood (not the true-mask diagnostic).

    Args:
        models: the loaded models.

    Returns:
        method name -> (is_bound, estimator).

    Raises:
        TypeError: models not a ModelSet.
    """
    V, methods = _check_models(models).vocab_size, {}
    if models.uniform_model is not None:
        methods["uniform"] = (True, partial(elbo_uniform_model, models.uniform_model, vocab_size=V))
    if models.planner is not None and models.uniform_denoiser is not None:
        methods["planner+uniform-denoiser"] = (True, partial(elbo_planned, models.planner, models.uniform_denoiser,
                                                             vocab_size=V, denoiser_type="uniform"))
    if models.planner is not None and models.mask_denoiser is not None:
        for mask, name, bound in (("planner", "planner+mask-denoiser", True),
                                  ("true", "planner+mask-denoiser(true-mask)", False)):
            methods[name] = (bound, partial(elbo_planned, models.planner, models.mask_denoiser, vocab_size=V,
                                            denoiser_type="mask", mask=mask, mask_id=models.mask_id))
    if models.mask_denoiser is not None:
        methods["mask-diffusion"] = (True, partial(elbo_mask_diffusion, models.mask_denoiser, vocab_size=V,
                                                   mask_id=models.mask_id))
    return methods


def _batches(sequences: Tensor, batch_size: int):
    batch_size = check_int("batch_size", batch_size, 1)
    if not isinstance(sequences, Tensor) or sequences.dim() != 2:
        raise ValueError(f"sequences must be Long[N, D], got {getattr(sequences, 'shape', type(sequences).__name__)}")
    if sequences.shape[0] == 0:
        raise ValueError("sequences must hold at least one row, got 0")
    for start in range(0, sequences.shape[0], batch_size):
        rows = torch.arange(start, min(start + batch_size, sequences.shape[0]), device=sequences.device)
        yield sequences[rows], rows


@torch.no_grad()
def evaluate_elbo(models: ModelSet, sequences: Tensor, *, mc_samples: int = 1, t_max: float = DEFAULT_T_MAX,
                  schedule: Union[str, Schedule] = "linear", seed: int = 0, batch_size: int = 32,
                  methods: Optional[list[str]] = None, progress: bool = False) -> list[dict]:
    """One row per method: every ELBO term (ddpd.eval.elbo.TERMS) as mean bits per token
    over the sequences, with its standard error (key + '_se'), across sequences.

    Args:
        models: the loaded models.
        sequences: Long[N, D] held-out sequences.
        mc_samples: Monte-Carlo samples a sequence.
        t_max: where the CTMC stops.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        batch_size: sequences an estimator call.
        methods: the methods to run; None: every one available.
        progress: draw a progress bar on a terminal.

    Returns:
        The rows.

    Raises:
        TypeError: models not a ModelSet.
        ValueError: an unknown or unavailable method, or no sequences.
    """
    available = elbo_methods(models)
    names = list(available) if methods is None else methods
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        raise ValueError(f"methods: these models support {sorted(available)}, got {names}")
    batches = list(_batches(sequences, batch_size))
    bar = tqdm(total=len(batches) * len(names), desc="elbo", unit="batch", disable=None if progress else True)
    rows = []
    for name in names:
        bound, estimate = available[name]
        bits: dict[str, list] = {term: [] for term in TERMS}
        for x1, ids in batches:
            terms = estimate(x1, mc_samples=mc_samples, t_max=t_max, schedule=schedule, seed=seed, row_ids=ids)
            for term, value in terms.bits().items():
                bits[term].append(value.cpu())
            bar.update()
        row = {"method": name, "bound": "yes" if bound else "no (diagnostic)",
               "num_sequences": sequences.shape[0], "length": sequences.shape[1], "mc_samples": mc_samples,
               "t_max": t_max}
        for term, values in bits.items():
            row[term], row[f"{term}_se"] = mean_and_se(torch.cat(values))
        rows.append(row)
    bar.close()
    return rows


def denoising_kinds(models: ModelSet) -> dict[str, tuple]:
    """{kind: (denoiser, planner or None)} for the available models.

    Args:
        models: the loaded models.

    Returns:
        kind -> (denoiser, planner or None).

    Raises:
        TypeError: models not a ModelSet.
    """
    _check_models(models)
    kinds = {}
    if models.uniform_model is not None:
        kinds["uniform"] = (models.uniform_model, None)
    if models.uniform_denoiser is not None:
        kinds["uniform-denoiser"] = (models.uniform_denoiser, None)
    if models.mask_denoiser is not None:
        kinds["mask-denoiser"] = (models.mask_denoiser, None)
        if models.planner is not None:
            kinds["mask-denoiser-planner"] = (models.mask_denoiser, models.planner)
    return kinds


@torch.no_grad()
def evaluate_denoising(models: ModelSet, sequences: Tensor, *, alpha: float = DEFAULT_ALPHA,
                       schedule: Union[str, Schedule] = "linear", seed: int = 0, batch_size: int = 32,
                       progress: bool = False) -> list[dict]:
    """One row per denoiser: bits per noisy token (mean over sequences of their mean,
    with its standard error) and accuracy (over all noisy positions) at level alpha.

    Args:
        models: the loaded models.
        sequences: Long[N, D] held-out sequences.
        alpha: the corruption level.
        schedule: "linear", "cosine" or a Schedule.
        seed: the seed of every uniform.
        batch_size: sequences a call.
        progress: draw a progress bar on a terminal.

    Returns:
        The rows.

    Raises:
        TypeError: models not a ModelSet.
        ValueError: no sequences, or no denoiser or uniform model.
    """
    kinds = denoising_kinds(models)
    if not kinds:
        raise ValueError("denoising: no denoiser or uniform model given")
    batches = list(_batches(sequences, batch_size))
    bar = tqdm(total=len(batches) * len(kinds), desc="denoising", unit="batch", disable=None if progress else True)
    rows = []
    for kind, (denoiser, planner) in kinds.items():
        nats, noisy, correct = [], [], []
        for x1, ids in batches:
            stats = denoising_stats(kind, denoiser, x1, models.vocab_size, alpha=alpha, planner=planner,
                                    mask_id=models.mask_id, schedule=schedule, seed=seed, row_ids=ids)
            nats.append(stats.nats.cpu())
            noisy.append(stats.noisy.cpu())
            correct.append(stats.correct.cpu())
            bar.update()
        nats, noisy, correct = torch.cat(nats), torch.cat(noisy), torch.cat(correct)
        has_noise, total = noisy > 0, int(noisy.sum())
        # no noisy position at all (alpha near 1, few sequences): no denoising to score, not 0 or NaN
        bits, bits_se = mean_and_se(nats[has_noise] / noisy[has_noise] / torch.log(torch.tensor(2.0))) \
            if total else (None, None)
        rows.append({"denoiser": kind, "bits": bits, "bits_se": bits_se,
                     "accuracy": float(correct.sum()) / total if total else None, "noisy_positions": total,
                     "alpha": alpha, "num_sequences": sequences.shape[0]})
    bar.close()
    return rows


def elbo_markdown(rows: list[dict]) -> str:
    """evaluate_elbo's rows as a Markdown table.

    Args:
        rows: evaluate_elbo's rows.

    Returns:
        The table.
    """
    return markdown_table(rows, ELBO_COLUMNS)


def denoising_markdown(rows: list[dict]) -> str:
    """evaluate_denoising's rows as a Markdown table.

    Args:
        rows: evaluate_denoising's rows.

    Returns:
        The table.
    """
    return markdown_table(rows, DENOISING_COLUMNS)
