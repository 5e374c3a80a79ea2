"""`pytest benchmarks/`, the suite users time the ops with: every bench_*.py runs once on the
CPU (--benchmark-disable: each case called once, nothing timed or written), so a benchmark
broken by a change to an op's signature or to the harness fails here, not on a user's GPU."""
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_benchmark_file_runs_its_cpu_cases_once(tmp_path):
    report = tmp_path / "report.xml"
    env = {**os.environ, "DDPD_BENCH_THREADS": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/", "-q", "-p", "no:cacheprovider",
                          "--benchmark-disable", "--rows", "", f"--junitxml={report}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    passed, broken = Counter(), []
    for case in ElementTree.parse(report).iter("testcase"):
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            broken.append(case.get("name"))
        elif "skipped" not in outcome:
            passed[case.get("classname").rsplit(".", 1)[-1]] += 1
    assert not broken
    files = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert [f for f in files if passed[f] == 0] == [], passed
