"""An SAE never computes a silently different number: non-finite tensors and hand-edited configs.

NaN, +inf or -inf in any parameter or buffer of any architecture (in ``sae_weights.safetensors``),
in the statistics folded in on load (``activation_scaler.json``, ``activation_whitening.safetensors``),
in ``sparsity.safetensors``, a weight that overflows the dtype asked for, and an SAE built in Python
with a non-finite parameter and spliced (``add_sae``): each is refused naming the file (or hook) and
the key. Config fields of the wrong JSON type (``"false"`` for a bool, a list for the architecture,
a string for ``k``...), contradicting fields and out-of-range values are refused naming file and key,
and nothing is spliced or left changed.
"""

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from glassbox.interp.sae.architectures import make_sae
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.format import load_sae, load_sparsity, save_sae
from glassbox.models import Config, HookedTransformer
from glassbox.train.sae import train_sae

D_IN, D_SAE = 24, 37
HOOK = "blocks.0.hook_resid_pre"
TC = dict(hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out", apply_b_dec_to_input=False,
          d_out=D_IN)
ARCHS = {
    "standard": {}, "topk": dict(k=5), "jumprelu": {}, "gated": {}, "transcoder": TC, "skip_transcoder": TC,
    "jumprelu_transcoder": TC, "jumprelu_skip_transcoder": TC,
}
BAD = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def build(arch, **extra):
    kw = {**ARCHS.get(arch, {}), **extra}
    sae = make_sae(SAEConfig(arch, D_IN, D_SAE, kw.pop("hook_name", HOOK), **kw))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return sae


def tensors_of(folder):
    with safe_open(str(folder / "sae_weights.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def saved(tmp_path, arch="standard", name="s", **extra):
    folder = tmp_path / name
    save_sae(build(arch, **extra), folder)
    return folder


def edit_cfg(folder, edit):
    cfg = json.loads((folder / "cfg.json").read_text())
    edit(cfg)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def tiny_model():
    torch.manual_seed(0)
    return HookedTransformer(Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16))


# -- non-finite tensors in the weights file ------------------------------------------------------
def cases():
    for arch in ARCHS:
        for key in build(arch).state_dict():
            yield arch, key


@pytest.mark.parametrize("arch,key", list(cases()))
@pytest.mark.parametrize("bad", list(BAD))
def test_non_finite_weight_is_refused_naming_file_and_key(tmp_path, arch, key, bad):
    folder = saved(tmp_path, arch)
    t = tensors_of(folder)
    t[key].view(-1)[min(3, t[key].numel() - 1)] = BAD[bad]
    save_file(t, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match=rf"sae_weights\.safetensors: key '{key}' holds 1 non-finite value"):
        load_sae(folder)


def test_non_finite_batchtopk_threshold_is_refused(tmp_path):
    folder = edit_cfg(saved(tmp_path, "topk"), lambda c: c.update(architecture="batchtopk", k=4.0))
    t = tensors_of(folder)
    t["topk_threshold"] = torch.tensor(float("nan"), dtype=torch.float64)
    save_file(t, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match=r"key 'topk_threshold' holds 1 non-finite value"):
        load_sae(folder)
    t["topk_threshold"] = torch.tensor(0.5, dtype=torch.float64)
    save_file(t, str(folder / "sae_weights.safetensors"))
    assert float(load_sae(folder).topk_threshold) == 0.5


def test_weight_overflowing_the_dtype_asked_for_is_refused(tmp_path):
    folder = saved(tmp_path)
    t = tensors_of(folder)
    t["W_dec"][2, 5] = 1e6  # finite in float32, inf in float16 (max 65504)
    save_file(t, str(folder / "sae_weights.safetensors"))
    assert torch.isfinite(load_sae(folder).W_dec).all()
    assert load_sae(folder, dtype=torch.bfloat16).W_dec.isfinite().all()  # bfloat16 holds 1e6
    with pytest.raises(ValueError, match=r"key 'W_dec' .*float16"):
        load_sae(folder, dtype=torch.float16)


# -- the statistics folded in on load ------------------------------------------------------------
@pytest.mark.parametrize("factor", [float("nan"), float("inf"), -2.0, 0.0, "2.0", True, [2.0]])
def test_bad_scaling_factor_is_refused(tmp_path, factor):
    folder = edit_cfg(saved(tmp_path), lambda c: c.update(normalize_activations="expected_average_only_in"))
    (folder / "activation_scaler.json").write_text(json.dumps({"scaling_factor": factor}))
    with pytest.raises(ValueError, match="activation_scaler.json does not give.*scaling_factor="):
        load_sae(folder)


def test_fold_that_overflows_is_refused(tmp_path):
    folder = edit_cfg(saved(tmp_path), lambda c: c.update(normalize_activations="expected_average_only_in"))
    (folder / "activation_scaler.json").write_text(json.dumps({"scaling_factor": 1e38}))  # W_enc * 1e38: inf
    with pytest.raises(ValueError, match=r"activation_scaler\.json.*W_enc.*non-finite"):
        load_sae(folder)


@pytest.mark.parametrize("key", ["mean", "matrix", "inverse_matrix"])
def test_non_finite_whitening_statistics_are_refused(tmp_path, key):
    folder = edit_cfg(saved(tmp_path), lambda c: c.update(normalize_activations="covariance_whitening"))
    (folder / "activation_scaler.json").write_text(json.dumps({"scaling_factor": None, "has_whitening": True}))
    stats = {"mean": torch.zeros(D_IN), "matrix": torch.eye(D_IN), "inverse_matrix": torch.eye(D_IN)}
    save_file(stats, str(folder / "activation_whitening.safetensors"))
    assert torch.equal(load_sae(folder).W_enc, tensors_of(folder)["W_enc"])  # the identity whitening
    stats[key].view(-1)[1] = float("nan")
    save_file(stats, str(folder / "activation_whitening.safetensors"))
    with pytest.raises(ValueError, match=rf"activation_whitening\.safetensors: key '{key}' holds 1 non-finite"):
        load_sae(folder)


# -- sparsity.safetensors --------------------------------------------------------------------------
def test_sparsity_nan_positive_or_misshapen_is_refused(tmp_path):
    folder = saved(tmp_path)
    good = torch.linspace(-10, 0, D_SAE)
    good[0] = float("-inf")  # log10 of a frequency of 0: a feature that never fired
    good[1] = math.log10(1 + 1e-10)  # a feature firing on every token, as the trainer writes it (+1e-10, float64)
    save_file({"sparsity": good}, str(folder / "sparsity.safetensors"))
    assert torch.equal(load_sparsity(folder), good)
    for value, message in ((float("nan"), "NaN"), (float("inf"), "above 0"), (0.5, "above 0")):
        bad = good.clone()
        bad[4] = value
        save_file({"sparsity": bad}, str(folder / "sparsity.safetensors"))
        with pytest.raises(ValueError, match=rf"sparsity\.safetensors: key 'sparsity' .*{message}"):
            load_sparsity(folder)
    save_file({"sparsity": good[:-1].clone()}, str(folder / "sparsity.safetensors"))
    with pytest.raises(ValueError, match=rf"key 'sparsity' has shape \(36,\).*d_sae={D_SAE}"):
        load_sparsity(folder)


# -- an SAE built in Python and spliced ------------------------------------------------------------
@pytest.mark.parametrize("arch", ["standard", "jumprelu", "gated", "skip_transcoder"])
def test_add_sae_refuses_non_finite_parameters_and_splices_nothing(arch):
    model = tiny_model()
    sae = build(arch)
    key = {"jumprelu": "threshold", "gated": "b_gate", "skip_transcoder": "W_skip"}.get(arch, "b_enc")
    with torch.no_grad():
        getattr(sae, key).view(-1)[0] = float("nan")
    before = model(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match=rf"the SAE at {sae.cfg.hook_name}.*'{key}' holds 1 non-finite"):
        model.add_sae(sae)
    with pytest.raises(ValueError, match=rf"'{key}' holds 1 non-finite"):
        with model.saes([sae]):
            pass
    assert model.splices == {} and model.acts_to_saes == {}
    assert torch.equal(model(torch.tensor([[1, 2, 3]])), before)


# -- hand-edited cfg.json ----------------------------------------------------------------------------
MUST = "must be"
WRONG_TYPES = [  # (architecture, edit, what the message says after "cfg.json: ")
    ("standard", lambda c: c.update(apply_b_dec_to_input="false"), "key 'apply_b_dec_to_input' must be true or false"),
    ("standard", lambda c: c.update(apply_b_dec_to_input=0), "key 'apply_b_dec_to_input' must be true or false"),
    ("topk", lambda c: c.update(rescale_acts_by_decoder_norm="false"),
     "key 'rescale_acts_by_decoder_norm' must be true or false"),
    ("standard", lambda c: c.update(architecture=["standard"]), "key 'architecture' must be an architecture name"),
    ("standard", lambda c: c.update(normalize_activations=3), "key 'normalize_activations' must be one of"),
    ("standard", lambda c: c.update(normalize_activations="layernorm"), "key 'normalize_activations' must be one of"),
    ("standard", lambda c: c.update(reshape_activations=True), "key 'reshape_activations' must be one of"),
    ("standard", lambda c: c["metadata"].update(hook_name=5), "key 'metadata.hook_name' must be the name of a hook"),
    ("standard", lambda c: c.update(metadata="blocks.0.hook_resid_pre"), "key 'metadata' must be a JSON object"),
    ("transcoder", lambda c: c["metadata"].update(hook_name_out=7), "key 'metadata.hook_name_out' must be the name"),
    ("transcoder", lambda c: c.update(d_out="24"), "key 'd_out' must be a positive int"),
    ("standard", lambda c: c.update(d_in="24"), "key 'd_in' must be a positive int"),
    ("standard", lambda c: c.update(d_sae=37.0), "key 'd_sae' must be a positive int"),
    ("topk", lambda c: c.update(k="5"), "key 'k' must be a positive number"),
    ("topk", lambda c: c.update(k=0), "key 'k' must be a positive number"),
    ("topk", lambda c: c.update(k=-3), "key 'k' must be a positive number"),
    ("topk", lambda c: c.update(k=float("nan")), "key 'k' must be a positive number"),
    ("topk", lambda c: c.update(k=5.5), r"a topk SAE needs an int k in \[1, d_sae=37\], got k=5.5"),
    ("topk", lambda c: c.update(k=D_SAE + 1), r"a topk SAE needs an int k in \[1, d_sae=37\], got k=38"),
    ("topk", lambda c: c.update(k=None), r"a topk SAE needs an int k .*got k=None"),
    ("standard", lambda c: c.update(dtype=32), "dtype 32 is not one of"),
]


@pytest.mark.parametrize("arch,edit,message", WRONG_TYPES, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(WRONG_TYPES)])
def test_hand_edited_config_is_refused_naming_file_and_key(tmp_path, arch, edit, message):
    folder = edit_cfg(saved(tmp_path, arch), edit)
    with pytest.raises(ValueError, match=rf"cfg\.json: {message}"):
        load_sae(folder)


def test_contradicting_fields_are_refused(tmp_path):
    folder = edit_cfg(saved(tmp_path, "transcoder"), lambda c: c.update(d_out=25))
    with pytest.raises(ValueError, match=r"key 'W_dec' has shape \(37, 24\).*d_out=25"):
        load_sae(folder)
    folder = edit_cfg(saved(tmp_path, name="b"), lambda c: c.update(d_sae=36))
    with pytest.raises(ValueError, match=r"key 'W_enc' has shape \(24, 37\).*d_sae=36"):
        load_sae(folder)
    folder = edit_cfg(saved(tmp_path, name="c"), lambda c: c["metadata"].update(hook_name="blocks.7.hook_resid_pre"))
    with pytest.raises(KeyError, match=r"cfg\.json: the SAE reads at 'blocks\.7\.hook_resid_pre', which this model"):
        load_sae(folder, model=tiny_model())


def test_legacy_config_with_wrong_types_is_refused(tmp_path):
    folder = saved(tmp_path, "topk")
    legacy = {"d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "hook_point": HOOK, "activation_fn_str": "topk",
              "activation_fn_kwargs": [5], "sae_lens_training_version": "3.12.0"}
    (folder / "cfg.json").write_text(json.dumps(legacy))
    with pytest.raises(ValueError, match=r"cfg\.json: .*activation_fn_kwargs"):
        load_sae(folder)
    (folder / "cfg.json").write_text(json.dumps({**legacy, "activation_fn_kwargs": {"k": 5},
                                                 "normalize_activations": "yes"}))
    with pytest.raises(ValueError, match=r"cfg\.json: .*normalize_activations"):
        load_sae(folder)


def test_python_config_with_wrong_types_is_refused():
    for field, value in (("apply_b_dec_to_input", "false"), ("rescale_acts_by_decoder_norm", 1),
                         ("normalize_activations", None), ("hook_name_out", 3), ("metadata", [])):
        with pytest.raises((TypeError, ValueError), match=field):
            SAEConfig("standard", D_IN, D_SAE, HOOK, **{field: value})


def test_python_config_errors_are_glassbox_own_without_the_shape_checker():
    """Under pytest the annotations are checked first; a user's session has no checker: SAEConfig's own
    check must name the field there too (a subprocess without the pytest hook)."""
    import subprocess
    import sys
    code = ("from glassbox.interp.sae.config import SAEConfig\n"
            "for field, value in (('apply_b_dec_to_input', 'false'), ('rescale_acts_by_decoder_norm', 1),\n"
            "                     ('normalize_activations', None), ('hook_name_out', 3), ('metadata', []),\n"
            "                     ('k', float('nan'))):\n"
            "    try:\n"
            "        SAEConfig('standard', 24, 37, 'blocks.0.hook_resid_pre', **{field: value})\n"
            "    except ValueError as e:\n"
            "        assert str(e).startswith(f'SAEConfig.{field} must be'), e\n"
            "    else:\n"
            "        raise SystemExit(f'{field}={value!r} accepted')\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# -- finite parameters that still compute a non-finite number --------------------------------------
def test_zero_decoder_row_under_rescale_is_refused(tmp_path):
    """rescale_acts_by_decoder_norm divides by each row's norm: a zero row gives 0 * inf = NaN in every
    output where the feature is among the top k (SAELens computes that NaN)."""
    folder = saved(tmp_path, "topk", rescale_acts_by_decoder_norm=True)
    t = tensors_of(folder)
    t["W_dec"][6] = 0
    save_file(t, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match=r"sae_weights\.safetensors: row 6 of 'W_dec' has norm 0"):
        load_sae(folder)
    edit_cfg(folder, lambda c: c.update(rescale_acts_by_decoder_norm=False))
    assert load_sae(folder).W_dec[6].abs().max() == 0  # without the rescale a zero row is a feature writing nothing


def test_gated_r_mag_whose_exp_overflows_is_refused(tmp_path):
    folder = saved(tmp_path, "gated")
    t = tensors_of(folder)
    t["r_mag"][2] = 100.0  # exp(100) = 2.7e43 > float32's 3.4e38
    save_file(t, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match=r"'r_mag'.*exp\(r_mag\) overflows torch.float32 at feature 2"):
        load_sae(folder)
    assert load_sae(folder, dtype=torch.float64).r_mag[2] == 100.0  # float64 holds exp(100)


def test_add_sae_refuses_an_sae_trained_on_one_head():
    """metadata.hook_head_index: SAELens trained it on one head's hook_z values; spliced at hook_z it would
    run on every head (SAELens's HookedSAETransformer does so silently)."""
    model = tiny_model()
    sae = make_sae(SAEConfig("standard", 8, D_SAE, "blocks.0.attn.hook_z", metadata={"hook_head_index": 1}))
    with pytest.raises(ValueError, match="hook_head_index=1"):
        model.add_sae(sae)
    assert model.splices == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_refusals_on_cuda(tmp_path):
    folder = saved(tmp_path, "topk", rescale_acts_by_decoder_norm=True)
    assert load_sae(folder, device="cuda").W_dec.is_cuda
    t = tensors_of(folder)
    t["W_dec"][6] = 0
    save_file(t, str(folder / "sae_weights.safetensors"))
    with pytest.raises(ValueError, match=r"row 6 of 'W_dec' has norm 0"):
        load_sae(folder, device="cuda")
    model = tiny_model().to("cuda")
    sae = build("jumprelu").to("cuda")
    with torch.no_grad():
        sae.threshold[3] = float("nan")
    with pytest.raises(ValueError, match=r"'threshold' holds 1 non-finite value \(NaN; the first at index \(3,\)\)"):
        model.add_sae(sae)
    assert model.splices == {}


def test_train_sae_refuses_a_non_finite_loss_before_updating():
    """A NaN in the activations (here a NaN weight of the model) makes the loss NaN: refused at the first
    step, naming it and the hook, with the SAE not updated (before, it trained on and saved NaN weights)."""
    broken = tiny_model()
    with torch.no_grad():
        broken.blocks[0].attn.W_V[1, 2, 3] = float("nan")
    stream = torch.randint(1, 50, (4000,), generator=torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match=r"SAE training step 1: the loss is nan \(the activations hold NaN or inf "
                                         r"at blocks\.0\.hook_resid_post\)"):
        train_sae(broken, stream, "blocks.0.hook_resid_post", d_sae=16, k=4, steps=3, batch_tokens=64,
                  context_size=16, buffer_batches=2, model_batch=2, bos_id=0, progress=False)
