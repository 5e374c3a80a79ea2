"""The README and docs/api.md as a newcomer follows them: their Python examples run as
written, the install lines are true on any machine, and no documentation or help text
sends a user to a file they do not have."""
import re
from pathlib import Path

import pytest
import torch

import ddpd.pretrained as pretrained
from ddpd.checkpoint import save_bundle
from ddpd.models import build_model, config_for
from oracles.fixtures import single_thread  # noqa: F401  (autouse)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
API = (ROOT / "docs" / "api.md").read_text()
BLOCKS = {"README.md": re.findall(r"```python\n(.*?)```", README, re.S),
          "docs/api.md": re.findall(r"```python\n(.*?)```", API, re.S)}


def _block(marker, doc="README.md"):
    (block,) = [b for b in BLOCKS[doc] if marker in b]
    return block


def test_sampler_example_runs_with_either_denoiser_type():
    example = _block("from ddpd.sampling import ddpd_sample\n\nV, D", "docs/api.md")
    assert 'denoiser_type="uniform",   # or "mask" (mask id = V)' in example
    for variant in (example, example.replace('denoiser_type="uniform"', 'denoiser_type="mask"')):
        scope = {}
        exec(compile(variant, "docs/api.md", "exec"), scope)
        assert scope["result"].tokens.shape == (16, 64)


@pytest.fixture
def tiny_default(tmp_path, monkeypatch):
    """A tiny stand-in for the bundled model: same kinds, alphabet and length."""
    models = []
    for seed, kind in enumerate(("planner", "mask-denoiser")):
        torch.manual_seed(seed)
        config = config_for(kind, 27, 256, d_model=16, n_layers=1, n_heads=2)
        models += [build_model(kind, config), {"kind": kind, "model": config.to_dict(),
                                               "tokenizer": {"name": "text8"}, "schedule": "linear"}]
    save_bundle(str(tmp_path / "bundle"), *models)
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path / "bundle"))


def test_python_quickstart_runs_on_one_thread(tiny_default, capsys):
    """It takes the tools' thread policy: with torch's default, a thread per core, it ran many
    times slower per sample than ddpd-sample on a busy 2-core machine."""
    quickstart = _block("load_default")
    torch.set_num_threads(2)  # torch's default on 2 cores (the fixture restores the tests' one)
    exec(compile(quickstart, "README.md", "exec"), {})
    assert torch.get_num_threads() == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line) == 256 and set(line) <= set(" abcdefghijklmnopqrstuvwxyz")
                                   for line in lines)


def test_fused_ops_example_runs():
    scope = {}
    exec(compile(_block("planner_select_mask", "docs/api.md"), "docs/api.md", "exec"), scope)
    assert scope["tokens"].shape == (4,)


def test_install_lines_take_a_cpu_torch_from_anywhere():
    install = README.split("## Install")[1].split("## Quickstart")[0]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in install
    assert "torch==" not in install  # a pin resolves to the CUDA build on the public index


def _documents():
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "docs" / "text8" / "README.md",
             ROOT / "docs" / "text8" / "reproduce.sh", *(ROOT / "ddpd").rglob("*.py")]
    return {p: p.read_text() for p in paths}


def test_no_document_or_help_text_names_a_file_users_do_not_have():
    from ddpd.cli.eval import build_parser as eval_parser
    from ddpd.cli.sample import build_parser as sample_parser
    from ddpd.cli.train import build_parser as train_parser

    texts = {str(p): t for p, t in _documents().items()}
    texts.update({name: parser().format_help() for name, parser in
                  (("ddpd-train --help", train_parser), ("ddpd-eval --help", eval_parser),
                   ("ddpd-sample --help", sample_parser))})
    for name, text in texts.items():
        assert "shared/data" not in text and "../shared" not in text, name
    assert "books" in texts["ddpd-train --help"]


def test_every_results_file_a_document_quotes_is_committed():
    """Performance numbers are quoted with the results file that holds them: each file named
    (in full, or by the suffix after its device name, as in `-2026-11-28-host.txt`) exists."""
    committed = [p.name for p in (ROOT / "benchmarks" / "results").iterdir()]
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        for name in re.findall(r"(?:cpu|nvidia)-[A-Za-z0-9-]+\.txt", text):
            assert name in committed, f"{path.name} quotes {name}, which benchmarks/results does not hold"
        for suffix in re.findall(r"`(-[A-Za-z0-9-]+\.txt)`", text):
            assert any(n.endswith(suffix) for n in committed), \
                f"{path.name} quotes {suffix}, which no results file ends with"
