"""The planner as a detector of wrong tokens (ddpd.eval.detection, docs/parallel/planner_errors.py)."""
import csv
import itertools
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

from ddpd.eval.detection import auc, error_detection
from ddpd.process import LinearSchedule

ROOT = Path(__file__).resolve().parents[2]
V, D = 5, 12


def pairwise_auc(score, positive):
    pos, neg = score[positive].tolist(), score[~positive].tolist()
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_is_the_chance_a_positive_scores_above_a_negative():
    g = torch.Generator().manual_seed(0)
    score = torch.randint(0, 4, (200,), generator=g).float()  # many ties
    positive = torch.rand(200, generator=g) < score / 6
    assert auc(score, positive) == pytest.approx(pairwise_auc(score, positive), abs=1e-12)
    assert auc(score, score > 1) == 1.0 and auc(-score, score > 1) == 0.0
    assert auc(torch.zeros(10), torch.arange(10) < 3) == 0.5
    assert math.isnan(auc(score, torch.zeros(200, dtype=torch.bool)))


def test_a_planner_that_knows_the_text_detects_every_wrong_token_and_a_negated_one_none():
    g = torch.Generator().manual_seed(1)
    x1 = torch.randint(0, V, (16, D), generator=g)

    def knowing(x):
        return torch.where(x != x1, 10.0, -10.0)

    def denoiser(x, t):  # unsure: every draw a coin among the five tokens
        return torch.zeros(*x.shape, V)

    seen = error_detection(knowing, denoiser, x1, 0.5, V, LinearSchedule(), V, torch.Generator().manual_seed(2))
    assert seen.uniform == 1.0 and seen.parallel == 1.0 and seen.combined == 1.0
    assert 0.6 < seen.parallel_wrong < 1.0 and abs(seen.drawn - 0.5 * x1.numel()) < 30
    assert seen.confidence == 0.5  # the denoiser is as sure of every draw
    blind = error_detection(lambda x: -knowing(x), denoiser, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(2))
    assert blind.uniform == 0.0 and blind.parallel == 0.0 and blind.combined == 0.0
    with pytest.raises(ValueError, match="fraction must be in"):
        error_detection(knowing, denoiser, x1, 1.0, V, LinearSchedule(), V)


def test_an_uninformed_planner_leaves_the_combined_detector_to_the_confidence():
    g = torch.Generator().manual_seed(3)
    x1 = torch.randint(0, V, (16, D), generator=g)
    bias = torch.randn(16, D, V, generator=g)

    def denoiser(x, t):  # leans to the text, unevenly: its confidence is a detector
        return bias + 2.0 * torch.nn.functional.one_hot(x1, V)

    found = error_detection(lambda x: torch.zeros(x.shape), denoiser, x1, 0.5, V, LinearSchedule(), V,
                            torch.Generator().manual_seed(4))
    assert found.parallel == 0.5 and 0.6 < found.confidence < 1.0
    assert found.combined == found.confidence and found.confident_combined == found.confident_confidence


def test_the_script_writes_a_row_a_fraction(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 1200))
    out = tmp_path / "errors.csv"
    monkeypatch.setattr(sys, "argv", ["planner_errors.py", "--data", str(corpus), "--sequences", "2", "--fractions",
                                      "0.2", "0.6", "--out", str(out)])
    runpy.run_path(str(ROOT / "docs" / "parallel" / "planner_errors.py"), run_name="__main__")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["fraction"] for row in rows] == ["0.2", "0.6"]
    assert all(0.0 <= float(row["uniform"]) <= 1.0 for row in rows)
    assert "| fraction | uniform |" in capsys.readouterr().out
