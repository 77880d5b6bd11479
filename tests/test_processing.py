"""Weight processing (fold_ln, center_writing_weights, center_unembed, fold_value_biases) leaves
predictions unchanged.

Oracles are identities: log-probs of the processed model equal the original's; logits too, except
with center_unembed, where they move by one constant per position; per-component logit
attributions (glassbox.interp's decompose_resid + logit_attrs) agree between processed and
original models. Every norm weight and bias is perturbed (conftest), so folding is never trivial.
Tiny models check to float64 rounding; the GPT-2-small shape (tests named small_shape) in float32.
"""

import itertools

import pytest
import torch

from conftest import TINY, make_hf_gpt2
from glassbox.models import HookedTransformer, preset_config
from glassbox.weights import from_pretrained, save_pretrained
from glassbox.weights.processing import (ALL_STEPS, STEPS, center_reader_weights, center_unembed,
                                         center_writing_weights, fold_ln, fold_value_biases, process,
                                         process_state_dict, refactor_factored_attn_matrices)

ALL = dict.fromkeys(STEPS, True)


def outputs(model, tokens):
    with torch.no_grad():
        logits = model(tokens)
    return logits, logits.log_softmax(-1)


def assert_same_predictions(model, processed, tokens, atol, logits_shift_allowed):
    logits, log_probs = outputs(model, tokens)
    new_logits, new_log_probs = outputs(processed, tokens)
    # measured 1.2e-14 (values up to 11), bound 1e-12: 80x; measured 2.9e-6 (values up to 13), bound 3e-5: 10x
    torch.testing.assert_close(new_log_probs, log_probs, atol=atol, rtol=0)
    diff = new_logits - logits
    if logits_shift_allowed:
        # One constant per position: the difference is flat along the vocabulary.
        # measured 1.2e-14 (values up to 0.83), bound 1e-12: 81x; measured 1.8e-6 (values up to 0.002), bound 3e-5: 17x
        torch.testing.assert_close(diff, diff.mean(-1, keepdim=True).expand_as(diff), atol=atol, rtol=0)
    else:
        # measured 1.7e-16 (values up to 0.21), bound 1e-12: 6005x; measured 6.0e-8 (values up to 0.21), bound 3e-5: 503x
        torch.testing.assert_close(new_logits, logits, atol=atol, rtol=0)


@pytest.fixture(scope="module")
def tiny64():
    return HookedTransformer.from_hf(make_hf_gpt2(dtype=torch.float64, **TINY))


@pytest.fixture
def tokens():
    return torch.randint(0, TINY["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(1))


COMBOS = [dict(zip(STEPS, flags)) for flags in itertools.product([False, True], repeat=4) if any(flags)]


@pytest.mark.parametrize("steps", COMBOS, ids=lambda s: "+".join(k for k, v in s.items() if v))
def test_every_combination_preserves_predictions_tiny(tiny64, tokens, steps):
    processed = process(tiny64, **steps)
    assert processed.processing == tuple(k for k in STEPS if steps[k])
    assert_same_predictions(tiny64, processed, tokens, 1e-12, logits_shift_allowed=steps["center_unembed"])


def test_center_unembed_really_moves_logits(tiny64, tokens):
    logits, _ = outputs(tiny64, tokens)
    shifted, _ = outputs(process(tiny64, center_unembed=True), tokens)
    assert (shifted - logits).abs().max() > 1e-3


def test_fold_ln_moves_the_norms_into_the_readers(tiny64):
    folded = process(tiny64, fold_ln=True)
    for name, param in folded.named_parameters():
        if name.endswith("ln1.w") or name.endswith("ln2.w") or name == "ln_final.w":
            assert torch.equal(param, torch.ones_like(param)), name
        if name.endswith(("ln1.b", "ln2.b")) or name == "ln_final.b":
            assert torch.equal(param, torch.zeros_like(param)), name
    w, W_Q = tiny64.blocks[1].ln1.w, tiny64.blocks[1].attn.W_Q
    # measured 0 (values up to 0.086), bound 1e-15 (exact here)
    torch.testing.assert_close(folded.blocks[1].attn.W_Q, W_Q * w[None, :, None], atol=1e-15, rtol=0)
    # The tied unembedding is untied, and ln_final's bias becomes b_U.
    assert (folded.cfg.tied_unembed, folded.cfg.unembed_bias) == (False, True)
    # measured 0 (values up to 0.043), bound 1e-12 (exact here)
    torch.testing.assert_close(folded.unembed.b_U, tiny64.ln_final.b @ tiny64.W_U, atol=1e-12, rtol=0)
    assert tiny64.processing == () and tiny64.cfg.tied_unembed, "the original model is untouched"


def test_functions_are_pure_and_idempotent(tiny64):
    sd = {k: v.clone() for k, v in tiny64.state_dict().items()}
    cfg = tiny64.cfg
    for fn in (fold_ln, center_writing_weights, center_unembed, fold_value_biases):
        once = fn(sd, cfg)
        twice = fn(once, cfg)
        assert set(once) == set(twice)
        for key in once:
            # measured 1.4e-17 (values up to 1.8), bound 1e-15: 72x
            torch.testing.assert_close(twice[key], once[key], atol=1e-15, rtol=0, msg=lambda m: f"{fn.__name__} {key}: {m}")
        for key, value in tiny64.state_dict().items():
            assert torch.equal(sd[key], value), f"{fn.__name__} modified its input {key}"


def test_processing_a_processed_model_is_a_no_op(tiny64):
    once = process(tiny64, **ALL)
    twice = process(once, **ALL)
    assert twice.processing == STEPS
    for (name, a), (_, b) in zip(once.state_dict().items(), twice.state_dict().items()):
        assert torch.equal(a, b), name


def test_refusals_name_the_reason():
    rms = HookedTransformer(preset_config("modern", d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19))
    with pytest.raises(ValueError, match="center_writing_weights relies on LayerNorm.*'RMS'"):
        process(rms, center_writing_weights=True)
    post = HookedTransformer(preset_config("classic", d_model=22, n_layers=2, n_heads=2, d_vocab=29, n_ctx=19))
    with pytest.raises(ValueError, match="fold_ln needs a pre-norm model; norm_placement='post'"):
        process(post, fold_ln=True)


@pytest.mark.parametrize("arch", ["modern", "parallel"])
def test_other_architectures_preserve_predictions(arch, tokens):
    sizes = dict(d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19, d_mlp=37)
    if arch == "modern":
        cfg, steps = preset_config("modern", **sizes), dict(fold_ln=True, center_unembed=True, fold_value_biases=True)
    else:
        cfg = preset_config("gpt2", **sizes, parallel_attn_mlp=True, positional="rotary", rotary_dim=4,
                            rotary_style="interleaved", unembed_bias=True, tied_unembed=False)
        steps = ALL
    torch.manual_seed(0)
    model = HookedTransformer(cfg, dtype=torch.float64)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    processed = process(model, **steps)
    assert_same_predictions(model, processed, tokens, 1e-12, logits_shift_allowed=True)
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in processed.named_parameters() if n.endswith("ln1.w"))


def test_from_pretrained_opts_in_and_records(tmp_path, tokens):
    model = HookedTransformer.from_hf(make_hf_gpt2(**TINY))
    save_pretrained(model, tmp_path)
    plain = from_pretrained(tmp_path)
    assert plain.processing == ()
    folded = from_pretrained(tmp_path, fold_ln=True, center_writing_weights=True)
    assert folded.processing == ("fold_ln", "center_writing_weights")
    assert_same_predictions(plain, folded, tokens, 3e-5, logits_shift_allowed=False)  # see the small-shape test
    with pytest.raises(TypeError, match="unexpected options for from_pretrained: fold_layernorm"):
        from_pretrained(tmp_path, fold_layernorm=True)


# -- center_reader_weights and refactor_factored_attn_matrices ---------------------------------
def test_center_reader_weights_centres_every_reader_and_keeps_predictions(tiny64, tokens):
    folded = process(tiny64, fold_ln=True)
    centred = process(folded, center_reader_weights=True)
    assert centred.processing == ("fold_ln", "center_reader_weights")
    readers = {"attn.W_Q": 1, "attn.W_K": 1, "attn.W_V": 1, "mlp.W_in": 0}
    for L, block in enumerate(centred.blocks):
        for name, axis in readers.items():
            W = getattr(getattr(block, name.split(".")[0]), name.split(".")[1]).detach()
            # measured 2.8e-18 (values up to 0.087), bound 3e-17: 11x
            assert float(W.mean(axis).abs().max()) <= 3e-17, f"blocks.{L}.{name}"
            before = getattr(getattr(folded.blocks[L], name.split(".")[0]), name.split(".")[1]).detach()
            assert float((W - before).abs().max()) > 1e-3, f"blocks.{L}.{name} was already centred"
    # measured 2.1e-18 (values up to 0.078), bound 3e-17: 14x
    assert float(centred.W_U.detach().mean(0).abs().max()) <= 3e-17
    assert_same_predictions(tiny64, centred, tokens, 1e-12, logits_shift_allowed=False)


def test_center_reader_weights_refuses_unfolded_norms_and_rms(tiny64):
    with pytest.raises(ValueError, match="needs folded norms.*blocks.0.ln1 has other values: apply fold_ln first"):
        center_reader_weights(tiny64.state_dict(), tiny64.cfg)
    rms = HookedTransformer(preset_config("modern", d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19))
    with pytest.raises(ValueError, match="center_reader_weights relies on LayerNorm.*'RMS'"):
        process(rms, fold_ln=True, center_reader_weights=True)


def _effective(W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[head d_model+1 d_head]: the weights with the bias as the row of an input that is always 1."""
    return torch.cat([W, b[:, None, :]], dim=1)


def test_refactor_keeps_every_circuit_and_makes_the_factors_even(tiny64, tokens):
    refactored = process(tiny64, refactor_factored_attn_matrices=True)
    assert refactored.processing == ("refactor_factored_attn_matrices",)
    for L, (old, new) in enumerate(zip(tiny64.blocks, refactored.blocks)):
        old, new = old.attn, new.attn
        old = type("Weights", (), {k: getattr(old, k).detach() for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")})
        new = type("Weights", (), {k: getattr(new, k).detach() for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")})
        qk_old = _effective(old.W_Q, old.b_Q) @ _effective(old.W_K, old.b_K).transpose(1, 2)
        qk_new = _effective(new.W_Q, new.b_Q) @ _effective(new.W_K, new.b_K).transpose(1, 2)
        # measured 3.4e-16 (values up to 0.73), bound 5e-15: 15x
        torch.testing.assert_close(qk_new, qk_old, atol=5e-15, rtol=0, msg=f"layer {L} QK with biases")
        # measured 9.7e-18 (values up to 0.0019), bound 1e-16: 10x
        torch.testing.assert_close(new.W_V @ new.W_O, old.W_V @ old.W_O, atol=1e-16, rtol=0, msg=f"layer {L} OV")
        torch.testing.assert_close(new.b_O, old.b_O + torch.einsum("he,hed->d", old.b_V, old.W_O), atol=0, rtol=0)
        assert not new.b_V.any()
        eye = torch.eye(new.W_O.shape[1], dtype=new.W_O.dtype).expand(new.W_O.shape[0], -1, -1)
        # W_O has orthonormal rows; W_V's columns and W_Q's, W_K's are orthogonal; Q and K share each norm.
        # measured 1.8e-15, bound 2e-14: 11x
        torch.testing.assert_close(new.W_O @ new.W_O.transpose(1, 2), eye, atol=2e-14, rtol=0)
        gram = new.W_V.transpose(1, 2) @ new.W_V
        # measured 1.2e-20 (diagonal up to 3.6e-5), bound 2e-19: 16x
        torch.testing.assert_close(gram, torch.diag_embed(torch.diagonal(gram, dim1=1, dim2=2)), atol=2e-19, rtol=0)
        q, k = _effective(new.W_Q, new.b_Q), _effective(new.W_K, new.b_K)
        # measured 3.3e-16 (norms up to 0.19), bound 5e-15: 15x
        torch.testing.assert_close(q.norm(dim=1), k.norm(dim=1), atol=5e-15, rtol=0)
    assert_same_predictions(tiny64, refactored, tokens, 1e-12, logits_shift_allowed=False)


def test_refactor_without_biases_and_its_refusal(tokens):
    cfg = preset_config("gpt2", d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19, use_bias=False)
    torch.manual_seed(0)
    model = HookedTransformer(cfg, dtype=torch.float64)
    refactored = process(model, refactor_factored_attn_matrices=True)
    assert "blocks.0.attn.b_Q" not in refactored.state_dict()
    assert_same_predictions(model, refactored, tokens, 1e-12, logits_shift_allowed=False)
    rotary = HookedTransformer(preset_config("modern", d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29,
                                             n_ctx=19))
    with pytest.raises(ValueError, match="refactor_factored_attn_matrices is not exact with positional='rotary'"):
        refactor_factored_attn_matrices(rotary.state_dict(), rotary.cfg)


def test_process_state_dict_applies_every_step_in_order(tiny64, tokens):
    sd, cfg = process_state_dict(tiny64.state_dict(), tiny64.cfg, list(reversed(ALL_STEPS)))
    model = HookedTransformer(cfg, init=False, dtype=torch.float64)
    model.load_state_dict(sd)
    assert_same_predictions(tiny64, model, tokens, 1e-12, logits_shift_allowed=True)
    by_process = process(tiny64, **dict.fromkeys(ALL_STEPS, True))
    assert by_process.processing == ALL_STEPS
    for key, value in by_process.state_dict().items():
        assert torch.equal(sd[key], value), key
    with pytest.raises(ValueError, match="unknown processing step.*'fold_layernorm'"):
        process_state_dict(tiny64.state_dict(), tiny64.cfg, ["fold_layernorm"])


# -- GPT-2-small shape ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_tokens():
    return torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def small_processed(small_model):
    return process(small_model, **ALL)


def test_small_shape_processing_preserves_log_probs(small_model, small_processed, small_tokens):
    """Log-probs within 3e-5 (measured 2.9e-6, log-probs down to -13.3: 10x); logits up to one constant
    per position (center_unembed is applied). Exact logits without center_unembed are checked on the
    tiny float64 models above, to 1e-12."""
    assert_same_predictions(small_model, small_processed, small_tokens, 3e-5, logits_shift_allowed=True)


def test_small_shape_logit_attributions_agree(small_model, small_processed, small_tokens):
    """Direct logit attribution of every component (embeddings, each attn and MLP output, the final
    norm's bias) to a logit difference, from the analysis tools, is the same before and after."""
    correct, wrong = small_tokens[:, -1], small_tokens[:, 0]
    attrs = []
    for model in (small_model, small_processed):
        with torch.no_grad():
            _, cache = model.run_with_cache(small_tokens)
        stack, labels = cache.decompose_resid(pos_slice=-2, return_labels=True)
        attrs.append((cache.logit_attrs(stack, correct, incorrect_tokens=wrong, pos_slice=-2), labels))
        del cache
    (before, labels), (after, labels_after) = attrs
    assert labels == labels_after and len(labels) == 2 + 2 * 12
    assert before.shape == (len(labels) + 1, 2)  # + the final norm's bias row
    assert before.abs().max() > 1e-2, "attributions too small for the comparison to mean anything"
    # measured 8.9e-8 (values up to 0.39), bound 1e-5: 112x
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
