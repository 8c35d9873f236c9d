"""Configuration: pydantic models, read from YAML and overridden from the command line.

Every command's options live in one pydantic model. The command line gets one flag per leaf
field (``--grpo.eps-low 0.1`` or ``--grpo.eps_low 0.1``), a YAML file can set any of them
(``--config run.yaml``), and the merged result is validated once. A mistake is reported as a
:class:`ConfigError` that names the field and, where the field has a fixed set, the allowed values.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration mistake, phrased for the user."""


class HelpFormatter(argparse.HelpFormatter):
    """Shows every help text as written. argparse reads a help string as a %-format (for ``%(default)s``), so a
    literal ``%`` in any description (``node_models[k % len]``, ``50%``) would make ``--help`` raise; swarmlm's help
    texts state their defaults themselves and use no directives, so none is expanded. Every parser of the
    ``swarmlm`` command uses this class (:func:`swarmlm.cli.build_parser`)."""

    def _expand_help(self, action: argparse.Action) -> str:
        return self._get_help_string(action) or ""


class StrictModel(BaseModel):
    """Base for every config section: unknown fields are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def _literal_values(annotation: Any) -> list[Any] | None:
    """The allowed values of a ``Literal`` (possibly inside ``Optional``), else None."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            values = _literal_values(arg)
            if values is not None:
                return values
    return None


def _field_annotation(model: type[BaseModel], path: tuple[Any, ...]) -> Any:
    current: Any = model
    annotation = None
    for part in path:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return annotation
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        current = annotation
    return annotation


def _format_validation_error(model: type[BaseModel], err: ValidationError) -> str:
    lines = []
    for item in err.errors():
        loc = tuple(item["loc"])
        name = ".".join(str(p) for p in loc) or "<root>"
        if item["type"] == "extra_forbidden":
            parent = _field_annotation(model, loc[:-1]) if len(loc) > 1 else model
            known = sorted(parent.model_fields) if isinstance(parent, type) and issubclass(parent, BaseModel) else []
            lines.append(f"unknown field '{name}'" + (f"; known fields here: {', '.join(known)}" if known else ""))
            continue
        msg = f"field '{name}': {item['msg']}"
        allowed = _literal_values(_field_annotation(model, loc))
        if allowed is not None:
            msg += f" (allowed values: {', '.join(repr(v) for v in allowed)})"
        if "input" in item and not isinstance(item["input"], dict):
            msg += f"; got {item['input']!r}"
        lines.append(msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def validate_config(model: type[M], data: dict[str, Any]) -> M:
    """Build ``model`` from ``data``, turning pydantic's errors into one readable :class:`ConfigError`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(model, err)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of fields, not {type(data).__name__}")
    return data


class NamedSection(StrictModel):
    """A config section that can also be given by its name alone: ``model: Qwen/Qwen2.5-0.5B`` in YAML or
    ``--model tiny-llama`` on the command line mean ``{name: ...}`` with every other field at its default."""

    name: str

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value


def parse_list(value: Any) -> Any:
    """A list option as the command line may give it: ``a,b``, ``"a b"``, ``[a, b]`` (YAML) or one value.

    Use as a ``mode="before"`` validator; a list (from YAML) passes through, and pydantic then converts
    the items (``"4"`` to 4 for a ``list[int]``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return value
    return [part for part in re.split(r"[\s,]+", text) if part]


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted name, annotation, help) for every non-model field, recursing into sub-models.
    A :class:`NamedSection` also gets a flag of its own, taking the name."""
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        dotted = f"{prefix}{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if issubclass(annotation, NamedSection):
                out.append((dotted, str, f"shorthand for --{dotted}.name"))
            out.extend(_leaf_fields(annotation, dotted + "."))
            continue
        default = field.default if field.default_factory is None else field.default_factory()
        allowed = _literal_values(annotation)
        help_text = field.description or ""
        if allowed is not None:
            help_text += f" {{{', '.join(str(v) for v in allowed)}}}"
        help_text += f" (default: {default!r})"
        out.append((dotted, annotation, help_text.strip()))
    return out


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """Give ``parser`` a ``--config`` YAML option and one flag per leaf field of ``model``.

    Values are parsed as YAML scalars or lists (``--initial-peers '[a, b]'``, ``--beta 0.04``), so every
    type pydantic understands can be given, and validation happens once on the merged config.
    """
    parser.add_argument("--config", metavar="YAML", help="YAML file with any of the options below")
    for dotted, _annotation, help_text in _leaf_fields(model):
        dashed = f"--{dotted.replace('_', '-')}"
        flags = [dashed] + ([f"--{dotted}"] if "_" in dotted else [])
        parser.add_argument(
            *flags,
            dest=f"cfg::{dotted}",
            metavar="VALUE",
            default=argparse.SUPPRESS,
            help=help_text,  # shown as written: the parsers use HelpFormatter, which expands no %-directive
        )


def _parse_cli_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    cursor = data
    for part in parts[:-1]:
        nxt = cursor.get(part)
        if isinstance(nxt, str):  # a NamedSection given by its name, now refined field by field
            nxt = {"name": nxt}
        if not isinstance(nxt, dict):
            nxt = {}
        cursor[part] = nxt
        cursor = nxt
    if isinstance(cursor.get(parts[-1]), dict) and isinstance(value, str):
        value = {**cursor[parts[-1]], "name": value}  # --model X after a YAML model section
    cursor[parts[-1]] = value


def config_from_args(model: type[M], args: argparse.Namespace) -> M:
    """Merge defaults, the ``--config`` YAML and the command-line flags, in that order, and validate."""
    data: dict[str, Any] = load_yaml(args.config) if getattr(args, "config", None) else {}
    # parents before children, so that ``--model X --model.device cuda`` refines the named section
    for key, raw in sorted(vars(args).items(), key=lambda kv: kv[0].count(".")):
        if key.startswith("cfg::"):
            dotted = key[len("cfg::"):]
            value = _parse_cli_value(raw) if isinstance(raw, str) else raw
            annotation = _field_annotation(model, tuple(dotted.split(".")))
            optional_str = typing.get_origin(annotation) in (typing.Union, types.UnionType) and str in typing.get_args(annotation)
            if annotation is str or optional_str:
                # Keep strings literal ("0012", "yes", "null") when the field wants a string.
                value = raw if not (raw == "null" and type(None) in typing.get_args(annotation)) else None
            _set_dotted(data, dotted, value)
    return validate_config(model, data)


def dump_config(config: BaseModel, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
