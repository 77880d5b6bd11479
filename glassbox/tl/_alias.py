"""as_transformer_lens(): make ``import transformer_lens`` (and its submodules) give glassbox.tl.

Every module of the glassbox.tl package is imported and entered in ``sys.modules`` under its
TransformerLens dotted name (``glassbox.tl.hook_points`` -> ``transformer_lens.hook_points``), so
``from transformer_lens.hook_points import HookPoint`` works too. The package is walked, so modules
added later are included; ``MODULE_PATHS`` adds TransformerLens's other module paths (2.x's
``transformer_lens.HookedTransformerConfig``, ``components.embed``, ``utilities.lm_utils`` ...) as the
glassbox.tl module holding their names. Refused, saying so, when a real ``transformer_lens`` is already imported
(its objects would mix with glassbox's); calling it again is a no-op.

Footguns: the registration is process-wide. A path of ``MODULE_PATHS`` is an alias of a module with
another name, so ``from transformer_lens.utilities.lm_utils import lm_accuracy`` works but
``import transformer_lens.utilities.lm_utils as m`` does not (Python looks the last part up as an
attribute of ``glassbox.tl.utils``). Anything importing ``transformer_lens`` afterwards gets
glassbox.tl, including libraries that expected the real package.
"""

import importlib
import pkgutil
import sys

ALIAS = "transformer_lens"

# TransformerLens module paths (2.x and 3.x) that hold names glassbox.tl defines elsewhere: the path is
# registered as the glassbox.tl module holding them, so ``from transformer_lens.<path> import <name>``
# works; the names are what each path provides (tests check them against TransformerLens 3.9).
MODULE_PATHS = {
    "HookedTransformerConfig": ("config.hooked_transformer_config", ["HookedTransformerConfig"]),  # 2.x
    "components.embed": ("components", ["Embed"]),
    "components.unembed": ("components", ["Unembed"]),
    "components.layer_norm": ("components", ["LayerNorm"]),
    "components.rms_norm": ("components", ["RMSNorm"]),
    "components.layer_norm_pre": ("components", ["LayerNormPre"]),
    "components.rms_norm_pre": ("components", ["RMSNormPre"]),
    "components.transformer_block": ("components", ["TransformerBlock"]),
    "utilities.activation_functions": ("_activation_functions", ["gelu_new", "solu", "xielu", "XIELU",
                                                                 "SUPPORTED_ACTIVATIONS", "apply_softcap"]),
    "utilities.attention": ("_attention_utils", ["simple_attn_linear", "complex_attn_linear"]),
    "utilities.components_utils": ("utils", ["get_act_name"]),
    "utilities.defaults_utils": ("utils", ["override_or_use_default_value"]),
    "utilities.devices": ("utils", ["get_device"]),
    "utilities.exploratory_utils": ("utils", ["test_prompt"]),
    "utilities.hf_utils": ("utils", ["download_file_from_hf", "keep_single_column", "get_dataset"]),
    "utilities.initialization_utils": ("utils", ["calc_fan_in_and_fan_out", "init_xavier_uniform_",
                                                 "init_xavier_normal_", "init_kaiming_uniform_",
                                                 "init_kaiming_normal_"]),
    "utilities.library_utils": ("utils", ["is_library_available"]),
    "utilities.lm_utils": ("utils", ["lm_cross_entropy_loss", "lm_accuracy"]),
    "utilities.matrix": ("utils", ["composition_scores"]),
    "utilities.slice": ("utils", ["Slice"]),
    "utilities.tensors": ("utils", ["to_numpy", "get_corner", "remove_batch_dim", "transpose", "is_square",
                                    "is_lower_triangular", "filter_dict_by_prefix"]),
    "utilities.tokenize_utils": ("utils", ["tokenize_and_concatenate", "get_input_with_manually_prepended_bos",
                                           "get_tokens_with_bos_removed", "get_attention_mask"]),
}


# TransformerLens 3.x utilities modules whose names glassbox.tl.utils does not hold: path -> glassbox.tl module.
SUBMODULES = {
    "utilities.cache": "_utilities.cache",
    "utilities.logits_utils": "_utilities.logits_utils",
    "utilities.parameter_swap": "_utilities.parameter_swap",
    "utilities.typed_module_list": "_utilities.typed_module_list",
}


def _submodules(package) -> list:
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        if any(part.startswith("_") for part in info.name[len(package.__name__) + 1:].split(".")):
            continue
        names.append(info.name)
    return names


def as_transformer_lens():
    """Register glassbox.tl as ``transformer_lens`` in ``sys.modules``; returns the glassbox.tl package."""
    import glassbox.tl as package

    present = sys.modules.get(ALIAS)
    if present is package:
        return package
    if present is not None:
        where = getattr(present, "__file__", None) or repr(present)
        raise RuntimeError(f"transformer_lens is already imported (from {where}), so glassbox.tl cannot take its "
                           "name: call glassbox.tl.as_transformer_lens() before anything imports transformer_lens, "
                           "or use the real package")
    real = [name for name in sys.modules if name.startswith(ALIAS + ".")]
    if real:
        raise RuntimeError(f"modules of a real transformer_lens are already imported ({', '.join(sorted(real)[:3])}"
                           "...): glassbox.tl cannot take its name")
    modules = {name: importlib.import_module(name) for name in _submodules(package)}
    for name, module in modules.items():
        sys.modules[ALIAS + name[len(package.__name__):]] = module
    # TransformerLens 3.x's own modules import its helpers as transformer_lens.utilities.
    sys.modules[ALIAS + ".utilities"] = package.utils
    for path, (target, _) in MODULE_PATHS.items():
        # a private module (``_attention_utils``) is registered only under the TransformerLens path
        sys.modules[f"{ALIAS}.{path}"] = importlib.import_module(f"{package.__name__}.{target}")
    for path, target in SUBMODULES.items():
        sys.modules[f"{ALIAS}.{path}"] = importlib.import_module(f"{package.__name__}.{target}")
    return package
