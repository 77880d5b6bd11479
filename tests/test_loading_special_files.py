"""A weights, index, shard or config file that is a link to something that is not a regular file (a
device such as /dev/zero, a folder) or a dangling link is named as what it is, before it is read: not
reported as "not in the folder", never read forever from /dev/zero."""

import json
import os
import shutil

import pytest

from glassbox.weights.pretrained import SHIPPED_DIR, from_pretrained

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")


@pytest.fixture
def folder(tmp_path):
    shutil.copytree(SHIPPED_DIR / "glassbox-austen", tmp_path / "m")
    return tmp_path / "m"


def sharded(folder):
    """The folder's weights as a one-shard index."""
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "model-00001-of-00001.safetensors"), "pt") as f:
        names = list(f.keys())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))
    return folder / "model-00001-of-00001.safetensors"


@pytest.mark.parametrize("target,what", [("/dev/zero", "character device"), ("/tmp", "directory"),
                                         ("/nonexistent/x", "dangling link")])
@pytest.mark.parametrize("which", ["shard", "model.safetensors", "config.json", "index"])
def test_a_linked_special_file_is_named_as_what_it_is(folder, which, target, what):
    if which == "shard":
        path = sharded(folder)
    elif which == "index":
        sharded(folder)
        path = folder / "model.safetensors.index.json"
    else:
        path = folder / which
    path.unlink()
    path.symlink_to(target)
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        from_pretrained(str(folder))
    message = str(err.value)
    assert str(path) in message and what in message and target in message, message
    assert "not in" not in message, message


@pytest.mark.parametrize("name", ["vocab.json", "merges.txt", "tokenizer_config.json"])
def test_a_tokenizer_file_linked_to_a_device_is_named(folder, name):
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=f"{name} is a link to /dev/zero, a character device, not a regular file"):
        from_pretrained(str(folder))
