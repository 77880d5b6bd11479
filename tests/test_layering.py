"""Each layer imports only from the layers before it (module-level imports)."""

import ast
from pathlib import Path

import glassbox

# Rank of each layer: a module may import layers of lower rank only. train and scale are siblings.
RANK = {"fs": 0, "hooks": 1, "models": 2, "weights": 3, "interp": 4, "train": 5, "scale": 5, "tl": 6, "cli": 7}
ORDER = list(RANK)
ROOT = Path(glassbox.__file__).parent


def imported_layers(path: Path) -> set:
    layers = set()
    for node in ast.parse(path.read_text()).body:  # module level only: call-time imports are entry points
        names = []
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: ..models -> models
                names = [module.split(".")[0]] if node.level >= 2 else []
            elif module.startswith("glassbox."):
                names = [module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("glassbox.")]
        layers.update(n for n in names if n in ORDER)
    return layers


def test_layers_import_only_earlier_layers():
    for layer, rank in RANK.items():
        folder = ROOT / layer
        if not folder.is_dir():
            continue
        allowed = {other for other, r in RANK.items() if r < rank} | {layer}
        for path in folder.rglob("*.py"):
            later = imported_layers(path) - allowed
            # A file two folders down (interp/patching/x.py) imports its siblings with "..": that is its own layer.
            assert not later, f"{path.relative_to(ROOT)} imports later layer(s) {sorted(later)}"


def test_the_check_sees_a_later_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ..cli import main\nimport glassbox.tl\n")
    assert imported_layers(bad) == {"cli", "tl"}
