"""glassbox.tl's extra module paths (``_alias.MODULE_PATHS``) against TransformerLens 3.9's own modules:
every name a path gives is a name TransformerLens 3.9 defines at that path (2.x's
``transformer_lens.HookedTransformerConfig`` module is not in 3.9 and is checked by the main suite), and
``is_library_available`` agrees with TransformerLens's."""

import importlib

import pytest

import transformer_lens.utilities as tl_utilities
from glassbox.tl import utils as gb_utils
from glassbox.tl._alias import MODULE_PATHS


@pytest.mark.parametrize("path", [p for p in MODULE_PATHS if p != "HookedTransformerConfig"])
def test_each_path_gives_transformer_lens_3_9_names(path):
    theirs = importlib.import_module(f"transformer_lens.{path}")
    target, names = MODULE_PATHS[path]
    ours = importlib.import_module(f"glassbox.tl.{target}")
    for name in names:
        assert hasattr(theirs, name), f"TransformerLens 3.9's transformer_lens.{path} has no {name}"
        assert hasattr(ours, name), f"glassbox.tl.{target} has no {name}"


@pytest.mark.parametrize("name", ["torch", "numpy", "transformer_lens", "no_such_library_x"])
def test_is_library_available_equals_transformer_lens(name):
    assert gb_utils.is_library_available(name) == tl_utilities.is_library_available(name)
