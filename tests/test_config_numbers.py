"""Every numeric field of every family's config.json, given a string, a negative, NaN, inf or a bool:
a ValueError naming the file, the field and the value, before any weight is read (never a KeyError
from the error-message table, never a model computing with float("2") or an infinite rope base)."""

import json
import math

import pytest

from glassbox.weights.architectures import ARCHITECTURES
from glassbox.weights.pretrained import from_pretrained

from loading_families import FAMILIES, hf_model

BAD = {"a string": "2", "a negative": -1, "NaN": math.nan, "inf": math.inf, "a bool": True}
NUMERIC_KINDS = ("size", "count", "number", "number>=0")
ROPE_FAMILIES = sorted(set(FAMILIES) - {"gpt2", "gptj", "opt", "gpt_neo"})  # (GPT-J's rotary has no rope_parameters)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    for model_type in FAMILIES:
        hf_model(model_type).save_pretrained(root / model_type)
    return root


def edited(saved, tmp_path, model_type, **changes):
    """A folder whose config.json is the saved one with ``changes``, its weights a link to the saved ones."""
    folder = tmp_path / model_type
    if not folder.exists():
        folder.mkdir()
        (folder / "model.safetensors").symlink_to(saved / model_type / "model.safetensors")
    config = json.loads((saved / model_type / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_numeric_field_refuses_each_bad_value_by_name(model_type, saved, tmp_path):
    fields = [f for f, kind in ARCHITECTURES[model_type].config_fields.items() if kind.rstrip("?") in NUMERIC_KINDS]
    assert len(fields) >= 8, fields  # every family reads at least its sizes, eps and init range
    for field in fields:
        for what, value in BAD.items():
            folder = edited(saved, tmp_path, model_type, **{field: value})
            with pytest.raises(ValueError) as err:
                from_pretrained(str(folder))
            message = str(err.value)
            assert str(folder / "config.json") in message and f"field {field!r}" in message, (field, what, message)
            assert repr(value) in message, (field, what, message)


def test_gemma2_soft_caps_name_the_field_not_the_table(saved, tmp_path):
    for field in ("final_logit_softcapping", "attn_logit_softcapping"):
        for value in ("30", -5.0, 0):
            with pytest.raises(ValueError, match=f"field '{field}' must be a finite number > 0 or null, got "
                                                 f"{value!r}"):
                from_pretrained(str(edited(saved, tmp_path, "gemma2", **{field: value})))
    model = from_pretrained(str(edited(saved, tmp_path, "gemma2", final_logit_softcapping=None)))
    assert model.cfg.output_logits_soft_cap is None  # null is the documented "no cap"


@pytest.mark.parametrize("model_type", ROPE_FAMILIES)
@pytest.mark.parametrize("key", ["rope_theta", "partial_rotary_factor"])
def test_rope_numbers_name_their_field(model_type, key, saved, tmp_path):
    config = json.loads((saved / model_type / "config.json").read_text())
    rope = config["rope_parameters"]
    nested = "full_attention" in rope  # Gemma 3: one dict per layer type
    for what, value in {**BAD, "above 1": 1.5}.items():
        if what == "above 1" and key == "rope_theta":
            continue
        params = {**rope, "full_attention": {**rope["full_attention"], key: value}} if nested else {**rope, key: value}
        folder = edited(saved, tmp_path, model_type, rope_parameters=params)
        where = f"rope_parameters.full_attention.{key}" if nested else f"rope_parameters.{key}"
        with pytest.raises(ValueError) as err:
            from_pretrained(str(folder))
        assert f"field {where} must be" in str(err.value) and repr(value) in str(err.value), (what, str(err.value))


def test_a_gemma3_image_text_configs_text_fields_are_checked_too(tmp_path):
    import transformers

    text = dict(vocab_size=300, hidden_size=32, intermediate_size=19, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4)
    vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=299, boi_token_index=297, eoi_token_index=298)
    transformers.Gemma3ForConditionalGeneration(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for field in ("rms_norm_eps", "query_pre_attn_scalar", "sliding_window", "num_key_value_heads"):
        for what, value in BAD.items():
            (tmp_path / "config.json").write_text(json.dumps({**saved, "text_config": {**saved["text_config"],
                                                                                        field: value}}))
            with pytest.raises(ValueError) as err:
                from_pretrained(str(tmp_path))
            assert f"field 'text_config.{field}'" in str(err.value) and repr(value) in str(err.value), str(err.value)
