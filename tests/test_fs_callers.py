"""Every writer of the package goes through glassbox.fs, and fails the way it does: a user's files in an
output folder are kept byte for byte, a fault at any file-system call of a save leaves (after the next
read) the old content or the new one, a file where a folder goes is refused naming it, and what the
savers of earlier versions left when killed mid-swap is recovered."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from fs_faults import fail_at, folder_state
from glassbox.fs import JOURNAL, RECORD

USER = {"README.md": b"# my SAE\n", "notes.txt": b"found feature 3 = commas", "figures/x.png": b"\x89PNG\r\n\x1a\n",
        "model-backup.safetensors": b"a user's look-alike", "pytorch_model-old.bin": b"another look-alike",
        "sae_weights-old.safetensors": b"and another"}


def add_user_files(folder: Path) -> None:
    for rel, data in USER.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def user_files(folder: Path) -> dict:
    return {rel: data for rel, data in folder_state(folder).items() if rel in USER}


def no_leftovers(folder: Path) -> bool:
    return not [e for e in os.listdir(folder) if e.startswith(".glassbox-") and e != RECORD] and \
        not [e for e in os.listdir(folder.parent) if e.startswith(("." + folder.name + ".", folder.name + ".glassbox"))]


# -- save_sae ---------------------------------------------------------------------------------------
def sae(arch="standard", seed=0):
    from glassbox.interp.sae.architectures import make_sae
    from glassbox.interp.sae.config import SAEConfig

    model = make_sae(SAEConfig(arch, 6, 11, "blocks.0.hook_resid_pre", metadata={"model_name": "tiny"}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def same_sae(a, b) -> bool:
    return a.architecture == b.architecture and all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                                                        b.state_dict().values()))


def test_save_sae_overwrite_keeps_a_user_s_files_and_drops_only_stale_sae_files(tmp_path):
    from glassbox.interp.sae.format import load_sae, load_sparsity, save_sae

    folder = tmp_path / "s"
    save_sae(sae(), folder, sparsity=torch.zeros(11))
    add_user_files(folder)
    save_sae(sae("gated", 1), folder, overwrite=True)
    assert user_files(folder) == USER
    assert same_sae(load_sae(folder), sae("gated", 1))
    assert load_sparsity(folder) is None, "the old save's sparsity was kept beside the new SAE"
    assert no_leftovers(folder)
    # a folder written without glassbox's record (SAELens's, or an earlier glassbox's): its SAE files are
    # the SAE format's names; a stale scaler beside the new SAE would be folded into it on load
    os.unlink(folder / RECORD)
    (folder / "activation_scaler.json").write_text('{"scaling_factor": 2.0}')
    save_sae(sae(seed=4), folder, overwrite=True)
    assert not (folder / "activation_scaler.json").exists() and user_files(folder) == USER
    assert json.loads((folder / RECORD).read_text())["files"] == ["cfg.json", "sae_weights.safetensors"]


def test_save_final_of_a_finished_run_keeps_the_user_s_files(tmp_path):
    """train-sae --resume of a finished run writes the final SAE again through save_final."""
    from glassbox.interp.sae.format import load_sae
    from glassbox.train.sae.checkpoint import save_final

    folder = tmp_path / "run" / "sae"
    save_final(sae(), folder)
    add_user_files(folder)
    save_final(sae(seed=2), folder)
    assert user_files(folder) == USER and same_sae(load_sae(folder), sae(seed=2))


def test_save_sae_onto_a_file_is_refused_naming_it(tmp_path):
    from glassbox.interp.sae.format import save_sae

    path = tmp_path / "s"
    path.write_bytes(b"a user's file")
    for overwrite in (False, True):
        with pytest.raises(NotADirectoryError, match="not a folder") as info:
            save_sae(sae(), path, overwrite=overwrite)
        assert info.value.filename == str(path)
    assert path.read_bytes() == b"a user's file"


def test_save_sae_faulted_at_any_call_leaves_the_old_or_new_sae_and_the_user_s_files(tmp_path):
    from glassbox.interp.sae.format import load_sae, save_sae

    old, new, event, seen = sae(seed=0), sae("jumprelu", 5), 1, set()
    while True:
        folder = tmp_path / str(event) / "s"
        save_sae(old, folder)
        add_user_files(folder)
        faulted, error = fail_at(event, lambda: save_sae(new, folder, overwrite=True))
        if not faulted:
            break
        assert isinstance(error, OSError), f"event {event}: {error!r}"
        back = load_sae(folder)  # recovers an interrupted save first
        assert same_sae(back, old) or same_sae(back, new), f"event {event}: a mix"
        assert user_files(folder) == USER and no_leftovers(folder), f"event {event}"
        seen.add(same_sae(back, new))
        event += 1
    assert event > 15 and seen == {False, True}


def test_an_sae_left_aside_by_the_earlier_two_rename_save_is_put_back(tmp_path):
    """The earlier save_sae renamed s into .s.XXXXXXXX.old/ and a .s.XXXXXXXX.tmp/ into place; killed in
    between, no s/ was left and nothing recovered it."""
    from glassbox.interp.sae.format import load_sae, save_sae

    save_sae(sae(seed=3), tmp_path / "s")
    (tmp_path / ".s.ab12cd34.old").mkdir()
    os.rename(tmp_path / "s", tmp_path / ".s.ab12cd34.old" / "s")
    (tmp_path / ".s.zz99yy88.tmp").mkdir()
    (tmp_path / ".s.zz99yy88.tmp" / "cfg.json").write_text("{half")
    (tmp_path / "s.old").mkdir()  # a user's folder that only looks like a leftover
    assert same_sae(load_sae(tmp_path / "s"), sae(seed=3))
    assert sorted(os.listdir(tmp_path)) == ["s", "s.old"]
