""""Did you mean": a mistyped model, hook, SAE, activation or subcommand name is answered with the
closest valid names (at most 3), in an error of the type callers already catch; a name close to
nothing gets no guess."""

import json
import re

import pytest
import torch

from glassbox.suggest import close_names, did_you_mean

HINT = re.compile(r"did you mean ([^?]*)\?")


def suggested(message: str) -> list:
    """The names a message suggests, in order."""
    found = HINT.search(message)
    return re.findall(r"'([^']*)'", found.group(1)) if found else []


# -- the helper ---------------------------------------------------------------------------------------

def test_helper_lists_at_most_three_best_first_and_nothing_for_a_far_name():
    valid = ["resid_pre", "resid_post", "resid_mid", "attn_out", "mlp_out"]
    assert close_names("resid_pr", valid) == ["resid_pre", "resid_post", "resid_mid"]
    assert did_you_mean("resid_pr", valid) == "; did you mean 'resid_pre', 'resid_post' or 'resid_mid'?"
    assert did_you_mean("attn_ot", valid) == "; did you mean 'attn_out'?"
    assert did_you_mean("zzzz", valid) == ""
    assert did_you_mean("RMs", ("LN", "RMS")) == "; did you mean 'RMS'?"  # case ignored, valid spelling returned
    assert did_you_mean(None, valid) == "" and did_you_mean(3, valid) == ""  # not a name: no guess
    assert did_you_mean("x", []) == ""


# -- the library ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    from glassbox import HookedTransformer

    return HookedTransformer.from_pretrained("glassbox-austen")


def small_config(**fields):
    from glassbox import Config

    return Config(**{"d_model": 6, "n_layers": 1, "n_heads": 2, "d_vocab": 7, "n_ctx": 5, **fields})


def shipped_sae_name():
    from glassbox.interp.sae.format import SHIPPED_SAES_DIR

    return sorted(p.name for p in SHIPPED_SAES_DIR.iterdir() if (p / "cfg.json").is_file())[0]


CASES = {  # name: (call, error type, the suggestion expected first)
    "Config.act_fn": (lambda m: small_config(act_fn="gelu_neww"), ValueError, "gelu_new"),
    "Config.normalization": (lambda m: small_config(normalization="RMs"), ValueError, "RMS"),
    "Config.positional": (lambda m: small_config(positional="rotory"), ValueError, "rotary"),
    "preset": (lambda m: __import__("glassbox.models.presets").models.presets.preset_config("modrn"),
               KeyError, "modern"),
    "hook_shape": (lambda m: __import__("glassbox.models").models.hook_shape("blocks.0.attn.hook_patern"),
                   KeyError, "blocks.{L}.attn.hook_pattern"),
    "hub_config": (lambda m: __import__("glassbox.weights").weights.hub_config("gpt2-medum"), KeyError,
                   "gpt2-medium"),
    "model_type": (lambda m: __import__("glassbox.weights.architectures").weights.architectures
                   .architecture_of_type("lama"), ValueError, "llama"),
    "tl official name": (lambda m: __import__("glassbox.tl.loading_from_pretrained").tl.loading_from_pretrained
                         .get_official_model_name("gpt2-mediun"), ValueError, "gpt2-medium"),
    "GPT-2 activation_function": (lambda m: __import__("glassbox.weights.gpt2").weights.gpt2.config_from_hf(
        __import__("transformers").GPT2Config(activation_function="gelu_nwe")), ValueError, "gelu_new"),
    "GPT-J activation_function": (lambda m: __import__("glassbox.weights.gptj").weights.gptj.config_from_gptj(
        __import__("transformers").GPTJConfig(activation_function="rleu")), ValueError, "relu"),
    "SAE architecture": (lambda m: __import__("glassbox.interp.sae.architectures").interp.sae.architectures
                         .sae_class("jumprelu_"), ValueError, "jumprelu"),
    "sweep activation": (lambda m: __import__("glassbox.interp.patching.engine").interp.patching.engine
                         .resolve_template(m, "resid_pr"), ValueError, "resid_pre"),
    "atp activation": (lambda m: __import__("glassbox.interp.attribution.nodes").interp.attribution.nodes
                       .resolve_nodes(m, "resid_pr", ("layer", "pos")), ValueError, "resid_pre"),
    "job activation": (lambda m: __import__("glassbox.interp.patching.engine").interp.patching.engine
                       .check_activation("mlp_ot"), ValueError, "mlp_out"),
    "job hook template": (lambda m: __import__("glassbox.interp.patching.engine").interp.patching.engine
                          .check_activation("blocks.{L}.hook_resid_pr"), KeyError, "blocks.{L}.hook_resid_pre"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_library_errors_suggest_the_closest_name(model, case):
    call, kind, first = CASES[case]
    with pytest.raises(kind) as error:
        call(model)
    message = error.value.args[0] if isinstance(error.value, KeyError) else str(error.value)
    names = suggested(message)
    assert names and names[0] == first and len(names) <= 3, f"{case}: {message}"


def test_a_far_name_gets_no_guess(model):
    with pytest.raises(ValueError) as error:
        small_config(act_fn="zzzzzz")
    assert "did you mean" not in str(error.value) and "'zzzzzz'" in str(error.value)
    from glassbox.interp.patching.engine import check_activation
    with pytest.raises(ValueError) as error:
        check_activation("qqqqqqq")
    assert "did you mean" not in str(error.value)


@pytest.mark.parametrize("name, first", [("glassbox-austn", "glassbox-austen"), ("gpt-2", "gpt2"),
                                         ("gpt2-mediun", "gpt2-medium")])
def test_an_unknown_model_name_suggests_the_known_ones(monkeypatch, tmp_path, name, first):
    from glassbox import HookedTransformer
    from glassbox.weights.pretrained import ModelNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache: nothing found, nothing fetched
    with pytest.raises(ModelNotFoundError) as error:
        HookedTransformer.from_pretrained(name)
    assert isinstance(error.value, (OSError, ValueError))
    assert suggested(str(error.value))[0] == first, str(error.value)


def test_a_cached_repo_id_is_suggested(monkeypatch, tmp_path):
    from glassbox import HookedTransformer
    from glassbox.weights.pretrained import known_model_names

    (tmp_path / "models--EleutherAI--pythia-70m" / "snapshots").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert "EleutherAI/pythia-70m" in known_model_names()
    with pytest.raises(OSError) as error:
        HookedTransformer.from_pretrained("EleutherAI/pythia-70")
    assert suggested(str(error.value))[0] == "EleutherAI/pythia-70m", str(error.value)


def test_hook_names_list_at_most_three_closest(model):
    for call in (lambda: model.add_hook("blocks.0.attn.hook_patern", lambda x, hook: x),
                 lambda: model.run_with_hooks("a", fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: x)]),
                 lambda: model.hooks(fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: x)]).__enter__(),
                 lambda: model.run_with_cache("a")[1]["blocks.0.attn.hook_patern"]):
        with pytest.raises(KeyError) as error:
            call()
        message = error.value.args[0]
        listed = message.split("closest valid names: ")[1].split(" (")[0].split(", ")
        assert listed[0] == "blocks.0.attn.hook_pattern" and len(listed) <= 3, message
    assert not model.has_hooks


def test_load_sae_names_the_shipped_saes():
    from glassbox.interp.sae.format import load_sae

    shipped = shipped_sae_name()  # glassbox-austen-L1-resid-pre
    typo = shipped.replace("resid-pre", "resid_pre")
    assert typo != shipped
    with pytest.raises(FileNotFoundError) as error:
        load_sae(typo)
    assert suggested(str(error.value)) == [shipped] and "no such SAE folder" in str(error.value)
    with pytest.raises(FileNotFoundError) as error:
        load_sae("resid_pre")  # close to no shipped name, but the message lists them
    assert f"shipped: {shipped}" in str(error.value) and "did you mean" not in str(error.value)
    assert load_sae(shipped).cfg.d_sae > 0  # the right name still loads


def test_load_sae_of_a_folder_without_config_keeps_its_message(tmp_path):
    from glassbox.interp.sae.format import load_sae

    with pytest.raises(FileNotFoundError, match="no SAE config"):
        load_sae(tmp_path)
    with pytest.raises(FileNotFoundError, match="no SAE config"):
        load_sae(str(tmp_path / "missing" / "sae"))  # a path, not a name: not looked up among the shipped


# -- the command line -------------------------------------------------------------------------------------

def run_cli(argv, capsys):
    from glassbox.cli import main

    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, first", [
    (["dmo"], "demo"),
    (["trian-sae", "--help"], "train-sae"),
    (["train", "--text", "t", "--out", "o", "--arch", "modrn"], "modern"),
    (["parity", "--dtype", "float23"], "float32"),
    (["demo", "--model", "glassbox-austn"], "glassbox-austen"),
])
def test_the_command_line_suggests(argv, first, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert suggested(err)[0] == first, err


def test_sweep_refuses_a_bad_activation_before_its_progress_bar(capsys, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"clean": "Elizabeth read the letter. Then Elizabeth read the",
                                 "corrupted": "Elizabeth read the garden. Then Elizabeth read the",
                                 "answer": " letter", "distractor": " garden"}) + "\n")
    for activation, first in (("resid_pr", "resid_pre"), ("blocks.{L}.hook_resid_pr", "blocks.{L}.hook_resid_pre")):
        for command in ("sweep", "attribute"):
            out = tmp_path / f"{command}-out"
            code, stdout, err = run_cli([command, "--model", "glassbox-austen", "--pairs", str(pairs), "--activation",
                                         activation, "--out", str(out)], capsys)
            assert code == 2 and suggested(err)[0] == first, err
            assert err.count("\n") == 1 and "%|" not in err and "shards" not in err, err  # no progress bar
            assert not out.exists()
