"""The layers of the package import downward only (docs/architecture.md).

Every `import ddpd...` / `from ddpd... import` in the package, at module level or inside a
function, is an edge between two layers; an edge must go from a higher layer to a lower one.
"""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ddpd"

# rank of each part of the package: a part may import parts of lower rank only
LAYERS = {
    "ddpd._interrupts": -1,  # imported by the package's __init__ before anything else
    "ddpd": 0, "ddpd.validation": 0, "ddpd.files": 0, "ddpd.streams": 0, "ddpd.assets": 0, "ddpd.number_text": 0,
    "ddpd.process": 1, "ddpd.kernels": 1,
    "ddpd.ops": 2,
    "ddpd.models": 3,
    "ddpd.checkpoint": 4,
    "ddpd.training": 5,
    "ddpd.eval": 6, "ddpd.pretrained": 6,
    "ddpd.sampling": 7,
    "ddpd.cli": 8,
    "ddpd.testing": 9,  # what the tests and benchmarks share: nothing in the package imports it
}


def part(module: str) -> str:
    """The layer a module belongs to: its first two name parts (ddpd.ops.rng -> ddpd.ops)."""
    return ".".join(module.split(".")[:2])


def imports():
    """(importing module, imported module, line) for every ddpd import in the package."""
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ddpd"):
                targets = [node.module] if node.module != "ddpd" else [f"ddpd.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ddpd")]
            else:
                continue
            for target in targets:
                yield module, target, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"


def test_every_part_of_the_package_has_a_layer():
    edges = list(imports())
    assert len(edges) > 100  # the walk sees the package's imports
    parts = {part(m) for m, _, _ in edges} | {part(t) for _, t, _ in edges}
    assert parts <= set(LAYERS), sorted(parts - set(LAYERS))


def test_layers_import_downward_only():
    upward = [f"{where}: {source} imports {target}" for source, target, where in imports()
              if part(source) != part(target) and LAYERS[part(source)] <= LAYERS[part(target)]]
    assert not upward, "\n".join(upward)
