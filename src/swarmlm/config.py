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
    """A mistake the user can fix (an option, a config file, a model name, a missing file), phrased for the user in
    one line that says what is wrong and what is allowed. The command line prints it and exits with code 2."""


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
    return "invalid configuration: " + "; ".join(lines)  # one line, as the command line prints every mistake


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


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def help_sentence(description: str | None) -> str:
    """The first sentence of a field's description: its ``--help`` text. What follows (the reasons, the measurements)
    is for the configuration reference, which shows the whole description."""
    parts = _SENTENCE_END.split((description or "").strip(), maxsplit=1)
    return parts[0][:-1] if len(parts) > 1 and parts[0].endswith(".") else parts[0]


def _optional_inner(annotation: Any) -> Any:
    """``X`` for ``X | None``, else ``annotation``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _metavar(annotation: Any) -> str | None:
    """What the flag's value looks like, where its type says so plainly (``{a,b}``, ``N``, ``X``, ``LIST``)."""
    inner = _optional_inner(annotation)
    if typing.get_origin(inner) is Literal:
        return "{" + ",".join(str(v) for v in typing.get_args(inner)) + "}"
    if inner is bool:
        return "BOOL"
    if inner is int:
        return "N"
    if inner is float:
        return "X"
    if typing.get_origin(inner) is list:
        return "LIST"
    return None


def _field_help(field: Any, annotation: Any) -> str:
    default = field.default if field.default_factory is None else field.default_factory()
    text = help_sentence(field.description)
    allowed = _literal_values(annotation)
    if allowed is not None and typing.get_origin(_optional_inner(annotation)) is not Literal:
        text += f" {{{', '.join(str(v) for v in allowed)}}}"  # a Literal in a wider union: the metavar cannot say it
    if isinstance(default, BaseModel) or (default is None and "default" in text):
        return text.strip()  # a section has no value of its own; a None the text explains needs no "(default: None)"
    return f"{text} (default: {default!r})".strip()


def config_options(model: type[BaseModel]) -> list[tuple[str, str, Any, str, bool]]:
    """(dotted field, section, annotation, help text, shown) for every flag of ``model``'s command line: one per leaf
    field (recursing into sections; ``section`` is the dotted path of the leaf's parent, ``""`` at the top), and for
    a :class:`NamedSection` one more, ``--model``, that takes the name. The ``name`` leaf of such a section is not
    shown in ``--help`` (``--model X`` says it), but is still accepted (``--model.name X``)."""
    out: list[tuple[str, str, Any, str, bool]] = []

    def walk(current: type[BaseModel], prefix: str, hide_name: bool) -> None:
        for name, field in current.model_fields.items():
            annotation = field.annotation
            dotted = f"{prefix}{name}"
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                named = issubclass(annotation, NamedSection)
                if named:
                    name_field = annotation.model_fields["name"]
                    out.append((dotted, prefix[:-1], str, _field_help(name_field, name_field.annotation), True))
                walk(annotation, dotted + ".", named)
                continue
            out.append((dotted, prefix[:-1], annotation, _field_help(field, annotation), not (hide_name and name == "name")))

    walk(model, "", False)
    return out


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], common: tuple[str, ...] = ()) -> None:
    """Give ``parser`` a ``--config`` YAML option and one flag per leaf field of ``model``.

    Values are parsed as YAML scalars or lists (``--initial-peers '[a, b]'``, ``--beta 0.04``), so every
    type pydantic understands can be given, and validation happens once on the merged config.

    ``--help`` shows each flag once, with dashes (``--grpo.eps-low``) and the first sentence of the field's
    description; the underscore spelling (``--grpo.eps_low``) is accepted too. The fields named in ``common``
    (dotted, in that order) come first, in a group of their own with ``--config``; the other top-level fields
    follow, then one group per section (``grpo``, ``sharing.limits``...). A boolean flag alone means true
    (``--progress`` = ``--progress true``).
    """
    options = config_options(model)
    by_name = {dotted: i for i, (dotted, *_rest) in enumerate(options)}
    unknown = [name for name in common if name not in by_name]
    if unknown:
        raise ValueError(f"common options {unknown} are not fields of {model.__name__}")
    first = parser.add_argument_group("common options") if common else None
    groups: dict[str, Any] = {}

    def group_of(section: str) -> Any:
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section} options" if section else "options")
        return groups[section]

    (first or group_of("")).add_argument("--config", metavar="YAML", help="YAML file with any of the options below")
    if not parser.add_help:  # the command line's own parsers put -h with the common options
        (first or group_of("")).add_argument("-h", "--help", action="help", default=argparse.SUPPRESS,
                                             help="show this help and exit")
    order = [by_name[name] for name in common] + [i for i in range(len(options)) if options[i][0] not in common]
    for i in order:
        dotted, section, annotation, help_text, shown = options[i]
        target = first if dotted in common else group_of(section)
        dashed = f"--{dotted.replace('_', '-')}"
        boolean = _optional_inner(annotation) is bool
        kwargs: dict[str, Any] = dict(dest=f"cfg::{dotted}", metavar=_metavar(annotation) or "VALUE",
                                      default=argparse.SUPPRESS)
        if boolean:
            kwargs.update(nargs="?", const="true")
        # help shown as written: the parsers use HelpFormatter, which expands no %-directive
        target.add_argument(dashed, help=help_text if shown else argparse.SUPPRESS, **kwargs)
        if "_" in dotted:
            target.add_argument(f"--{dotted}", help=argparse.SUPPRESS, **kwargs)  # the other spelling, accepted


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
