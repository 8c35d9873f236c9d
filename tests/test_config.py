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


# ----------------------------------------------------------------------------- typos: the command's usage, a suggestion
@pytest.mark.parametrize("argv, usage, suggestion", [
    (["sapo", "simulate", "--rouns", "3"], "usage: swarmlm sapo simulate", "did you mean --rounds?"),
    (["sapo", "simulate", "--roun", "3"], "usage: swarmlm sapo simulate", "did you mean --rounds?"),  # no abbreviations
    (["sapo", "simulate", "--grpo.eps_lo", "0.1"], "usage: swarmlm sapo simulate", "did you mean --grpo.eps-low?"),
    (["noloco", "train", "--inner.lrr=0.1"], "usage: swarmlm noloco train", "did you mean --inner.lr?"),
    (["sapo", "simulat"], "usage: swarmlm sapo ", "did you mean simulate?"),
    (["nolcoo", "train"], "usage: swarmlm ", "did you mean noloco?"),
    (["simulate", "--rounds", "3"], "usage: swarmlm ", "did you mean swarmlm sapo simulate?"),
    (["noloco", "sync-bnch"], "usage: swarmlm noloco ", "did you mean sync-bench?"),
    (["--log-level", "DEBG", "models"], "usage: swarmlm ", "did you mean DEBUG?"),
    (["sapo", "simulate", "--log-level", "DEBUG"], "usage: swarmlm sapo simulate",
     "--log-level is an option of swarmlm itself and goes before the command: swarmlm --log-level VALUE sapo simulate"),
])
def test_a_typo_answers_with_the_commands_usage_and_a_suggestion(argv, usage, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and suggestion in err, err


def test_an_option_far_from_any_gets_no_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sapo", "simulate", "--zzzzzzzz", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzzzz 1" in err and "did you mean" not in err


# ----------------------------------------------------------------------------- user errors: one line, exit 2, nothing written
def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


def test_config_errors_are_one_line(capsys, tmp_path):
    line = one_line_error(capsys, ["sapo", "simulate", "--sharing.selection", "best", "--grpo.ppo-epochs", "0",
                                   "--out", str(tmp_path / "x")])
    assert line.startswith("swarmlm sapo simulate: invalid configuration: ")
    assert "grpo.ppo_epochs" in line and "'top_reward'" in line
    missing = tmp_path / "nope.yaml"
    assert one_line_error(capsys, ["sapo", "simulate", "--config", str(missing)]) == \
        f"swarmlm sapo simulate: config file not found: {missing}"
    assert not (tmp_path / "x").exists()


@pytest.fixture
def offline_hub(monkeypatch):
    """No network: the hub is offline (as HF_HUB_OFFLINE=1 makes it), so a name found nowhere else is unknown."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_an_unknown_model_is_one_line_naming_the_presets_before_anything_is_written(capsys, tmp_path, offline_hub):
    out = tmp_path / "run"
    line = one_line_error(capsys, ["noloco", "train", "--model", "llama-7b", "--out", str(out)])
    assert line.startswith("swarmlm noloco train: model 'llama-7b' is not a preset")
    assert "tiny-llama" in line and "llama-125m" in line and "hub id" in line
    assert not out.exists()
    for argv, says in ((["sapo", "simulate", "--model", str(tmp_path / "no" / "dir")], "does not exist"),
                       (["sapo", "swarm", "--node-models", "tiny-qwen2,./missing-model"], "does not exist"),
                       (["warmstart", "--model", "Qwen/Qwen2.5-0.5B"], "is not a built-in preset; presets: tiny-qwen2")):
        line = one_line_error(capsys, [*argv, "--out", str(out)])
        assert says in line, line
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x")
    for spec in (tmp_path / "empty", tmp_path / "weights.bin"):
        assert "a .gguf file" in one_line_error(capsys, ["sapo", "simulate", "--model", str(spec), "--out", str(out)])
    assert not out.exists()


def test_an_unreachable_hub_is_one_line(capsys, tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", no_network)
    line = one_line_error(capsys, ["sapo", "simulate", "--model", "someone/some-model", "--out", str(tmp_path / "x")])
    assert "could not reach the Hugging Face hub to look up model 'someone/some-model'" in line
    assert "Name or service not known" in line and "tiny-qwen2" in line
    assert not (tmp_path / "x").exists()


def test_a_missing_identity_is_an_error_unless_asked_to_create_it(capsys, tmp_path):
    from swarmlm.preflight import check_identity
    from swarmlm.sapo.swarm.config import SwarmNodeConfig

    out = tmp_path / "node"
    typo = tmp_path / "my-nod.key"
    line = one_line_error(capsys, ["sapo", "node", "--identity", str(typo), "--out", str(out)])
    assert line.startswith(f"swarmlm sapo node: identity file '{typo}' does not exist")
    assert "--create-identity" in line
    assert not out.exists() and not typo.exists()
    # allowed: asked to create it, no identity given (OUT/identity.key), the default path given, an existing file
    check_identity(SwarmNodeConfig(identity=str(typo), create_identity=True, out=str(out)))
    check_identity(SwarmNodeConfig(out=str(out)))
    check_identity(SwarmNodeConfig(identity=str(out / "identity.key"), out=str(out)))
    pytest.importorskip("hivemind")  # what a key file holds is read with hivemind (the swarm extra)
    typo.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="is not an identity file"):
        check_identity(SwarmNodeConfig(identity=str(typo), out=str(out)))
    from swarmlm.sapo.transports.hivemind.identity import load_identity

    key = tmp_path / "real.key"
    load_identity(key)  # creates it
    check_identity(SwarmNodeConfig(identity=str(key), out=str(out)))
    (tmp_path / "dir.key").mkdir()
    with pytest.raises(ConfigError, match="not a readable file"):
        check_identity(SwarmNodeConfig(identity=str(tmp_path / "dir.key"), out=str(out)))
    args = build_parser().parse_args(["sapo", "node", "--identity", "k", "--create-identity"])  # a flag alone: true
    assert config_from_args(SwarmNodeConfig, args).create_identity is True


def test_a_missing_data_file_is_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    line = one_line_error(capsys, ["noloco", "train", "--data.source", str(tmp_path / "corpus.txt"), "--out", str(out)])
    assert line.startswith("swarmlm noloco train: data.source: ") and "corpus.txt" in line
    assert not out.exists()


def _raise_missing_file(config):
    raise FileNotFoundError(2, "No such file or directory", "/data/corpus.txt")


def _raise_bug(config):
    raise RuntimeError("a bug, not a user's mistake")


def _raise_hub_error(config):
    from huggingface_hub.errors import LocalEntryNotFoundError

    raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache\nand outgoing traffic is disabled")


def test_errors_met_during_a_run_are_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    """What the preflight cannot see (a file gone, the hub) is still one line, exit 2; any other exception is a bug
    and is raised with its traceback."""
    from swarmlm import cli

    def command(name, run):
        return cli.Command(("sapo", name), "swarmlm.cli:ModelsConfig", f"tests.test_config:{run}", "a test command")

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, command("file", "_raise_missing_file"),
                                          command("bug", "_raise_bug"), command("hub", "_raise_hub_error")])
    assert one_line_error(capsys, ["sapo", "file"]) == \
        "swarmlm sapo file: cannot read /data/corpus.txt: No such file or directory"
    line = one_line_error(capsys, ["sapo", "hub"])
    assert line.startswith("swarmlm sapo hub: Hugging Face hub: Cannot find the requested files")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["sapo", "bug"])


def test_the_built_in_task_mixes_validate():
    """The presets' families are built without validation (so that importing the configs does not import
    reasoning-gym); each must still be a valid, audited family spec."""
    from swarmlm.tasks.reasoning_gym_tasks import TASK_PRESETS, FamilySpec, TaskConfig

    for preset, families in TASK_PRESETS.items():
        for spec in families:
            assert FamilySpec.model_validate(spec.model_dump()) == spec, (preset, spec)
        config = validate_config(TaskConfig, {"families": [f.model_dump() for f in families]})
        assert config.resolved_families() == families
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
        FamilySpec(name="chain_summ")
