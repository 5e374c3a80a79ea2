"""Every ddpd-train, ddpd-sample and ddpd-eval command line the README and docs show, in any
code block, parses with the tool's own parser, and each --policy / --policies spec in it is
one parse_policy reads: a renamed flag or policy field would otherwise leave the docs behind."""
import argparse
import re
import shlex
from pathlib import Path

import pytest

from ddpd.cli.eval import build_parser as eval_parser
from ddpd.cli.sample import build_parser as sample_parser
from ddpd.cli.train import build_parser as train_parser
from ddpd.sampling.policies import parse_policy

ROOT = Path(__file__).resolve().parents[2]
PARSERS = {"ddpd-train": train_parser, "ddpd-sample": sample_parser, "ddpd-eval": eval_parser}
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _commands() -> list:
    """(doc, command line) of every code block line that starts with a tool, a line ending in a
    backslash joined to the next; not the synopses of docs/cli.md ([optional], a|b)."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"^```\w*\n(.*?)^```", doc.read_text(), re.S | re.M):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.strip().removeprefix("$ ").split(" #")[0]
                if line.split(" ")[0] in PARSERS and "[" not in line and "|" not in line:
                    found.append((str(doc.relative_to(ROOT)), line))
    return found


COMMANDS = _commands()


def test_the_docs_show_each_tool():
    assert {line.split(" ")[0] for _, line in COMMANDS} == set(PARSERS)
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("doc, command", COMMANDS, ids=[f"{doc}: {line[:80]}" for doc, line in COMMANDS])
def test_every_command_line_parses(doc, command):
    tool, *argv = shlex.split(command.replace("ddpd-train KIND ", "ddpd-train planner "))  # KIND: any kind
    args = PARSERS[tool]().parse_args(argv)  # argparse exits (and the test fails) on a flag it does not know
    for spec in [getattr(args, "policy", None), *(getattr(args, "policies", None) or [])]:
        if spec is not None:
            parse_policy(spec)


def _flags() -> list:
    """(command, action) of every option of every tool and ddpd-eval subcommand, but --help."""
    found = []
    for tool, build in PARSERS.items():
        parsers = [(tool, build())]
        for name, parser in parsers:
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parsers += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
                elif action.option_strings and action.dest != "help":
                    found.append((name, action))
    return found


FLAGS = _flags()


@pytest.mark.parametrize("command, action", FLAGS, ids=[f"{c} {a.option_strings[-1]}" for c, a in FLAGS])
def test_every_flag_is_in_cli_md_and_says_what_it_is(command, action):
    """A flag added to a parser is documented in docs/cli.md and --help says what it is (a
    line that is only its default, or none, left --sampler and --out-dir unexplained)."""
    flag = action.option_strings[-1]
    assert re.search(re.escape(flag) + r"(?![\w-])", (ROOT / "docs" / "cli.md").read_text()), flag
    assert action.help and not action.help.startswith("("), f"{command} {flag}: no help text"
