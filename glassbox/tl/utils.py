"""TransformerLens's ``utils`` (3.x), mapped onto glassbox's own functions.

Each name keeps TransformerLens's signature and defaults; the work happens in ``glassbox.interp``
(``axis_slice``, ``tensor_utils``, ``act_names``, ``token_masks``, ``lm_metrics``, ``prompts``,
``composition``), ``glassbox.models`` (``lm_loss``, ``gelu_new``) and ``glassbox.train``
(``datasets``, ``param_init``).

Deliberate differences: ``get_act_name`` refuses what names no hook (``("q", 0, "mlp")``,
``("scale", 2)`` without its norm, ``"resid_pre5"``) instead of building it; ``test_prompt`` prints
without rich's bold markup; ``tokenize_and_concatenate`` also takes a plain list of strings (packed as
the same list in a ``datasets.Dataset`` would be) and never adds a pad token to the tokenizer;
``lm_cross_entropy_loss`` computes in at least float32 and refuses a mask that leaves no target
(TransformerLens returns nan); ``download_file_from_hf`` reads the local Hugging Face cache only.
"""

import json
import os
from typing import Optional

import torch

from ..hooks.errors import ArgumentError
from ..interp.act_names import act_name, split_compact
from ..interp.axis_slice import Slice, SliceInput
from ..interp.lm_metrics import next_token_accuracy
from ..interp.prompts import format_prompt_report, prompt_report
from ..interp.tensor_utils import get_corner, is_lower_triangular, is_square, remove_batch_dim, to_numpy, transpose
from ..interp.token_masks import pad_attention_mask, remove_bos
from ..models.mlp import gelu_new
from ._activation_functions import ACTIVATION_FN_DICT, XIELU, solu, xielu
from ._attention_utils import complex_attn_linear, simple_attn_linear
from ..models.transformer import lm_loss
from ..train import param_init
from ..train.datasets import cached_hf_dataset, keep_column, pack_hf_dataset, pack_texts

from ._utilities.logits_utils import logits_to_df, sample_logits
from ._utilities.parameter_swap import temporarily_swap_parameter
from ._utilities.typed_module_list import TypedModuleList

USE_DEFAULT_VALUE = None

__all__ = [
    "ACTIVATION_FN_DICT", "XIELU", "complex_attn_linear", "simple_attn_linear", "solu", "xielu",
    "Slice", "SliceInput", "TypedModuleList", "USE_DEFAULT_VALUE", "calc_fan_in_and_fan_out",
    "clear_huggingface_cache", "composition_scores",
    "download_file_from_hf", "gelu_new", "get_act_name", "get_attention_mask", "get_corner", "get_dataset",
    "get_device", "get_input_with_manually_prepended_bos",
    "get_tokens_with_bos_removed", "init_kaiming_normal_", "init_kaiming_uniform_", "init_xavier_normal_",
    "init_xavier_uniform_", "is_library_available", "is_lower_triangular", "is_square", "keep_single_column", "lm_accuracy",
    "filter_dict_by_prefix", "lm_cross_entropy_loss", "logits_to_df", "override_or_use_default_value",
    "remove_batch_dim", "sample_logits", "temporarily_swap_parameter", "test_prompt", "to_numpy",
    "tokenize_and_concatenate", "transpose",
]


def filter_dict_by_prefix(dictionary: dict, prefix: str) -> dict:
    """The entries whose key starts with ``prefix`` + "." (one dot, whether or not ``prefix`` ends with
    it), keyed by the rest: ``{"blocks.0.W_Q": w}``, "blocks.0" -> ``{"W_Q": w}``."""
    start = prefix if prefix.endswith(".") else prefix + "."
    return {key[len(start):]: value for key, value in dictionary.items() if key.startswith(start)}


def get_act_name(name, layer=None, layer_type=None) -> str:
    """A hook name from TransformerLens's shorthand: ``("k", 6, "a")``, ``"k6"``, ``"scale4ln1"``, a full name."""
    if not isinstance(name, str):
        raise KeyError(f"activation name must be a string, got {name!r}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = split_compact(name)
    if compact is not None:  # "k6" -> ("k", 6), "scale4ln1" -> ("scale", 4, "ln1"); they replace the arguments
        name, layer, layer_type = compact
    if isinstance(layer, str) and layer.isdigit():
        layer = int(layer)
    return act_name(name, layer, layer_type or None)


def get_attention_mask(tokenizer, tokens: torch.Tensor, prepend_bos: bool, padding_side: Optional[str] = None):
    return pad_attention_mask(tokenizer, tokens, prepend_bos, padding_side)


def get_tokens_with_bos_removed(tokenizer, tokens: torch.Tensor, padding_side: Optional[str] = None):
    return remove_bos(tokenizer, tokens, padding_side)


def override_or_use_default_value(default_flag, override=None):
    return override if override is not None else default_flag


def test_prompt(prompt: str, answer, model, prepend_space_to_answer: bool = True, print_details: bool = True,
                prepend_bos: Optional[bool] = USE_DEFAULT_VALUE, top_k: int = 10) -> None:
    """Print how the model ranks the answer (``glassbox.interp.prompts.prompt_report`` has the numbers)."""
    report = prompt_report(model, prompt, answer, prepend_space_to_answer, prepend_bos, top_k)
    print(format_prompt_report(report, print_details))


test_prompt.__test__ = False  # pytest would collect it by its name


def lm_cross_entropy_loss(logits: torch.Tensor, tokens: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                          per_token: bool = False) -> torch.Tensor:
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(tokens.shape):  # TransformerLens asserts here, in these words
            raise ArgumentError(f"attention_mask must have the same shape as tokens, got "
                                f"{tuple(attention_mask.shape)} and {tuple(tokens.shape)}")
        attention_mask = attention_mask.bool()
    return lm_loss(logits, tokens, attention_mask, per_token)


def lm_accuracy(logits: torch.Tensor, tokens: torch.Tensor, per_token: bool = False) -> torch.Tensor:
    return next_token_accuracy(logits, tokens, per_token)


def tokenize_and_concatenate(dataset, tokenizer, streaming: bool = False, max_length: int = 1024,
                             column_name: str = "text", add_bos_token: bool = True, num_proc: Optional[int] = 10,
                             set_format: bool = True):
    """Rows ``{"tokens": [max_length]}``: a ``datasets`` Dataset in, one out; a list of strings in, a
    ``TokenRows`` out (``rows["tokens"]`` is [rows max_length]). See ``glassbox.train.datasets``."""
    if isinstance(dataset, (list, tuple)):
        return pack_texts(dataset, tokenizer, max_length, add_bos_token, None if streaming else num_proc)
    return pack_hf_dataset(dataset, tokenizer, max_length, column_name, add_bos_token, num_proc, streaming,
                           set_format)


def keep_single_column(dataset, col_name: str):
    return keep_column(dataset, col_name)


# TransformerLens's short names for small (10k-document) hub datasets.
DATASET_ALIASES = {
    "openwebtext": "stas/openwebtext-10k", "owt": "stas/openwebtext-10k", "pile": "NeelNanda/pile-10k",
    "c4": "NeelNanda/c4-10k", "code": "NeelNanda/code-10k", "python": "NeelNanda/code-10k",
    "c4_code": "NeelNanda/c4-code-20k", "c4-code": "NeelNanda/c4-code-20k", "wiki": "NeelNanda/wiki-10k",
}


def get_dataset(dataset_name: str, **kwargs):
    """The train split of one of ``DATASET_ALIASES``, from the local Hugging Face datasets cache only."""
    if dataset_name not in DATASET_ALIASES:
        raise ValueError(f"Dataset {dataset_name} not supported; the names: {', '.join(DATASET_ALIASES)}")
    return cached_hf_dataset(DATASET_ALIASES[dataset_name], split="train", **kwargs)


def get_input_with_manually_prepended_bos(bos_token: Optional[str], input):
    """``bos_token`` in front of a string or of each string of a list (unchanged without a BOS)."""
    if bos_token is None:
        return input
    return bos_token + input if isinstance(input, str) else [bos_token + text for text in input]


def is_library_available(name: str) -> bool:
    """Whether the module ``name`` can be imported (found on the path; nothing is imported)."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


def get_device() -> str:
    """"cuda" when available; "mps" only with TRANSFORMERLENS_ALLOW_MPS=1 (as TransformerLens); else "cpu"."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available() and os.environ.get("TRANSFORMERLENS_ALLOW_MPS", "") == "1":
        return "mps"
    return "cpu"


def calc_fan_in_and_fan_out(tensor: torch.Tensor) -> tuple:
    return param_init.fans(tensor)


def init_xavier_uniform_(param: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    return param_init.xavier_uniform_(param, gain)


def init_xavier_normal_(param: torch.Tensor, gain: float = 1.0) -> torch.Tensor:
    return param_init.xavier_normal_(param, gain)


def init_kaiming_uniform_(param: torch.Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0,
                          mode: str = "fan_in") -> torch.Tensor:
    return param_init.kaiming_uniform_(param, a, nonlinearity, gain, mode)


def init_kaiming_normal_(param: torch.Tensor, a: float = 0, nonlinearity: str = "relu", gain: float = 1.0,
                         mode: str = "fan_in") -> torch.Tensor:
    return param_init.kaiming_normal_(param, a, nonlinearity, gain, mode)


def composition_scores(left, right, broadcast_dims: bool = True) -> torch.Tensor:
    from ..interp.composition import composition_scores as scores

    return scores(left, right, broadcast_dims)


def clear_huggingface_cache() -> None:
    """Refused: TransformerLens's deletes the whole Hugging Face cache folder (its CI's disk clean-up);
    glassbox deletes no files it did not write. Remove the folder yourself (``hf cache delete``)."""
    raise NotImplementedError("clear_huggingface_cache is not provided: glassbox never deletes the Hugging Face "
                              "cache (files it did not write); use `hf cache delete` or remove the folder yourself")


def download_file_from_hf(repo_name: str, file_name: str, subfolder: str = ".", cache_dir=None,
                          force_is_torch: bool = False, **kwargs):
    """A file from the local Hugging Face hub cache (never downloaded): a .pth (or ``force_is_torch``)
    file loaded with ``torch.load(weights_only=True)`` (tensors and plain containers; a file that needs
    arbitrary unpickling is refused, naming it, where TransformerLens unpickles it), a .json file parsed,
    anything else its path."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id=repo_name, filename=file_name, subfolder=subfolder, cache_dir=cache_dir,
                               local_files_only=True)
    except Exception as error:
        raise FileNotFoundError(f"{subfolder}/{file_name} of {repo_name!r} is not in the local Hugging Face cache "
                                f"and glassbox does not download; fetch it with huggingface_hub.hf_hub_download "
                                f"where there is network ({type(error).__name__})") from None
    if path.endswith(".pth") or force_is_torch:
        import pickle

        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise ValueError(f"{path}: holds objects other than tensors and plain containers, which glassbox "
                             f"does not unpickle (torch.load(weights_only=True): {str(error).splitlines()[0]})") from None
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    return path
