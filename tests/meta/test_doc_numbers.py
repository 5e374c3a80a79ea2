"""The numbers docs/parallel.md and docs/text8/README.md quote, recomputed from the committed
raw files they come from (docs/parallel/*.csv, docs/text8/quality/sweep.csv)."""
import csv
from pathlib import Path

from ddpd.eval.frontier import against_baselines, read_frontier

ROOT = Path(__file__).resolve().parents[2]
PARALLEL = " ".join((ROOT / "docs" / "parallel.md").read_text().split())
TEXT8 = " ".join((ROOT / "docs" / "text8" / "README.md").read_text().split())


def _rows(name):
    with open(ROOT / "docs" / "parallel" / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_plan_every_4_is_above_maskgit_only_where_the_sweeps_are_compared():
    compared = [c for c in against_baselines(read_frontier(str(ROOT / "docs/parallel/frontier.csv")))
                if "plan_every=4" in c["sampler"] and c["baseline"].startswith("maskgit maskgit")]
    higher = [c["steps"] for c in compared if c["verdict"] == "higher"]
    assert higher == [32, 64, 128] and len(compared) == 4
    assert "revising every 4 steps is above MaskGIT at 32, 64 and 128 passes" in PARALLEL
