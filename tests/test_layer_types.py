"""``layer_types`` in config.json: one reading for every family, checked against the transformers model
loaded from the same folder (transformers 5.24, eager attention).

- Qwen2/3 and Gemma 2/3 read it layer by layer ("sliding_attention" layers get the window), and so
  does a Mistral folder with layer_types: transformers' AutoConfig loads it as Ministral.
- Every other family's model class never reads it (nor does an in-memory MistralForCausalLM, which
  windows every layer when sliding_window is set: its forward and its cached generation agree, so
  ``from_hf`` follows it). Where an entry would make transformers' generation cache slide a layer its
  forward does not, transformers computes two models (or fails), so glassbox refuses naming the field.
- Entries transformers does not know, or glassbox does not compute ("chunked_attention"), and a list
  of the wrong length are refused naming layer_types.
"""

import json

import pytest
import torch
import transformers

from glassbox import HookedTransformer

from loading_families import FAMILIES, hf_model, tokens

READS = ("qwen2", "qwen3", "gemma2", "gemma3_text", "mistral")
IGNORES = tuple(sorted(set(FAMILIES) - set(READS)))
FULL, SLIDE = "full_attention", "sliding_attention"
WINDOW = {"qwen2": dict(use_sliding_window=True, sliding_window=3), "qwen3": dict(use_sliding_window=True, sliding_window=3),
          "gemma2": dict(sliding_window=3), "gemma3_text": dict(sliding_window=3), "mistral": dict(sliding_window=3)}


def folder_with(model_type, tmp_path, layer_types, **fields):
    model = hf_model(model_type, **{**WINDOW.get(model_type, {}), **fields})
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = layer_types
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def compare(folder, pos=13, generate=False):
    ids = tokens(pos=pos)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ours = HookedTransformer.from_pretrained(str(folder))
    with torch.no_grad():
        expected, got = hf(ids).logits, ours(ids)
    # measured <= 1.3e-5 over these cases (gemma3_text with mixed layers; logits up to 4.3), 4x headroom
    torch.testing.assert_close(got, expected, atol=5e-5, rtol=0)
    if generate:  # greedy generation with transformers' cache (sliding layers keep their window), token for token
        with torch.no_grad():
            hf_gen = hf.generate(ids[:, :4], max_new_tokens=8, do_sample=False, min_new_tokens=8)
        assert torch.equal(ours.generate(ids[:, :4], max_new_tokens=8, do_sample=False, verbose=False), hf_gen)
    return ours


@pytest.mark.parametrize("model_type", READS)
@pytest.mark.parametrize("layer_types", [[FULL, SLIDE], [SLIDE, FULL]])  # uniform lists: the parity tests
def test_families_that_read_layer_types_follow_it_layer_by_layer(model_type, layer_types, tmp_path):
    ours = compare(folder_with(model_type, tmp_path, layer_types), generate=layer_types[0] == SLIDE)
    expected = tuple("local" if t == SLIDE else "global" for t in layer_types)
    assert (ours.cfg.attn_types or ("global",) * 2) == expected


def test_an_in_memory_mistral_model_ignores_layer_types_as_it_does(tmp_path):
    """MistralForCausalLM itself (not through AutoConfig) windows every layer, whatever layer_types says;
    from_hf follows it where its generation agrees, and refuses a mix."""
    ids = tokens(pos=13)
    hf = transformers.MistralForCausalLM.from_pretrained(folder_with("mistral", tmp_path, [FULL, FULL]),
                                                         attn_implementation="eager").eval()
    ours = HookedTransformer.from_hf(hf)
    assert ours.cfg.attn_types == ("local", "local") and ours.cfg.window_size == 3
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=2e-5, rtol=0)  # measured 1.4e-6
    hf.config.layer_types = [FULL, SLIDE]
    with pytest.raises(ValueError, match=r"Mistral layer_types=\['full_attention', 'sliding_attention'\]: "
                                         r"transformers' Mistral model does not read layer_types"):
        HookedTransformer.from_hf(hf)


@pytest.mark.parametrize("model_type", IGNORES)
def test_all_full_layer_types_change_nothing_where_the_model_ignores_them(model_type, tmp_path):
    ours = compare(folder_with(model_type, tmp_path, [FULL, FULL]))
    assert ours.cfg.attn_types is None


@pytest.mark.parametrize("model_type", IGNORES)
@pytest.mark.parametrize("layer_types", [[FULL, SLIDE], [SLIDE, SLIDE]])
def test_sliding_entries_a_model_ignores_are_refused_by_name(model_type, layer_types, tmp_path):
    folder = folder_with(model_type, tmp_path, layer_types)
    with pytest.raises(ValueError, match=r"config\.json: .*layer_types=\['[a-z_]+', '[a-z_]+'\].* does not read "
                                         r"layer_types"):
        HookedTransformer.from_pretrained(str(folder))


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "gemma2"])
def test_sliding_entries_without_a_window_are_refused(model_type, tmp_path):
    no_window = dict(use_sliding_window=False) if model_type == "qwen2" else dict(sliding_window=None)
    folder = folder_with(model_type, tmp_path, [SLIDE, SLIDE], **no_window)
    with pytest.raises(ValueError, match="layer_types.*sliding_window is None"):
        HookedTransformer.from_pretrained(str(folder))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_unknown_entries_and_wrong_lengths_are_refused_naming_layer_types(model_type, tmp_path):
    folder = folder_with(model_type, tmp_path, [FULL, FULL])
    config = json.loads((folder / "config.json").read_text())
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder)
    hf.config.layer_types = ["chunked_attention", FULL]  # an in-memory config changed after transformers checked it
    for layer_types in (["chunked_attention", FULL], [FULL], [FULL, FULL, FULL], "full_attention", [FULL, 3]):
        (folder / "config.json").write_text(json.dumps({**config, "layer_types": layer_types}))
        with pytest.raises(ValueError, match=r"layer_types"):
            HookedTransformer.from_pretrained(str(folder))
    with pytest.raises(ValueError, match=r"layer_types=\['chunked_attention', 'full_attention'\] has "
                                         r"\['chunked_attention'\]: glassbox computes full_attention, sliding_attention"):
        HookedTransformer.from_hf(hf)


def test_legacy_attention_entries_read_as_full_attention(tmp_path):
    """transformers remaps the old name "attention" to "full_attention"."""
    ours = compare(folder_with("qwen2", tmp_path, ["attention", SLIDE]))
    assert ours.cfg.attn_types == ("global", "local")


def test_a_mixed_local_global_mistral_layout_exports_as_ministral(tmp_path):
    """The inverse: a glassbox model with a local and a global layer, Mistral's layout otherwise, exports
    as transformers' Ministral (per-layer layer_types), which computes the same logits."""
    from glassbox.weights import to_hf

    folder = folder_with("mistral", tmp_path, [SLIDE, FULL])
    ours = HookedTransformer.from_pretrained(str(folder))
    hf = to_hf(ours)
    assert type(hf).__name__ == "MinistralForCausalLM" and hf.config.layer_types == [SLIDE, FULL]
    hf.config._attn_implementation = "eager"
    ids = tokens(pos=13)
    with torch.no_grad():
        # measured 3.1e-6 (logits up to 2.7)
        torch.testing.assert_close(hf.eval()(ids).logits, ours(ids), atol=2e-5, rtol=0)
