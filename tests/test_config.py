"""Configuration: readable errors that name the field and its allowed values; YAML < CLI merge order."""

from __future__ import annotations

import argparse

import pytest
import yaml

from swarmlm.cli import build_parser, main
from swarmlm.config import ConfigError, add_config_arguments, config_from_args, dump_config, load_yaml, validate_config
from swarmlm.sapo.config import SAPOConfig, SimulateConfig


def error_of(model, data) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(model, data)
    return str(err.value)


# ----------------------------------------------------------------------------- errors
def test_unknown_field_names_itself_and_the_known_fields():
    msg = error_of(SAPOConfig, {"grpo": {"eps_lo": 0.1}})
    assert "unknown field 'grpo.eps_lo'" in msg
    assert "eps_low" in msg and "eps_high" in msg and "ppo_epochs" in msg
    msg = error_of(SAPOConfig, {"roundz": 3})
    assert "unknown field 'roundz'" in msg and "rounds" in msg


def test_wrong_literal_names_the_field_and_the_allowed_values():
    msg = error_of(SAPOConfig, {"sharing": {"selection": "random"}})
    assert "sharing.selection" in msg
    assert "'uniform'" in msg and "'first_valid'" in msg and "'top_reward'" in msg
    assert "'random'" in msg  # what was given
    msg = error_of(SAPOConfig, {"model": {"dtype": "fp8"}})
    assert "model.dtype" in msg and "'float32'" in msg and "'bfloat16'" in msg
    msg = error_of(SimulateConfig, {"transport": "hivemind?"})
    assert "transport" in msg and "'in_process'" in msg and "'torch'" in msg


def test_out_of_range_and_wrong_type_name_the_field():
    msg = error_of(SAPOConfig, {"grpo": {"eps_low": 1.5}})
    assert "grpo.eps_low" in msg
    msg = error_of(SAPOConfig, {"generation": {"group_size": "eight"}})
    assert "generation.group_size" in msg
    msg = error_of(SAPOConfig, {"tasks": {"families": [{"name": "no_such_family"}]}})
    assert "tasks.families.0.name" in msg and "no_such_family" in msg


def test_several_mistakes_are_reported_together():
    msg = error_of(SAPOConfig, {"rounds": 0, "grpo": {"beta": -1}})
    assert "rounds" in msg and "grpo.beta" in msg


def test_cross_field_rule():
    msg = error_of(SimulateConfig, {"nodes": 1, "external": 2})
    assert "external > 0 needs at least 2 nodes" in msg
    assert validate_config(SimulateConfig, {"nodes": 1, "external": 0}).nodes == 1


# ----------------------------------------------------------------------------- YAML + CLI
@pytest.fixture
def yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "rounds": 7, "nodes": 3, "local": 2,
        "grpo": {"eps_low": 0.1, "ppo_epochs": 2},
        "sharing": {"selection": "first_valid"},
    }))
    return path


def parse(argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, SimulateConfig)
    return config_from_args(SimulateConfig, parser.parse_args(argv))


def test_defaults_then_yaml_then_cli(yaml_file):
    config = parse(["--config", str(yaml_file), "--rounds", "3", "--grpo.ppo-epochs", "4", "--grpo.eps_high", "0.3"])
    assert config.rounds == 3                      # CLI over YAML
    assert config.nodes == 3 and config.local == 2  # YAML over defaults
    assert config.grpo.eps_low == 0.1               # YAML, sibling of CLI-set fields kept
    assert config.grpo.ppo_epochs == 4              # CLI, dashed flag
    assert config.grpo.eps_high == 0.3              # CLI, underscore flag
    assert config.sharing.selection == "first_valid"
    assert config.external == SimulateConfig().external  # untouched default
    only_yaml = parse(["--config", str(yaml_file)])
    assert only_yaml.rounds == 7 and only_yaml.grpo.ppo_epochs == 2


def test_cli_values_are_typed_by_the_field():
    config = parse(["--model.name", "0012", "--grpo.lr", "null", "--sharing.limits.group-sizes", "[4, 8]",
                    "--out", "null", "--grpo.beta", "0.04"])
    assert config.model.name == "0012"           # a string field keeps the literal text
    assert config.out == "null"
    assert config.grpo.lr is None                 # an optional number takes null
    assert config.sharing.limits.group_sizes == [4, 8]
    assert config.grpo.beta == 0.04


def test_cli_errors_name_the_flag_value():
    with pytest.raises(ConfigError, match="sharing.selection.*allowed values"):
        parse(["--sharing.selection", "best"])


def test_real_command_line_parser_merges_the_same_way(yaml_file):
    args = build_parser().parse_args(["sapo", "simulate", "--config", str(yaml_file), "--nodes", "5"])
    config = config_from_args(SimulateConfig, args)
    assert config.nodes == 5 and config.rounds == 7 and config.grpo.eps_low == 0.1


def test_main_reports_config_errors_and_exits_2(capsys, tmp_path):
    # these never start a run: the configuration is rejected first
    assert main(["sapo", "simulate", "--sharing.selection", "bogus", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "sharing.selection" in err and "'uniform'" in err and "'top_reward'" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  eps_lo: 0.1\n")
    assert main(["sapo", "simulate", "--config", str(bad), "--out", str(tmp_path / "y")]) == 2
    assert "unknown field 'grpo.eps_lo'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_unknown_flag_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse(["--grpo.epsilon", "0.1"])
    assert "--grpo.epsilon" in capsys.readouterr().err


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rounds: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_yaml(listing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_yaml(empty) == {}


def test_dump_and_reload_round_trip(tmp_path):
    config = validate_config(SimulateConfig, {"nodes": 3, "grpo": {"beta": 0.1}, "sharing": {"limits": {"group_sizes": [8]}}})
    dump_config(config, tmp_path / "c.yaml")
    assert validate_config(SimulateConfig, load_yaml(tmp_path / "c.yaml")) == config


def test_assignment_is_validated():
    config = SAPOConfig()
    with pytest.raises(Exception):
        config.grpo.ppo_epochs = 0
