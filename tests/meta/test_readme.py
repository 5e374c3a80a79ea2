"""The README and docs/api.md as a newcomer follows them: their Python examples run as
written, the install lines are true on any machine, and no documentation or help text
sends a user to a file (or a section) they do not have."""
import functools
import re
import subprocess
from pathlib import Path

import pytest
import torch

import ddpd.pretrained as pretrained
from ddpd.checkpoint import save_bundle
from ddpd.models import build_model, config_for
from oracles.fixtures import single_thread  # noqa: F401  (autouse)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
API = (ROOT / "docs" / "api.md").read_text()
BLOCKS = {"README.md": re.findall(r"```python\n(.*?)```", README, re.S),
          "docs/api.md": re.findall(r"```python\n(.*?)```", API, re.S)}


def _block(marker, doc="README.md"):
    (block,) = [b for b in BLOCKS[doc] if marker in b]
    return block


def test_sampler_example_runs_with_either_denoiser_type():
    example = _block("from ddpd.sampling import DDPDOptions, ddpd_sample\n\nV, D", "docs/api.md")
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
    assert scope["draw"].tokens.shape == (4,) and scope["plan"].masked.shape == (4, 128)


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


# a results file's name, after the commit that holds it where newer results replaced it
QUOTED_RESULTS = r"(?:\b([0-9a-f]{7,40}):benchmarks/results/)?((?:cpu|nvidia)-[A-Za-z0-9-]+\.txt)"


@pytest.mark.integration
def test_every_results_file_a_document_quotes_is_committed():
    """Performance numbers are quoted with the results file that holds them: each file named
    (in full, or by the suffix after its device name, as in `-2026-11-28-host.txt`) exists, or,
    quoted as `COMMIT:benchmarks/results/NAME` (a file newer results replaced), exists in that commit."""
    committed = [p.name for p in (ROOT / "benchmarks" / "results").iterdir()]
    in_git = subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode == 0
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        for commit, name in re.findall(QUOTED_RESULTS, text):
            if not commit:
                assert name in committed, f"{path.name} quotes {name}, which benchmarks/results does not hold"
            elif in_git:
                found = subprocess.run(["git", "cat-file", "-e", f"{commit}:benchmarks/results/{name}"], cwd=ROOT)
                assert found.returncode == 0, f"{path.name} quotes {commit}:benchmarks/results/{name}, not in git"
        for suffix in re.findall(r"`(-[A-Za-z0-9-]+\.txt)`", text):
            assert any(n.endswith(suffix) for n in committed), \
                f"{path.name} quotes {suffix}, which no results file ends with"


class _TinyNet(torch.nn.Module):
    """A denoiser with a backbone and an output head, its logits different at every position."""

    def __init__(self, vocab_size, length, width=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size + 1, width)  # + the mask id
        self.position = torch.nn.Parameter(torch.randn(length, width))
        self.head = torch.nn.Linear(width, vocab_size)

    def hidden(self, x):
        return self.embed(x) + self.position

    def forward(self, x):
        return self.head(self.hidden(x))


@torch.no_grad()
def test_the_llada_step_writes_the_greedy_tokens_of_the_k_most_confident_masked_positions():
    V, k = 11, 2
    torch.manual_seed(0)
    net = _TinyNet(V, 6)
    x = torch.full((3, 6), V)
    x[:, :2] = torch.tensor([1, 2])  # a prompt
    scope = {"net": net, "x": x.clone(), "temperature": 0.0, "seed": 0, "step": 0, "k": k, "mask_id": V,
             "rows": torch.arange(x.numel()).view(x.shape)}
    exec(compile(_block("confidence.topk"), "README.md", "exec"), scope)
    filled = scope["x"] != x
    assert torch.equal(scope["x"][~filled], x[~filled]) and (filled.sum(1) == k).all()
    assert not (filled & (x != V)).any()
    probs = net(x).softmax(-1)
    assert torch.equal(scope["x"][filled], probs.argmax(-1)[filled])  # temperature 0: the argmax
    confidence = probs.amax(-1).masked_fill(x != V, float("-inf"))
    kth = confidence.topk(k, dim=1).values[:, -1:]
    assert (confidence[filled].view(3, k) >= kth).all()


@torch.no_grad()
def test_the_mdlm_step_reveals_masked_positions_only_and_the_last_step_reveals_all():
    V, T = 11, 4
    torch.manual_seed(0)
    net = _TinyNet(V, 6)
    x = torch.full((3, 6), V)
    x[:, 0] = 4  # a prompt
    for i, revealed_all in ((0, False), (T - 1, True)):  # a quarter of the coins land, then all
        scope = {"net": net, "x": x.clone(), "mask_id": V, "T": T, "i": i, "seed": 0, "temperature": 1.0,
                 "rows": torch.arange(x.numel()).view(x.shape)}
        exec(compile(_block("sample_from_hidden"), "README.md", "exec"), scope)
        new = scope["x"]
        assert (new[:, 0] == 4).all() and ((new == V) | (new < V)).all()
        assert bool((new[:, 1:] != V).all()) == revealed_all
    assert (new[:, 1:] < V).all()


def _slug(heading):
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(path):
    """The relative link targets of a Markdown file, outside its code blocks."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://"))]


def test_every_link_of_the_readme_and_docs_leads_to_a_file_and_a_section_it_has():
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"),
                 ROOT / "docs" / "text8" / "README.md"]:
        for target in _links(path):
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            assert dest.exists(), f"{path.relative_to(ROOT)} links {target}, which does not exist"
            if anchor and dest.suffix == ".md":
                text = re.sub(r"```.*?```", "", dest.read_text(), flags=re.S)
                anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
                assert anchor in anchors, f"{path.relative_to(ROOT)} links {target}, a section {name} lacks"


def test_the_readme_maps_every_doc():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(ROOT / "README.md")}
    for doc in [*(ROOT / "docs").glob("*.md"), ROOT / "docs" / "text8" / "README.md"]:
        assert doc.resolve() in linked, f"README.md does not link {doc.relative_to(ROOT)}"


def _paragraph(text, marker):
    (paragraph,) = [p for p in text.split("\n\n") if marker in p]
    return paragraph


def test_the_docs_name_the_ops_that_run_torch_code_on_the_cpu():
    """The README and docs/api.md give every op a C++ kernel for CPU tensors: the ops that have
    none (the networks' rotary and norm) must be named there as the exceptions."""
    modules = [p.stem for p in (ROOT / "ddpd" / "ops").glob("*.py") if "torch.library.custom_op(" in p.read_text()]
    without = [m for m in modules if not (ROOT / "csrc" / "cpu" / f"{m}.cpp").exists()]
    assert without  # rotary and norm today
    for name, text in (("README.md", README), ("docs/api.md", API)):
        paragraph = _paragraph(text, "C++ kernel")
        for module in without:
            assert f"`{module}`" in paragraph, f"{name} gives {module} a C++ kernel it does not have"


def test_every_name_ddpd_ops_and_ddpd_sampling_export_is_documented():
    import ddpd.ops
    import ddpd.sampling

    sampling_docs = API + (ROOT / "docs" / "sampling.md").read_text() + (ROOT / "docs" / "parallel.md").read_text()
    for module, docs in ((ddpd.ops, API), (ddpd.sampling, sampling_docs)):
        for name in module.__all__:
            named = re.search(rf"`(?:[\w.]+\.)?{name}\b", docs)
            assert named, f"{module.__name__}.{name} is exported but not documented"


def _doc_block(doc, marker):
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / doc).read_text(), re.S) if marker in b]
    return block


def _tiny(kind, V, D, **fields):
    torch.manual_seed(0)
    return build_model(kind, config_for(kind, V, D, d_model=16, n_layers=1, n_heads=2, **fields))


@torch.no_grad()
def test_the_sampling_example_runs_with_every_option_object():
    """docs/sampling.md's call with every option: a prompt, guidance and a fused run (on the CPU)."""
    V, D = 27, 64
    x_init = torch.full((16, D), -1)
    x_init[:, :4] = 3
    scope = {"planner": _tiny("planner", V, D), "denoiser": _tiny("mask-denoiser", V, D, num_classes=2),
             "x_init": x_init, "frozen": x_init >= 0, "labels": torch.arange(16) % 2}
    example = _doc_block("sampling.md", "Temperature(1.0, 0.5)")
    assert 'device="cuda"' in example
    quick = example.replace('device="cuda"', 'device="cpu"').replace("steps=256", "steps=32")
    exec(compile(quick, "docs/sampling.md", "exec"), scope)
    assert scope["result"].tokens.shape == (16, D) and (scope["result"].tokens[:, :4] == 3).all()


@torch.no_grad()
def test_the_models_examples_run():
    """docs/models.md's precision, attention and class-label examples, with tiny networks."""
    from ddpd.ops import sample_from_hidden

    V, D = 27, 8
    x, t = torch.randint(0, V, (3, D)), torch.rand(3)
    scope = {"planner": _tiny("planner", V, D), "denoiser": _tiny("mask-denoiser", V, D), "x": x, "t": t,
             "device": "cpu", "rows": torch.arange(3), "pos": torch.tensor([0, 3, 7]),
             "sample_from_hidden": sample_from_hidden}
    precision = _doc_block("models.md", "resolve_dtype(").replace(", ...)", ")")
    exec(compile(precision, "docs/models.md", "exec"), scope)
    assert scope["logits"].dtype == torch.float32 and scope["draw"].tokens.shape == (3,)
    exec(compile(_doc_block("models.md", "record_attention() as calls"), "docs/models.md", "exec"), scope)
    small = functools.partial(config_for, d_model=16, n_layers=1, n_heads=2)
    labels = {"V": V, "D": D, "x": x, "t": t, "y": torch.tensor([0, 999, 1000]), "config_for": small,
              "build_model": build_model}
    exec(compile(_doc_block("models.md", "num_classes=1000"), "docs/models.md", "exec"), labels)
    assert labels["model"].null_label == 1000 and labels["logits"].shape == (3, D, V)
