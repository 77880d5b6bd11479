"""circuit-tracer's on-disk layout: round trips, the exact files and keys circuit-tracer 0.5 reads, and
every refusal naming the file and key; the writer under faults at each file-system call and with a
user's files in the folder. (That circuit-tracer itself loads these folders with equal outputs is
tested in circuit-tracer's own environment.)"""

import shutil

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from glassbox.interp.transcoders import (TranscoderSet, from_saes, load_circuit_tracer, load_saelens_set,
                                         save_circuit_tracer, save_saelens_set, seeded_set)

N, D, F = 3, 7, 11


def _equal_sets(a: TranscoderSet, b: TranscoderSet):
    assert (a.n_layers, a.d_model, a.d_transcoder, a.cross_layer, a.skip, a.activation, a.k) == \
        (b.n_layers, b.d_model, b.d_transcoder, b.cross_layer, b.skip, b.activation, b.k)
    assert (a.input_hook, a.output_hook) == (b.input_hook, b.output_hook)
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


KINDS = [dict(cross_layer=False), dict(cross_layer=False, skip=True), dict(cross_layer=False, activation="jumprelu"),
         dict(cross_layer=False, activation="topk", k=4), dict(cross_layer=True),
         dict(cross_layer=True, activation="jumprelu"), dict(cross_layer=True, skip=True),
         dict(cross_layer=True, activation="topk", k=2, skip=True)]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(tmp_path, kind, dtype):
    ts = seeded_set(N, D, F, seed=3, dtype=dtype, input_hook="ln2.hook_out", **kind)
    save_circuit_tracer(ts, tmp_path / "tc")
    back = load_circuit_tracer(tmp_path / "tc")
    _equal_sets(ts, back)
    x = {l: torch.randn(4, D, generator=torch.Generator().manual_seed(l)) for l in range(N)}
    for l, out in ts.reconstruct(x).items():
        assert torch.equal(out, back.reconstruct(x)[l])


def test_files_and_keys_are_circuit_tracers(tmp_path):
    per = seeded_set(N, D, F, seed=1, activation="jumprelu", skip=True, input_hook="ln2.hook_out",
                     metadata={"model_name": "glassbox-austen"})
    save_circuit_tracer(per, tmp_path / "per")
    config = yaml.safe_load((tmp_path / "per" / "config.yaml").read_text())
    assert config["model_kind"] == "transcoder_set"
    assert config["feature_input_hook"] == "mlp.hook_in" and config["feature_output_hook"] == "hook_mlp_out"
    assert config["transcoders"] == [f"layer_{l}.safetensors" for l in range(N)]
    assert config["model_name"] == "glassbox-austen"
    t = load_file(str(tmp_path / "per" / "layer_1.safetensors"))
    assert sorted(t) == ["W_dec", "W_enc", "W_skip", "activation_function.threshold", "b_dec", "b_enc"]
    # circuit-tracer: F.linear(x, W_enc [d_transcoder d_model]), acts @ W_dec [d_transcoder d_model], x @ W_skip.T
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(0))
    pre = torch.nn.functional.linear(x, t["W_enc"], t["b_enc"])
    acts = pre * (pre > t["activation_function.threshold"])
    ct_out = acts @ t["W_dec"] + t["b_dec"] + x @ t["W_skip"].T
    # measured max |diff| 0.0 (values up to 0.27); bound 1e-6, a few float32 ulps (addmm vs matmul + add may round apart)
    torch.testing.assert_close(per.reconstruct({1: x})[1].detach(), ct_out, rtol=0, atol=1e-6)

    clt = seeded_set(N, D, F, seed=2, cross_layer=True, activation="jumprelu", input_hook="hook_resid_mid")
    save_circuit_tracer(clt, tmp_path / "clt")
    config = yaml.safe_load((tmp_path / "clt" / "config.yaml").read_text())
    assert config["model_kind"] == "cross_layer_transcoder" and "transcoders" not in config
    names = sorted(p.name for p in (tmp_path / "clt").iterdir() if not p.name.startswith("."))
    assert names == sorted(["config.yaml"] + [f"W_{w}_{l}.safetensors" for w in ("enc", "dec") for l in range(N)])
    enc = load_file(str(tmp_path / "clt" / "W_enc_2.safetensors"))
    assert sorted(enc) == ["W_enc_2", "b_dec_2", "b_enc_2", "threshold_2"] and enc["W_enc_2"].shape == (F, D)
    assert load_file(str(tmp_path / "clt" / "W_dec_1.safetensors"))["W_dec_1"].shape == (F, N - 1, D)
    # circuit-tracer's CLT: einsum("lbd,lfd->lbf") per layer, features * (features > threshold), then
    # index_add of scaled decoders into (layer, pos) and + b_dec[:, None]
    xs = torch.randn(N, 5, D, generator=torch.Generator().manual_seed(1))
    W_enc = torch.stack([load_file(str(tmp_path / "clt" / f"W_enc_{l}.safetensors"))[f"W_enc_{l}"] for l in range(N)])
    files = [load_file(str(tmp_path / "clt" / f"W_enc_{l}.safetensors")) for l in range(N)]
    feats = torch.einsum("lbd,lfd->lbf", xs, W_enc) + torch.stack([f[f"b_enc_{l}"] for l, f in enumerate(files)])[:, None]
    feats = feats * (feats > torch.stack([f[f"threshold_{l}"] for l, f in enumerate(files)])[:, None])
    want = torch.stack([f[f"b_dec_{l}"] for l, f in enumerate(files)])[:, None].repeat(1, 5, 1)
    for s in range(N):
        W_dec = load_file(str(tmp_path / "clt" / f"W_dec_{s}.safetensors"))[f"W_dec_{s}"]
        for j, t in enumerate(range(s, N)):
            want[t] += feats[s] @ W_dec[:, j, :]
    got = clt.reconstruct({l: xs[l] for l in range(N)})
    for t in range(N):
        # measured max |diff| 0.0 (values up to 2.7); bound 2e-6, a few float32 ulps at 2.7
        torch.testing.assert_close(got[t].detach(), want[t], rtol=0, atol=2e-6, msg=f"layer {t}")


def test_what_circuit_tracer_cannot_hold_gets_a_kind_it_refuses(tmp_path):
    for name, kind in (("topk", dict(activation="topk", k=3)), ("clt-skip", dict(cross_layer=True, skip=True))):
        save_circuit_tracer(seeded_set(N, D, F, input_hook="ln2.hook_out", **kind), tmp_path / name)
        config = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert config["model_kind"].startswith("glassbox_"), name
    assert yaml.safe_load((tmp_path / "topk" / "config.yaml").read_text())["k"] == 3


def _write(tmp_path, **kind):
    folder = tmp_path / "tc"
    save_circuit_tracer(seeded_set(N, D, F, seed=5, input_hook="hook_resid_mid", **kind), folder)
    return folder


def _edit(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _edit_config(folder, change):
    config = yaml.safe_load((folder / "config.yaml").read_text())
    change(config)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))


def test_missing_files_are_named(tmp_path):
    folder = _write(tmp_path)
    (folder / "config.yaml").rename(folder / "config.bak")
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        load_circuit_tracer(folder)
    (folder / "config.bak").rename(folder / "config.yaml")
    (folder / "layer_1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="layer_1.safetensors"):
        load_circuit_tracer(folder)
    clt = tmp_path / "clt"
    save_circuit_tracer(seeded_set(N, D, F, cross_layer=True, input_hook="hook_resid_mid"), clt)
    (clt / "W_dec_2.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="W_dec_2.safetensors"):
        load_circuit_tracer(clt)
    (clt / "W_enc_1.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="not layer 1.*W_enc_1.safetensors"):
        load_circuit_tracer(clt)
    with pytest.raises(FileNotFoundError, match="no such transcoder folder"):
        load_circuit_tracer(tmp_path / "nothing")


def test_missing_extra_and_misshapen_keys_are_named(tmp_path):
    folder = _write(tmp_path)
    _edit(folder / "layer_2.safetensors", lambda t: t.pop("b_enc"))
    with pytest.raises(KeyError, match="layer_2.safetensors: missing key 'b_enc'"):
        load_circuit_tracer(folder)
    folder = _write(tmp_path / "b")
    _edit(folder / "layer_0.safetensors", lambda t: t.update(log_thresholds=torch.zeros(F)))
    with pytest.raises(ValueError, match="layer_0.safetensors: unexpected key\\(s\\) 'log_thresholds'"):
        load_circuit_tracer(folder)
    folder = _write(tmp_path / "c")
    _edit(folder / "layer_1.safetensors", lambda t: t.update(W_dec=torch.zeros(F, D + 1)))
    with pytest.raises(ValueError, match=r"layer_1.safetensors: key 'W_dec' has shape \(11, 8\); expected \(11, 7\)"):
        load_circuit_tracer(folder)
    folder = _write(tmp_path / "d", cross_layer=True)
    _edit(folder / "W_dec_0.safetensors", lambda t: t.update(W_dec_0=torch.zeros(F, N - 1, D)))
    with pytest.raises(ValueError, match=r"W_dec_0.safetensors: key 'W_dec_0' has shape \(11, 2, 7\); expected \(11, 3, 7\)"):
        load_circuit_tracer(folder)


def test_a_threshold_in_some_layers_only_is_refused(tmp_path):
    folder = _write(tmp_path, activation="jumprelu")
    _edit(folder / "layer_2.safetensors", lambda t: t.pop("activation_function.threshold"))
    with pytest.raises(ValueError, match="layer_2.safetensors: key 'activation_function.threshold' is missing"):
        load_circuit_tracer(folder)
    folder = _write(tmp_path / "b", cross_layer=True)
    _edit(folder / "W_enc_1.safetensors", lambda t: t.update(threshold_1=torch.zeros(F)))
    with pytest.raises(ValueError, match="W_enc_1.safetensors: key 'threshold_1' is present"):
        load_circuit_tracer(folder)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_refused_naming_file_and_key(tmp_path, value):
    folder = _write(tmp_path, cross_layer=True, activation="jumprelu")

    def poison(t):
        t["threshold_1"][3] = value

    _edit(folder / "W_enc_1.safetensors", poison)
    with pytest.raises(ValueError, match=r"W_enc_1.safetensors: key 'threshold_1' holds 1 non-finite value"):
        load_circuit_tracer(folder)
    big = _write(tmp_path / "b")
    _edit(big / "layer_0.safetensors", lambda t: t["W_enc"].__setitem__((0, 0), 1e39) if False else
          t.update(W_enc=t["W_enc"].double().index_fill(1, torch.tensor([0]), 1e39)))
    with pytest.raises(ValueError, match="key 'W_enc' is finite in the file .* in torch.float32"):
        load_circuit_tracer(big, dtype=torch.float32)


def test_config_fields_are_checked(tmp_path):
    folder = _write(tmp_path)
    _edit_config(folder, lambda c: c.update(d_model=8))
    with pytest.raises(ValueError, match="config.yaml: key 'd_model' is 8, but the tensors have d_model=7"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(d_model=7, model_kind="transcoders"))
    with pytest.raises(ValueError, match="config.yaml: model_kind 'transcoders' is not one of"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(model_kind="cross_layer_transcoder"))
    with pytest.raises(FileNotFoundError, match="no W_enc_0.safetensors"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(model_kind="transcoder_set", feature_input_hook="ln2.hook_normalised"))
    with pytest.raises(ValueError, match="config.yaml: feature_input_hook='ln2.hook_normalised' is not a per-block hook"
                                         ".*did you mean 'ln2.hook_normalized'"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: (c.pop("feature_input_hook")))
    with pytest.raises(KeyError, match="config.yaml: missing key 'feature_input_hook'"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(feature_input_hook="mlp.hook_in", activation_function="topk", k=2))
    with pytest.raises(ValueError, match="activation_function='topk' with model_kind 'transcoder_set'"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: (c.pop("activation_function"), c.pop("k"), c.update(n_layers="3")))
    with pytest.raises(ValueError, match="key 'n_layers' must be a positive int, got '3'"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(n_layers=3, transcoders=["hf://org/repo/layer_0.safetensors"]))
    with pytest.raises(ValueError, match="a Hugging Face file; glassbox reads local folders only"):
        load_circuit_tracer(folder)
    _edit_config(folder, lambda c: c.update(transcoders=["layer_0.safetensors", "layer_1.safetensors"]))
    with pytest.raises(ValueError, match="layer_2.safetensors: a layer file that .* does not list"):
        load_circuit_tracer(folder)
    (folder / "config.yaml").write_text("model_kind: [unclosed\n")
    with pytest.raises(ValueError, match="config.yaml: not a YAML config"):
        load_circuit_tracer(folder)
    (folder / "config.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="config.yaml: the config is a YAML list, not a mapping"):
        load_circuit_tracer(folder)
    (folder / "layer_0.safetensors").write_bytes(b"not safetensors")
    _edit_config(folder, lambda c: None) if False else (folder / "config.yaml").write_text(
        "model_kind: transcoder_set\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n")
    with pytest.raises(ValueError, match="layer_0.safetensors: not a safetensors file"):
        load_circuit_tracer(folder)


def test_mlp_hook_names_map_to_glassbox(tmp_path):
    folder = _write(tmp_path)
    _edit_config(folder, lambda c: c.update(feature_input_hook="mlp.hook_in", feature_output_hook="mlp.hook_out"))
    ts = load_circuit_tracer(folder)
    assert ts.feature_input_hook(1) == "blocks.1.ln2.hook_out" and ts.feature_output_hook(0) == "blocks.0.hook_mlp_out"


def test_save_keeps_a_users_files_and_removes_a_larger_sets_layers(tmp_path):
    folder = tmp_path / "tc"
    folder.mkdir()
    (folder / "README.md").write_text("my notes")
    (folder / "layer_3.safetensors").write_bytes(b"a circuit-tracer file of an older, 4-layer set")
    ts = seeded_set(N, D, F, input_hook="hook_resid_mid")
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        save_circuit_tracer(ts, folder)
    save_circuit_tracer(ts, folder, overwrite=True)
    assert (folder / "README.md").read_text() == "my notes"
    assert not (folder / "layer_3.safetensors").exists()
    _equal_sets(load_circuit_tracer(folder), ts)
    clt = seeded_set(N, D, F, cross_layer=True, input_hook="hook_resid_mid")
    save_circuit_tracer(clt, folder, overwrite=True)  # the per-layer files are the old set's: removed
    assert sorted(p.name for p in folder.glob("layer_*")) == [] and (folder / "README.md").read_text() == "my notes"
    _equal_sets(load_circuit_tracer(folder), clt)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="a file, not a folder"):
        save_circuit_tracer(ts, tmp_path / "file", overwrite=True)


def test_a_fault_at_every_file_system_call_leaves_the_old_set_or_the_new(tmp_path):
    from fs_faults import fail_at, fast_tmp, folder_state

    root = fast_tmp(tmp_path)
    old = seeded_set(N, D, F, seed=1, input_hook="hook_resid_mid")
    new = seeded_set(N, D, F, seed=2, cross_layer=True, activation="jumprelu", input_hook="hook_resid_mid")
    try:
        for name, ts in (("old", old), ("new", new)):
            save_circuit_tracer(ts, root / name / "tc")
            (root / name / "tc" / "notes.txt").write_text("kept")
        expected = {name: folder_state(root / name / "tc") for name in ("old", "new")}
        outcomes, event = set(), 1
        while True:
            folder = root / f"k{event}" / "tc"
            shutil.copytree(root / "old" / "tc", folder)
            faulted, error = fail_at(event, lambda: save_circuit_tracer(new, folder, overwrite=True))
            if not faulted:
                break
            assert error is None or isinstance(error, OSError), f"call {event}: {error!r}"
            loaded = load_circuit_tracer(folder)  # finishes an interrupted commit first
            state = folder_state(folder)
            outcome = [name for name, files in expected.items() if files == state]
            assert outcome, f"call {event}: a mix of the two sets: {sorted(state)}"
            assert state["notes.txt"] == b"kept"
            _equal_sets(loaded, old if outcome == ["old"] else new)
            outcomes.add(outcome[0])
            event += 1
    finally:
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)
    assert event > 20 and outcomes == {"old", "new"}, (event, outcomes)


def test_saelens_set_folders_round_trip(tmp_path):
    ts = seeded_set(N, D, F, seed=4, activation="jumprelu", skip=True, input_hook="ln2.hook_normalized")
    save_saelens_set(ts, tmp_path / "sl")
    assert sorted(p.name for p in (tmp_path / "sl").iterdir()) == [f"layer_{l}" for l in range(N)]
    back = load_saelens_set(tmp_path / "sl")
    _equal_sets(ts, back)
    with pytest.raises(FileExistsError, match="layer_0 exists"):
        save_saelens_set(ts, tmp_path / "sl")
    shutil.rmtree(tmp_path / "sl" / "layer_1")
    with pytest.raises(FileNotFoundError, match="no transcoder for layer 1"):
        load_saelens_set(tmp_path / "sl")
    with pytest.raises(ValueError, match="SAELens has no TopK transcoder"):
        save_saelens_set(seeded_set(N, D, F, activation="topk", k=2, input_hook="hook_resid_mid"), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_seeded_set_is_reproducible():
    a = seeded_set(2, 5, 9, seed=7, cross_layer=True, input_hook="hook_resid_mid")
    b = seeded_set(2, 5, 9, seed=7, cross_layer=True, input_hook="hook_resid_mid")
    _equal_sets(a, b)
    assert not torch.equal(a.encoder, seeded_set(2, 5, 9, seed=8, cross_layer=True, input_hook="hook_resid_mid").encoder)
