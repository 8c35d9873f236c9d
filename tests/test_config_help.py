"""Every option of every command says what it does: each config field, in every nested section, has a description
(its first sentence becomes the option's ``--help`` text), and every command's ``--help`` renders: grouped, the
command's common options first, each flag once, and without importing torch, transformers or reasoning-gym."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, Field

from swarmlm import cli
from swarmlm.cli import COMMANDS, Command, _load, build_parser, main
from swarmlm.config import HelpFormatter, StrictModel, add_config_arguments, config_from_args, help_sentence
from swarmlm.sapo.config import GRPOSection, SimulateConfig


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


# ---------------------------------------------------------------- a light parser: no torch, transformers or reasoning-gym
HEAVY = ("torch", "transformers", "reasoning_gym")

# builds the parser, or runs one command's --help, in a fresh interpreter; prints the heavy libraries it imported
_PROBE = """
import sys, json, contextlib, io
from swarmlm.cli import build_parser, main
if sys.argv[1:] == ["build"]:
    parser = build_parser()
    for action in parser._actions:
        pass
else:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(sys.argv[1:])
        except SystemExit as exit_:
            assert exit_.code == 0, exit_.code
print(json.dumps([m for m in %r if m in sys.modules]))
""" % (HEAVY,)


def _heavy_imports(*args: str) -> list[str]:
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_building_the_whole_parser_imports_no_heavy_library():
    """Every command's config module is read to build the parser: none of them may import torch, transformers or
    reasoning-gym at import time (they take seconds; ``--help`` and a typo must answer at once)."""
    assert _heavy_imports("build") == []


@pytest.mark.parametrize("path", [(), *[c.path for c in COMMANDS]], ids=lambda p: " ".join(p) or "swarmlm")
def test_every_help_imports_no_heavy_library(path):
    assert _heavy_imports(*path, "--help") == []


# ---------------------------------------------------------------- help grouped, one spelling per flag
def _option_lines(text: str) -> list[str]:
    """The options ``--help`` lists, each as its first word, one per option line."""
    return [line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  -")]


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.common], ids=lambda c: " ".join(c.path))
def test_help_shows_each_flag_once_common_options_first(command, capsys):
    with pytest.raises(SystemExit):
        main([*command.path, "--help"])
    text = capsys.readouterr().out
    shown = _option_lines(text)
    assert len(shown) == len(set(shown)), [s for s in shown if shown.count(s) > 1]
    flags = " ".join(line for line in text.splitlines() if line.startswith("  -"))
    assert "_" not in "".join(w for w in flags.split() if w.startswith("--")), "an underscore spelling is shown"
    # the first group: --config, -h and the command's common options, in their order
    first_group = text.split("common options:\n", 1)[1].split("\n\n", 1)[0]
    expected = ["--config", "-h"] + [f"--{name.replace('_', '-')}" for name in command.common]
    assert _option_lines(first_group) == expected
    assert text.index("common options:") < text.index("\noptions:") if "\noptions:" in text else True


def test_sections_have_groups_and_the_other_spelling_still_parses():
    parser = build_parser()
    sub = dict(_parsers(parser))[("sapo", "simulate")]
    titles = [g.title for g in sub._action_groups]
    assert titles.index("common options") < titles.index("grpo options") < titles.index("sharing.limits options")
    shown = sub.format_help()
    assert "--grpo.eps-low" in shown and "--grpo.eps_low" not in shown and "--model.name" not in shown
    args = parser.parse_args(["sapo", "simulate", "--grpo.eps_low", "0.1", "--model.name", "tiny-llama",
                              "--grpo.shuffle-advantages"])
    config = config_from_args(SimulateConfig, args)
    assert config.grpo.eps_low == 0.1 and config.model.name == "tiny-llama" and config.grpo.shuffle_advantages is True


def test_help_texts_are_one_sentence_and_the_description_keeps_the_rest():
    """A field's description may go on with reasons and measurements (the configuration reference shows it all);
    ``--help`` shows its first sentence."""
    assert help_sentence("rate of x. Measured: 3 s. More") == "rate of x"
    assert help_sentence("a; b (c. d)") == "a; b (c. d)"
    parsers = dict(_parsers(build_parser()))
    for command in COMMANDS:
        for action in parsers[command.path]._actions:
            if action.help and action.help is not argparse.SUPPRESS:
                text = action.help.rsplit(" (default:", 1)[0]
                assert help_sentence(text) == text, (command.path, action.help)
    field = GRPOSection.model_fields["external_weight"]
    assert "lost the answer format" in field.description  # the rationale stays where the docs read it
    shown = parsers[("sapo", "simulate")].format_help()
    assert "lost the answer format" not in shown


def test_common_options_must_be_fields():
    bad = argparse.ArgumentParser(formatter_class=HelpFormatter)
    with pytest.raises(ValueError, match="not fields"):
        add_config_arguments(bad, PercentConfig, common=("ratio", "no_such_field"))


def test_main_builds_only_the_command_it_runs(monkeypatch):
    """``swarmlm sapo simulate ...`` reads no other command's config (each parser is cheap, not free)."""
    loaded = []
    real = cli._load
    monkeypatch.setattr(cli, "_load", lambda target: loaded.append(target) or real(target))
    with pytest.raises(SystemExit):
        main(["sapo", "simulate", "--help"])
    assert loaded == ["swarmlm.sapo.config:SimulateConfig"]
    loaded.clear()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert loaded == []
