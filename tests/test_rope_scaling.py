"""Rope scaling ("linear", "dynamic", "llama3", "yarn") against transformers' own Llama.

The oracles are transformers 5.x's LlamaRotaryEmbedding (its tables, its dynamic state) and
LlamaForCausalLM (eager, seeded random weights, norms perturbed away from 1) with rope_parameters of
each type. The glassbox model gets the same weights through ``llama_to_glassbox`` and its Config
states the scaling itself (``rope_scaling``, with ``original_max_position_embeddings`` for the
dynamic type: transformers' max_position_embeddings), with n_ctx past it.

Float64: transformers' Llama computes its rope frequencies, tables, RMSNorm and softmax in float32
whatever the model's dtype, so its float64 model agrees with ours to float32 rounding only. For a
float64 oracle, ``hf_in_float64`` runs transformers' own code (modeling_rope_utils' formulas and
dynamic update, modeling_llama's forward) with its float32 read as float64; that oracle agrees with
the unchanged float32 one to float32 rounding (both comparisons below), and with ours to ~1e-15.

The sequences run past original_max_position_embeddings (and, for the dynamic type, through its
grow / keep / reset states in that order), and every case is checked to exercise its scaling
(``test_each_case_exercises_its_scaling``) so that an unscaled table cannot pass.
Errors measured on this machine (max |error|; logits up to 5.6, tables up to 1.14; generation: the
logits each new token was chosen from, against hf.generate's):
  case                    tables f32   tables f64   logits f32   logits f64   generation f32
  linear                  1.1e-6       2.8e-17      7.5e-6       1.1e-14
  dynamic                 1.6e-6       2.8e-17      6.0e-6       7.3e-15      5.4e-6
  llama3                  8.4e-7       1.4e-17      9.1e-6       1.2e-14      4.3e-6
  yarn                    4.2e-7       0            6.1e-6       9.5e-15
  yarn_ramp               9.5e-7       0            9.3e-6       1.1e-14      4.3e-6
  yarn_attention_factor   4.5e-7       0            6.6e-6       9.8e-15
Half precision (mean |error| over the forwards, ours / transformers'): dynamic 0.92 in bfloat16 and
0.88 in float16, yarn_ramp 0.83 and 0.90 (the Llama family's tests cover the other types).
"""

import contextlib
import copy
import math

import pytest
import torch

from conftest import perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.models.positional import RotaryTable, rope_parameters_for_hf, rope_scaling_from_hf
from glassbox.weights.llama import config_from_llama, llama_to_glassbox

SIZES = dict(hidden_size=21, num_attention_heads=3, head_dim=12, intermediate_size=37, vocab_size=29,
             num_hidden_layers=2)
BASE, N_CTX, ROTARY_DIM = 500.0, 64, 12

# name: (transformers' max_position_embeddings, its rope_parameters without rope_theta).
CASES = {
    "linear": (40, {"rope_type": "linear", "factor": 2.5}),
    # scaling starts after 11 positions
    "dynamic": (11, {"rope_type": "dynamic", "factor": 2.5}),
    # wavelengths 6.3 (kept: < 32 / 4), 17.7 (blended), 50 to 1113 (slowed: > 32 / 1)
    "llama3": (40, {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 32,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    # truncated correction range [0, 1]: pair 0 kept, the others slowed; attention factor 1 + 0.1 ln 4
    "yarn": (64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    # untruncated range [0.23, 2.24]: pairs 1 and 2 blended; attention factor from mscale / mscale_all_dim
    "yarn_ramp": (64, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                       "beta_fast": 2, "beta_slow": 0.25, "truncate": False, "mscale": 0.9,
                       "mscale_all_dim": 0.5}),
    "yarn_attention_factor": (48, {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 16,
                                   "attention_factor": 0.8, "beta_fast": 16.0}),
}
# Table lengths in this order take the dynamic type through grow (30), keep (20: 30's frequencies),
# reset (10 < 11), grow again (25) and past n_ctx's first table size (64).
LENGTHS = (8, 30, 20, 10, 25, 64)
FORWARDS = (30, 20, 8, 25)  # forward lengths: grow, keep, reset, grow


def glassbox_scaling(name) -> dict:
    mpe, rope = CASES[name]
    return dict(rope, original_max_position_embeddings=mpe) if rope["rope_type"] == "dynamic" else dict(rope)


def hf_config(name):
    from transformers import LlamaConfig

    mpe, rope = CASES[name]
    return LlamaConfig(**SIZES, max_position_embeddings=mpe, rope_parameters={**rope, "rope_theta": BASE},
                       initializer_range=0.3, rms_norm_eps=1e-5, attn_implementation="eager", bos_token_id=1,
                       eos_token_id=2)


def make_hf(name, seed=0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_config(name))
    perturb_vectors(model)
    return model.eval()


def glassbox_twin(hf, name, dtype=torch.float32):
    """Our model with hf's weights; its Config built from an unscaled copy of hf's config, then given
    the scaling and room past transformers' max_position_embeddings."""
    from transformers import LlamaConfig

    unscaled = LlamaConfig(**{**hf.config.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": BASE}})
    cfg = config_from_llama(unscaled).replace(n_ctx=N_CTX, rope_scaling=glassbox_scaling(name))
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(llama_to_glassbox(hf.state_dict(), cfg), strict=True)
    return model.to(dtype).eval()


class _Float64Torch:
    """``torch`` for transformers' modules with float32 read as float64 (everything else is torch's)."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def hf_in_float64():
    """Inside: transformers' rope formulas and Llama forward compute in float64 (their own code)."""
    import transformers.modeling_rope_utils as rope_utils
    from transformers.models.llama import modeling_llama

    saved, default = (rope_utils.torch, modeling_llama.torch), torch.get_default_dtype()
    rope_utils.torch = modeling_llama.torch = _Float64Torch()
    torch.set_default_dtype(torch.float64)  # the dynamic update's int * float tensors
    try:
        yield
    finally:
        rope_utils.torch, modeling_llama.torch = saved
        torch.set_default_dtype(default)


def hf_float64_twin(hf):
    """A float64 copy of hf whose rotary embedding was built in float64 (call it inside hf_in_float64)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf64 = copy.deepcopy(hf).to(torch.float64)
    hf64.model.rotary_emb = LlamaRotaryEmbedding(hf64.config)
    assert hf64.model.rotary_emb.inv_freq.dtype == torch.float64
    return hf64


def ours_both_halves(table, length, dtype, positions):
    """Our (cos, sin) [length rotary_dim] in transformers' layout (the "half" pairing's two halves)."""
    cos, sin = table.tables(length, torch.device("cpu"), dtype, positions)
    return torch.cat([cos[:length]] * 2, -1), torch.cat([sin[:length]] * 2, -1)


def max_err(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


# -- the tables, against transformers' rotary embedding -----------------------------------------
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_tables_equal_transformers_rotary_embedding(name, precision):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    dtype = getattr(torch, precision)
    context = hf_in_float64() if precision == "float64" else contextlib.nullcontext()
    table = RotaryTable(N_CTX, ROTARY_DIM, BASE, glassbox_scaling(name))
    with context:
        theirs = LlamaRotaryEmbedding(hf_config(name))
        assert table.attention_factor == theirs.attention_scaling
        for length in LENGTHS:
            positions = torch.arange(length)[None]
            cos, sin = theirs(torch.zeros(1, length, ROTARY_DIM, dtype=dtype), positions)
            our_cos, our_sin = ours_both_halves(table, length, dtype, positions)
            assert our_cos.dtype == cos.dtype == dtype
            err = max(max_err(our_cos, cos[0]), max_err(our_sin, sin[0]))
            if precision == "float32":
                # measured <= 1.6e-6 (tables up to 1.14; float32 angles p * inv_freq); bound 2e-5, 12x
                assert err < 2e-5, (name, length, err)
            else:
                # measured <= 2.8e-17; bound 3e-16, 11x
                assert err < 3e-16, (name, length, err)
            if table.dynamic:
                assert table.frequencies_length == int(theirs.max_seq_len_cached), (length, table.frequencies_length)


def test_each_case_exercises_its_scaling():
    """transformers' own frequencies (relative to the unscaled ones) show each scaling acts here."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    unscaled = BASE ** (-torch.arange(0, ROTARY_DIM, 2, dtype=torch.float64) / ROTARY_DIM)

    def ratio(name, grow_to=None):
        emb = LlamaRotaryEmbedding(hf_config(name))
        if grow_to:
            emb(torch.zeros(1, grow_to, ROTARY_DIM), torch.arange(grow_to)[None])
        return (emb.inv_freq.double() / unscaled).tolist(), emb.attention_scaling

    def kinds(ratios, factor):
        return ["kept" if math.isclose(r, 1, rel_tol=1e-5) else "slowed" if math.isclose(r, 1 / factor, rel_tol=1e-5)
                else "blended" if 1 / factor < r < 1 else "other" for r in ratios]

    assert kinds(ratio("linear")[0], 2.5) == ["slowed"] * 6
    assert kinds(ratio("llama3")[0], 4.0) == ["kept", "blended"] + ["slowed"] * 4
    assert ratio("yarn") == (pytest.approx([1] + [0.25] * 5, rel=1e-5), 1 + 0.1 * math.log(4))
    ramp, factor = ratio("yarn_ramp")
    assert kinds(ramp, 4.0) == ["kept", "blended", "blended", "slowed", "slowed", "slowed"]
    assert factor == pytest.approx((0.09 * math.log(4) + 1) / (0.05 * math.log(4) + 1), rel=1e-12)
    assert ratio("yarn_attention_factor")[1] == 0.8
    before, after = ratio("dynamic")[0], ratio("dynamic", grow_to=30)[0]
    assert kinds(before, 2.5) == ["kept"] * 6 and after[0] == 1 and all(r < 1 - 1e-3 for r in after[1:])


# -- full logits against LlamaForCausalLM ------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_logits_equal_transformers_llama(name, precision):
    hf = make_hf(name)
    gen = torch.Generator().manual_seed(1)
    if precision == "float32":
        ours, theirs, context = glassbox_twin(hf, name), hf, contextlib.nullcontext
    else:
        context = hf_in_float64
        with context():
            theirs = hf_float64_twin(hf)
        ours = glassbox_twin(hf, name, torch.float64)
    for length in FORWARDS:  # one pair of models through the sequence: the dynamic state carries over
        tokens = torch.randint(0, SIZES["vocab_size"], (2, length), generator=gen)
        with torch.no_grad(), context():
            expected = theirs(tokens).logits
        with torch.no_grad():
            got = ours(tokens)
        assert expected.abs().max() > 1.0, "logits too small for the comparison to mean anything"
        err = max_err(got, expected)
        if precision == "float32":
            # measured <= 9.3e-6 (logits up to 5.6); bound 1e-4, 11x
            assert err < 1e-4, (name, length, err)
        else:
            # measured <= 1.2e-14 (logits up to 5.6); bound 1.5e-13, 12x
            assert err < 1.5e-13, (name, length, err)
    if ours.blocks[0].attn.rotary.dynamic:
        assert ours.blocks[0].attn.rotary.frequencies_length == 25 == int(theirs.model.rotary_emb.max_seq_len_cached)


# measured ours / transformers': dynamic 0.92 (bfloat16) and 0.88 (float16), yarn_ramp 0.83 and 0.90
# (mean |error| 0.020..0.027 in bfloat16, 2.7e-3..3.2e-3 in float16). Required: <= 1.2.
@pytest.mark.parametrize("name", ["dynamic", "yarn_ramp"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_no_worse_than_transformers(name, dtype):
    """Mean |logit error| over the forwards (the dynamic type past its boundary) against the float64
    oracle: ours <= 1.2 x transformers' own in the same dtype (the same rounded weights)."""
    hf = make_hf(name)
    with hf_in_float64():
        reference_model = hf_float64_twin(hf)
    half, ours = copy.deepcopy(hf).to(dtype), glassbox_twin(hf, name, dtype)
    gen = torch.Generator().manual_seed(1)
    theirs_err, ours_err = [], []
    for length in FORWARDS:
        tokens = torch.randint(0, SIZES["vocab_size"], (2, length), generator=gen)
        with torch.no_grad():
            with hf_in_float64():
                reference = reference_model(tokens).logits
            theirs_err.append((half(tokens).logits.double() - reference).abs().flatten())
            ours_err.append((ours(tokens).double() - reference).abs().flatten())
    theirs, mine = float(torch.cat(theirs_err).mean()), float(torch.cat(ours_err).mean())
    assert theirs > 0, "transformers' half-precision logits equal the float64 ones: nothing measured"
    assert mine <= 1.2 * theirs, f"{dtype}: our mean error {mine:.3g} vs transformers' {theirs:.3g}"


# -- generation with the key-value cache -------------------------------------------------------
NEW = 12


@pytest.mark.parametrize("name", ["dynamic", "llama3", "yarn_ramp"])
def test_greedy_generation_equals_transformers_generate(name):
    """Left-padded prompts of 9, 5 and 7 tokens continued by 12 (past the dynamic type's 11):
    the tokens equal hf.generate's, and so do the logits each was chosen from (transformers' cache
    keeps each key's rotation, as ours does)."""
    hf = make_hf(name, seed=2)
    ours = glassbox_twin(hf, name)
    gen = torch.Generator().manual_seed(3)
    lengths = (9, 5, 7)
    width = max(lengths)
    tokens = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        tokens[i, width - n:], mask[i, width - n:] = torch.randint(0, SIZES["vocab_size"], (n,), generator=gen), True
    with torch.no_grad():
        ref = hf.generate(tokens, attention_mask=mask.long(), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    out, logits = ours.generate(tokens, NEW, attention_mask=mask, eos_token_id=None, output_logits=True)
    assert torch.equal(out, ref.sequences)
    assert len(set(out[:, width:].flatten().tolist())) > 5, "the generations are one repeated token"
    err = max_err(logits, torch.stack(ref.logits, 1))
    # measured <= 5.4e-6 (logits up to 4.4); bound 6e-5, 11x
    assert err < 6e-5, (name, err)
    if name == "dynamic":
        # Recomputing without a cache rotates every key with the last step's frequencies: different
        # logits, so the comparison above does tell a cached key's old rotation from a new one.
        _, recomputed = ours.generate(tokens, NEW, attention_mask=mask, eos_token_id=None, output_logits=True,
                                      use_past_kv_cache=False)
        assert max_err(recomputed[:, -1], logits[:, -1]) > 1e-3  # measured 4.5


# -- transformers' rope_parameters, both ways ---------------------------------------------------
@pytest.mark.parametrize("name", CASES)
def test_rope_parameters_map_to_rope_scaling_and_back(name):
    """From a config's (standardized) rope_parameters to rope_scaling, and back to a config whose
    rotary embedding computes transformers' original tables bit for bit."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    original = hf_config(name)
    scaling = rope_scaling_from_hf(original.rope_parameters, original.max_position_embeddings)
    assert scaling == glassbox_scaling(name)
    params, max_positions = rope_parameters_for_hf(scaling, BASE)
    assert (max_positions is not None) == (name == "dynamic")
    back = LlamaConfig(**SIZES, max_position_embeddings=max_positions or 99, rope_parameters=params)
    theirs, again = LlamaRotaryEmbedding(original), LlamaRotaryEmbedding(back)
    for length in LENGTHS:
        x, positions = torch.zeros(1, length, ROTARY_DIM), torch.arange(length)[None]
        assert all(torch.equal(a, b) for a, b in zip(theirs(x, positions), again(x, positions))), length


def test_rope_parameters_mapping_fills_and_refuses_as_transformers_reads_them():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    assert rope_scaling_from_hf(None, 11) is None
    assert rope_scaling_from_hf({"rope_type": "default", "rope_theta": 5.0}, 11) is None
    assert rope_scaling_from_hf({"type": "linear", "factor": 2.0, "partial_rotary_factor": 1.0}, 11) == {
        "rope_type": "linear", "factor": 2.0}
    assert rope_scaling_from_hf({"rope_type": "yarn", "factor": 2.0}, 32) == {
        "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}
    # transformers' dynamic scaling starts after max_position_embeddings whatever the dict says:
    stated = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 5}
    assert rope_scaling_from_hf(stated, 11)["original_max_position_embeddings"] == 11
    emb = LlamaRotaryEmbedding(LlamaConfig(**SIZES, max_position_embeddings=11, rope_parameters=stated))
    emb(torch.zeros(1, 9, ROTARY_DIM), torch.arange(9)[None])
    assert emb.max_seq_len_cached == 11  # 9 > 5 positions did not scale
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 \(rope_type 'llama3'\) is Config.rotary_dim"):
        rope_scaling_from_hf({"rope_type": "llama3", "factor": 2.0, "partial_rotary_factor": 0.5}, 11)


def test_dynamic_generation_from_a_prompt_past_the_boundary_equals_transformers():
    """A 14-token prompt (past the 11 positions) is rotated with 14-position frequencies, each new
    token with its own length's; after it, a short prompt resets both models alike."""
    hf = make_hf("dynamic", seed=5)
    ours = glassbox_twin(hf, "dynamic")
    gen = torch.Generator().manual_seed(6)
    for length in (14, 6):
        prompt = torch.randint(0, SIZES["vocab_size"], (1, length), generator=gen)
        with torch.no_grad():
            ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        out, logits = ours.generate(prompt, 8, eos_token_id=None, output_logits=True)
        assert torch.equal(out, ref.sequences), length
        err = max_err(logits, torch.stack(ref.logits, 1))
        # measured <= 3.1e-6 (logits up to 4.8); bound 3e-5, 10x
        assert err < 3e-5, (length, err)
        assert ours.blocks[0].attn.rotary.frequencies_length == int(hf.model.rotary_emb.max_seq_len_cached)


# -- the table: growth, sharing, casts ---------------------------------------------------------
@pytest.mark.parametrize("name", ["linear", "llama3", "yarn_ramp"])
def test_static_tables_grow_by_doubling_and_rows_do_not_depend_on_size(name):
    grown = RotaryTable(3000, ROTARY_DIM, BASE, glassbox_scaling(name))
    whole_cos, whole_sin = RotaryTable(3000, ROTARY_DIM, BASE, glassbox_scaling(name)).tables(
        3000, torch.device("cpu"), torch.float64)
    for length, rows in ((1, 64), (5, 64), (65, 128), (200, 256), (129, 256), (1500, 1500), (1501, 3000)):
        cos, sin = grown.tables(length, torch.device("cpu"), torch.float64)
        assert grown.rows == cos.shape[0] == rows, (length, grown.rows)
        assert torch.equal(cos, whole_cos[:rows]) and torch.equal(sin, whole_sin[:rows]), length


def test_layers_share_one_table_and_equal_scalings_have_equal_keys():
    hf = make_hf("dynamic")
    model = glassbox_twin(hf, "dynamic")
    assert len({id(block.attn.rotary) for block in model.blocks}) == 1
    keys = {name: RotaryTable(N_CTX, ROTARY_DIM, BASE, glassbox_scaling(name)).key for name in CASES}
    assert len(set(keys.values())) == len(CASES)
    assert RotaryTable(N_CTX, ROTARY_DIM, BASE, dict(glassbox_scaling("yarn"))).key == keys["yarn"]
    assert RotaryTable(N_CTX, ROTARY_DIM, BASE).key != keys["linear"]


def test_dynamic_state_changes_renew_every_cast_copy():
    """After the frequencies change, every (device, dtype) copy is the new one, not a stale cast."""
    table = RotaryTable(N_CTX, ROTARY_DIM, BASE, glassbox_scaling("dynamic"))
    cpu = torch.device("cpu")
    short32, _ = table.tables(8, cpu, torch.float32)
    short64, _ = table.tables(8, cpu, torch.float64)
    long32, _ = table.tables(30, cpu, torch.float32)
    long64, _ = table.tables(30, cpu, torch.float64)
    assert torch.equal(long32, long64.float()) and not torch.equal(long64[:8], short64[:8])
    again64, _ = table.tables(8, cpu, torch.float64)  # reset: the original frequencies again
    again32, _ = table.tables(8, cpu, torch.float32)
    assert torch.equal(again64[:8], short64[:8]) and torch.equal(again32[:8], short32[:8])
    assert not torch.equal(again32[:8], long32[:8])


def test_a_dynamic_table_read_from_threads_gives_cos_and_sin_of_one_state():
    """Threads move the frequencies back and forth; every (cos, sin) returned is one state's pair
    (cos^2 + sin^2 = 1 row by row to float32 rounding, ~1e-7; a cos of one state with a sin of
    another is off by up to ~1 at the long rows)."""
    import threading

    table = RotaryTable(N_CTX, ROTARY_DIM, BASE, glassbox_scaling("dynamic"))
    failures = []

    def read(lengths):
        for length in lengths:
            for dtype in (torch.float32, torch.float64):
                cos, sin = table.tables(length, torch.device("cpu"), dtype)
                if cos.shape != sin.shape or cos.shape[0] < length or \
                        float((cos.double() ** 2 + sin.double() ** 2 - 1).abs().max()) > 1e-6:
                    failures.append((length, dtype, cos.shape, sin.shape))

    threads = [threading.Thread(target=read, args=([8, 30, 12, 45, 5, 20, 64, 9] * 20,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# -- refusals ----------------------------------------------------------------------------------
REFUSED = [
    ({"rope_type": "ntk", "factor": 2.0}, r"rope_type='ntk' is not one of \('linear', 'dynamic', 'llama3', 'yarn'\)"),
    ({"factor": 2.0}, r"rope_type=None is not one of"),
    ({"rope_type": "linear"}, r"rope_type 'linear'\): missing key 'factor'"),
    ({"rope_type": "dynamic", "factor": 2.0},
     r"rope_type 'dynamic'\): missing key 'original_max_position_embeddings' \(for 'dynamic': transformers' "
     r"max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 2.0}, r"rope_type 'yarn'\): missing key 'original_max_position_embeddings'"),
    ({"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 8, "low_freq_factor": 1.0},
     r"rope_type 'llama3'\): missing key 'high_freq_factor'"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, r"rope_type 'linear'\): unknown key 'beta_fast'"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0},
     r"rope_type 'linear'\): key 'rope_theta' does not belong in the dict; it is Config.rotary_base"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "partial_rotary_factor": 0.5},
     r"rope_type 'yarn'\): key 'partial_rotary_factor' does not belong in the dict; it is Config.rotary_dim"),
    ({"type": "linear", "rope_type": "linear", "factor": 2.0}, r"key 'type' does not belong.*old name of 'rope_type'"),
    ({"rope_type": "linear", "factor": 0.5}, r"rope_type 'linear'\): factor=0.5 must be a finite number >= 1"),
    ({"rope_type": "linear", "factor": True}, r"factor=True must be a finite number >= 1"),
    ({"rope_type": "linear", "factor": "2"}, r"factor='2' must be a finite number >= 1"),
    ({"rope_type": "dynamic", "factor": math.inf, "original_max_position_embeddings": 8},
     r"rope_type 'dynamic'\): factor=inf must be"),
    ({"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8.0},
     r"rope_type 'dynamic'\): original_max_position_embeddings=8.0 must be a positive int"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": None},
     r"rope_type 'yarn'\): original_max_position_embeddings=None must be a positive int"),
    ({"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
      "high_freq_factor": None}, r"high_freq_factor=None must be a finite number > low_freq_factor=1.0"),
    ({"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 8, "low_freq_factor": 4.0,
      "high_freq_factor": 4.0}, r"rope_type 'llama3'\): high_freq_factor=4.0 must be a finite number > "
                                r"low_freq_factor=4.0"),
    ({"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 8, "low_freq_factor": 0,
      "high_freq_factor": 4.0}, r"low_freq_factor=0 must be a finite number > 0"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "beta_fast": 1, "beta_slow": 2},
     r"rope_type 'yarn'\): beta_fast=1 must be >= beta_slow=2"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "beta_slow": 64},
     r"beta_fast=32 must be >= beta_slow=64 \(defaults 32 and 1\)"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "attention_factor": -1.0},
     r"rope_type 'yarn'\): attention_factor=-1.0 must be a finite number > 0"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "truncate": None},
     r"rope_type 'yarn'\): truncate=None must be True or False"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "mscale": "1"},
     r"mscale='1' must be a finite number"),
    ({"rope_type": "yarn", "factor": math.e, "original_max_position_embeddings": 8, "mscale": 1.0,
      "mscale_all_dim": -10.0}, r"mscale=1.0 and mscale_all_dim=-10.0 give the attention factor inf, not > 0"),
]


@pytest.mark.parametrize("scaling,message", REFUSED)
def test_bad_scalings_are_refused_naming_the_key_and_the_rope_type(scaling, message):
    with pytest.raises(ValueError, match=message):
        RotaryTable(N_CTX, ROTARY_DIM, BASE, scaling)


def test_refusals_that_depend_on_the_rotation_and_the_model_level_refusal():
    with pytest.raises(ValueError, match=r"rope_type 'dynamic'\): rotary_dim=2 must be > 2"):
        RotaryTable(N_CTX, 2, BASE, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match=r"rope_type 'yarn'\): rotary_base=1 is refused"):
        RotaryTable(N_CTX, ROTARY_DIM, 1.0, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8})
    cfg = glassbox_twin(make_hf("linear"), "linear").cfg
    with pytest.raises(ValueError, match=r"rope_type 'linear'\): unknown key 'low_freq_factor'"):
        HookedTransformer(cfg.replace(rope_scaling={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}))
