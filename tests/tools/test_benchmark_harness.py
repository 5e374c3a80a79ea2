"""benchmarks/conftest.py, the harness of `pytest benchmarks/`: how it names a case and words
fused's ratio against each variant in its table. No clock: the medians are given."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("benchmarks_harness", ROOT / "benchmarks" / "conftest.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)


def test_a_case_is_titled_by_its_nonempty_parts_and_cuda_only_on_a_gpu():
    assert harness.case_title(("draw", (64, 50257), "bfloat16", "top_p 0.9", "cuda")) == \
        "draw 64x50257 bfloat16 top_p 0.9 cuda"
    assert harness.case_title(("draw", (3,), "float32", "", "cpu")) == "draw 3 float32"


@pytest.mark.parametrize("theirs, ours, text", [
    (3.0, 1.5, "2.00x faster"), (2.0, 2.0, "1.00x faster"), (1.0, 4.0, "4.00x SLOWER"),
    (None, 1.0, ""), (1.0, None, ""), (0.0, 1.0, ""),
])
def test_fuseds_ratio_says_how_many_times_faster_or_slower_and_nothing_without_both_times(theirs, ours, text):
    assert harness._ratio(theirs, ours) == text


def test_peak_memory_is_in_mib_to_a_tenth_or_na():
    assert harness._mib(None) == "n/a"
    assert harness._mib(3 * 2**20 + 2**19) == "3.5 MiB"
