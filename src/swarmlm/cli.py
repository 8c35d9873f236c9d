"""The ``swarmlm`` command line.

Each command is a config model plus a function that takes the validated config. Options come from
the model's fields (``--rounds 20``, ``--grpo.beta 0.04``) or a YAML file (``--config run.yaml``).

The parser is cheap to build: a command's config module imports no torch, transformers or reasoning-gym, and
:func:`main` builds the options of the one command it runs (``swarmlm --help`` reads no config at all). A mistake
the user can fix (an unknown option or command, a bad value, an unknown model, a missing file or identity, an
unreachable hub) is one line on stderr and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from dataclasses import dataclass
from typing import Any

from swarmlm.config import ConfigError, HelpFormatter, StrictModel, add_config_arguments, config_from_args


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # e.g. ("sapo", "simulate")
    config: str  # "module:Class" of the pydantic config
    run: str  # "module:function" taking the config
    help: str
    # "module:function" taking the config, called after the run (also an interrupted one): a report drawn by the
    # layer above the methods (experiments), which the methods' own handlers may not import
    report: str | None = None
    # the few options most runs set (dotted field names), shown first in --help in a group of their own
    common: tuple[str, ...] = ()


COMMANDS: list[Command] = [
    Command(("warmstart",), "swarmlm.sapo.warmstart:WarmstartConfig", "swarmlm.sapo.commands:warmstart_command",
            "teach a built-in preset the answer format (cached; run on demand by the SAPO commands)",
            common=("model", "steps", "seed", "out")),
    Command(("sapo", "simulate"), "swarmlm.sapo.config:SimulateConfig", "swarmlm.sapo.commands:simulate_command",
            "run N SAPO nodes on this machine (in-process or torch.distributed)",
            report="swarmlm.experiments.sapo_learning_curve:simulate_report",
            common=("nodes", "rounds", "local", "external", "model", "out", "seed")),
    Command(("noloco", "train"), "swarmlm.noloco.config:TrainConfig", "swarmlm.noloco.launch:train_command",
            "pre-train M replicas with NoLoCo (pair averaging), DiLoCo or data parallel (local workers or under torchrun)",
            common=("method", "replicas", "steps", "model", "backend", "device", "out", "seed")),
    Command(("noloco", "compare"), "swarmlm.experiments.noloco_compare:CompareConfig",
            "swarmlm.experiments.noloco_compare:compare_command",
            "train ddp, diloco and noloco alike and compare validation perplexity against step and simulated wall-clock",
            common=("methods", "replicas", "steps", "seeds", "model", "backend", "out")),
    Command(("noloco", "sync-bench"), "swarmlm.experiments.sync_bench:SyncBenchConfig",
            "swarmlm.experiments.sync_bench:sync_bench_command",
            "time one synchronisation step, NoLoCo pair exchange against all-reduce, as M grows (with an analytic model)",
            common=("replicas", "numel", "repeats", "latency_ms", "bandwidth_gbit", "out")),
    Command(("sapo", "experiment"), "swarmlm.experiments.sapo_sharing:ExperimentConfig",
            "swarmlm.experiments.sapo_sharing:experiment_command",
            "the SAPO paper's sharing experiment: I/J configurations x seeds, with table and plots",
            common=("configurations", "seeds", "nodes", "rounds", "model", "out")),
    Command(("models",), "swarmlm.cli:ModelsConfig", "swarmlm.cli:models_command",
            "list the built-in model presets"),
    Command(("sapo", "node"), "swarmlm.sapo.swarm.config:SwarmNodeConfig", "swarmlm.sapo.commands:node_command",
            "run one SAPO node of a decentralized swarm over the hivemind DHT (a volunteer's command)",
            common=("initial_peers", "host_maddrs", "announce_maddrs", "identity", "create_identity", "swarm.run",
                    "model", "rounds", "out")),
    Command(("sapo", "swarm"), "swarmlm.sapo.swarm.config:SwarmConfig", "swarmlm.sapo.commands:swarm_command",
            "start N SAPO node processes on this machine over loopback and follow them",
            common=("nodes", "rounds", "model", "node_models", "swarm.run", "out")),
]


class ModelsConfig(StrictModel):
    """``swarmlm models`` takes no options."""


def models_command(config: ModelsConfig) -> int:
    from swarmlm.models import PRESETS, build_preset, count_parameters

    for name, preset in PRESETS.items():
        size = f"{count_parameters(build_preset(name).model) / 1e6:.1f}M" if preset.hidden <= 512 else "(GPU shape)"
        print(f"{name:14s} {preset.family:6s} {size:>12s}  {preset.description}")
    print("Any Hugging Face causal LM also works: a hub id, a local directory, or a .gguf file.")
    return 0


def _load(target: str) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


#: options that were renamed: old spelling -> new one (said when the old one is given)
RENAMED = {"--nproc": "--replicas"}


def _did_you_mean(word: str, candidates: list[str]) -> str:
    """``"; did you mean X?"`` for the candidate closest to ``word`` (difflib), or ``""``."""
    if word in RENAMED and RENAMED[word] in candidates:
        return f"; {word} is now {RENAMED[word]}"
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, suggesting the closest command or choice when a value is not one of them."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            hint = _did_you_mean(str(value), choices)
            if not hint and isinstance(action, argparse._SubParsersAction):
                # a command without its group (``swarmlm simulate``): suggest the whole command
                leaves = {cmd.path[-1]: "swarmlm " + " ".join(cmd.path) for cmd in COMMANDS}
                close = difflib.get_close_matches(str(value), list(leaves), n=1, cutoff=0.6)
                hint = f"; did you mean {leaves[close[0]]}?" if close else ""
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {', '.join(choices)})" + hint)

    def unknown_options(self, extras: list[str], top_level: tuple[str, ...] = ()) -> None:
        """Exit (code 2) with this parser's usage, naming the arguments it did not recognise and, for a misspelled
        option, the closest one it has; for an option of ``swarmlm`` itself (``top_level``) given after the
        command, where it goes."""
        names = [arg.split("=", 1)[0] for arg in extras if arg.startswith("--")]
        misplaced = next((name for name in names if name in top_level), None)
        if misplaced:
            self.error(f"unrecognized arguments: {' '.join(extras)}; {misplaced} is an option of swarmlm itself and "
                       f"goes before the command: swarmlm {misplaced} VALUE {self.prog.split(' ', 1)[-1]} ...")
        known = sorted({s.replace("_", "-") for s in self._option_string_actions if s.startswith("--")})
        hints = [_did_you_mean(name.replace("_", "-"), known) for name in names]
        self.error(f"unrecognized arguments: {' '.join(extras)}" + next((h for h in hints if h), ""))


def _command_path(argv: list[str]) -> tuple[str, ...]:
    """The command named by ``argv`` (after the top-level options), as far as it names one: ``("sapo", "simulate")``."""
    prefixes = {cmd.path[:depth] for cmd in COMMANDS for depth in range(1, len(cmd.path) + 1)}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--log-level" else 1
    path: tuple[str, ...] = ()
    while i < len(argv) and path + (argv[i],) in prefixes:
        path += (argv[i],)
        i += 1
    return path


def build_parser(only: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The ``swarmlm`` parser with every command's options, or, with ``only``, with the options of that command
    alone (the other commands are listed, with their help, but not built: :func:`main` builds what it runs)."""
    # every parser shows its help texts as written (HelpFormatter): a '%' in any of them is just a '%'
    # no abbreviations: with a hundred options, a prefix (or a misspelling that is one, --grpo.eps_lo) would silently
    # set whichever option it begins; a misspelled option is an error with a suggestion instead
    parser = ArgumentParser(prog="swarmlm", description="Decentralized LM training: SAPO and NoLoCo.",
                            epilog="'swarmlm COMMAND --help' lists a command's options.",
                            formatter_class=HelpFormatter, allow_abbrev=False)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default: INFO)")
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="COMMAND", required=True)}
    order = [part for cmd in COMMANDS for part in cmd.path]
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for cmd in COMMANDS:
        for depth in range(1, len(cmd.path)):
            prefix = cmd.path[:depth]
            if prefix not in parsers:
                children = sorted({c.path[depth] for c in COMMANDS if c.path[:depth] == prefix}, key=order.index)
                parsers[prefix] = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{', '.join(children)}",
                                                                 formatter_class=HelpFormatter, allow_abbrev=False)
                groups[prefix] = parsers[prefix].add_subparsers(dest="_".join(prefix), metavar="COMMAND", required=True)
        # the usage line names the common options: the groups below list every option once
        common = "".join(f" [--{name.replace('_', '-')} ...]" for name in cmd.common[:4])
        sub = groups[cmd.path[:-1]].add_parser(cmd.path[-1], help=cmd.help, description=cmd.help,
                                               formatter_class=HelpFormatter, add_help=False, allow_abbrev=False,
                                               usage=f"%(prog)s [-h] [--config YAML]{common} [--OPTION VALUE ...]")
        if only is None or only == cmd.path:
            add_config_arguments(sub, _load(cmd.config), common=cmd.common)
        else:
            sub.add_argument("-h", "--help", action="help", default=argparse.SUPPRESS, help="show this help and exit")
        sub.set_defaults(_command=cmd, _parser=sub)
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def _quiet_transformers() -> None:
    """No progress bars or warnings from transformers (imported here, once the run is sure to start)."""
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _user_error(err: BaseException) -> str | None:
    """The one line that says what is wrong, for a mistake the user can fix; None for anything else (a bug)."""
    if isinstance(err, ConfigError):
        return _one_line(err)
    loading = sys.modules.get("swarmlm.models.loading")
    if loading is not None and isinstance(err, loading.ModelLoadError):
        return _one_line(err)
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)) and err.filename:
        return f"cannot read {err.filename}: {err.strerror}"
    # the hub's and the network's errors, from whichever of these libraries the run imported
    for module, names, what in (
            ("huggingface_hub.errors", ("HfHubHTTPError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
                                        "HFValidationError"), "Hugging Face hub"),
            ("requests.exceptions", ("ConnectionError", "Timeout"), "network error"),
            ("httpx", ("TransportError",), "network error")):
        found = sys.modules.get(module)
        kinds = tuple(k for k in (getattr(found, n, None) for n in names) if isinstance(k, type))
        if kinds and isinstance(err, kinds):
            return f"{what}: {_one_line(err)}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_command_path(argv))
    args, extras = parser.parse_known_args(argv)
    if extras:
        args._parser.unknown_options(extras, top_level=("--log-level",))
    _setup_logging(args.log_level)
    cmd: Command = args._command
    try:
        config = config_from_args(_load(cmd.config), args)
        from swarmlm.preflight import check_inputs  # what a run reads must exist before anything is written

        check_inputs(config)
        _quiet_transformers()
        result = _load(cmd.run)(config)
        if cmd.report is not None and result in (None, 0, 130):
            _load(cmd.report)(config)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        line = _user_error(err)
        if line is None:
            raise
        print(f"swarmlm {' '.join(cmd.path)}: {line}", file=sys.stderr)
        if args.log_level == "DEBUG":
            logging.getLogger(__name__).debug("the error's traceback", exc_info=err)
        return 2
    if isinstance(result, int):
        return result
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
