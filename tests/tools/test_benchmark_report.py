"""benchmarks/report.py: docs/performance.md's tables are made from the rows of
benchmarks/results/<device>.jsonl, and only the blocks between the rows comments change."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = str(ROOT / "benchmarks" / "report.py")
sys.path.insert(0, str(ROOT / "benchmarks"))

import report as report_module  # noqa: E402


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, REPORT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_performance_tables_are_those_of_the_committed_rows():
    done = report("--check")
    assert done.returncode == 0, done.stderr


def row(baseline: str, baseline_median: float, median: float = 2e-5, mode: str = "eager") -> dict:
    return dict(op="sample_categorical", shape=[64, 50257], dtype="bfloat16", params="", device="GPU X", mode=mode,
                commit="abc1234", sources=None, median=median, baseline=baseline, baseline_median=baseline_median,
                ratio=baseline_median / median, date="2026-11-29", source="benchmarks/gpu_timings.py")


@pytest.mark.integration
def test_a_table_names_the_fastest_torch_code_of_each_mode(tmp_path):
    rows = [row("torch: slow", 9e-5), row("torch: fast", 6e-5), row("reference", 1e-5),
            row("torch: slow", 8e-5, 1e-5, "graph"), row("torch: fast", 3e-5, 1e-5, "graph")]
    (tmp_path / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prose = "# Title\n\nProse before.\n\n<!-- rows: gpu-x -->\nstale\n<!-- end rows: gpu-x -->\n\nProse after.\n"
    doc = tmp_path / "performance.md"
    doc.write_text(prose)
    assert report("--doc", str(doc), "--results", str(tmp_path), "--check").returncode == 1
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert text.startswith("# Title\n\nProse before.\n\n<!-- rows: gpu-x -->\n") and text.endswith(
        "<!-- end rows: gpu-x -->\n\nProse after.\n")
    line, = [line for line in text.splitlines() if line.startswith("| `sample_categorical`")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    # the reference is no torch code; eager's fastest is 'fast' (3.00x), graph's too (3.00x)
    assert cells[1:] == ["64 x 50257", "bfloat16", "-", "gpu_timings.py", "20.0 us / 10.0 us", "fast",
                         "60.0 us / 30.0 us", "3.00x / 3.00x", "abc1234"], cells
    assert report("--doc", str(doc), "--results", str(tmp_path), "--check").returncode == 0


@pytest.mark.integration
def test_a_table_names_each_modes_own_fastest_torch_code(tmp_path):
    """Where eager and graph replay have different fastest torch code, the table names both."""
    rows = [row("torch: slow", 9e-5), row("torch: fast", 6e-5),
            row("torch: slow", 2e-5, 1e-5, "graph"), row("torch: fast", 3e-5, 1e-5, "graph")]
    (tmp_path / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: gpu-x -->\n<!-- end rows: gpu-x -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    line, = [line for line in doc.read_text().splitlines() if line.startswith("| `sample_categorical`")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[6:9] == ["fast / slow", "60.0 us / 20.0 us", "3.00x / 2.00x"], cells


@pytest.mark.integration
def test_a_table_of_missing_rows_is_an_error(tmp_path):
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: nowhere -->\n<!-- end rows: nowhere -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 2 and "nowhere.jsonl" in done.stderr


@pytest.mark.integration
def test_an_op_table_lists_every_baseline(tmp_path):
    rows = [dict(row("fused fp32", 8.0, 1.0, "run"), op="ddpd_sample", shape=[64, 256, 28]),
            dict(row("reference fp32", 12.5, 1.0, "run"), op="ddpd_sample", shape=[64, 256, 28]),
            row("torch: fast", 6e-5)]
    (tmp_path / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: gpu-x ddpd_sample -->\n<!-- end rows: gpu-x ddpd_sample -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = [line for line in doc.read_text().splitlines() if line.startswith("| 64 x 256 x 28 ")]
    assert [line.split(" | ")[4:8] for line in lines] == [["1 s", "fused fp32", "8 s", "8.00x"],
                                                         ["1 s", "reference fp32", "12.5 s", "12.50x"]], lines


@pytest.mark.integration
def test_a_table_keeps_devices_and_benchmarks_apart(tmp_path):
    """Rows of two devices in one file make a table each; rows of two benchmarks (two timers)
    of one case make a line each, never one line of the fastest across them."""
    rows = [row("torch: fast", 6e-5), row("torch: fast", 3e-5, 1e-5, "graph"),
            dict(row("torch: fast", 5e-5, 4e-5), source="benchmarks/bench_sample_categorical.py"),
            dict(row("torch: fast", 1e-6, 1e-3), device="CPU Y 2vCPU", source="benchmarks/bench_sample_categorical.py")]
    (tmp_path / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: gpu-x -->\n<!-- end rows: gpu-x -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    gpu_part, cpu_part = doc.read_text().split("CPU Y 2vCPU", 1)
    assert "GPU X" in gpu_part
    gpu_lines, cpu_lines = ([line for line in part.splitlines() if line.startswith("| `sample_categorical`")]
                            for part in (gpu_part, cpu_part))
    assert len(gpu_lines) == 2 and len(cpu_lines) == 1, (gpu_lines, cpu_lines)
    assert sorted("gpu_timings" in line for line in gpu_lines) == [False, True], gpu_lines


@pytest.mark.integration
def test_a_cpu_table_gives_ratios_only(tmp_path):
    """Absolute times come from GPU runs naming the device; a CPU's table gives the speed-ups."""
    rows = [dict(row("torch: fast", 6e-3, 2e-3), device="CPU Y 2vCPU", source="benchmarks/bench_multinomial.py"),
            dict(row("fused fp32", 8.0, 1.0, "run"), op="ddpd_sample", device="CPU Y 2vCPU")]
    (tmp_path / "cpu-y.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: cpu-y -->\n<!-- end rows: cpu-y -->\n<!-- rows: cpu-y ddpd_sample -->\n"
                   "<!-- end rows: cpu-y ddpd_sample -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    text = doc.read_text()
    assert "3.00x" in text and "8.00x" in text, text
    assert not any(unit in text for unit in (" ms", " us", " s |")), text


@pytest.mark.integration
def test_related_code_of_another_job_is_never_the_fastest_torch_code(tmp_path):
    """A "related: ..." baseline (less work or another job, e.g. nonzero + index_select for
    compact_fixed) is shown apart, never as the fastest torch code for ddpd's job."""
    rows = [dict(row("torch: sort + index_select", 9e-5), op="compact_fixed"),
            dict(row("related: nonzero + index_select", 1e-5), op="compact_fixed")]
    (tmp_path / "gpu-x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: gpu-x -->\n<!-- end rows: gpu-x -->\n")
    done = report("--doc", str(doc), "--results", str(tmp_path))
    assert done.returncode == 0, done.stderr
    main, related = doc.read_text().split("related torch code", 1)
    line, = [line for line in main.splitlines() if line.startswith("| `compact_fixed`")]
    assert "sort + index_select" in line and "nonzero" not in line, line
    line, = [line for line in related.splitlines() if line.startswith("| `compact_fixed`")]
    assert "nonzero + index_select" in line and "0.50x" in line, line


def test_times_are_written_in_the_unit_that_fits():
    assert [report_module.seconds(v) for v in (None, 5e-7, 1e-3, 0.25, 1.0, 12.5)] == [
        "-", "0.5 us", "1 ms", "250 ms", "1 s", "12.5 s"]


def test_the_tables_of_several_devices_are_apart_under_their_names():
    rows = [row("torch: fast", 6e-5), dict(row("torch: fast", 6e-3, 2e-3), device="CPU Y 2vCPU")]
    text = report_module.table(rows)
    assert text.startswith("GPU X:\n\n| op |") and "|\n\nCPU Y 2vCPU:\n\n| op |" in text, text


def test_related_and_op_tables_on_a_cpu_give_no_times_and_a_dash_for_no_params():
    rows = [dict(row("torch: sort + index_select", 9e-3, 1e-3), op="compact_fixed", device="CPU Y 2vCPU"),
            dict(row("related: nonzero + index_select", 1e-3, 2e-3), op="compact_fixed", device="CPU Y 2vCPU")]
    related = report_module.related_table(rows).splitlines()
    assert related[3] == "| op | shape | dtype | params | timed by | mode | related torch code | ratio | commit |"
    assert related[5] == ("| `compact_fixed` | 64 x 50257 | bfloat16 | - | gpu_timings.py | eager | "
                          "nonzero + index_select | 0.50x | abc1234 |")
    lines = report_module.op_table(rows).splitlines()
    assert lines[0] == "| shape | dtype | params | mode | baseline | speed-up | commit |"
    assert lines[2] == "| 64 x 50257 | bfloat16 | - | eager | torch: sort + index_select | 9.00x | abc1234 |"


def test_an_op_table_of_gpu_and_cpu_rows_gives_no_times():
    """A CPU's times depend on its load: a table that holds any CPU row gives the speed-ups only."""
    rows = [row("torch: fast", 6e-5), dict(row("torch: fast", 6e-3, 2e-3), device="CPU Y 2vCPU")]
    assert report_module.op_table(rows).splitlines()[0] == "| shape | dtype | params | mode | baseline | speed-up" \
                                                           " | commit |"


def test_writing_names_the_tables_written(tmp_path, capsys):
    (tmp_path / "gpu-x.jsonl").write_text(json.dumps(row("torch: fast", 6e-5)) + "\n")
    doc = tmp_path / "performance.md"
    doc.write_text("<!-- rows: gpu-x -->\n<!-- end rows: gpu-x -->\n<!-- rows: gpu-x sample_categorical -->\n"
                   "<!-- end rows: gpu-x sample_categorical -->\n")
    assert report_module.main(["--doc", str(doc), "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"report: 2 table(s) of {doc} written (gpu-x, gpu-x sample_categorical)\n"
    doc.write_text("prose only\n")
    assert report_module.main(["--doc", str(doc), "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"report: 0 table(s) of {doc} written (none)\n"
