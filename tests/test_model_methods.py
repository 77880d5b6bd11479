"""The model's convenience methods against hand computations and identities: input_to_embed then
start_at_layer=0 is the forward, loss_fn is a hand cross-entropy, tokens_to_residual_directions is
W_U's columns; the tokenizer methods' input kinds and return shapes; generate_tl_style's meanings."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassbox.models import Config, HookedTransformer
from glassbox.models.generate import generate_from_embeds, generate_tl_style
from glassbox.models.kv_cache import KVCache
from glassbox.models.tokenize import TokenInputError

GPT2_VOCAB = 50257


def seeded(seed=0, **fields):
    options = dict(d_model=16, n_layers=2, n_heads=2, d_vocab=GPT2_VOCAB, n_ctx=24, d_mlp=20, init_range=1.0)
    options.update(fields)
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**options)).eval()
    with torch.no_grad():  # biases and norm weights off their initial values, so none can be ignored
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def model():
    return seeded()


@pytest.fixture(scope="module")
def rotary():
    return seeded(1, positional="rotary", d_vocab=37, n_ctx=19)


# -- input_to_embed ------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["The cat sat", ["The cat sat on", "A dog"]])
@pytest.mark.parametrize("side", ["left", "right"])
def test_input_to_embed_then_start_at_layer_0_is_the_forward(model, prompt, side):
    with torch.no_grad():
        residual, tokens, shortformer, mask = model.input_to_embed(prompt, padding_side=side)
        expected_tokens, expected_mask = model.tokenize(prompt, padding_side=side)
        assert shortformer is None and torch.equal(tokens, expected_tokens)
        assert (mask is None and expected_mask is None) or torch.equal(mask, expected_mask)
        resumed = model(residual, start_at_layer=0, attention_mask=mask)
        assert torch.equal(resumed, model(prompt, padding_side=side))
        loss = model(residual, start_at_layer=0, attention_mask=mask, tokens=tokens, return_type="loss")
        assert torch.equal(loss, model(prompt, padding_side=side, return_type="loss"))
    # By hand: the token embedding plus the learned position of each real token (cumsum of the mask).
    positions = torch.arange(tokens.shape[1]).expand(tokens.shape) if mask is None else (mask.long().cumsum(-1) - 1).clamp(min=0)
    torch.testing.assert_close(residual, model.W_E[tokens] + model.W_pos[positions], atol=0, rtol=0)


def test_input_to_embed_runs_the_embedding_hooks_and_rotary_has_no_positions(model, rotary):
    tokens = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        residual, _, _, mask = rotary.input_to_embed(tokens)
        assert mask is None and torch.equal(residual, rotary.W_E[tokens])
        assert torch.equal(rotary(residual, start_at_layer=0), rotary(tokens))
        double = lambda x, hook: 2 * x
        with model.hooks(fwd_hooks=[("hook_embed", double)]):
            hooked = model.input_to_embed(tokens[:1])[0]
    assert torch.equal(hooked, 2 * model.W_E[tokens[:1]] + model.W_pos[:7])


def test_input_to_embed_with_a_cache_offsets_positions_and_leaves_the_cache(model):
    tokens = torch.randint(0, 500, (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :2] = False
    kv = KVCache(model.cfg.n_layers)
    with torch.no_grad():
        model(tokens[:, :6], attention_mask=mask, past_kv_cache=kv)
        before = (len(kv), kv.key_mask.clone(), kv[0].k.clone())
        residual, new_tokens, _, full_mask = model.input_to_embed(tokens[:, 6:], past_kv_cache=kv)
    assert (len(kv), kv[0].k.shape) == (6, before[2].shape) and torch.equal(kv.key_mask, before[1])
    assert torch.equal(full_mask, torch.cat([mask, torch.ones(2, 3, dtype=torch.bool)], 1))
    positions = torch.tensor([[6, 7, 8], [4, 5, 6]])  # row 1 has two pads before its real tokens
    torch.testing.assert_close(residual, model.W_E[tokens[:, 6:]] + model.W_pos[positions], atol=0, rtol=0)
    assert torch.equal(new_tokens, tokens[:, 6:])


# -- loss_fn -------------------------------------------------------------------------------------
def test_loss_fn_is_the_hand_cross_entropy(model):
    gen = torch.Generator().manual_seed(5)
    logits = 3 * torch.randn(2, 6, 50, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 50, (2, 6), generator=gen)
    log_probs = logits.log_softmax(-1)
    nll = torch.stack([torch.stack([-log_probs[b, p, tokens[b, p + 1]] for p in range(5)]) for b in range(2)])
    # lm_loss takes the log-softmax in float32: measured 6.1e-7 (per token, losses up to 13), bound 6e-6: 10x
    torch.testing.assert_close(model.loss_fn(logits, tokens).double(), nll.mean(), atol=6e-6, rtol=0)
    torch.testing.assert_close(model.loss_fn(logits, tokens, per_token=True).double(), nll, atol=6e-6, rtol=0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])  # ints, as TransformerLens takes
    valid = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(model.loss_fn(logits, tokens, mask).double(), nll[valid].mean(), atol=6e-6, rtol=0)
    torch.testing.assert_close(model.loss_fn(logits, tokens, mask, per_token=True).double(), nll * valid,
                               atol=6e-6, rtol=0)
    with pytest.raises(ValueError, match=r"tokens have shape \(2, 5\)"):
        model.loss_fn(logits, tokens[:, :5])
    with pytest.raises(ValueError, match="token id 50 is outside"):
        model.loss_fn(logits, tokens.clamp(max=49) + (tokens == tokens.max()).long())


def test_loss_fn_equals_the_forwards_loss(model):
    with torch.no_grad():
        logits, loss = model(["Elizabeth read the letter", "It was"], return_type="both")
        tokens, mask = model.tokenize(["Elizabeth read the letter", "It was"])
        assert torch.equal(model.loss_fn(logits, tokens, mask), loss)


# -- tokens_to_residual_directions, accumulated_bias, all_head_labels ----------------------------
def test_tokens_to_residual_directions_are_unembedding_columns(model):
    W_U = model.W_U
    world = model.to_single_token(" world")
    assert torch.equal(model.tokens_to_residual_directions(" world"), W_U[:, world])
    assert torch.equal(model.tokens_to_residual_directions(7), W_U[:, 7])
    for one in (torch.tensor(7), torch.tensor([7]), torch.tensor([[7]]), np.array([7])):
        assert torch.equal(model.tokens_to_residual_directions(one), W_U[:, 7])  # [d_model], as TransformerLens
    ids = torch.tensor([[3, 11, 50256], [0, 5, 5]])
    directions = model.tokens_to_residual_directions(ids)
    assert directions.shape == (2, 3, 16)
    for b in range(2):
        for p in range(3):
            assert torch.equal(directions[b, p], W_U[:, ids[b, p]])
    assert model.tokens_to_residual_directions(7).data_ptr() == W_U[:, 7].data_ptr()  # a view, no copy
    with pytest.raises(ValueError, match="token id 50257 is outside"):
        model.tokens_to_residual_directions(torch.tensor([1, 50257]))
    with pytest.raises(ValueError, match="integer"):
        model.tokens_to_residual_directions(torch.tensor([1.0, 2.0]))
    with pytest.raises(TokenInputError, match="not one"):
        model.tokens_to_residual_directions(" hello world")


def test_accumulated_bias_sums_the_output_biases(model):
    b_O = [block.attn.b_O for block in model.blocks]
    b_out = [block.mlp.b_out for block in model.blocks]
    assert torch.equal(model.accumulated_bias(0), torch.zeros(16))
    torch.testing.assert_close(model.accumulated_bias(2), b_O[0] + b_out[0] + b_O[1] + b_out[1], atol=0, rtol=0)
    torch.testing.assert_close(model.accumulated_bias(1, mlp_input=True), b_O[0] + b_out[0] + b_O[1], atol=0, rtol=0)
    torch.testing.assert_close(model.accumulated_bias(2, include_mlp_biases=False), b_O[0] + b_O[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="layer must be < n_layers=2"):
        model.accumulated_bias(2, mlp_input=True)
    with pytest.raises(ValueError, match="layer=3"):
        model.accumulated_bias(3)
    assert model.all_head_labels() == ["L0H0", "L0H1", "L1H0", "L1H1"]


# -- tokenizer methods ---------------------------------------------------------------------------
def pieces(model, ids):
    return [model.tokenizer.decode([i], clean_up_tokenization_spaces=False) for i in ids]


def test_to_str_tokens_input_kinds_and_shapes(model):
    ids = model.to_tokens("Hello world, it is").tolist()[0]
    assert model.to_str_tokens("Hello world, it is") == pieces(model, ids)
    flat = pieces(model, ids)
    for form in (torch.tensor(ids), torch.tensor([ids]), torch.tensor([[ids]]), torch.tensor(ids)[:, None],
                 np.array(ids), np.array([ids]), ids, tuple(ids)):
        assert model.to_str_tokens(form) == flat
    assert model.to_str_tokens(torch.tensor(15496)) == ["Hello"]
    assert model.to_str_tokens(np.array(15496)) == ["Hello"]
    assert model.to_str_tokens(["Hello world", "Hi"]) == [pieces(model, [50256, 15496, 995]), pieces(model, [50256, 17250])]
    assert model.to_str_tokens([torch.tensor([15496, 995]), [17250]]) == [["Hello", " world"], ["Hi"]]
    assert model.to_str_tokens([]) == []
    assert "".join(model.to_str_tokens("a , b .", prepend_bos=False)) == "a , b ."  # no space clean-up
    with pytest.raises(ValueError, match=r"one sequence.*\(2, 3\)"):
        model.to_str_tokens(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 50257"):
        model.to_str_tokens([1, 50257])
    with pytest.raises(ValueError, match="integer"):
        model.to_str_tokens(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="got int"):
        model.to_str_tokens(5)


def test_to_string_ranks(model):
    assert model.to_string(15496) == "Hello"
    assert model.to_string(torch.tensor(15496)) == "Hello"
    assert model.to_string([15496, 995]) == model.to_string(torch.tensor([15496, 995])) == "Hello world"
    assert model.to_string(np.array([[15496, 995], [17250, 995]])) == ["Hello world", "Hi world"]
    assert model.to_string([[15496], [17250]]) == ["Hello", "Hi"]
    assert model.to_string(torch.tensor([11, 764])) == ", ."  # no clean-up of the space before "."
    with pytest.raises(ValueError, match="rank 0, 1 or 2"):
        model.to_string(torch.zeros(1, 1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="rectangular"):
        model.to_string([[1, 2], [3]])


def test_get_token_position_and_single_tokens(model):
    text = "the cat and the dog and the end"
    tokens = model.to_tokens(text)
    the = model.to_single_token(" the")
    where = (tokens[0] == the).nonzero()[:, 0].tolist()
    assert len(where) == 2
    assert model.get_token_position(" the", text) == where[0]
    assert model.get_token_position(the, text, mode="last") == where[-1]
    assert model.get_token_position(torch.tensor(the), tokens[0]) == where[0]
    assert model.get_token_position(" the", text, prepend_bos=False) == where[0] - 1
    assert model.get_token_position(the, tokens.numpy(), mode="last") == where[-1]
    with pytest.raises(TokenInputError, match="does not occur"):
        model.get_token_position(" horse", text)
    with pytest.raises(AssertionError):  # TransformerLens's error type, too
        model.get_token_position(" horse", text)
    with pytest.raises(TokenInputError, match=r"\[1 pos\].*\(2, 9\)"):
        model.get_token_position(the, tokens.repeat(2, 1))
    with pytest.raises(ValueError, match="mode must be 'first' or 'last'"):
        model.get_token_position(the, text, mode="middle")
    assert model.to_single_str_token(995) == " world"
    with pytest.raises(TypeError, match="one int"):
        model.to_single_str_token(True)


def test_get_token_position_in_a_float_tensor_of_whole_ids(model):
    # TransformerLens's tests pass torch.tensor([2.0, 3, 4]); the positions are read off by hand
    assert model.get_token_position(2, torch.tensor([2.0, 3, 4])) == 0
    assert model.get_token_position(2, torch.tensor([2.0, 3, 4, 2, 5]), mode="last") == 3
    assert model.get_token_position(4, torch.tensor([[2.0, 3, 4]], dtype=torch.float64)) == 2
    assert model.get_token_position(2048, torch.tensor([1.0, 2048.0], dtype=torch.float16)) == 1
    for bad, dtype, match in ((2.5, torch.float32, "2.5"), (float("nan"), torch.float32, "nan"),
                              (2.0 ** 24 + 2, torch.float32, "whole numbers up to 16777216"),
                              (4096.0, torch.float16, "up to 2048")):
        with pytest.raises(ValueError, match=match):
            model.get_token_position(2, torch.tensor([2.0, bad], dtype=dtype))
    with pytest.raises(ValueError, match="integer token ids, got dtype torch.bool"):
        model.get_token_position(1, torch.tensor([True, False]))


def test_to_tokens_truncate_and_device(model):
    long = "word " * 40
    with pytest.raises(ValueError, match="longer than n_ctx=24"):
        model.to_tokens(long)
    cut = model.to_tokens(long, truncate=True)
    full = [50256] + model.tokenizer.encode(long, add_special_tokens=False)
    assert cut.tolist() == [full[:24]]
    assert model.to_tokens(long, truncate=False).tolist() == [full]  # every token, as TransformerLens's
    with pytest.raises(ValueError, match="n_ctx"):
        model(model.to_tokens(long, truncate=False))  # the forward still refuses them
    with pytest.raises(TypeError, match="truncate"):
        model.to_tokens(long, truncate="no")
    assert model.to_tokens("hi", move_to_device=False).device.type == "cpu"
    # padding_side=None: the tokenizer's side (GPT-2's is right), TransformerLens's default
    assert model.tokenize(["a b c", "a"], padding_side=None)[1].tolist()[1] == [True, True, False, False]


# -- generate_tl_style ---------------------------------------------------------------------------
def test_generate_tl_style_greedy_matches_transformers(model):
    hf = model.to_hf().eval()
    prompt = model.to_tokens("Elizabeth read")
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                          eos_token_id=None, pad_token_id=50256)
    ours = generate_tl_style(model, prompt, 8, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(ours, ref)
    assert len(set(ref[0, 3:].tolist())) > 3  # varied text
    text = generate_tl_style(model, "Elizabeth read", 8, do_sample=False, stop_at_eos=False, verbose=False)
    assert text == model.tokenizer.decode(ref[0], skip_special_tokens=True)
    assert torch.equal(generate_tl_style(model, "Elizabeth read", 8, temperature=0.0, stop_at_eos=False,
                                         return_type="tokens", verbose=False), ref)
    embeds = generate_tl_style(model, "Elizabeth read", 8, do_sample=False, stop_at_eos=False,
                               return_type="embeds", verbose=False)
    assert torch.equal(embeds, model.W_E[ref])


def test_generate_tl_style_stop_at_eos_pads_finished_rows(model):
    prompts = ["Elizabeth read the letter", "It was"]
    free = generate_tl_style(model, prompts, 10, do_sample=False, stop_at_eos=False, return_type="tokens",
                             verbose=False)
    width = model.to_tokens(prompts, padding_side="left").shape[1]
    assert torch.equal(free[:, :width], model.to_tokens(prompts, padding_side="left"))  # forced left padding
    eos = int(free[1, width + 2])
    out = generate_tl_style(model, prompts, 10, do_sample=False, eos_token_id=eos, return_type="tokens", verbose=False)
    row0 = free[0, width:].tolist()
    stop0 = row0.index(eos) + 1 if eos in row0 else len(row0)
    assert out.shape[1] <= free.shape[1]
    assert out[0, width:].tolist()[:stop0] == row0[:stop0]
    assert out[1, width:].tolist() == free[1, width: width + 3].tolist() + [eos] * (out.shape[1] - width - 3)
    texts = generate_tl_style(model, prompts, 3, do_sample=False, stop_at_eos=False, verbose=False)
    assert isinstance(texts, list) and len(texts) == 2
    assert isinstance(generate_tl_style(model, ["It was"], 2, do_sample=False, verbose=False), str)


def test_generate_tl_style_progress_bar_logits_and_refusals(model, capsys):
    generate_tl_style(model, "It was", 3, do_sample=False, stop_at_eos=False)
    assert "3/3" in capsys.readouterr().err
    generate_tl_style(model, "It was", 3, do_sample=False, stop_at_eos=False, verbose=False)
    assert capsys.readouterr().err == ""
    out = generate_tl_style(model, "It was", 3, do_sample=False, stop_at_eos=False, verbose=False, output_logits=True)
    assert out.sequences.shape == (1, 6) and len(out.logits) == 3
    assert torch.equal(out.logits[0].argmax(-1), out.sequences[:, 3])
    with pytest.raises(ValueError, match="return_type"):
        generate_tl_style(model, "It was", 2, return_type="logits")
    with pytest.raises(TypeError, match="num_beams"):
        generate_tl_style(model, "It was", 2, num_beams=2)
    with pytest.raises(ValueError, match="freq_penalty needs the prompt's tokens"):
        generate_tl_style(model, torch.zeros(1, 3, 16), 2, freq_penalty=1.0)
    bare = seeded(2, d_vocab=31, n_ctx=12)
    with pytest.raises(ValueError, match="stop_at_eos=True needs an eos_token_id"):
        generate_tl_style(bare, torch.tensor([[1, 2]]), 2)
    assert generate_tl_style(bare, torch.tensor([[1, 2]]), 2, stop_at_eos=False, verbose=False).shape == (1, 4)


def test_freq_penalty_forbids_repeats_when_huge(model):
    prompt = model.to_tokens("the the the")
    torch.manual_seed(0)
    out = model.generate(prompt, 12, do_sample=True, freq_penalty=1e6, eos_token_id=None)
    new = out[0, 4:].tolist()
    assert len(set(new)) == 12 and not set(new) & set(prompt[0].tolist())
    with pytest.raises(ValueError, match="freq_penalty.*do_sample=False"):
        model.generate(prompt, 2, freq_penalty=1.0)
    with pytest.raises(ValueError, match="freq_penalty must be"):
        model.generate(prompt, 2, do_sample=True, freq_penalty=-1.0)


def test_generate_from_embeds_equals_generate_from_the_tokens(model):
    prompt = model.to_tokens(["Elizabeth read the", "It was a dark"], padding_side="left")[:, 1:]  # no pads
    expected = model.generate(prompt, 6, eos_token_id=None)
    new, embeds = generate_from_embeds(model, model.W_E[prompt].detach(), 6, eos_token_id=None)
    assert torch.equal(new, expected[:, prompt.shape[1]:])
    assert torch.equal(embeds, model.W_E[expected])
    assert torch.equal(generate_tl_style(model, model.W_E[prompt].detach(), 6, do_sample=False, stop_at_eos=False,
                                         return_type="tokens", verbose=False), new)
    assert generate_tl_style(model, model.W_E[prompt].detach(), 6, do_sample=False, stop_at_eos=False,
                             verbose=False).shape == (2, prompt.shape[1] + 6, 16)
    seen = []
    with model.hooks(fwd_hooks=[("hook_pos_embed", lambda x, hook: seen.append(hook.ctx["step"]))]):
        generate_from_embeds(model, model.W_E[prompt[:1]].detach(), 3, eos_token_id=None)
    assert seen == [0, 1, 2] and all("step" not in p.ctx for p in model.hook_dict.values())
    with pytest.raises(ValueError, match="float64.*float32"):
        generate_from_embeds(model, model.W_E[prompt].detach().double(), 2)
    with pytest.raises(ValueError, match="exceed n_ctx=24"):
        generate_from_embeds(model, model.W_E[prompt].detach(), 24)


def test_a_masked_minus_infinity_logit_does_not_reach_the_loss(model):
    torch.manual_seed(0)
    logits = torch.randn(1, 3, model.cfg.d_vocab)
    tokens = torch.tensor([[1, 3, 2]])
    logits[0, 1, 2] = float("-inf")  # the log-probability of the masked target is -inf
    mask = torch.tensor([[True, True, False]])
    loss = model.loss_fn(logits, tokens, attention_mask=mask)
    by_hand = -torch.log_softmax(logits[0, 0], -1)[3]  # the one real (input, target) pair
    assert torch.isfinite(loss) and abs(float(loss - by_hand)) < 1e-6  # float32 rounding: measured 0
