"""Evaluation of ddpd models: likelihood bounds, denoising performance, sample quality
and convergence of sampling.

- elbo: per-sequence ELBO terms (rate matching, transitioning) of the single uniform
  model, planner + uniform / mask denoiser, and mask diffusion (appendix 'Evaluating
  the ELBO'), Monte-Carlo with a bounded-variance estimator.
- denoising: cross-entropy and accuracy of denoisers at a fixed corruption level.
- likelihood: both over held-out sequences, as the paper's tables.
- quality: judge NLL and unigram entropy of samples; sweeps over samplers.
- convergence: noise left and stopped samples along the steps of DDPD sampling.
- detection: the planner as a detector of wrong tokens, of uniform noise and of a parallel
  decoder's draws, beside the denoiser's confidence.
"""
from ddpd.eval.convergence import PlannerRecorder, convergence_rows, stopped_fraction, write_convergence
from ddpd.eval.denoising import DenoisingStats, denoising_stats
from ddpd.eval.detection import Detection, auc, detection_rows, detection_table, error_detection, parallel_draws
from ddpd.eval.elbo import ElboTerms, elbo_mask_diffusion, elbo_planned, elbo_uniform_model
from ddpd.eval.heldout import heldout_sequences, pick_chunks
from ddpd.eval.likelihood import ModelSet, elbo_methods, evaluate_denoising, evaluate_elbo
from ddpd.eval.quality import (
    SamplerSpec,
    judge_nll,
    merge_sweeps,
    quality_metrics,
    read_sweep,
    run_sweep,
    unigram_entropy,
    write_sweep,
)
from ddpd.eval.report import MissingDependency

__all__ = [
    "DenoisingStats", "Detection", "ElboTerms", "MissingDependency", "ModelSet", "PlannerRecorder", "SamplerSpec",
    "auc", "convergence_rows", "detection_rows", "detection_table", "denoising_stats", "elbo_mask_diffusion",
    "elbo_methods", "elbo_planned", "elbo_uniform_model", "error_detection", "evaluate_denoising", "evaluate_elbo",
    "heldout_sequences", "judge_nll", "parallel_draws", "pick_chunks", "merge_sweeps", "quality_metrics",
    "read_sweep", "run_sweep", "stopped_fraction", "unigram_entropy", "write_convergence", "write_sweep",
]
