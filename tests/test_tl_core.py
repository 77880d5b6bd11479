"""glassbox.tl's HookedTransformerConfig and HookedTransformer: mapping, refusals, settable fields,
loading with TransformerLens's processing defaults, the forward's argument order, run_with_cache.

Oracles: hand-written expected glassbox Configs and TransformerLens field values (read off
TransformerLens 3.9's documented defaults; tests_tl/test_core.py checks them against TransformerLens
itself), glassbox's own model on the same weights, and identities (log-probs kept by processing).
"""

import copy

import pytest
import torch

import glassbox
import glassbox.tl as tl
from glassbox import Config
from glassbox.tl.config.fields import REFUSED, TL_DEFAULTS
from glassbox.tl.loading_from_pretrained import OFFICIAL_MODEL_NAMES, get_official_model_name
from glassbox.tl.past_key_value_caching import HookedTransformerKeyValueCache

BASE = dict(d_model=24, d_head=8, n_layers=2, n_ctx=16, d_vocab=53)


def tiny(**kwargs) -> tl.HookedTransformer:
    torch.manual_seed(0)
    return tl.HookedTransformer(tl.HookedTransformerConfig(**{**BASE, "act_fn": "gelu_new", **kwargs}))


def toks(batch=2, pos=7, seed=0):
    return torch.randint(0, BASE["d_vocab"], (batch, pos), generator=torch.Generator().manual_seed(seed))


# -- the config --------------------------------------------------------------------------------
def test_tl_kwargs_build_the_glassbox_config():
    cfg = tl.HookedTransformerConfig(**BASE, positional_embedding_type="rotary", normalization_type="RMS",
                                     act_fn="silu", gated_mlp=True, eps=1e-6, rotary_adjacent_pairs=True,
                                     rotary_base=500, model_name="toy", default_prepend_bos=False)
    expected = Config(d_model=24, n_layers=2, n_heads=3, d_vocab=53, n_ctx=16, d_head=8, d_mlp=96, act_fn="silu",
                      gated_mlp=True, layer_norm_eps=1e-6, init_range=0.8 / 24 ** 0.5, normalization="RMS",
                      positional="rotary", rotary_dim=8, rotary_base=500.0, rotary_style="interleaved",
                      use_bias=True, tied_unembed=False, unembed_bias=True, default_prepend_bos=False,
                      model_name="toy", gated_mlp_bias="product")  # TransformerLens's GatedMLP: b_in after the gate
    assert cfg.glassbox == expected
    # TransformerLens's derived fields: n_heads = d_model // d_head, d_mlp = 4 d_model, n_params counts
    # W_Q, W_K, W_V, W_O and the MLP's three matrices, attn_scale = sqrt(d_head).
    assert (cfg.n_heads, cfg.d_mlp, cfg.d_vocab_out, cfg.rotary_dim) == (3, 96, 53, 8)
    assert cfg.n_params == 2 * (4 * 24 * 8 * 3 + 3 * 24 * 96)
    assert cfg.attn_scale == pytest.approx(8 ** 0.5, abs=0)
    # glassbox's names read through to the glassbox Config.
    assert (cfg.normalization, cfg.positional, cfg.layer_norm_eps, cfg.rotary_style) == ("RMS", "rotary", 1e-6,
                                                                                         "interleaved")


def test_tl_defaults_and_round_trip():
    cfg = tl.HookedTransformerConfig(**BASE)
    assert (cfg.act_fn, cfg.positional_embedding_type, cfg.normalization_type, cfg.eps) == ("relu", "standard", "LN", 1e-5)
    assert cfg.glassbox.positional == "learned" and cfg.glassbox.act_fn == "relu"
    assert set(cfg.to_dict()) == set(TL_DEFAULTS)
    assert tl.HookedTransformerConfig(**cfg.to_dict()) == cfg
    assert tl.HookedTransformerConfig.unwrap(cfg.to_dict()) == cfg and tl.HookedTransformerConfig.unwrap(cfg) is cfg


def test_glassbox_config_viewed_the_tl_way():
    gcfg = Config(d_model=20, n_layers=3, n_heads=4, d_vocab=31, n_ctx=9, positional="rotary", rotary_dim=2,
                  normalization="RMS", act_fn="silu", gated_mlp=True)
    cfg = tl.HookedTransformerConfig.from_glassbox(gcfg, normalization_type="RMSPre")
    assert cfg.glassbox is gcfg
    assert (cfg.d_head, cfg.n_heads, cfg.d_mlp, cfg.positional_embedding_type, cfg.rotary_dim,
            cfg.normalization_type, cfg.act_fn, cfg.uses_rms_norm) == (5, 4, 80, "rotary", 2, "RMSPre", "silu", True)
    assert cfg.n_params == 3 * (4 * 20 * 5 * 4 + 3 * 20 * 80)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_every_option_glassbox_cannot_compute_is_refused_by_name(field):
    default = TL_DEFAULTS[field]
    value = {bool: not default, type(None): 2, float: 3.5, int: 7}.get(type(default), "other")
    if field == "attention_dir":
        value = "bidirectional"
    with pytest.raises(ValueError, match=f"HookedTransformerConfig.{field}="):
        tl.HookedTransformerConfig(**BASE, **{field: value})


@pytest.mark.parametrize("field, value", [("positional_embedding_type", "shortformer"),
                                          ("positional_embedding_type", "alibi"), ("normalization_type", None),
                                          ("act_fn", "solu_lnn"), ("init_mode", "xavier_uniform"),
                                          ("d_vocab_out", 60)])
def test_refusals_of_values(field, value):
    with pytest.raises(ValueError, match=f"HookedTransformerConfig.{field}={value!r} is not supported"):
        tl.HookedTransformerConfig(**BASE, **{field: value})


def test_signature_errors_are_type_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_layer'"):
        tl.HookedTransformerConfig(**BASE, n_layer=2)
    with pytest.raises(TypeError, match="missing required argument.*d_head"):
        tl.HookedTransformerConfig(d_model=24, n_layers=2, n_ctx=16)


def test_values_glassbox_computes_the_same_way_are_accepted():
    cfg = tl.HookedTransformerConfig(**BASE, n_key_value_heads=3, attn_scale=8 ** 0.5, final_rms=True,
                                     normalization_type="RMS", attn_only=True, act_fn="solu_ln")
    assert cfg.glassbox.attn_only and cfg.n_params == 2 * 4 * 24 * 8 * 3
    solu = tl.HookedTransformerConfig(**BASE, act_fn="solu_ln").glassbox  # SoLU, then a LayerNorm over d_mlp
    assert (solu.act_fn, solu.mlp_ln) == ("solu", True) and tl.HookedTransformerConfig.from_glassbox(solu).act_fn == "solu_ln"


def test_a_free_config_is_settable_and_revalidated():
    cfg = tl.HookedTransformerConfig(**BASE)
    cfg.n_layers = 3
    assert cfg.glassbox.n_layers == 3 and cfg.n_params == 3 * (4 * 24 * 8 * 3 + 2 * 24 * 96)
    cfg.d_model = 32  # d_mlp and n_heads were derived, so they follow
    assert (cfg.n_heads, cfg.d_mlp, cfg.glassbox.d_mlp) == (4, 128, 128)
    before = cfg.to_dict()
    with pytest.raises(ValueError, match="positional_embedding_type='shortformer'"):
        cfg.positional_embedding_type = "shortformer"
    assert cfg.to_dict() == before, "a refused value changes nothing"
    with pytest.raises(AttributeError, match="no field 'n_layer'"):
        cfg.n_layer = 2


# -- the model ---------------------------------------------------------------------------------
def test_the_model_is_a_glassbox_model_with_a_tl_config():
    torch.manual_seed(0)
    model = tl.HookedTransformer({**BASE, "act_fn": "gelu_new"})
    with torch.no_grad():  # norms away from w = 1, b = 0, so folding them changes the weights
        for name, param in model.named_parameters():
            if ".ln" in name or name.startswith("ln_final"):
                param.add_(0.3 * torch.randn_like(param))
    assert isinstance(model, glassbox.HookedTransformer) and isinstance(model.cfg, tl.HookedTransformerConfig)
    assert model.cfg.device == "cpu" and model.cfg.dtype == torch.float32
    # glassbox code reads glassbox fields through the TransformerLens config.
    from glassbox.weights.processing import process

    folded = process(model, fold_ln=True)
    assert type(folded) is glassbox.HookedTransformer and isinstance(folded.cfg, Config)
    t = toks()
    with torch.no_grad():
        # measured 1.4e-6 (log-probs down to -7.7), bound 1.5e-5: 10x
        torch.testing.assert_close(folded(t).log_softmax(-1), model(t).log_softmax(-1), atol=1.5e-5, rtol=0)
    with pytest.raises(ValueError, match="use HookedTransformer.from_pretrained"):
        tl.HookedTransformer("gpt2")


def test_d_vocab_comes_from_the_tokenizer():
    from glassbox.models import gpt2_tokenizer

    model = tl.HookedTransformer(tl.HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8),
                                 tokenizer=gpt2_tokenizer())
    assert model.cfg.d_vocab == model.cfg.d_vocab_out == 50257
    with pytest.raises(ValueError, match="d_vocab=-1: give d_vocab, or a tokenizer"):
        tl.HookedTransformer(tl.HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8))


def test_attention_only_model():
    model = tiny(attn_only=True)
    assert model.cfg.attn_only and not any(".mlp." in k or ".ln2." in k for k in model.state_dict())
    _, cache = model.run_with_cache(toks())
    # resid_post = resid_pre + attn_out: the block adds attention alone.
    # measured 0 (float32 sum, values up to 4), bound 0
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"],
                               cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"], atol=0, rtol=0)


def test_hook_flags_write_through_both_ways():
    model = tiny()
    assert not model.cfg.use_attn_result and "blocks.0.attn.hook_result" not in model.hook_dict
    model.cfg.use_attn_result = True
    assert model.hook_flags.use_attn_result and "blocks.0.attn.hook_result" in model.hook_dict
    model.set_use_split_qkv_input(True)
    assert model.cfg.use_split_qkv_input
    with pytest.raises(ValueError, match="use_split_qkv_input and use_attn_in cannot both be on"):
        model.cfg.use_attn_in = True
    assert not model.cfg.use_attn_in
    flagged = tiny(use_hook_mlp_in=True)
    assert flagged.hook_flags.use_hook_mlp_in and "blocks.1.hook_mlp_in" in flagged.hook_dict


@pytest.fixture(scope="module")
def with_tokenizer():
    from glassbox.models import gpt2_tokenizer

    torch.manual_seed(0)
    return tl.HookedTransformer(tl.HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=12,
                                                           act_fn="gelu_new"), tokenizer=gpt2_tokenizer())


def test_default_prepend_bos_is_settable(with_tokenizer):
    model = copy.deepcopy(with_tokenizer)
    bos = model.tokenizer.bos_token_id
    assert model.to_tokens("ab")[0, 0] == bos
    model.cfg.default_prepend_bos = False
    assert model.to_tokens("ab")[0, 0] != bos
    assert torch.equal(model.to_tokens("ab"), with_tokenizer.to_tokens("ab", prepend_bos=False))


def test_settable_and_fixed_fields_of_a_built_model():
    model = tiny()
    model.cfg.model_name, model.cfg.seed = "renamed", 5
    assert model.cfg.to_dict()["model_name"] == "renamed"
    with pytest.raises(AttributeError, match="cfg.n_layers shapes the model's computation"):
        model.cfg.n_layers = 3
    with pytest.raises(AttributeError, match=r"use model.to\('cpu'\)"):
        model.cfg.device = "cpu"
    model.to(torch.float64)
    assert model.cfg.dtype == torch.float64
    with pytest.raises(AttributeError, match="glassbox Config, which is frozen"):
        model.cfg.layer_norm_eps = 1e-3


def test_copies_of_the_config():
    model = tiny()
    model.cfg.use_attn_result = True
    free = copy.deepcopy(model.cfg)
    assert free._model is None and free.use_attn_result
    free.n_layers = 1  # a free config, so settable
    assert model.cfg.n_layers == 2
    twin = copy.deepcopy(model)
    assert twin.cfg._model is twin and twin.cfg.use_attn_result
    other = tl.HookedTransformer(model.cfg)  # a bound config: the new model gets its own copy
    assert other.cfg is not model.cfg and other.cfg._model is other


def test_lnpre_norms_are_the_identity_affine_map():
    model = tl.HookedTransformer(tl.HookedTransformerConfig(**BASE, normalization_type="LNPre", init_weights=False))
    for name, param in model.named_parameters():
        if ".ln" in name or name.startswith("ln_final"):
            assert torch.equal(param, torch.ones_like(param) if name.endswith(".w") else torch.zeros_like(param))


def test_forward_takes_transformer_lens_s_argument_order(with_tokenizer):
    model = tiny()
    t = toks()
    forward = glassbox.HookedTransformer.forward
    with torch.no_grad():
        torch.testing.assert_close(model(t, "loss", True), forward(model, t, return_type="loss", loss_per_token=True),
                                   atol=0, rtol=0)
        # 4th and 5th positional: prepend_bos and padding_side (glassbox's 4th is attention_mask).
        text = ["ab", "a b c d"]
        torch.testing.assert_close(with_tokenizer(text, "logits", False, False, "left"),
                                   forward(with_tokenizer, text, prepend_bos=False, padding_side="left"), atol=0, rtol=0)
    with pytest.raises(ValueError, match="shortformer_pos_embed is not supported"):
        model(t, shortformer_pos_embed=torch.zeros(2, 7, 24))


# -- run_with_cache ----------------------------------------------------------------------------
def test_run_with_cache_has_transformer_lens_s_signature():
    model = tiny()
    t = toks()
    logits, cache = model.run_with_cache(t, names_filter=["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"])
    assert type(cache).__module__ == "glassbox.tl.ActivationCache"
    assert sorted(cache.keys()) == ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"]
    with torch.no_grad():
        torch.testing.assert_close(logits, model(t), atol=0, rtol=0)
    loss, raw = model.run_with_cache(t, "loss", return_cache_object=False, names_filter="blocks.0.hook_resid_pre")
    assert type(raw) is dict and loss.ndim == 0
    _, one = model.run_with_cache(t[:1], remove_batch_dim=True, names_filter="blocks.0.hook_resid_pre")
    torch.testing.assert_close(one["blocks.0.hook_resid_pre"], cache["blocks.0.hook_resid_pre"][0], atol=0, rtol=0)
    _, sliced = model.run_with_cache(t, pos_slice=-1, names_filter=["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"])
    # TransformerLens slices position third from the end for z, second for the residual stream.
    torch.testing.assert_close(sliced["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_z"][:, -1:], atol=0, rtol=0)
    torch.testing.assert_close(sliced["blocks.0.hook_resid_pre"], cache["blocks.0.hook_resid_pre"][:, -1:],
                               atol=0, rtol=0)
    with pytest.raises(ValueError, match="reset_hooks_end=False"):
        model.run_with_cache(t, reset_hooks_end=False)


def test_run_with_cache_gradients_leave_parameters_alone():
    model = tiny()
    _, cache = model.run_with_cache(toks(), "loss", incl_bwd=True, names_filter="blocks.1.hook_resid_post")
    assert cache["blocks.1.hook_resid_post_grad"].shape == cache["blocks.1.hook_resid_post"].shape
    assert all(p.grad is None for p in model.parameters())


def test_kv_cache_with_transformer_lens_s_constructor():
    model = tiny().eval()
    t = toks(2, 9)
    past = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    with torch.no_grad():
        first = model(t[:, :6], past_kv_cache=past)
        rest = model(t[:, 6:], past_kv_cache=past)
        full = model(t)
    assert len(past) == 9 and past.entries[0].past_keys.shape == (2, 9, 3, 8)
    # measured 1.3e-6 (logits up to 2.7), bound 1.5e-5: 12x
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1.5e-5, rtol=0)
    past.freeze()  # TransformerLens's names over glassbox's frozen cache (tests/test_kv_cache_frozen.py)
    assert past.frozen and all(entry.frozen for entry in past.entries)
    with torch.no_grad():
        again = model(t[:, 6:], past_kv_cache=past)
    assert len(past) == 9 and torch.equal(again, model(t[:, 6:], past_kv_cache=past))
    past.unfreeze()
    assert not past.frozen and not any(entry.frozen for entry in past.entries)


# -- loading -----------------------------------------------------------------------------------
def test_names_glassbox_loads():
    assert {"gpt2", "gpt2-medium", "distilgpt2", "glassbox-austen"} <= set(OFFICIAL_MODEL_NAMES)
    assert get_official_model_name("GPT2-small") == "gpt2" and get_official_model_name("distil-gpt2") == "distilgpt2"
    with pytest.raises(ValueError, match="'solu-2ll' is not a model glassbox can load by name.*glassbox-austen"):
        get_official_model_name("solu-2ll")
    # TransformerLens's own-format models (glassbox.weights.tl_format): NeelNanda's repos
    assert get_official_model_name("solu-2l") == "NeelNanda/SoLU_2L512W_C4_Code"
    assert get_official_model_name("attn-only-1l-c4-code") == "NeelNanda/Attn_Only_1L512W_C4_Code"
    assert get_official_model_name("gelu-4l") == "NeelNanda/GELU_4L512W_C4_Code"
    for name, why in (("solu-4l-old", "old SoLU"), ("attn-only-demo", "shortformer")):
        with pytest.raises(ValueError, match=f"'{name}' cannot be loaded by glassbox: .*{why}"):
            get_official_model_name(name)
    assert get_official_model_name("pythia-70m") == "EleutherAI/pythia-70m"
    assert get_official_model_name("stanford-gpt2-small-a") == "stanford-crfm/alias-gpt2-small-x21"


@pytest.fixture(scope="module")
def austen():
    return glassbox.HookedTransformer.from_pretrained("glassbox-austen")


def test_from_pretrained_applies_transformer_lens_s_processing(austen):
    model = tl.HookedTransformer.from_pretrained("glassbox-austen", device="cpu")
    assert model.processing == ("fold_ln", "center_reader_weights", "center_writing_weights", "center_unembed",
                                "fold_value_biases")
    assert model.cfg.normalization_type == "LNPre" and model.cfg.original_architecture == "GPT2LMHeadModel"
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in model.named_parameters() if n.endswith("ln1.w"))
    t = austen.to_tokens("Elizabeth read the letter")
    with torch.no_grad():
        # measured 8.6e-6 (log-probs down to -18.3), bound 1e-4: 12x
        torch.testing.assert_close(model(t).log_softmax(-1), austen(t).log_softmax(-1), atol=1e-4, rtol=0)
    plain = tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen", device="cpu")
    assert plain.processing == () and plain.cfg.normalization_type == "LN"
    with torch.no_grad():
        torch.testing.assert_close(plain(t), austen(t), atol=0, rtol=0)
    assert austen.processing == (), "glassbox's own from_pretrained keeps the weights unprocessed"


def test_from_pretrained_refuses_what_glassbox_cannot_load():
    with pytest.raises(ValueError, match=r"'glassbox-austen' has no training checkpoints"):
        tl.HookedTransformer.from_pretrained("glassbox-austen", checkpoint_index=3)
    with pytest.raises(ValueError, match=r"from_pretrained\(first_n_layers=1\) is not supported"):
        tl.HookedTransformer.from_pretrained("glassbox-austen", first_n_layers=1)
    with pytest.raises(ValueError, match=r"n_devices=2"):
        tl.HookedTransformer.from_pretrained("glassbox-austen", n_devices=2)
    with pytest.raises(TypeError, match="load_in_8bit"):
        tl.HookedTransformer.from_pretrained("glassbox-austen", load_in_8bit=True)
    with pytest.raises(ValueError, match="not exact with positional='rotary'"):
        tl.HookedTransformer.from_glassbox(glassbox.HookedTransformer(glassbox.models.preset_config(
            "modern", d_model=16, n_layers=1, n_heads=2, d_vocab=29, n_ctx=8)), refactor_factored_attn_matrices=True)


def test_post_norm_skips_folding_with_a_warning():
    post = glassbox.HookedTransformer(glassbox.models.preset_config("classic", d_model=16, n_layers=1, n_heads=2,
                                                                    d_vocab=29, n_ctx=8))
    with pytest.warns(UserWarning, match="post-norm model: fold_ln and center_writing_weights"):
        model = tl.HookedTransformer.from_glassbox(post)
    assert model.processing == ("center_unembed", "fold_value_biases") and model.cfg.normalization_type == "LN"


def test_process_weights_in_place_keeps_log_probs():
    model = tiny()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln" in name or name.startswith("ln_final"):
                param.add_(0.3 * torch.randn_like(param))
    t = toks()
    with torch.no_grad():
        before = model(t).log_softmax(-1)
    model.process_weights_()
    assert model.cfg.normalization_type == "LNPre" and model.processing[0] == "fold_ln"
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in model.named_parameters() if n.endswith(".w"))
    with torch.no_grad():
        # measured 2.4e-6 (log-probs down to -7.7), bound 2.5e-5: 10x
        torch.testing.assert_close(model(t).log_softmax(-1), before, atol=2.5e-5, rtol=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.process_weights_()  # every step is applied already
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_default_padding_side(with_tokenizer):
    from glassbox.models import gpt2_tokenizer

    left = tl.HookedTransformer(with_tokenizer.cfg, tokenizer=gpt2_tokenizer(), default_padding_side="left")
    left.load_state_dict(with_tokenizer.state_dict())
    text = ["ab", "a b c d"]
    assert torch.equal(left.to_tokens(text), with_tokenizer.to_tokens(text, padding_side="left"))
    assert not torch.equal(left.to_tokens(text), with_tokenizer.to_tokens(text))
    with torch.no_grad():
        torch.testing.assert_close(left(text), with_tokenizer(text, padding_side="left"), atol=0, rtol=0)
    logits, _ = left.run_with_cache(text, names_filter="hook_embed")
    torch.testing.assert_close(logits, left(text), atol=0, rtol=0)


def test_from_pretrained_dtype():
    model = tl.HookedTransformer.from_pretrained("glassbox-austen", device="cpu", dtype="float64")
    assert model.cfg.dtype == torch.float64 and model.W_E.dtype == torch.float64
    exact = glassbox.HookedTransformer.from_pretrained("glassbox-austen", dtype=torch.float64)
    t = exact.to_tokens("Elizabeth read the letter")
    with torch.no_grad():
        # measured 2.1e-14 (log-probs down to -18.3), bound 3e-13: 14x
        torch.testing.assert_close(model(t).log_softmax(-1), exact(t).log_softmax(-1), atol=3e-13, rtol=0)
    with pytest.raises(ValueError, match="dtype='float8' is not one of"):  # torch_dtype wins, as in TransformerLens
        tl.HookedTransformer.from_pretrained("glassbox-austen", dtype="float32", torch_dtype="float8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_from_pretrained_on_cuda(austen):
    model = tl.HookedTransformer.from_pretrained("glassbox-austen", device="cuda")
    assert model.cfg.device.startswith("cuda") and model.W_E.is_cuda
    cpu = tl.HookedTransformer.from_pretrained("glassbox-austen", device="cpu")
    t = cpu.to_tokens("Elizabeth read the letter")
    logits, cache = model.run_with_cache(t, device="cpu", names_filter="blocks.1.hook_resid_post")
    assert cache["blocks.1.hook_resid_post"].device.type == "cpu"
    with torch.no_grad():
        # not measured here (no GPU on the development machines): 10x the CPU processing gap of 8.6e-6
        torch.testing.assert_close(logits.cpu(), cpu(t), atol=1e-4, rtol=0)
    past = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 1)
    with torch.no_grad():
        model(t, past_kv_cache=past)
    assert past.entries[0].past_keys.is_cuda


def test_pretrained_config_without_weights():
    from glassbox.tl.loading_from_pretrained import get_pretrained_model_config

    cfg = get_pretrained_model_config("gpt2-small", fold_ln=True)
    # GPT-2 small's published sizes.
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab, cfg.n_ctx) == \
        (12, 768, 12, 64, 3072, 50257, 1024)
    assert cfg.normalization_type == "LNPre" and cfg.act_fn == "gelu_new" and cfg.model_name == "gpt2-small"
    shipped = get_pretrained_model_config("glassbox-austen")
    model = tl.HookedTransformer.from_pretrained("glassbox-austen", device="cpu", fold_ln=False)
    for field in ("n_layers", "d_model", "n_heads", "d_mlp", "d_vocab", "n_ctx", "normalization_type", "n_params",
                  "tokenizer_name"):
        assert getattr(shipped, field) == getattr(model.cfg, field), field
    # TransformerLens names the hub repo the tokenizer loads from (a tokenizer-only subclass reloads it);
    # the shipped model's tokenizer is glassbox's own, as from_pretrained's config says
    assert cfg.tokenizer_name == "gpt2" and shipped.tokenizer_name is None
    with pytest.raises(ValueError, match="'gpt2' has no training checkpoints"):
        get_pretrained_model_config("gpt2", checkpoint_index=1)
    from glassbox.tl.loading_from_pretrained import Config, get_basic_config

    basic = get_basic_config("gpt2-small")  # TransformerLens's basic Config, GPT-2 small's published sizes
    assert basic == Config(d_model=768, debug=True, layer_norm_eps=1e-5, d_vocab=50257, init_range=0.02, n_ctx=1024,
                           d_head=64, d_mlp=3072, n_heads=12, n_layers=12)
    assert get_basic_config("glassbox-austen").d_model == shipped.d_model
    with pytest.raises(ValueError, match="first_n_layers not supported"):
        get_pretrained_model_config("gpt2", first_n_layers=1)


def test_config_of_reads_no_weights(austen, tmp_path):
    from glassbox.weights.pretrained import config_of

    assert config_of("glassbox-austen") == austen.cfg
    (tmp_path / "config.json").write_text((glassbox.weights.pretrained.SHIPPED_DIR / "glassbox-austen" /
                                           "config.json").read_text())
    assert config_of(tmp_path).replace(model_name="glassbox-austen") == austen.cfg  # a folder without weights


def test_transformer_lens_s_weight_views_and_helpers(with_tokenizer):
    model = tiny()
    stacked = torch.stack([block.attn.b_Q for block in model.blocks])
    assert torch.equal(model.b_Q, stacked) and model.W_gate is None
    assert model.W_E_pos.shape == (53 + 16, 24) and model.n_params_total == sum(p.numel() for p in model.parameters())
    bias_free = tl.HookedTransformer.from_glassbox(glassbox.HookedTransformer(glassbox.models.preset_config(
        "modern", d_model=16, n_layers=2, n_heads=2, d_vocab=29, n_ctx=8)))
    assert bias_free.b_Q.shape == (2, 2, 8) and not bias_free.b_Q.any() and not bias_free.b_U.any()
    assert bias_free.W_gate.shape == (2, 16, bias_free.cfg.d_mlp)
    with pytest.raises(AttributeError):  # no MLP, as in TransformerLens
        tiny(attn_only=True).b_in
    scores = model.all_composition_scores("Q")
    assert scores.shape == (2, 3, 2, 3) and not scores[1, :, 0].any()  # later layers only
    from glassbox.models import gpt2_tokenizer

    other = copy.deepcopy(with_tokenizer)
    other.set_tokenizer(gpt2_tokenizer(), default_padding_side="left")
    assert other.default_padding_side == "left"


def test_run_with_cache_clear_contexts_and_unknown_names():
    model = tiny()
    model.hook_dict["blocks.0.hook_resid_pre"].ctx["seen"] = 1
    model.run_with_cache(toks(), names_filter="hook_embed")
    assert model.hook_dict["blocks.0.hook_resid_pre"].ctx == {"seen": 1}
    model.run_with_cache(toks(), names_filter="hook_embed", clear_contexts=True)
    assert model.hook_dict["blocks.0.hook_resid_pre"].ctx == {}
    # Unlike TransformerLens (which caches nothing for it), an unknown name is an error.
    with pytest.raises(KeyError, match="blocks.0.hook_resid_prefix"):
        model.run_with_cache(toks(), names_filter=["blocks.0.hook_resid_prefix"])


def test_load_and_process_state_dict_processes_what_it_is_given_on_a_processed_model():
    from glassbox import Config, HookedTransformer as Glassbox

    torch.manual_seed(0)
    base = Glassbox(Config(d_model=20, n_layers=2, n_heads=4, d_vocab=53, n_ctx=9, tied_unembed=False))
    with torch.no_grad():
        for name, param in base.named_parameters():
            if name.endswith(".w"):
                param.add_(0.3 * torch.randn_like(param))
    base.set_use_attn_result(True)
    model = tl.HookedTransformer.from_glassbox(base)
    assert model.hook_flags.use_attn_result  # the flags come along
    model.load_and_process_state_dict(base.state_dict())  # raw weights into an already-processed model
    assert model.processing == ("fold_ln", "center_reader_weights", "center_writing_weights", "center_unembed",
                                "fold_value_biases")
    assert torch.equal(model.blocks[0].ln1.w, torch.ones(20))  # folded again, not loaded as they were
    # readers centred: measured 7.5e-10 (entries of mean size 0.015), bound 1e-8
    assert model.blocks[0].mlp.W_in.detach().mean(0).abs().max() < 1e-8
    x = toks(2, 7)
    with torch.no_grad():
        # processing keeps the predictions: measured 4.8e-7 (log-probs up to 4.2), bound 5e-6: 10x
        diff = (model(x).log_softmax(-1) - base(x).log_softmax(-1)).abs().max()
    assert diff < 5e-6


def test_load_and_process_state_dict_refuses_bad_state_dicts_naming_the_key_and_changes_nothing():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg_before = model.cfg.to_dict()
    good = {k: v.clone() for k, v in model.state_dict().items()}
    W_U = good.pop("unembed.W_U_T").T.contiguous()  # TransformerLens's layout, [d_model d_vocab]
    tl_style = {**good, "unembed.W_U": W_U}
    without = {k: v for k, v in tl_style.items() if k != "blocks.1.attn.W_Q"}
    cases = [
        (without, KeyError, r"missing blocks.1.attn.W_Q"),
        ({**tl_style, "blocks.9.attn.W_Q": good["blocks.0.attn.W_Q"]}, KeyError, r"unexpected.*blocks.9.attn.W_Q"),
        ({**tl_style, "blocks.0.attn.W_Q": torch.randn(3, 24, 7)}, ValueError,
         r"blocks.0.attn.W_Q.*\(3, 24, 7\).*\(3, 24, 8\)"),
        ({**tl_style, "unembed.W_U": torch.randn(24, 50)}, ValueError, r"unembed.W_U.*\(24, 50\).*\(24, 53\)"),
        ({**tl_style, "unembed.W_U": torch.randn(24)}, ValueError, r"unembed.W_U.*\(24,\).*\(24, 53\)"),
        ({**tl_style, "blocks.0.mlp.b_in": 3}, TypeError, r"blocks.0.mlp.b_in.*int"),
        ({**tl_style, "blocks.0.mlp.W_in": good["blocks.0.mlp.W_in"].long()}, ValueError,
         r"blocks.0.mlp.W_in.*torch.int64"),
        ({**tl_style, "blocks.1.ln2.w": torch.full((24,), float("nan"))}, ValueError, r"blocks.1.ln2.w.*nan"),
        ([1, 2], TypeError, r"state_dict must be a mapping.*list"),
    ]
    for state, kind, message in cases:
        with pytest.raises(kind, match=message):
            model.load_and_process_state_dict(state)
        after = model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in before.items()), message  # nothing half-loaded
        assert model.cfg.to_dict() == cfg_before and model.processing == ()
    model.load_and_process_state_dict(tl_style)  # the same state dict, unharmed, loads
    assert model.cfg.normalization_type == "LNPre"


def test_the_model_owns_a_tokenizer_copy_with_transformer_lens_conventions():
    from glassbox.models import gpt2_tokenizer
    from glassbox.models.tokenize import tokenizer_copy

    shared = gpt2_tokenizer()
    own = tokenizer_copy(shared)
    own.pad_token, own.padding_side = own.eos_token, "left"
    assert shared.pad_token is None and shared.padding_side == "right"  # the original is untouched
    assert own("Elizabeth read").input_ids == shared("Elizabeth read").input_ids
    model = tl.HookedTransformer(tl.HookedTransformerConfig(**{**BASE, "d_vocab": 50257, "act_fn": "relu"}))
    assert model.tokenizer is not shared and model.tokenizer.pad_token_id == shared.eos_token_id == 50256
    prompts = ["a b c d", "a"]
    assert model.to_tokens(prompts)[1].tolist() == [50256, 64, 50256, 50256, 50256]  # right: the default
    model.tokenizer.padding_side = "left"  # as in TransformerLens, the model pads on its tokenizer's side
    assert model.default_padding_side == "left"
    assert model.to_tokens(prompts)[1].tolist() == [50256, 50256, 50256, 50256, 64]
    assert shared.padding_side == "right" and shared.pad_token is None
    model.default_padding_side = "right"
    assert model.tokenizer.padding_side == "right"
    with pytest.raises(ValueError, match="padding_side"):
        model.default_padding_side = "middle"


def test_run_with_cache_from_a_residual_stream_and_negative_start_at_layer():
    model = tiny(n_layers=3)
    x = toks(2, 7)
    with torch.no_grad():
        logits, full = model.run_with_cache(x)
        for start in (1, -2, -1):  # -2 is block 1, -1 block 2 (TransformerLens slices the blocks)
            block = start % 3
            out, cache = model.run_with_cache(full["resid_pre", block], start_at_layer=start)
            # the rest of the same forward: measured 0.0 (logits up to 2.7), bound 1e-5
            assert float((out - logits).abs().max()) < 1e-5, start
            assert f"blocks.{block}.hook_resid_pre" in cache and f"blocks.{block - 1}.hook_resid_pre" not in cache
            torch.testing.assert_close(model(full["resid_pre", block], start_at_layer=start), out, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"residual stream \[batch pos d_model\], got \(2, 7\)"):
        model.run_with_cache(x, start_at_layer=1)
    with pytest.raises(ValueError, match="start_at_layer=-4"):
        model(full["resid_pre", 0], start_at_layer=-4)
