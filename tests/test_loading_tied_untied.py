"""A config that says ``tie_word_embeddings: true`` over weights that say otherwise: glassbox computes
what ``transformers`` 5 computes from the same folder (its ``tie_weights`` in ``from_pretrained``):

- an ``lm_head.weight`` that differs from the embedding is kept (transformers logs that it will not
  tie them): the logits use it, not W_E;
- an ``lm_head.weight`` equal to the embedding (``torch.equal``, as a .bin checkpoint stores both) is
  tied;
- an ``lm_head.weight`` with no embedding tensor: transformers ties the embedding to it.

Each family is checked against the transformers model loaded from the same folder, and through
``from_hf`` of that model.
"""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from glassbox import HookedTransformer

from loading_families import FAMILIES, hf_model, tokens

# The name of each family's embedding in its checkpoint (lm_head.weight in all of them).
EMBEDDING = {"gpt2": "transformer.wte.weight", "gptj": "transformer.wte.weight",
             "gpt_neox": "gpt_neox.embed_in.weight", "gpt_neo": "transformer.wte.weight",
             "opt": "model.decoder.embed_tokens.weight"}
HEAD = {"gpt_neox": "embed_out.weight"}  # transformers 5 saves GPT-NeoX's lm_head under its old name


def untied_folder(model_type, tmp_path, head=None, drop_embedding=False):
    """An untied model saved, then its config.json edited to claim tied embeddings."""
    model = hf_model(model_type, tie_word_embeddings=False)
    folder = tmp_path / model_type
    model.save_pretrained(folder)
    path = folder / "model.safetensors"
    state = load_file(path)
    embedding = EMBEDDING.get(model_type, "model.embed_tokens.weight")
    if head is not None:
        state[HEAD.get(model_type, "lm_head.weight")] = head(state[embedding]).contiguous()
    if drop_embedding:
        del state[embedding]
    save_file(state, path)
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def their_logits(folder):
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf, hf(tokens()).logits


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_differing_lm_head_is_kept_as_transformers_keeps_it(model_type, tmp_path):
    folder = untied_folder(model_type, tmp_path)
    hf, expected = their_logits(folder)
    assert not torch.equal(hf.lm_head.weight, hf.get_input_embeddings().weight), "transformers kept both"
    ours = HookedTransformer.from_pretrained(str(folder))
    assert not ours.cfg.tied_unembed
    with torch.no_grad():
        got = ours(tokens())
    # measured <= 3.4e-6 over the families (qwen3; logits up to 4.3); the old rule (unembedding with W_E)
    # failed this in every family
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    with torch.no_grad():
        from_hf = HookedTransformer.from_hf(hf)(tokens())
    torch.testing.assert_close(from_hf, expected, atol=2e-5, rtol=0)  # measured as from the folder


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_an_lm_head_equal_to_the_embedding_is_tied(model_type, tmp_path):
    folder = untied_folder(model_type, tmp_path, head=lambda embedding: embedding.clone())
    _, expected = their_logits(folder)
    ours = HookedTransformer.from_pretrained(str(folder))
    assert ours.cfg.tied_unembed
    with torch.no_grad():
        got = ours(tokens())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)  # measured <= 5.8e-6 (qwen3)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_an_lm_head_without_an_embedding_becomes_the_embedding(model_type, tmp_path):
    folder = untied_folder(model_type, tmp_path, drop_embedding=True)
    hf, expected = their_logits(folder)
    assert torch.equal(hf.lm_head.weight, hf.get_input_embeddings().weight)
    ours = HookedTransformer.from_pretrained(str(folder))
    assert ours.cfg.tied_unembed
    with torch.no_grad():
        got = ours(tokens())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)  # measured <= 2.0e-6 (qwen2)


def test_a_gemma3_image_text_checkpoint_keeps_its_differing_lm_head(tmp_path):
    """Gemma3ForConditionalGeneration ties by the top-level flag; over a differing lm_head it keeps both."""
    text = dict(vocab_size=300, hidden_size=32, intermediate_size=19, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4)
    vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=299, boi_token_index=297, eoi_token_index=298,
                                       tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Gemma3ForConditionalGeneration(config).eval().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "tie_word_embeddings": True}))
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert not torch.equal(hf.lm_head.weight, hf.get_input_embeddings().weight), "transformers kept both"
    ids = torch.randint(0, 290, (2, 12), generator=torch.Generator().manual_seed(1))
    ours = HookedTransformer.from_pretrained(str(tmp_path))
    assert not ours.cfg.tied_unembed
    with torch.no_grad():
        # measured 1.3e-7 (logits up to 0.41)
        torch.testing.assert_close(ours(ids), hf(input_ids=ids).logits, atol=2e-5, rtol=0)
