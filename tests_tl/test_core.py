"""glassbox.tl's config, model and processing against TransformerLens 3.9 itself.

- HookedTransformerConfig: TransformerLens's field table and defaults, and every field's value for the
  same keyword arguments.
- HookedTransformer(cfg): the same parameter names and shapes, and the same cache keys and shapes, as
  TransformerLens's model of the same config (the differences are listed and asserted exactly).
- Processing: the same glassbox weights processed by glassbox.tl (``from_glassbox`` / ``from_pretrained``
  with TransformerLens's defaults) and by TransformerLens's ``load_and_process_state_dict`` on the twin
  give the same weights and logits; with ``refactor_factored_attn_matrices`` the factors agree up to
  the sign of each singular direction (the only freedom an SVD has with distinct singular values).
"""

import dataclasses
import warnings

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL
from glassbox.tl.config.fields import TL_DEFAULTS, REQUIRED
from tl_oracle import max_diff, tiny_model, tl_config, tl_twin, tokens

warnings.filterwarnings("ignore", category=DeprecationWarning)

BASE = dict(d_model=24, d_head=8, n_layers=2, n_ctx=16, d_vocab=53)
KWARGS = {
    "defaults": {},
    "gelu_new_given_heads": dict(act_fn="gelu_new", n_heads=3, d_mlp=40, eps=1e-6),
    "rotary_rms_gated": dict(positional_embedding_type="rotary", normalization_type="RMS", gated_mlp=True,
                             act_fn="silu", rotary_dim=4, rotary_base=500, rotary_adjacent_pairs=True),
    "attn_only": dict(attn_only=True, act_fn="solu_ln", seed=3),
    "labels": dict(model_name="toy", tokenizer_name=None, original_architecture="GPT2LMHeadModel",
                   initializer_range=0.05, default_prepend_bos=False, use_attn_result=True),
}


def test_field_table_is_transformer_lens_s():
    theirs = {}
    for f in dataclasses.fields(TL.HookedTransformerConfig):
        theirs[f.name] = REQUIRED if f.default is dataclasses.MISSING else f.default
    assert list(TL_DEFAULTS) == list(theirs)
    assert TL_DEFAULTS == theirs


@pytest.mark.parametrize("name", KWARGS)
def test_config_fields_equal_transformer_lens_s(name):
    kwargs = {**BASE, **KWARGS[name]}
    ours, theirs = gtl.HookedTransformerConfig(**kwargs), TL.HookedTransformerConfig(**kwargs)
    expected = theirs.to_dict()
    got = ours.to_dict()
    assert list(got) == list(expected)
    for field, value in expected.items():
        assert got[field] == value, f"{field}: glassbox.tl {got[field]!r}, TransformerLens {value!r}"
    assert gtl.HookedTransformerConfig(**ours.to_dict()) == ours


@pytest.mark.parametrize("kwargs", [{}, dict(attn_only=True),
                                    dict(positional_embedding_type="rotary", normalization_type="RMS",
                                         act_fn="silu")], ids=["gpt2", "attn_only", "rotary_rms"])
def test_model_from_config_has_transformer_lens_s_parameters_and_cache(kwargs):
    kwargs = {**BASE, "act_fn": "gelu_new", **kwargs}
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs))
    theirs = TL.HookedTransformer(TL.HookedTransformerConfig(**kwargs))
    a = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    b = {k: tuple(v.shape) for k, v in theirs.state_dict().items()
         if not k.endswith((".mask", ".IGNORE")) and "rotary_" not in k}
    # glassbox stores the unembedding as W_U_T [d_vocab d_model]; ours.W_U is TransformerLens's W_U.
    assert a.pop("unembed.W_U_T") == b["unembed.W_U"][::-1]
    assert tuple(ours.W_U.shape) == b.pop("unembed.W_U")
    assert a == b
    toks = torch.randint(0, BASE["d_vocab"], (2, 7), generator=torch.Generator().manual_seed(0))
    _, c1 = ours.run_with_cache(toks)
    _, c2 = theirs.run_with_cache(toks)
    extra = {k for k in c1.keys() if k.endswith(".hook_out") and (".ln" in k or k.startswith("ln_final"))}
    assert set(c1.keys()) - extra == set(c2.keys())  # glassbox adds each norm's output, hook_out
    assert {k: tuple(c1[k].shape) for k in c2.keys()} == {k: tuple(c2[k].shape) for k in c2.keys()}


PROCESSED = {
    "gpt2": {},
    "rms_rotary_gated": dict(normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu",
                             use_bias=False, tied_unembed=False),
    "attn_only": dict(attn_only=True),
}


def tl_processed(model, **flags):
    twin = tl_twin(model)
    proc = TL.HookedTransformer(tl_config(model.cfg), move_to_device=False)
    proc.load_and_process_state_dict(twin.state_dict(), **flags)
    return proc.eval()


def ours_with_w_u(model) -> dict:
    state = {k: v.detach() for k, v in model.state_dict().items()}
    state["unembed.W_U"] = model.W_U.detach()
    return state


@pytest.mark.parametrize("name", PROCESSED)
def test_processing_defaults_equal_transformer_lens_s(name):
    model = tiny_model(0, **PROCESSED[name])
    theirs = tl_processed(model, fold_ln=True, center_writing_weights=True, center_unembed=True,
                          fold_value_biases=True)
    ours = gtl.HookedTransformer.from_glassbox(model)
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type
    state = ours_with_w_u(ours)
    for key, value in theirs.state_dict().items():
        if key.endswith((".mask", ".IGNORE")) or "rotary_" in key:
            continue
        if key not in state:  # a bias glassbox's bias-free model does not have: zero in TransformerLens too
            assert key.split(".")[-1].startswith("b_") and not value.any(), key
            continue
        # measured <= 6.0e-8 (weights up to 1.1), bound 1e-6: 16x
        assert max_diff(state[key], value) <= 1e-6, key
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        # measured <= 2.9e-6 (logits up to 5.4), bound 3e-5: 10x
        torch.testing.assert_close(ours(toks), theirs(toks), atol=3e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "attn_only"])
def test_refactor_equals_transformer_lens_s_up_to_sign(name):
    model = tiny_model(0, **PROCESSED[name])
    theirs = tl_processed(model, refactor_factored_attn_matrices=True).state_dict()
    ours = gtl.HookedTransformer.from_glassbox(model, refactor_factored_attn_matrices=True)
    assert ours.processing[-1] == "refactor_factored_attn_matrices"
    state = ours.state_dict()
    for L in range(model.cfg.n_layers):
        a = f"blocks.{L}.attn."
        for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
            sign = torch.sign((state[a + W] * theirs[a + W]).sum(1, keepdim=True))  # [head 1 d_head]
            assert bool((sign != 0).all())
            # measured <= 3.7e-6 (weights up to 0.79; TransformerLens refactors in float32), bound 4e-5: 11x
            assert max_diff(state[a + W] * sign, theirs[a + W]) <= 4e-5, a + W
            assert max_diff(state[a + b] * sign[:, 0], theirs[a + b]) <= 4e-5, a + b
            if W == "W_V":
                assert max_diff(state[a + "W_O"] * sign.transpose(1, 2), theirs[a + "W_O"]) <= 4e-5, a + "W_O"
        # measured 1.9e-8, bound 1e-6: 54x
        assert max_diff(state[a + "b_O"], theirs[a + "b_O"]) <= 1e-6
        assert not state[a + "b_V"].any() and not theirs[a + "b_V"].any()


def test_no_processing_logits_equal_the_twin_and_glassbox():
    model = tiny_model(1)
    hf = model.to_hf()
    ours = gtl.HookedTransformer.from_pretrained_no_processing("tiny", hf_model=hf, device="cpu")
    assert ours.processing == () and ours.cfg.normalization_type == "LN"
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        torch.testing.assert_close(ours(toks), model(toks), atol=0, rtol=0)
        # measured 2.1e-6 (logits up to 4.5), bound 3e-5: 14x
        torch.testing.assert_close(ours(toks), tl_twin(model)(toks), atol=3e-5, rtol=0)


def test_from_pretrained_processes_an_hf_model_as_transformer_lens_does():
    model = tiny_model(2)
    ours = gtl.HookedTransformer.from_pretrained("tiny", hf_model=model.to_hf(), device="cpu")
    theirs = tl_processed(model, fold_ln=True, center_writing_weights=True, center_unembed=True,
                          fold_value_biases=True)
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type == "LNPre"
    assert ours.cfg.original_architecture == "GPT2LMHeadModel"
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        # measured 1.9e-6 (logits up to 5.0), bound 3e-5: 16x
        torch.testing.assert_close(ours(toks), theirs(toks), atol=3e-5, rtol=0)


def test_config_of_a_loaded_model_reads_like_transformer_lens_s():
    model = tiny_model(0)
    ours = gtl.HookedTransformer.from_glassbox(model)
    theirs = tl_processed(model)
    for field in ("d_model", "d_head", "n_heads", "n_layers", "n_ctx", "d_mlp", "d_vocab", "d_vocab_out", "act_fn",
                  "eps", "normalization_type", "positional_embedding_type", "attn_only", "n_params", "attn_scale",
                  "parallel_attn_mlp", "gated_mlp", "use_attn_result", "use_split_qkv_input", "use_attn_in",
                  "use_hook_mlp_in", "default_prepend_bos", "dtype"):
        assert getattr(ours.cfg, field) == getattr(theirs.cfg, field), field
    assert ours.cfg.device == str(theirs.cfg.device) == "cpu"


@pytest.mark.parametrize("name", ["gpt2", "attn_only"])
def test_load_and_process_state_dict_of_a_transformer_lens_state_dict(name):
    model = tiny_model(3, **PROCESSED[name])
    twin = tl_twin(model)
    theirs = tl_processed(model)
    kwargs = {k: v for k, v in tl_config(model.cfg).to_dict().items() if k not in ("n_params", "device")}
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs))
    ours.load_and_process_state_dict(twin.state_dict())
    assert ours.cfg.normalization_type == theirs.cfg.normalization_type == "LNPre"
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        # measured <= 1.9e-6 (logits up to 5.2), bound 3e-5: 16x
        torch.testing.assert_close(ours(toks), theirs(toks), atol=3e-5, rtol=0)
    # An already-processed TransformerLens state dict (LNPre: no norm weights) loads unprocessed.
    again = gtl.HookedTransformer(gtl.HookedTransformerConfig(**{**kwargs, "normalization_type": "LNPre"}))
    again.load_and_process_state_dict(theirs.state_dict(), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    with torch.no_grad():
        # measured 1.7e-6 (logits up to 5.2), bound 3e-5: 18x
        torch.testing.assert_close(again(toks), theirs(toks), atol=3e-5, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "rms_rotary_gated"])
def test_weight_views_equal_transformer_lens_s(name):
    model = tiny_model(4, **PROCESSED[name])
    ours = gtl.HookedTransformer.from_glassbox(model, fold_ln=False, center_writing_weights=False,
                                               center_unembed=False, fold_value_biases=False)
    twin = tl_twin(model)
    views = ["W_E", "W_U", "b_U", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "W_out", "b_in",
             "b_out", "W_gate"]
    if name == "gpt2":
        views += ["W_pos", "W_E_pos"]
    for view in views:
        a, b = getattr(ours, view), getattr(twin, view)
        if b is None:
            assert a is None, view
            continue
        assert a.shape == b.shape and torch.equal(a, b), view
    for mode in "QKV":
        a, b = ours.all_composition_scores(mode), twin.all_composition_scores(mode)
        assert a.shape == b.shape
        # measured <= 1.5e-7 (scores up to 0.29), bound 2e-6: 13x
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0)


def test_n_params_total_equals_transformer_lens_s():
    kwargs = {**BASE, "act_fn": "gelu_new"}
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs))
    theirs = TL.HookedTransformer(TL.HookedTransformerConfig(**kwargs))
    assert ours.n_params_total == theirs.n_params_total


@pytest.mark.parametrize("edit, theirs_raise, kind, words", [
    (lambda sd: sd.update({"unembed.W_U": sd["unembed.W_U"][:, :50]}), RuntimeError, ValueError,
     r"unembed.W_U.*\(24, 50\).*\(24, 50257\)"),
    (lambda sd: sd.pop("blocks.1.mlp.W_out"), ValueError, KeyError, r"missing blocks.1.mlp.W_out"),
    (lambda sd: sd.update({"blocks.7.attn.W_Q": sd["blocks.0.attn.W_Q"]}), None, KeyError,
     r"unexpected blocks.7.attn.W_Q"),
])
def test_a_bad_transformer_lens_state_dict_is_refused_naming_the_key_before_anything_changes(edit, theirs_raise, kind,
                                                                                          words):
    model = tiny_model(3)
    twin = tl_twin(model)
    kwargs = {k: v for k, v in tl_config(model.cfg).to_dict().items() if k not in ("n_params", "device")}
    state = dict(twin.state_dict())
    edit(state)
    theirs = TL.HookedTransformer(tl_config(model.cfg))
    if theirs_raise is None:  # TransformerLens ignores a key no parameter has
        theirs.load_and_process_state_dict(dict(state))
    else:  # torch's broadcast error; for a missing weight a ValueError, which ours is too
        with pytest.raises(theirs_raise):
            theirs.load_and_process_state_dict(dict(state))
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs))
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(kind, match=words) as error:
        ours.load_and_process_state_dict(state)
    assert isinstance(error.value, ValueError)
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())
    assert ours.cfg.normalization_type == "LN" and ours.processing == ()
