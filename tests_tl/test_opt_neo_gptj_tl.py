"""OPT, GPT-Neo (TinyStories) and GPT-J by TransformerLens's names, against TransformerLens 3.9 reading
the same offline hub cache: the name resolves to the same repo, and the processed model (fold_ln,
centred weights, as both load it by default) gives the same logits, hook values and weights.

The cache holds seeded random ``transformers`` models under the real repo ids, with distinct small
sizes and GPT-2's tokenizer; 12 tokens exceed GPT-Neo's window of 5, so its local layers matter.
Known difference: TransformerLens cuts a TinyStories model's context to 512 positions (its config
claims 2048); glassbox keeps the checkpoint's 2048, whose first 512 rows are TransformerLens's W_pos.
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch

import transformer_lens

import glassbox.tl as gtl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_cache import cache_hf_model  # noqa: E402

TOKENIZER = Path(gtl.__file__).resolve().parents[1] / "assets" / "gpt2-tokenizer"


def opt():
    from transformers import OPTConfig, OPTForCausalLM

    return OPTForCausalLM(OPTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, ffn_dim=37,
                                    vocab_size=50272, max_position_embeddings=40))


def neo(positions):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    return GPTNeoForCausalLM(GPTNeoConfig(hidden_size=24, num_layers=3, num_heads=3, vocab_size=50257,
                                          max_position_embeddings=positions, window_size=5,
                                          attention_types=[[["global", "local"], 1], [["local"], 1]]))


def gptj():
    from transformers import GPTJConfig, GPTJForCausalLM

    return GPTJForCausalLM(GPTJConfig(n_embd=24, n_layer=2, n_head=3, rotary_dim=6, vocab_size=50400, n_positions=40))


# TransformerLens's name -> (repo id, stand-in factory)
MODELS = {
    "opt-125m": ("facebook/opt-125m", opt),
    "gpt-neo-125M": ("EleutherAI/gpt-neo-125M", lambda: neo(40)),
    "tiny-stories-1M": ("roneneldan/TinyStories-1M", lambda: neo(2048)),
    "gpt-j": ("EleutherAI/gpt-j-6B", gptj),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import huggingface_hub.constants as hub

    folder = tmp_path_factory.mktemp("hub")
    for seed, (repo, make) in enumerate(MODELS.values()):
        torch.manual_seed(seed)
        model = make().eval()
        with torch.no_grad():  # every weight random at 0.2 (norms and biases away from 1 and 0 too)
            for param in model.parameters():
                param.add_(0.2 * torch.randn_like(param))
        snapshot = cache_hf_model(folder, repo, model)
        for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / name, snapshot / name)
    patch = pytest.MonkeyPatch()
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_CACHE", str(folder))):
        patch.setenv(var, value)
    patch.setattr(hub, "HF_HUB_CACHE", str(folder))
    patch.setattr(hub, "HF_HUB_OFFLINE", True)
    yield folder
    patch.undo()


HOOKS = ("hook_embed", "blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z",
         "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post", "ln_final.hook_normalized")


@pytest.mark.parametrize("name", MODELS)
def test_names_load_what_transformer_lens_loads(name, cache):
    repo = MODELS[name][0]
    ref = transformer_lens.HookedTransformer.from_pretrained(name, device="cpu")
    ours = gtl.HookedTransformer.from_pretrained(name, device="cpu")
    assert ours.cfg.original_architecture == ref.cfg.original_architecture
    assert gtl.loading_from_pretrained.get_official_model_name(name) == repo
    assert transformer_lens.loading_from_pretrained.get_official_model_name(name) == repo
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "act_fn", "normalization_type",
                  "positional_embedding_type", "attn_types", "window_size", "use_attn_scale"):
        assert getattr(ours.cfg, field) == getattr(ref.cfg, field), field
    tokens = torch.tensor([[50256, 464, 3290, 318, 257, 1332, 13, 198, 50, 7, 1110, 30],
                           [50256, 40, 588, 262, 3290, 11, 290, 262, 3797, 373, 1263, 13]])
    with torch.no_grad():
        ref_logits, ref_cache = ref.run_with_cache(tokens)
        logits, cache_ = ours.run_with_cache(tokens)
    assert ref_logits.abs().max() > 0.5, "logits too small for the comparison to mean anything"
    # measured <= 5.3e-6 over the four (logits up to ~5.3); bound 5e-5
    torch.testing.assert_close(logits, ref_logits, atol=5e-5, rtol=0)
    for hook in HOOKS:
        # measured <= 4.8e-6 over the seven hooks and four models; bound 5e-5
        torch.testing.assert_close(cache_[hook], ref_cache[hook], atol=5e-5, rtol=0,
                                   msg=lambda m, hook=hook: f"{name}: {hook} differs from TransformerLens's: {m}")
    theirs = ref.state_dict()
    for key, value in ours.state_dict().items():
        if key not in theirs:
            continue
        expected = theirs[key]
        if key == "pos_embed.W_pos" and name.startswith("tiny-stories"):  # TransformerLens cuts it to 512 rows
            assert (value.shape[0], expected.shape[0], ours.cfg.n_ctx, ref.cfg.n_ctx) == (2048, 512, 2048, 512)
            value = value[:512]
        # measured <= 1.2e-7; bound 1e-5
        torch.testing.assert_close(value.to(expected.dtype), expected, atol=1e-5, rtol=0, msg=key)
