"""docs/conditional.md, docs/cli.md and the README's quickstart as a reader uses them:
the toy corpus block makes a labelled corpus ddpd-train reads, every ddpd-train /
ddpd-sample command line names the flags of conditional sampling (every docs command
parses: test_doc_commands.py), and the adapter example imports names ddpd has."""
import ast
import importlib
import re
import shlex
from pathlib import Path

import pytest

from ddpd.cli.sample import build_parser as sample_parser
from ddpd.cli.train import build_parser as train_parser
from ddpd.training.data import Text8Tokenizer, load_labelled

ROOT = Path(__file__).resolve().parents[2]
CONDITIONAL = (ROOT / "docs" / "conditional.md").read_text()
DOCS = [(ROOT / name).read_text() for name in ("README.md", "docs/cli.md", "docs/conditional.md")]
PYTHON = re.findall(r"```python\n(.*?)```", CONDITIONAL, re.S)
BASH = [block for doc in DOCS for block in re.findall(r"```bash\n(.*?)```", doc, re.S)]
PARSERS = {"ddpd-train": train_parser, "ddpd-sample": sample_parser}
COMMANDS = [line.split(" #")[0] for block in BASH for line in re.sub(r"\\\n\s*", "", block).splitlines()
            if line.split(" ")[0] in PARSERS]  # a line ending in a backslash goes on in the next


def test_the_toy_corpus_block_makes_a_labelled_corpus(tmp_path, monkeypatch):
    (block,) = [b for b in PYTHON if "toy.jsonl" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/conditional.md", "exec"), {})
    records = load_labelled(str(tmp_path / "toy.jsonl"), Text8Tokenizer())
    assert records.labels.tolist() == [0, 1] * 200
    assert int(records.lengths.min()) >= 32  # every record holds a --seq-len 32 window


def test_the_docs_train_and_sample_with_labels_and_prompts():
    text = " ".join(COMMANDS)
    for flag in ("--num-classes", "--label-dropout", "--labels", "--guidance-scale", "--prompt", "--infill"):
        assert flag in text, flag


def test_the_sample_outputs_show_both_summary_lines():
    """ddpd-sample prints its passes per sample on a second line, which the output blocks left out."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", CONDITIONAL, re.S | re.M)
    outputs = [block for info, block in blocks if not info and "ddpd-sample: " in block]
    assert outputs
    for block in outputs:
        lines = block.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("ddpd-sample: "))
        second = lines[first + 1] if first + 1 < len(lines) else ""
        assert re.fullmatch(r"ddpd-sample: network passes per sample [\d.]+ \(planner [\d.]+, denoiser [\d.]+\), "
                            r"[\d.]+ tokens committed per pass", second), block


def test_the_adapter_example_imports_what_ddpd_has():
    (block,) = [b for b in PYTHON if "SEDDAbsorbingDenoiser" in b]
    imported = [(node.module, alias.name) for node in ast.walk(ast.parse(block))
                if isinstance(node, ast.ImportFrom) and node.module.startswith("ddpd")
                for alias in node.names]
    assert ("ddpd.models.adapters", "SEDDAbsorbingDenoiser") in imported
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), (module, name)


# Where the documented toy samples were made: its test compares them token for token there only
# (training's float sums round otherwise with other vector instructions, another torch, or
# another maker's CPU: an Intel Xeon with AVX-512 and this torch draws other letters).
MADE_WITH = ("2.13.0+cpu", "AVX512", "AuthenticAMD")


def _cpu_vendor():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:  # not Linux: no match, the traits alone are checked
        return ""


WIDTH, GAP = 32, 3  # a sample (--seq-len 32) and the spaces between the columns
TOY_COMMANDS = [c for c in COMMANDS if "runs/toy" in c]


def _toy_words():
    (block,) = [b for b in PYTHON if "toy.jsonl" in b]
    (words,) = [ast.literal_eval(line.split("=", 1)[1].strip()) for line in block.splitlines()
                if line.startswith("words =")]
    return [" ".join(w) for w in words]


def _documented_samples():
    """docs/conditional.md's toy samples: [--labels 0 1, --guidance-scale 3, no labels], 6 each."""
    block = CONDITIONAL.split("The samples these commands printed")[1].split("```\n")[1]
    header, *rows = block.splitlines()
    assert header.split("  ")[0] == "--labels 0 1" and len(rows) == 6
    step = WIDTH + GAP
    return [[row[c * step:c * step + WIDTH].ljust(WIDTH) for row in rows] for c in range(3)]


def _check_traits(labelled, guided, unlabelled):
    """What docs/conditional.md says of them: with labels 0, 1, 0, ... each sample keeps to its class
    (no letter only the other class's words have); without labels the classes mix."""
    colours, numbers = (set(words) for words in _toy_words())
    only = [colours - numbers, numbers - colours]
    for run in (labelled, guided, unlabelled):
        assert len(run) == 6 and all(len(s) == WIDTH and set(s) <= set(" abcdefghijklmnopqrstuvwxyz") for s in run)
    for run in (labelled, guided):
        for i, sample in enumerate(run):
            assert not set(sample) & only[1 - i % 2], (i, sample)
    text = set("".join(unlabelled))
    assert text & only[0] and text & only[1], unlabelled


def test_the_documented_toy_samples_have_the_traits_the_doc_names():
    assert len(TOY_COMMANDS) == 5 and [c.split()[0] for c in TOY_COMMANDS] == ["ddpd-train"] * 2 + ["ddpd-sample"] * 3
    _check_traits(*_documented_samples())


@pytest.mark.integration
@pytest.mark.slow
def test_the_toy_commands_print_the_documented_samples(tmp_path, monkeypatch):
    """The documented commands as written, in a fresh directory: their samples have the traits,
    and are the documented ones where torch and the CPU are those they were made with."""
    import subprocess
    import sys

    import torch

    (block,) = [b for b in PYTHON if "toy.jsonl" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/conditional.md", "exec"), {})
    printed = []
    for command in TOY_COMMANDS:
        tool, *argv = shlex.split(command)
        module = {"ddpd-train": "ddpd.cli.train", "ddpd-sample": "ddpd.cli.sample"}[tool]
        done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, check=True)
        printed.append(done.stdout.splitlines())
    samples = printed[2:]
    _check_traits(*samples)
    if (torch.__version__, torch.backends.cpu.get_cpu_capability(), _cpu_vendor()) == MADE_WITH:
        assert samples == _documented_samples()
