"""A model name that names nothing is refused before anything is read: ``from_pretrained("")`` used to
load whatever model sat in the working directory (Path("") is ".")."""

import shutil
from pathlib import Path

import pytest

from glassbox import HookedTransformer
from glassbox.weights.pretrained import SHIPPED_DIR, config_of, from_pretrained, resolve


@pytest.fixture
def model_in_cwd(tmp_path, monkeypatch):
    shutil.copytree(SHIPPED_DIR / "glassbox-austen", tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("name", ["", " ", "\t\n", "   "])
@pytest.mark.parametrize("load", [from_pretrained, HookedTransformer.from_pretrained, config_of, resolve])
def test_an_empty_or_blank_name_is_refused_even_with_a_model_in_the_working_directory(model_in_cwd, load, name):
    with pytest.raises(ValueError, match=r"model name is empty \(got " + repr(name).replace("\\", "\\\\") + r"\)"):
        load(name)


@pytest.mark.parametrize("name", [None, 3, b"gpt2", ["gpt2"]])
@pytest.mark.parametrize("load", [from_pretrained, config_of])  # resolve's annotation is checked in tests
def test_a_name_that_is_not_a_string_or_path_is_a_type_error(model_in_cwd, load, name):
    with pytest.raises(TypeError, match=f"model name must be a str or a path, got {type(name).__name__}"):
        load(name)


def test_the_working_directory_named_explicitly_still_loads(model_in_cwd):
    assert from_pretrained(".").cfg.n_layers == from_pretrained(str(model_in_cwd)).cfg.n_layers
    assert resolve(Path(".")) == Path(".")
