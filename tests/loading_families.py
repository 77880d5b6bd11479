"""Tiny seeded ``transformers`` models of every family glassbox converts, for the loading tests:
distinct sizes (d_model 12, 3 heads of 4, vocab 29, 2 layers, MLP 20) so a swapped axis fails."""

import torch
import transformers

COMMON = dict(vocab_size=29, hidden_size=12, intermediate_size=20, num_hidden_layers=2, num_attention_heads=3,
              max_position_embeddings=32, bos_token_id=None, eos_token_id=None, pad_token_id=None)
GPT_STYLE = dict(vocab_size=29, n_embd=12, n_layer=2, n_head=3, n_positions=32, bos_token_id=None,
                 eos_token_id=None)

# model_type -> (config class, model class, config fields)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON, num_key_value_heads=1)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, num_key_value_heads=1, sliding_window=None)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(COMMON, num_key_value_heads=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, num_key_value_heads=1, head_dim=4)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(COMMON, num_key_value_heads=1, head_dim=4)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(COMMON, num_key_value_heads=1, head_dim=4,
                                                        sliding_window=3, query_pre_attn_scalar=4)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(COMMON, num_key_value_heads=1, head_dim=4,
                                                                 sliding_window=3, query_pre_attn_scalar=4)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(GPT_STYLE, n_inner=20)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        {k: v for k, v in COMMON.items() if k != "pad_token_id"},
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(COMMON, num_key_value_heads=1)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(GPT_STYLE, n_inner=20, rotary_dim=2)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(
        {k: v for k, v in COMMON.items() if k != "intermediate_size"}, ffn_dim=20)),
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(
        vocab_size=29, hidden_size=12, intermediate_size=20, num_layers=2, num_heads=3, max_position_embeddings=32,
        attention_types=[[["global"], 2]], window_size=3, bos_token_id=None, eos_token_id=None)),
}


def hf_config(model_type: str, **changes):
    config_class, _, fields = FAMILIES[model_type]
    config = getattr(transformers, config_class)(**{**fields, **changes})
    config._attn_implementation = "eager"
    return config


def hf_model(model_type: str, seed: int = 0, **changes):
    """A seeded random model of ``model_type`` (eager attention, eval mode), vectors perturbed away from
    their init so that norms and biases matter."""
    config = hf_config(model_type, **changes)
    torch.manual_seed(seed)
    model = getattr(transformers, FAMILIES[model_type][1])(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    return model


def tokens(seed: int = 1, batch: int = 2, pos: int = 11):
    return torch.randint(0, 29, (batch, pos), generator=torch.Generator().manual_seed(seed))
