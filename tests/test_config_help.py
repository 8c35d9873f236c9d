"""Every option of every command says what it does: each config field, in every nested section, has a description
(it becomes the option's ``--help`` text), and every command's ``--help`` renders."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, Field

from swarmlm import cli
from swarmlm.cli import COMMANDS, Command, _load, build_parser, main
from swarmlm.config import HelpFormatter, StrictModel, add_config_arguments


def _undescribed(model: type[BaseModel], prefix: str = "") -> list[str]:
    missing = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            missing += _undescribed(annotation, f"{prefix}{name}.")
        elif not (field.description or "").strip():
            missing.append(f"{prefix}{name}")
    return missing


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.path))
def test_every_option_has_help_text(command):
    assert _undescribed(_load(command.config)) == []


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.path))
def test_every_command_help_renders(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command.path, "--help"])
    assert exit_.value.code == 0
    assert "--config" in capsys.readouterr().out


# ---------------------------------------------------------------- help texts are shown as written, '%' included
def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every parser of the command tree, with its path (``()`` for ``swarmlm`` itself)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def _flat(text: str) -> str:
    """``text`` without its whitespace: argparse re-wraps help texts (at spaces and after hyphens)."""
    return "".join(text.split())


def test_every_help_string_of_every_parser_is_shown_as_written():
    """Every parser, the command groups' included, renders its help, and every option's help text appears in it
    verbatim (``%`` and all): no help string is read as a %-format."""
    parsers = dict(_parsers(build_parser()))
    assert {c.path for c in COMMANDS} <= set(parsers) and () in parsers and ("sapo",) in parsers
    for path, parser in parsers.items():
        assert parser.formatter_class is HelpFormatter, path
        shown = _flat(parser.format_help())
        for action in parser._actions:
            if action.help and action.help is not argparse.SUPPRESS:
                assert _flat(action.help) in shown, (path, action.help)
    assert _flat("node_models[k % len]") in _flat(parsers[("sapo", "swarm")].format_help())


class _PercentSection(StrictModel):
    share: float = Field(0.5, description="share of the batch, 0-100% (e.g. 50%); %(default)s is literal, so is %d")


class PercentConfig(StrictModel):
    """A command config whose help texts hold every kind of '%' argparse would misread."""

    section: _PercentSection = Field(default_factory=_PercentSection)
    ratio: int = Field(3, description="node k trains on k % ratio")


def test_percent_signs_in_field_and_command_help(monkeypatch, capsys):
    """A '%' in a field's description or in a command's own help text renders literally, at every level."""
    command = Command(("sapo", "percent"), "tests.test_config_help:PercentConfig", "tests.test_config_help:PercentConfig",
                      "uses 100% of k % n nodes")
    monkeypatch.setattr(cli, "COMMANDS", [*COMMANDS, command])
    for argv, expected in ((["sapo", "percent", "--help"], ["0-100% (e.g. 50%); %(default)s is literal, so is %d",
                                                             "node k trains on k % ratio", "uses 100% of k % n nodes"]),
                           (["sapo", "--help"], ["uses 100% of k % n nodes"])):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        shown = _flat(capsys.readouterr().out)
        for text in expected:
            assert _flat(text) in shown, (argv, text)
    # the hazard is real: argparse's own formatter raises on the same texts
    plain = argparse.ArgumentParser(formatter_class=argparse.HelpFormatter)
    add_config_arguments(plain, PercentConfig)
    with pytest.raises((TypeError, ValueError, KeyError)):
        plain.format_help()
