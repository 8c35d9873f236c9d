"""Every option of every command says what it does: each config field, in every nested section, has a description
(it becomes the option's ``--help`` text), and every command's ``--help`` renders."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from swarmlm.cli import COMMANDS, _load, main


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
