"""dump_graph.py's and the fixtures' refusals: bad arguments and damaged transcoder folders name what is
wrong (no model is loaded)."""

import pytest
import yaml

from ct_fixtures import load_transcoders
from dump_graph import parse_args


def test_bad_arguments_are_refused_naming_them(capsys):
    with pytest.raises(SystemExit):
        parse_args(["m", "t", "1,x,3", "o.pt", "--token-ids"])
    assert "--token-ids: PROMPT must be comma-separated integers, got '1,x,3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["m", "t", "text", "o.pt", "--prune", "0.8"])
    assert "--prune takes NODE,EDGE (two numbers), got '0.8'" in capsys.readouterr().err
    args = parse_args(["m", "t", "5,6,7", "o.pt", "--token-ids", "--prune", "0.5,0.9", "--prune", "0.8,0.98"])
    assert args.prompt == [5, 6, 7] and args.prune == [(0.5, 0.9), (0.8, 0.98)]


def test_damaged_transcoder_folders_are_refused_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"config.yaml: a circuit-tracer transcoder folder holds config.yaml"):
        load_transcoders(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(dict(model_kind="transcoder_set", feature_output_hook="hook_mlp_out")))
    with pytest.raises(ValueError, match=r"config.yaml: no 'feature_input_hook'"):
        load_transcoders(tmp_path)
    config.write_text(yaml.safe_dump(dict(model_kind="sae", feature_input_hook="hook_resid_mid",
                                          feature_output_hook="hook_mlp_out")))
    with pytest.raises(ValueError, match=r"model_kind 'sae' is neither 'transcoder_set' nor 'cross_layer_transcoder'"):
        load_transcoders(tmp_path)
