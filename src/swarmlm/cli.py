"""The ``swarmlm`` command line.

Each command is a config model plus a function that takes the validated config. Options come from
the model's fields (``--rounds 20``, ``--grpo.beta 0.04``) or a YAML file (``--config run.yaml``).
"""

from __future__ import annotations

import argparse
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


COMMANDS: list[Command] = [
    Command(("warmstart",), "swarmlm.sapo.warmstart:WarmstartConfig", "swarmlm.sapo.commands:warmstart_command",
            "teach a built-in preset the answer format (cached; run on demand by the SAPO commands)"),
    Command(("sapo", "simulate"), "swarmlm.sapo.config:SimulateConfig", "swarmlm.sapo.commands:simulate_command",
            "run N SAPO nodes on this machine (in-process or torch.distributed)",
            report="swarmlm.experiments.sapo_learning_curve:simulate_report"),
    Command(("noloco", "train"), "swarmlm.noloco.config:TrainConfig", "swarmlm.noloco.launch:train_command",
            "pre-train M replicas with NoLoCo (pair averaging), DiLoCo or data parallel (local workers or under torchrun)"),
    Command(("noloco", "compare"), "swarmlm.experiments.noloco_compare:CompareConfig",
            "swarmlm.experiments.noloco_compare:compare_command",
            "train ddp, diloco and noloco alike and compare validation perplexity against step and simulated wall-clock"),
    Command(("noloco", "sync-bench"), "swarmlm.experiments.sync_bench:SyncBenchConfig",
            "swarmlm.experiments.sync_bench:sync_bench_command",
            "time one synchronisation step, NoLoCo pair exchange against all-reduce, as M grows (with an analytic model)"),
    Command(("sapo", "experiment"), "swarmlm.experiments.sapo_sharing:ExperimentConfig",
            "swarmlm.experiments.sapo_sharing:experiment_command",
            "the SAPO paper's sharing experiment: I/J configurations x seeds, with table and plots"),
    Command(("models",), "swarmlm.cli:ModelsConfig", "swarmlm.cli:models_command",
            "list the built-in model presets"),
    Command(("sapo", "node"), "swarmlm.sapo.swarm.config:SwarmNodeConfig", "swarmlm.sapo.commands:node_command",
            "run one SAPO node of a decentralized swarm over the hivemind DHT (a volunteer's command)"),
    Command(("sapo", "swarm"), "swarmlm.sapo.swarm.config:SwarmConfig", "swarmlm.sapo.commands:swarm_command",
            "start N SAPO node processes on this machine over loopback and follow them"),
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


def build_parser() -> argparse.ArgumentParser:
    # every parser shows its help texts as written (HelpFormatter): a '%' in any of them is just a '%'
    parser = argparse.ArgumentParser(prog="swarmlm", description="Decentralized LM training: SAPO and NoLoCo.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default: INFO)")
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", metavar="COMMAND", required=True)}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for cmd in COMMANDS:
        for depth in range(1, len(cmd.path)):
            prefix = cmd.path[:depth]
            if prefix not in parsers:
                parsers[prefix] = groups[prefix[:-1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands",
                                                                 formatter_class=HelpFormatter)
                groups[prefix] = parsers[prefix].add_subparsers(dest="_".join(prefix), metavar="COMMAND", required=True)
        sub = groups[cmd.path[:-1]].add_parser(cmd.path[-1], help=cmd.help, description=cmd.help,
                                               formatter_class=HelpFormatter)
        add_config_arguments(sub, _load(cmd.config))
        sub.set_defaults(_command=cmd)
    return parser


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_level)
    cmd: Command = args._command
    try:
        config = config_from_args(_load(cmd.config), args)
        result = _load(cmd.run)(config)
        if cmd.report is not None and result in (None, 0, 130):
            _load(cmd.report)(config)
    except ConfigError as err:
        print(f"swarmlm {' '.join(cmd.path)}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if isinstance(result, int):
        return result
    return 0

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
