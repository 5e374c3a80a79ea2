"""The README's conditional generation and command-line sections as a reader uses them:
the toy corpus block makes a labelled corpus ddpd-train reads, every ddpd-train /
ddpd-sample command line of a bash block parses with the tools' own parsers, and the
adapter example imports names ddpd has."""
import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

from ddpd.cli.sample import build_parser as sample_parser
from ddpd.cli.train import build_parser as train_parser
from ddpd.training.data import Text8Tokenizer, load_labelled

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON = re.findall(r"```python\n(.*?)```", README, re.S)
BASH = re.findall(r"```bash\n(.*?)```", README, re.S)
PARSERS = {"ddpd-train": train_parser, "ddpd-sample": sample_parser}
COMMANDS = [line.split(" #")[0] for block in BASH for line in block.splitlines()
            if line.split(" ")[0] in PARSERS]


def test_the_toy_corpus_block_makes_a_labelled_corpus(tmp_path, monkeypatch):
    (block,) = [b for b in PYTHON if "toy.jsonl" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {})
    records = load_labelled(str(tmp_path / "toy.jsonl"), Text8Tokenizer())
    assert records.labels.tolist() == [0, 1] * 200
    assert int(records.lengths.min()) >= 32  # every record holds a --seq-len 32 window


def test_the_readme_trains_and_samples_with_labels_and_prompts():
    text = " ".join(COMMANDS)
    for flag in ("--num-classes", "--label-dropout", "--labels", "--guidance-scale", "--prompt", "--infill"):
        assert flag in text, flag


@pytest.mark.parametrize("command", COMMANDS, ids=[c.strip() for c in COMMANDS])
def test_every_command_line_parses(command):
    tool, *argv = shlex.split(command)
    args = PARSERS[tool]().parse_args(argv)  # argparse exits (and the test fails) on a flag it does not know
    assert args is not None


def test_the_adapter_example_imports_what_ddpd_has():
    (block,) = [b for b in PYTHON if "SEDDAbsorbingDenoiser" in b]
    imported = [(node.module, alias.name) for node in ast.walk(ast.parse(block))
                if isinstance(node, ast.ImportFrom) and node.module.startswith("ddpd")
                for alias in node.names]
    assert ("ddpd.models.adapters", "SEDDAbsorbingDenoiser") in imported
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), (module, name)
