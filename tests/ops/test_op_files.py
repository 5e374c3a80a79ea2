"""Where the ops live (docs/architecture.md, section Ops): one op, one name in each tree
(ddpd/ops/<op>.py, kernels/<op>.py, csrc/cpu/<op>.cpp, csrc/cuda/<op>.cu with its
<op>_binding.cpp; besides them only the shared pieces named here), op modules that import
each other one way only, and no private name of ddpd.ops imported from outside it."""
import ast
import re
from pathlib import Path

import pytest

from hang_guard import HANG_GUARD_SECONDS

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ddpd" / "ops"
SHARED = {"rng"}  # the counter-based streams: every op's, in every tree
API = {"controls", "reference", "results"}  # the ops' argument and result types, the references by law
# the C++ kernels' vector paths (docs/architecture.md): every CPU kernel's uniforms, Gumbel
# variables and transcendental functions, and which instruction sets the CPU has
CPU_SHARED = {"isa", "uniforms", "vector_math"}
SOURCES = (".h", ".cuh", ".cpp", ".cu")


def op_names() -> set:
    return {p.stem for p in OPS.glob("*.py") if not p.stem.startswith("_")} - SHARED - API


def test_every_kernel_file_is_named_after_its_op():
    ops = op_names()
    trees = {
        "kernels": {p.stem for p in (ROOT / "kernels").glob("*.py") if p.stem != "__init__"},
        "csrc/cpu": {p.stem for p in (ROOT / "csrc" / "cpu").glob("*.cpp")} - CPU_SHARED,
        "csrc/cuda": {p.stem for p in (ROOT / "csrc" / "cuda").glob("*.cu")},
        "csrc/cuda bindings": {p.stem.removesuffix("_binding") for p in (ROOT / "csrc" / "cuda").glob("*.cpp")},
    }
    for tree, names in trees.items():
        assert names - SHARED <= ops, f"{tree} has files named after no op: {sorted(names - SHARED - ops)}"
    assert trees["csrc/cuda bindings"] == trees["csrc/cuda"]  # each .cu beside its torch binding
    # every op has a kernel somewhere
    assert ops <= trees["kernels"] | trees["csrc/cpu"] | trees["csrc/cuda"]


def test_every_source_file_the_cpp_sources_name_exists():
    """Their comments point to each other for the law and the launch grids: a file merged
    into another must not leave readers a name to look for."""
    named = re.compile(r"(?<![\w/])csrc/[\w/]+\.(?:h|cuh|cpp|cu)\b")
    missing = {f"{path.relative_to(ROOT)}: {name}" for path in (ROOT / "csrc").rglob("*") if path.suffix in SOURCES
               for name in named.findall(path.read_text()) if not (ROOT / name).is_file()}
    assert not missing, sorted(missing)


def imports_of(path: Path) -> set:
    """Modules a file imports (absolute names, `from a import b` as a and a.b)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_op_modules_import_each_other_one_way():
    for package, prefix in ((OPS, "ddpd.ops."), (ROOT / "kernels", "ddpd.kernels.")):
        graph = {p.stem: {m[len(prefix):].split(".")[0] for m in imports_of(p) if m.startswith(prefix)} - {p.stem}
                 for p in package.glob("*.py")}
        state = {}

        def visit(node, path):
            assert state.get(node) != "open", f"import cycle in {package.name}: {' -> '.join(path + [node])}"
            if state.get(node) == "done":
                return
            state[node] = "open"
            for nxt in graph.get(node, ()):
                visit(nxt, path + [node])
            state[node] = "done"

        for node in graph:
            visit(node, [])
    for tree, prefix in ((ROOT / "kernels", "ddpd.kernels"), (OPS, "ddpd.ops")):  # the pair that was inverted
        assert f"{prefix}.planner_select" in imports_of(tree / "planner_mask.py")
        assert not any("planner_mask" in m for m in imports_of(tree / "planner_select.py"))


def test_nothing_outside_ops_imports_a_private_name_of_it():
    offenders = []
    for path in list((ROOT / "ddpd").rglob("*.py")) + list((ROOT / "benchmarks").glob("*.py")) + \
            list((ROOT / "examples").glob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("ddpd/ops/"):
            continue
        for name in imports_of(path):
            parts = name.split(".")
            if parts[:2] == ["ddpd", "ops"] and any(part.startswith("_") for part in parts[2:]):
                offenders.append(f"{relative}: {name}")
    assert not offenders, offenders


@pytest.mark.integration
def test_kernels_install_as_ddpd_kernels_only(tmp_path):
    """The Triton kernels import as ddpd.kernels.<op>; no top-level `kernels` module of
    ours exists outside the source tree (a fresh process away from the checkout)."""
    import subprocess
    import sys

    script = ("import importlib.util, ddpd.kernels.rng as k; spec = importlib.util.find_spec('kernels'); "
              "print(k.__file__); print(spec.origin if spec and spec.origin else "
              "(list(spec.submodule_search_locations) if spec else None))")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS,
                            env={k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    ours, other = result.stdout.strip().splitlines()
    assert Path(ours).resolve() == (ROOT / "kernels" / "rng.py").resolve()
    assert other == "None" or str(ROOT) not in other  # another project's `kernels` package may exist
