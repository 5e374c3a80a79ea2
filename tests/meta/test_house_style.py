"""The house style of the code's prose (CONTRIBUTING.md): short module docstrings that link
docs/, no measured timing or results file quoted in a comment or docstring, and Google-style
Args / Returns sections on the public functions of the user-facing modules, with a Raises
section naming each exception class a function raises itself.

The checks read the source (ast and tokenize); nothing is imported. ROOTS and USER_FACING
say where they apply: widen them as more of the package follows the style.
"""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Where module docstrings are short and no comment or docstring quotes a timing.
ROOTS = [
    "ddpd/models",
    "ddpd/training",
    "ddpd/eval",
    "ddpd/cli",
    "ddpd/ops",
    "ddpd/sampling",
    "ddpd/pretrained",
    "ddpd/*.py",
    "kernels",
    "examples",
    "tests/oracles",
    "tests/conftest.py",
    "tests/hang_guard.py",
]
# Where every public function documents its arguments and its result.
USER_FACING = [
    "ddpd/models/*.py",
    "ddpd/training/*.py",
    "ddpd/eval/*.py",
    "ddpd/pretrained/*.py",
    "ddpd/ops/*.py",
    "ddpd/sampling/*.py",
    "ddpd/cli/*.py",
    "ddpd/checkpoint.py",
    "ddpd/files.py",
    "ddpd/process.py",
    "ddpd/streams.py",
    "ddpd/number_text.py",
    "ddpd/validation.py",
]
MAX_MODULE_DOCSTRING_LINES = 15
# A measured time (12 us, 3.5 ms, 0.8µs), a speed ratio (1.3x faster) or a results file.
TIMING = re.compile(r"\b\d+(\.\d+)?\s?(µs|us|ms|ns)\b|\d+(\.\d+)?x (faster|slower)|results/")


def _files(patterns: list[str]) -> list[Path]:
    found = set()
    for pattern in patterns:
        path = ROOT / pattern
        if path.is_dir():
            found.update(path.rglob("*.py"))
        else:
            found.update(ROOT.glob(pattern))
    return sorted(p for p in found if p.is_file())


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def _own_nodes(function: ast.AST):
    """The nodes of a function's body, without those of functions and classes nested in it."""
    todo = list(function.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def _public_functions(tree: ast.Module):
    """(qualified name, node) of the public functions and methods of public classes;
    properties are attributes, documented by their summary alone."""
    def visit(nodes, prefix=""):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                if not any(isinstance(d, ast.Name) and d.id in ("property", "cached_property")
                           for d in node.decorator_list):
                    yield prefix + node.name, node
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                yield from visit(node.body, f"{prefix}{node.name}.")
    yield from visit(tree.body)


def _missing_sections(node: ast.FunctionDef) -> list[str]:
    doc = ast.get_docstring(node) or ""
    arguments = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                 if a.arg not in ("self", "cls")] + [a.arg for a in (node.args.vararg, node.args.kwarg) if a]
    own = list(_own_nodes(node))
    returns = any(isinstance(n, ast.Return) and n.value is not None
                  and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in own)
    yields = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own)
    missing = []
    if arguments and "Args:" not in doc:
        missing.append("Args")
    if returns and "Returns:" not in doc:
        missing.append("Returns")
    if yields and "Yields:" not in doc:
        missing.append("Yields")
    raised = _raised(own)
    documented = doc.partition("Raises:")[2]
    if raised and "Raises:" not in doc:
        missing.append("Raises")
    missing += [f"Raises: {name}" for name in sorted(raised) if "Raises:" in doc
                and not re.search(rf"\b{name}\b", documented)]
    return missing


def _raised(nodes) -> set[str]:
    """The exception classes a function raises by name (`raise ValueError(...)`); not a
    re-raise, an exception made by a helper call, nor NotImplementedError (an abstract method)."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else ""
            if name[:1].isupper() and name != "NotImplementedError":
                names.add(name)
    return names


@pytest.mark.parametrize("path", _files(ROOTS), ids=_name)
def test_module_docstrings_are_short(path):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    lines = len(doc.strip("\n").splitlines()) if doc else 0
    assert lines <= MAX_MODULE_DOCSTRING_LINES, \
        f"{_name(path)}: a module docstring of {lines} lines; move the explanation to docs/ and link it"


@pytest.mark.parametrize("path", _files(ROOTS), ids=_name)
def test_no_comment_or_docstring_quotes_a_timing(path):
    quoted = [f"{_name(path)}:{line}: {TIMING.search(text).group(0)!r}" for line, text in _prose(path.read_text())
              if TIMING.search(text)]
    assert not quoted, "timings and results files belong in docs/performance.md:\n" + "\n".join(quoted)


@pytest.mark.parametrize("path", _files(USER_FACING), ids=_name)
def test_public_functions_document_arguments_and_results(path):
    undocumented = [f"{_name(path)}:{node.lineno} {name}: no {', '.join(missing)} section"
                    for name, node in _public_functions(ast.parse(path.read_text()))
                    if (missing := _missing_sections(node))]
    assert not undocumented, "\n".join(undocumented)


def test_the_checks_see_what_they_check():
    """The helpers find a timing, a long docstring and a missing section where there is one."""
    source = '"""Summary.\n\nMore."""\n# 12.5 us at 64 rows (benchmarks/results/x.txt)\n' \
             'def f(x):\n    """Doubled."""\n    return 2 * x\n\n\ndef g():\n    """Nothing."""\n    return None\n' \
             'def h():\n    """Refuses."""\n    raise ValueError("no")\n' \
             'def k(x):\n    """Refuses.\n\n    Raises:\n        ValueError: always.\n    """\n' \
             '    if x:\n        raise ValueError("no")\n    raise errors.CheckpointError("no")\n' \
             'def m():\n    """Re-raises."""\n    raise make_error()\n'
    assert [TIMING.search(text).group(0) for _, text in _prose(source) if TIMING.search(text)] == ["12.5 us"]
    tree = ast.parse(source)
    assert {name: _missing_sections(node) for name, node in _public_functions(tree)} == \
        {"f": ["Args", "Returns"], "g": [], "h": ["Raises"], "k": ["Args", "Raises: CheckpointError"], "m": []}
    assert _files(["ddpd/models"]) and all(p.suffix == ".py" for p in _files(ROOTS))
