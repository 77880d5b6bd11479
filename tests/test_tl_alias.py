"""as_transformer_lens(): glassbox.tl registered as ``transformer_lens``, every submodule under its
TransformerLens name; refused when another transformer_lens is imported; idempotent.

Each test restores ``sys.modules`` afterwards, so no other test sees the alias.
"""

import importlib
import pkgutil
import sys
import types

import pytest
import torch

import glassbox.tl


@pytest.fixture(autouse=True)
def clean_modules():
    saved = {k: v for k, v in sys.modules.items() if k == "transformer_lens" or k.startswith("transformer_lens.")}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [k for k in sys.modules if k == "transformer_lens" or k.startswith("transformer_lens.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def glassbox_tl_modules() -> set:
    """Every public module of the glassbox.tl package, found independently of the alias."""
    names = {"glassbox.tl"}
    for info in pkgutil.walk_packages(glassbox.tl.__path__, prefix="glassbox.tl."):
        if not any(part.startswith("_") for part in info.name.split(".")[2:]):
            names.add(info.name)
    return names


def test_every_submodule_is_registered_under_its_transformer_lens_name():
    package = glassbox.tl.as_transformer_lens()
    assert package is glassbox.tl and sys.modules["transformer_lens"] is glassbox.tl
    expected = {"transformer_lens" + name[len("glassbox.tl"):] for name in glassbox_tl_modules()}
    expected.add("transformer_lens.utilities")  # TransformerLens 3.x's own name for its helpers: glassbox.tl.utils
    expected.update(f"transformer_lens.{path}" for path in TL_PATHS)
    expected.update(f"transformer_lens.utilities.{name}" for name in ("cache", "logits_utils", "parameter_swap",
                                                                      "typed_module_list"))
    registered = {k for k in sys.modules if k == "transformer_lens" or k.startswith("transformer_lens.")}
    assert registered == expected
    for name in glassbox_tl_modules():
        assert sys.modules["transformer_lens" + name[len("glassbox.tl"):]] is importlib.import_module(name)
    assert sys.modules["transformer_lens.utilities"] is glassbox.tl.utils
    # A module and a class share a name (as in TransformerLens): the package attribute is the class.
    import transformer_lens

    assert isinstance(transformer_lens.HookedRootModule, type) and isinstance(transformer_lens.ActivationCache, type)
    assert transformer_lens.TransformerLensKeyValueCache is glassbox.tl.HookedTransformerKeyValueCache
    # The names TransformerLens code (and SAELens) imports.
    for module in ("hook_points", "HookedTransformer", "ActivationCache", "FactoredMatrix", "utils", "patching",
                   "evals", "head_detector", "SVDInterpreter", "loading_from_pretrained", "past_key_value_caching",
                   "config", "config.hooked_transformer_config", "components.mlps.can_be_used_as_mlp",
                   "HookedRootModule", "cache.key_value_cache", "cache.key_value_cache_entry"):
        assert f"transformer_lens.{module}" in registered, module


# TransformerLens's other module paths (2.x and 3.x), written out here, and a name each must give.
TL_PATHS = {
    "HookedTransformerConfig": "HookedTransformerConfig", "components.attention": "Attention",
    "components.embed": "Embed", "components.pos_embed": "PosEmbed", "components.unembed": "Unembed",
    "components.layer_norm": "LayerNorm", "components.rms_norm": "RMSNorm",
    "components.layer_norm_pre": "LayerNormPre", "components.rms_norm_pre": "RMSNormPre",
    "components.transformer_block": "TransformerBlock", "components.mlps.mlp": "MLP",
    "components.mlps.gated_mlp": "GatedMLP", "utilities.activation_functions": "xielu", "utilities.attention": "complex_attn_linear",
    "utilities.components_utils": "get_act_name", "utilities.defaults_utils": "override_or_use_default_value",
    "utilities.devices": "get_device", "utilities.exploratory_utils": "test_prompt",
    "utilities.hf_utils": "keep_single_column", "utilities.initialization_utils": "init_kaiming_normal_",
    "utilities.library_utils": "is_library_available", "utilities.lm_utils": "lm_cross_entropy_loss",
    "utilities.matrix": "composition_scores", "utilities.slice": "Slice", "utilities.tensors": "to_numpy",
    "utilities.tokenize_utils": "get_attention_mask",
}


def test_transformer_lens_2_and_3_module_paths_import():
    glassbox.tl.as_transformer_lens()
    from transformer_lens.HookedTransformerConfig import HookedTransformerConfig
    from transformer_lens.components.mlps.mlp import MLP
    from transformer_lens.utilities.lm_utils import lm_cross_entropy_loss

    assert HookedTransformerConfig is glassbox.tl.HookedTransformerConfig and MLP is glassbox.tl.components.MLP
    assert lm_cross_entropy_loss is glassbox.tl.utils.lm_cross_entropy_loss
    for path, name in TL_PATHS.items():
        module = importlib.import_module(f"transformer_lens.{path}")
        assert hasattr(module, name), (path, name)
    import transformer_lens

    assert isinstance(transformer_lens.HookedTransformerConfig, type)  # the package attribute stays the class
    assert glassbox.tl.utils.is_library_available("torch") and not glassbox.tl.utils.is_library_available("no_such_x")


def test_transformer_lens_code_runs_unchanged():
    glassbox.tl.as_transformer_lens()
    from transformer_lens import ActivationCache, HookedTransformer, HookedTransformerConfig  # noqa: F401
    from transformer_lens.components.mlps.can_be_used_as_mlp import CanBeUsedAsMLP
    from transformer_lens.config.hooked_transformer_config import HookedTransformerConfig as Nested
    from transformer_lens.hook_points import HookedRootModule, HookPoint
    from transformer_lens.HookedTransformer import Loss, Output  # noqa: F401

    assert Nested is HookedTransformerConfig and HookedTransformer is glassbox.tl.HookedTransformer
    cfg = HookedTransformerConfig(d_model=16, d_head=4, n_layers=1, n_ctx=8, d_vocab=19, act_fn="gelu_new")
    model = HookedTransformer(cfg)
    assert isinstance(model, HookedRootModule) and isinstance(model.hook_embed, HookPoint)
    assert isinstance(model.blocks[0].mlp, CanBeUsedAsMLP)
    _, cache = model.run_with_cache(torch.zeros(1, 3, dtype=torch.long))
    assert isinstance(cache, ActivationCache)


def test_calling_twice_is_a_no_op():
    first = glassbox.tl.as_transformer_lens()
    modules = dict(sys.modules)
    assert glassbox.tl.as_transformer_lens() is first
    assert dict(sys.modules) == modules


def test_refused_when_another_transformer_lens_is_imported():
    sys.modules["transformer_lens"] = types.ModuleType("transformer_lens")
    with pytest.raises(RuntimeError, match="transformer_lens is already imported .* cannot take its name"):
        glassbox.tl.as_transformer_lens()
    assert not isinstance(sys.modules["transformer_lens"].__dict__.get("HookedTransformer"), type)


def test_refused_when_real_submodules_are_imported():
    sys.modules["transformer_lens.utils"] = types.ModuleType("transformer_lens.utils")
    with pytest.raises(RuntimeError, match=r"modules of a real transformer_lens are already imported \(transformer_lens.utils"):
        glassbox.tl.as_transformer_lens()
    assert "transformer_lens" not in sys.modules, "nothing registered when refused"
