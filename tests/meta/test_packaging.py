"""What the package declares and ships: dependencies where they are needed, optional
extras with one-line errors, the extension importable on its own, the shipped data."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import ddpd.training.data as data
from ddpd.assets import ASSETS, BOOKS, GPT2_RANKS
from ddpd.validation import MissingExtra
from hang_guard import HANG_GUARD_SECONDS

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements):
    return {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements}


def test_runtime_dependencies_are_what_the_code_needs():
    runtime = _names(PROJECT["dependencies"])
    # ninja: the first-use build of ddpd._C; numpy: safetensors.torch.save (every checkpoint save)
    assert runtime == {"torch", "safetensors", "numpy", "tqdm", "ninja"}
    assert "torch>=2.8" in PROJECT["dependencies"]  # the oldest the suite passes on (docs/api.md)
    extras = PROJECT["optional-dependencies"]
    assert extras["hf"] == ["datasets"] and extras["gpt2"] == ["tiktoken"]
    assert {"numpy", "scipy", "tiktoken", "triton", "matplotlib"} <= _names(extras["test"])  # plots are tested


@pytest.mark.integration
def test_a_checkpoint_saves_with_the_runtime_dependencies_alone():
    """Saving imports numpy inside safetensors: with numpy blocked the save fails, which is
    why numpy is a runtime dependency (an install without the test extra lost every run)."""
    script = ("import sys; sys.modules['numpy'] = None\n"
              "import torch\nfrom safetensors.torch import save\n"
              "try:\n    save({'w': torch.zeros(2)})\nexcept ImportError:\n    print('needs numpy')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "needs numpy":
        assert "numpy" in _names(PROJECT["dependencies"])


def test_nothing_imports_an_undeclared_or_optional_package_at_module_level():
    """numpy, pybind11, datasets, tiktoken, triton and matplotlib are imported lazily
    (or not at all) by the package, so a CPU install without the extras imports it."""
    for path in (ROOT / "ddpd").rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import ", "from ")):
                module = line.split()[1].split(".")[0]
                assert module not in ("numpy", "pybind11", "datasets", "tiktoken", "triton", "matplotlib",
                                      "scipy"), f"{path}: {line}"


@pytest.mark.integration
def test_import_ddpd_C_works_in_a_fresh_process():
    """ddpd._C links against torch's libraries: importing it first must work."""
    built = list((ROOT / "ddpd").glob("_C*.so"))
    if not built:
        pytest.skip("ddpd._C was not built in place (JIT install)")
    proc = subprocess.run([sys.executable, "-c", "import ddpd._C as c; print(c.with_cuda in (0, 1))"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr


# A fresh process that takes a Ctrl-C while `import torch` runs (the import raises it here).
_INTERRUPTED_IMPORT = """import builtins, sys
sys.argv[0] = {argv0!r}
imported = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "torch":
        raise KeyboardInterrupt
    return imported(name, *args, **kwargs)
builtins.__import__ = interrupted
import ddpd
import torch  # in a tool's process ddpd leaves it to the tool, after its command line is checked
"""


@pytest.mark.integration
@pytest.mark.parametrize("argv0, tool", [("/venv/bin/ddpd-sample", "ddpd-sample"), ("ddpd-train", "ddpd-train"),
                                         ("-c", None)])
def test_a_ctrl_c_while_torch_imports_ends_a_tool_in_one_line(argv0, tool):
    """A tool's first seconds go to importing torch, before it handles signals itself: a
    Ctrl-C then ends it with one line, not a traceback (and by SIGINT, as Python ends any
    process on an uncaught KeyboardInterrupt); a process that is not a tool keeps Python's
    traceback."""
    proc = subprocess.run([sys.executable, "-c", _INTERRUPTED_IMPORT.format(argv0=argv0)], capture_output=True,
                          text=True, timeout=HANG_GUARD_SECONDS)
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (proc.returncode, proc.stderr)
    if tool:
        assert proc.stderr == f"{tool}: interrupted\n", proc.stderr
    else:
        assert proc.stderr.startswith("Traceback") and proc.stderr.rstrip().endswith("KeyboardInterrupt")


@pytest.mark.integration
def test_the_tools_are_known_by_their_scripts_and_their_modules():
    """python -m ddpd.cli.<tool> (how torchrun starts its workers) counts as the tool too."""
    from ddpd._interrupts import tool_name

    assert tool_name("/venv/bin/ddpd-eval", []) == "ddpd-eval"
    assert tool_name("-m", ["python3", "-u", "-m", "ddpd.cli.train", "--steps", "1"]) == "ddpd-train"
    assert tool_name("/repo/ddpd/cli/sample.py", ["python", "-m", "ddpd.cli.sample"]) == "ddpd-sample"
    for argv0, orig in (("-c", ["python", "-c", "import ddpd"]), ("-m", ["python", "-m", "pytest"]),
                        ("-m", ["python", "-m"]), ("", []),
                        ("-m", ["python", "-m", "pytest", "-m", "ddpd.cli.train"])):  # pytest's own -m
        assert tool_name(argv0, orig) is None


def test_only_the_interpreters_own_options_name_the_tool():
    """-m counts as CPython reads it: joined (-mddpd.cli.train), after options that take an
    argument (-X dev, -W ignore), never among the arguments of a script or of -c."""
    from ddpd._interrupts import tool_name

    for orig, tool in ((["python", "-mddpd.cli.train"], "ddpd-train"),
                       (["python", "-um", "ddpd.cli.eval"], "ddpd-eval"),
                       (["python", "-u", "-m", "ddpd.cli.sample"], "ddpd-sample"),
                       (["python", "-X", "dev", "-m", "ddpd.cli.sample"], "ddpd-sample"),
                       (["python", "-Xdev", "-W", "ignore", "-m", "ddpd.cli.train"], "ddpd-train"),
                       (["python", "--check-hash-based-pycs", "always", "-m", "ddpd.cli.eval"], "ddpd-eval"),
                       (["python", "myscript.py", "-m", "ddpd.cli.sample"], None),
                       (["python", "-u", "myscript.py", "-m", "ddpd.cli.sample"], None),
                       (["python", "-", "-m", "ddpd.cli.sample"], None),
                       (["python", "-c", "import ddpd", "-m", "ddpd.cli.sample"], None),
                       (["python", "-X", "-m", "ddpd.cli.sample"], None)):  # -m is -X's argument
        assert tool_name("", orig) == tool, orig


def test_a_tool_prints_an_uncaught_ctrl_c_in_one_line_and_hands_other_errors_on(monkeypatch, capsys):
    """The hook replaces the traceback of a KeyboardInterrupt only; any other exception goes
    to the hook that was in place."""
    from ddpd import _interrupts

    handed = []
    monkeypatch.setattr(sys, "argv", ["/venv/bin/ddpd-train", "--steps", "1"])
    monkeypatch.setattr(sys, "excepthook", lambda *args: handed.append(args[0]))
    assert _interrupts.install() == "ddpd-train"
    sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert capsys.readouterr().err == "ddpd-train: interrupted\n" and handed == []
    sys.excepthook(ValueError, ValueError("x"), None)
    assert handed == [ValueError] and capsys.readouterr().err == ""


def test_a_tool_prints_a_subclass_of_keyboard_interrupt_in_one_line_too(monkeypatch, capsys):
    """The tools' own Interrupted (raised by their signal handlers) is a KeyboardInterrupt."""
    from ddpd import _interrupts

    class Stopped(KeyboardInterrupt):
        pass

    monkeypatch.setattr(sys, "argv", ["/venv/bin/ddpd-sample"])
    monkeypatch.setattr(sys, "excepthook", lambda *args: None)
    _interrupts.install()
    sys.excepthook(Stopped, Stopped(), None)
    assert capsys.readouterr().err == "ddpd-sample: interrupted\n"


def test_a_process_that_is_no_tool_keeps_its_excepthook(monkeypatch):
    from ddpd import _interrupts

    hook = lambda *args: None  # noqa: E731
    monkeypatch.setattr(sys, "argv", [])
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"])
    monkeypatch.setattr(sys, "excepthook", hook)
    assert _interrupts.this_tool() is None and _interrupts.install() is None and sys.excepthook is hook
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "ddpd.cli.eval"])
    assert _interrupts.this_tool() == "ddpd-eval"


def test_shipped_data():
    text = BOOKS.read_text(encoding="ascii")
    assert len(text) == 197_991 and len(BOOKS.read_bytes()) <= 200_000
    assert set(text) <= set(" abcdefghijklmnopqrstuvwxyz") and "  " not in text
    import hashlib

    assert hashlib.sha256(GPT2_RANKS.read_bytes()).hexdigest() == data.GPT2_SHA256
    notice = (ASSETS / "NOTICE.md").read_text()
    assert "public domain" in notice and "MIT License" in notice and "Copyright (c) 2022 OpenAI" in notice


def test_missing_extras_name_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # as if not installed
    with pytest.raises(MissingExtra, match='pip install "ddpd\\[gpt2\\]"'):
        data.GPT2Tokenizer()
    monkeypatch.setitem(sys.modules, "datasets", None)
    for source in ("text8", "hf:someone/corpus"):
        with pytest.raises(MissingExtra, match='pip install "ddpd\\[hf\\]"') as info:
            data.load_text(source)
        assert len(str(info.value).splitlines()) == 1


def test_the_cli_names_a_missing_extra_in_one_line(monkeypatch, capsys, tmp_path):
    from ddpd.cli.train import main

    monkeypatch.setitem(sys.modules, "datasets", None)
    code = main(["planner", "--data", "text8", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and 'ddpd[hf]' in err


class FakeDatasets:
    """The few calls of `datasets` that ddpd makes, answering from memory (no network)."""

    def __init__(self, splits=None, error=None):
        self.splits, self.error, self.calls = splits or {}, error, []

    def load_dataset(self, repo, config=None, split=None):
        self.calls.append((repo, config, split))
        if self.error is not None:
            raise self.error
        return FakeRows(self.splits[split])

    def is_progress_bar_enabled(self):
        return True

    def disable_progress_bars(self):
        pass

    def enable_progress_bars(self):
        pass


class FakeRows:
    def __init__(self, texts):
        self.texts, self.column_names = texts, ["text"]

    def __getitem__(self, column):
        return self.texts


def test_text8_is_the_hub_splits_joined_in_order(monkeypatch):
    fake = FakeDatasets({"train": [" anarchism originated"], "validation": [" as a term"], "test": [" of abuse"]})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert data.load_text("text8") == " anarchism originated as a term of abuse"
    assert fake.calls == [(data.HUB_TEXT8, None, s) for s in ("train", "validation", "test")]
    fake = FakeDatasets({"train": ["first", "second"]})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    assert data.load_text("hf:someone/corpus:small") == "first\nsecond"
    assert fake.calls == [("someone/corpus", "small", "train")]


def test_no_network_is_one_line_that_says_so(monkeypatch):
    error = ConnectionError("Couldn't reach 'afmck/text8' on the Hub (LocalEntryNotFoundError)\nmore detail")
    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets(error=error))
    with pytest.raises(ValueError) as info:
        data.load_text("text8")
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "network connection" in message and "Couldn't reach" in message


def test_corpus_names_and_files(tmp_path, monkeypatch):
    assert data.resolve_source("books") == "books" and data.load_text("books") == BOOKS.read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text8").write_text("a local text eight")  # `unzip text8.zip` makes a file named text8
    assert data.resolve_source("text8") == str(tmp_path / "text8") and data.load_text("text8") == "a local text eight"
    (tmp_path / "books").write_text("a local file named books")  # a checkpoint's record of a name is the corpus
    assert data.resolve_source("books", recorded=True) == "books"
    assert data.load_text("books", recorded=True) == BOOKS.read_text()
    with pytest.raises(FileNotFoundError, match="no such file: nothing.txt .*books.*text8.*hf:NAME"):
        data.resolve_source("nothing.txt")


@pytest.mark.integration
def test_wheel_ships_the_data(tmp_path):
    """build_py puts the books corpus, the ranks file and the notice into the package, and
    py.typed: without it (PEP 561) type checkers ignore the annotations of an installed ddpd."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path / "lib")], cwd=ROOT, check=True,
                   capture_output=True, timeout=HANG_GUARD_SECONDS, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    shipped = sorted(p.name for p in (tmp_path / "lib" / "ddpd" / "assets").iterdir())
    assert shipped == ["NOTICE.md", "__init__.py", "books.txt", "gpt2.tiktoken"]
    assert (tmp_path / "lib" / "ddpd" / "py.typed").is_file()


@pytest.mark.integration
def test_the_source_distribution_holds_the_tests_and_docs(tmp_path):
    """The sdist held the package alone: a packager building from it could not run the tests
    or read the docs."""
    tree = tmp_path / "tree"  # a copy: sdist writes its release tree beside setup.py
    patterns = shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", ".*cache", ".benchmarks", "*.so")

    def ignored(folder, names):  # the root's git-ignored corpora and outputs, and caches anywhere
        root = {"data", "runs", "build", "dist"} if Path(folder) == ROOT else set()
        return patterns(folder, names) | (root & set(names))

    shutil.copytree(ROOT, tree, ignore=ignored)
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=tree, check=True,
                   capture_output=True, timeout=HANG_GUARD_SECONDS, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    (archive,) = (tmp_path / "dist").iterdir()
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    expected = {"tests/conftest.py", "tests/data/pinned_samples.json", "docs/api.md", "benchmarks/conftest.py",
                "examples/" + sorted(p.name for p in (ROOT / "examples").glob("*.py"))[0], "CHANGELOG.md",
                "README.md", "csrc/module.cpp", "kernels/" + sorted(p.name for p in (ROOT / "kernels").glob("*.py"))[0]}
    assert expected <= names, sorted(expected - names)
    assert not any("__pycache__" in name for name in names)


def _top_level_field(text: str, key: str) -> str:
    """A top-level `key: value` line of a YAML file (no YAML parser in the test extra)."""
    values = [line.split(":", 1)[1].strip().strip('"') for line in text.splitlines() if line.startswith(f"{key}:")]
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def test_the_licence_file_is_the_declared_licence():
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().splitlines()[0] == "MIT License"


def test_the_citation_file_describes_this_release():
    """CITATION.cff carries its own version and licence: they must follow pyproject.toml's."""
    citation = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert _top_level_field(citation, "cff-version") == "1.2.0"
    assert _top_level_field(citation, "version") == PROJECT["version"]
    assert _top_level_field(citation, "license") == PROJECT["license"]
    assert "preferred-citation:" in citation.splitlines()


def test_the_linter_is_pinned_once():
    """The lint in .ci/run (the test extra's ruff) and the pre-commit hook run the same ruff:
    a newer release adds checks, so an unpinned one fails an unchanged tree."""
    pins = [r.split("==")[1] for r in PROJECT["optional-dependencies"]["test"] if r.startswith("ruff==")]
    assert len(pins) == 1, PROJECT["optional-dependencies"]["test"]
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    assert "repo: https://github.com/astral-sh/ruff-pre-commit" in hooks
    assert re.findall(r"^\s*rev:\s*(\S+)$", hooks, re.MULTILINE) == [f"v{pins[0]}"]
