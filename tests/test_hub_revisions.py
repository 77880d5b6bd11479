"""Hub revisions and training checkpoints (glassbox.weights.pretrained's ``revision=``,
glassbox.weights.checkpoints), against ``transformers`` reading the same hand-written hub cache, and
against the published checkpoint schedules written out by hand."""

import pytest
import torch

from hub_cache import cache_hf_model, repo_folder, write_hub_cache

REPO = "EleutherAI/pythia-tiny"  # a Pythia name: its checkpoints are step revisions


def hf_neox(seed, layers=2):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(hidden_size=20, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=44,
                        vocab_size=53, max_position_embeddings=64, rotary_pct=0.5, tie_word_embeddings=False)
    return GPTNeoXForCausalLM(cfg).eval()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    # main and three checkpoints, each its own seed; step2 sorts after step1000 as text, before it as a number
    snapshots = {}
    for seed, ref in enumerate(["main", "step0", "step2", "step1000"]):
        snapshots[ref] = cache_hf_model(folder, REPO, hf_neox(seed, layers=3 if ref == "step2" else 2))
    for ref, snapshot in snapshots.items():  # cache_hf_model points refs/main at each in turn
        (repo_folder(folder, REPO) / "refs" / ref).write_text(snapshot.name)
    return folder, snapshots


def logits_of(model, tokens):
    with torch.no_grad():
        return model(tokens)


TOKENS = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9]])


def test_each_revision_loads_its_own_snapshot_as_transformers_does(cache):
    from transformers import GPTNeoXForCausalLM

    from glassbox.weights import from_pretrained

    folder, snapshots = cache
    seen = {}
    for ref in ["main", "step0", "step1000"]:
        ours = logits_of(from_pretrained(REPO, revision=ref), TOKENS)
        hf = GPTNeoXForCausalLM.from_pretrained(REPO, revision=ref, cache_dir=str(folder)).eval()
        with torch.no_grad():
            theirs = hf(TOKENS).logits
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)  # measured 6.0e-8 max
        seen[ref] = ours
    by_commit = logits_of(from_pretrained(REPO, revision=snapshots["step0"].name), TOKENS)
    torch.testing.assert_close(by_commit, seen["step0"], rtol=0, atol=0)
    assert (seen["main"] - seen["step1000"]).abs().max() > 0.1  # different seeds, different models


def test_config_of_reads_the_revision_s_config(cache):
    from glassbox.weights.pretrained import config_of

    assert config_of(REPO).n_layers == 2
    assert config_of(REPO, revision="step2").n_layers == 3


def test_a_revision_missing_from_the_cache_is_named_with_the_cached_ones_in_step_order(cache):
    from glassbox.weights import from_pretrained
    from glassbox.weights.pretrained import ModelNotFoundError

    with pytest.raises(ModelNotFoundError) as err:
        from_pretrained(REPO, revision="step7")
    text = str(err.value)
    assert isinstance(err.value, OSError) and isinstance(err.value, ValueError)
    assert "revision 'step7'" in text and REPO in text, text
    assert "4 revisions cached: main, step0, step2, step1000" in text, text
    assert "HF_HUB_OFFLINE" in text, text


def test_a_revision_whose_snapshot_lacks_the_weights_names_the_folder_and_the_revision(cache):
    from glassbox.weights import from_pretrained

    folder, snapshots = cache
    config = (snapshots["main"] / "config.json").read_bytes()
    write_hub_cache(folder, REPO, {"config.json": config}, ref="step5")
    with pytest.raises(FileNotFoundError) as err:
        from_pretrained(REPO, revision="step5")
    text = str(err.value)
    assert "no weights in" in text and "model.safetensors" in text and "'step5'" in text and REPO in text, text


@pytest.mark.parametrize("revision,kind,words", [("", ValueError, "non-empty str"), ("  ", ValueError, "non-empty"),
                                                 (1000, TypeError, "revision")])  # the test run's shape checker or ours
def test_a_blank_or_non_string_revision_is_refused_before_any_lookup(cache, revision, kind, words):
    from glassbox.weights import from_pretrained

    with pytest.raises(kind, match=words):
        from_pretrained(REPO, revision=revision)


def test_a_revision_of_a_local_folder_or_shipped_model_is_refused(cache, tmp_path):
    from glassbox.weights import from_pretrained

    _, snapshots = cache
    for name in [str(snapshots["main"]), "glassbox-austen"]:
        with pytest.raises(ValueError, match="names a revision of a Hugging Face repo"):
            from_pretrained(name, revision="step0")


def test_cached_revisions_are_listed_main_first_then_checkpoints_by_step(cache):
    from glassbox.weights.checkpoints import cached_revisions

    folder, _ = cache
    assert cached_revisions(REPO, folder) == ["main", "step0", "step2", "step1000"]
    assert cached_revisions("nobody/nothing", folder) == []


# -- the published schedules, written out by hand -----------------------------------------------------
def test_pythia_checkpoints_are_step_0_then_powers_of_two_then_every_thousand():
    from glassbox.weights.checkpoints import checkpoint_labels

    labels, kind = checkpoint_labels("EleutherAI/pythia-70m")
    assert kind == "step" and len(labels) == 154
    assert labels[:12] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert labels[-3:] == [141000, 142000, 143000]
    v0, _ = checkpoint_labels("EleutherAI/pythia-70m-deduped-v0")
    assert v0[:2] == [1000, 2000] and len(v0) == 143


def test_stanford_checkpoints_follow_the_four_spacings():
    from glassbox.weights.checkpoints import checkpoint_labels

    labels, _ = checkpoint_labels("stanford-crfm/alias-gpt2-small-x21")
    assert len(labels) == 10 + 38 + 180 + 381 == 609
    assert labels[:11] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert labels[10:13] == [100, 150, 200] and labels[47:50] == [1950, 2000, 2100]
    assert labels[227:230] == [19900, 20000, 21000] and labels[-1] == 400000
    assert labels == sorted(set(labels))


def test_checkpoint_revision_by_index_or_step_and_each_bad_argument():
    from glassbox.weights.checkpoints import checkpoint_revision

    assert checkpoint_revision("EleutherAI/pythia-70m", index=-1) == ("step143000", 143000, -1)
    assert checkpoint_revision("EleutherAI/pythia-70m", index=11) == ("step1000", 1000, 11)
    assert checkpoint_revision("EleutherAI/pythia-70m", value=512) == ("step512", 512, 10)
    assert checkpoint_revision("stanford-crfm/alias-gpt2-small-x21", value=150) == ("checkpoint-150", 150, 11)
    assert checkpoint_revision("EleutherAI/pythia-70m", index=11, value=1000)[0] == "step1000"
    with pytest.raises(ValueError, match="checkpoint_index=154 is out of range.*154 checkpoints"):
        checkpoint_revision("EleutherAI/pythia-70m", index=154)
    with pytest.raises(ValueError, match="checkpoint_value=1001 is not a checkpoint.*either side are 1000 and 2000"):
        checkpoint_revision("EleutherAI/pythia-70m", value=1001)
    with pytest.raises(ValueError, match="either side are 143000 .get_checkpoint_labels lists all 154"):
        checkpoint_revision("EleutherAI/pythia-70m", value=10 ** 6)
    with pytest.raises(ValueError, match="checkpoint_index=11 is step 1000, but checkpoint_value=2000"):
        checkpoint_revision("EleutherAI/pythia-70m", index=11, value=2000)
    with pytest.raises(TypeError, match="checkpoint_index must be an int, got bool"):
        checkpoint_revision("EleutherAI/pythia-70m", index=True)
    with pytest.raises(TypeError, match="value"):  # the test run's shape checker or ours
        checkpoint_revision("EleutherAI/pythia-70m", value=1000.0)
    with pytest.raises(ValueError, match="'gpt2' has no training checkpoints"):
        checkpoint_revision("gpt2", index=0)
