"""Damaged, foreign and unsafe weight files and folders fail loudly, naming the file and the tensor.

Each test writes a real folder the way ``transformers`` does (config.json + model.safetensors, or
pytorch_model.bin), damages one thing, and checks the error names what is wrong. Pickle checkpoints
load only through ``torch.load(weights_only=True)``: one that needs anything more is refused, and
the object it carries is never called (a marker file proves it).
"""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from conftest import TINY, make_hf_gpt2
from glassbox.weights import from_pretrained


@pytest.fixture(scope="module")
def hf():
    return make_hf_gpt2(seed=3, **TINY)


@pytest.fixture
def folder(hf, tmp_path):
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    return tmp_path


def header(path):
    """(header length, {name: (start, end)}) of a safetensors file, parsed here by its spec."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8:8 + length])
    return length, {k: tuple(v["data_offsets"]) for k, v in meta.items() if k != "__metadata__"}


def write_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def tensors(hf):
    return {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}


def test_intact_folder_loads_with_the_same_logits(hf, folder):
    tokens = torch.tensor([[1, 5, 7, 2, 28]])
    with torch.no_grad():
        # measured 1.5e-8 (values up to 0.17), bound 1e-5: 671x
        torch.testing.assert_close(from_pretrained(str(folder))(tokens), hf(tokens).logits, atol=1e-5, rtol=0)


# -- safetensors ------------------------------------------------------------------------------------
def test_truncated_file_names_the_file_and_the_first_missing_tensor(folder):
    path = folder / "model.safetensors"
    length, offsets = header(path)
    victim, (start, end) = max(offsets.items(), key=lambda item: item[1][1])  # the tensor stored last
    path.write_bytes(path.read_bytes()[:8 + length + start + 4])  # 4 bytes into it
    with pytest.raises(ValueError, match=rf"{path}.*truncated: tensor {victim.replace('.', '[.]')} needs data "
                                         rf"bytes up to {end} but the file holds {start + 4}"):
        from_pretrained(str(folder))


def test_file_cut_inside_its_header_is_named(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match=rf"could not read weights file {path}.*truncated or not safetensors"):
        from_pretrained(str(folder))


@pytest.mark.parametrize("damage", [lambda raw: raw[:8] + b"\xff\xfe" + raw[10:], lambda raw: b"", lambda raw: b"abc"])
def test_corrupted_or_empty_file_is_named(folder, damage):
    path = folder / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ValueError, match=rf"could not read weights file {path}"):
        from_pretrained(str(folder))


def test_missing_tensor_is_named(hf, folder):
    state = tensors(hf)
    del state["transformer.h.1.attn.c_proj.bias"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{folder / 'model.safetensors'} is missing 1 tensor\(s\), e.g. "
                                         r"\['transformer.h.1.attn.c_proj.bias'\]"):
        from_pretrained(str(folder))


def test_tensor_of_the_wrong_shape_is_named(hf, folder):
    state = tensors(hf)
    state["transformer.h.0.mlp.c_fc.weight"] = state["transformer.h.0.mlp.c_fc.weight"][:, :-1].contiguous()
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{folder / 'model.safetensors'}: tensor transformer.h.0.mlp.c_fc.weight has shape \(15, 21\), "
                                         r"expected \(15, 22\)"):
        from_pretrained(str(folder))


def test_tensor_of_an_integer_dtype_is_named_not_cast(hf, folder):
    state = tensors(hf)
    state["transformer.ln_f.weight"] = torch.ones(TINY["n_embd"], dtype=torch.int64)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"{folder / 'model.safetensors'}: tensor transformer.ln_f.weight has dtype "
                                         r"torch.int64, expected floating"):
        from_pretrained(str(folder))


# -- folders of another size or architecture ---------------------------------------------------------
def test_config_with_fewer_layers_than_the_weights_is_refused(folder):
    write_config(folder, n_layer=1)
    with pytest.raises(ValueError, match=rf"{folder / 'config.json'}: n_layer=1, but {folder / 'model.safetensors'} "
                                         r"holds weights for 2 layer\(s\) \(indices 0\.\.1\)"):
        from_pretrained(str(folder))


def test_config_with_more_layers_than_the_weights_is_refused(folder):
    write_config(folder, n_layer=3)
    with pytest.raises(ValueError, match=r"n_layer=3, but .* holds weights for 2 layer\(s\)"):
        from_pretrained(str(folder))


def test_config_of_another_width_names_the_first_tensor(folder):
    write_config(folder, n_embd=18)
    with pytest.raises(ValueError, match=r"n_embd=18, but .* holds transformer.wte.weight of shape \(29, 15\)"):
        from_pretrained(str(folder))


def test_another_architectures_weights_under_a_gpt2_config(folder):
    llama_like = {"model.embed_tokens.weight": torch.randn(29, 15), "model.norm.weight": torch.ones(15)}
    save_file(llama_like, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"n_layer=2, but .* holds no layer weights"):
        from_pretrained(str(folder))


def test_unknown_model_type_names_the_config(folder):
    write_config(folder, model_type="bert")
    with pytest.raises(ValueError, match=rf"{folder / 'config.json'} describes model_type='bert'"):
        from_pretrained(str(folder))


def test_missing_or_broken_config_is_named(folder):
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=rf"could not read {folder / 'config.json'}"):
        from_pretrained(str(folder))
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=rf"no config.json in {folder}"):
        from_pretrained(str(folder))


def test_folder_without_weights_lists_what_it_looked_for(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=rf"no weights in {folder}: expected model.safetensors, "
                                                r"model.safetensors.index.json or pytorch_model.bin"):
        from_pretrained(str(folder))


# -- sharded folders ------------------------------------------------------------------------------
def shard(hf, folder, names):
    state = tensors(hf)
    first = {k: v for k, v in state.items() if k.startswith("transformer.h.0.")}
    rest = {k: v for k, v in state.items() if k not in first}
    save_file(first, str(folder / names[0]))
    save_file(rest, str(folder / "rest.safetensors"))
    weight_map = {**{k: names[1] for k in first}, **{k: "rest.safetensors" for k in rest}}
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_sharded_folder_loads(hf, folder):
    shard(hf, folder, ["a.safetensors", "a.safetensors"])
    tokens = torch.tensor([[3, 1, 4]])
    with torch.no_grad():
        # measured 1.5e-8 (values up to 0.17), bound 1e-5: 671x
        torch.testing.assert_close(from_pretrained(str(folder))(tokens), hf(tokens).logits, atol=1e-5, rtol=0)


def test_index_naming_a_missing_shard_names_it(hf, folder):
    shard(hf, folder, ["a.safetensors", "gone.safetensors"])
    with pytest.raises(ValueError, match=rf"maps \d+ tensor\(s\) \(e\.g\. transformer\.h\.0\..*\) to shard "
                                         rf"gone.safetensors, which is not in {folder}"):
        from_pretrained(str(folder))


def test_index_naming_a_file_outside_its_folder_is_refused(hf, folder):
    shard(hf, folder, ["a.safetensors", "../a.safetensors"])
    with pytest.raises(ValueError, match=r"names shard '\.\./a\.safetensors', which is not a file name in the same folder"):
        from_pretrained(str(folder))


# -- pickle checkpoints ---------------------------------------------------------------------------
def as_bin(hf, folder, payload):
    (folder / "model.safetensors").unlink()
    torch.save(payload, folder / "pytorch_model.bin")
    return folder / "pytorch_model.bin"


def test_plain_tensor_checkpoint_loads_with_weights_only(hf, folder):
    as_bin(hf, folder, tensors(hf))
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        # measured 1.5e-8 (values up to 0.17), bound 1e-5: 671x
        torch.testing.assert_close(from_pretrained(str(folder))(tokens), hf(tokens).logits, atol=1e-5, rtol=0)


class OpensAFile:
    """Unpickling this calls open(marker, "w"): code execution, made visible."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_needing_arbitrary_unpickling_is_refused_and_never_runs(hf, folder, tmp_path_factory):
    marker = tmp_path_factory.mktemp("marker") / "executed"
    path = as_bin(hf, folder, {**tensors(hf), "payload": OpensAFile(marker)})
    with pytest.raises(ValueError, match=rf"refused to load {path}: it needs more than plain tensors to unpickle "
                                         r"\(.*open.*\)\. glassbox loads PyTorch checkpoints only with "
                                         r"torch\.load\(weights_only=True\)"):
        from_pretrained(str(folder))
    assert not marker.exists(), "the checkpoint's payload ran"


@pytest.mark.parametrize("extra,what", [({"step": 3}, r"'step' is a int"), (None, r"'state_dict' is a dict")])
def test_checkpoint_that_is_not_a_flat_state_dict_is_refused(hf, folder, extra, what):
    payload = {**tensors(hf), **extra} if extra else {"state_dict": tensors(hf)}
    path = as_bin(hf, folder, payload)
    with pytest.raises(ValueError, match=rf"{path} does not hold a flat state dict of tensors \({what}\)"):
        from_pretrained(str(folder))


def test_truncated_checkpoint_is_named(hf, folder):
    path = as_bin(hf, folder, tensors(hf))
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(ValueError, match=rf"could not read weights file {path}: .*\(truncated or corrupted\?\)"):
        from_pretrained(str(folder))
