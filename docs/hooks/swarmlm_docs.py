"""MkDocs hook that generates the parts of the documentation that have one source elsewhere.

* ``reference/config/<command>.md``: one page per ``swarmlm`` command, a table of every option (flag, type,
  default, description) walked from the command's pydantic config model, so the reference cannot drift from
  the code. The pages are added to the site in :func:`on_files` and to the navigation in :func:`on_config`.
* ``<!-- cli-commands -->`` in a page: a table of the commands with their one-line help.
* ``<!-- results: NAME -->`` in a page: a table rendered from ``docs/results/*.json`` by ``RESULTS[NAME]``.
  ``tests/test_docs.py`` also checks that the README's headline tables are exactly these renderings.

The module is plain Python (no MkDocs import at module level), so the tests can import it by path.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "docs" / "results"
CONFIG_DIR = "reference/config"
NAV_TITLE = "Configuration"  # the nav entry under which the generated pages are listed


# --------------------------------------------------------------------------------------------- the commands


def commands() -> list[Any]:
    """``swarmlm.cli.COMMANDS``: every command with its path, config model (``module:Class``) and help."""
    from swarmlm.cli import COMMANDS

    return list(COMMANDS)


def load_model(target: str) -> type:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def command_slug(path: tuple[str, ...]) -> str:
    return "-".join(path)


def _escape(text: str) -> str:
    """Text for a markdown table cell."""
    text = " ".join(str(text).split())
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def type_name(annotation: Any) -> str:
    """A short, readable name of a field's type: ``int``, ``float | None``, ``'a' | 'b'``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "(required)"
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value!r}`"


def _is_model(annotation: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _flag(dotted: str) -> str:
    return "--" + dotted.replace("_", "-")


def config_rows(model: type, prefix: str = "") -> list[tuple[str, list[tuple[str, str, str, str]], str]]:
    """The model's options as sections: (dotted prefix, rows of (flag, type, default, description), section doc).
    The first section is the model's own (top-level) fields; each sub-model follows as its own section."""
    from swarmlm.config import NamedSection

    rows: list[tuple[str, str, str, str]] = []
    subsections: list[tuple[str, list[tuple[str, str, str, str]], str]] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        annotation = field.annotation
        if _is_model(annotation):
            if issubclass(annotation, NamedSection):
                rows.append((_flag(dotted), "str", "", f"shorthand for `{_flag(dotted + '.name')}`"))
            subsections.extend(config_rows(annotation, dotted + "."))
            continue
        rows.append((_flag(dotted), type_name(annotation), _default(field), field.description or ""))
    doc = (model.__doc__ or "").strip()
    if doc.startswith(("A base class", "Usage docs:")):  # pydantic's own BaseModel docstring
        doc = ""
    return [(prefix, rows, doc)] + subsections


def config_page(command: Any) -> str:
    """The reference page of one command's options."""
    model = load_model(command.config)
    name = " ".join(command.path)
    sections = config_rows(model)
    example = next((f"{row[0]} VALUE" for _, rows, _ in sections for row in rows if row[1] != "bool"), None)
    if example is None:
        return "\n".join([f"# `swarmlm {name}`", "", _escape(command.help) + ".", "", f"`swarmlm {name}` takes no options.", ""])
    lines = [
        f"# `swarmlm {name}`",
        "",
        _escape(command.help) + ".",
        "",
        f"Every option is a flag (`swarmlm {name} {example}`) and a field of the YAML file given by `--config`",
        "(nested options as nested mappings; flags override the file). Generated from the pydantic model "
        f"`{command.config.replace(':', '.')}`; `swarmlm {name} --help` lists the same options.",
        "",
    ]
    for prefix, rows, doc in sections:
        if prefix:
            lines += [f"## `{_flag(prefix)}*`", ""]
        if doc:
            doc = re.sub(r":(?:mod|class|func|meth|attr|data):`~?([^`]+)`", r"`\1`", doc)
            lines += [_escape(re.sub(r"``([^`]+)``", r"`\1`", doc)), ""]
        if not rows:
            lines += ["No options of its own.", ""]
            continue
        lines += ["| option | type | default | description |", "|---|---|---|---|"]
        for flag, type_, default, description in rows:
            lines.append(f"| `{flag}` | `{_escape(type_)}` | {_escape(default)} | {_escape(description)} |")
        lines.append("")
    return "\n".join(lines)


def cli_table() -> str:
    lines = ["| command | what it does | options |", "|---|---|---|"]
    for command in commands():
        name = " ".join(command.path)
        link = f"config/{command_slug(command.path)}.md"
        lines.append(f"| `swarmlm {name}` | {_escape(command.help)} | [all options]({link}) |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- results tables


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS_DIR / f"{name}.json").read_text())


def _f3(x: float) -> str:
    return f"{x:.3f}"


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"


def _sapo_run_cells(run: dict) -> tuple[str, str, str]:
    """A default run's seed, each node's final pass@1, and its format rate: lowest round / lowest 10-round mean /
    last round."""
    seed = re.search(r"--seed (\d+)", run["command"])
    nodes = list(run["nodes"].values())
    fmt = (f"{min(n['min_format_rate_round'] for n in nodes):.2f} / {min(n['format_rate_min10'] for n in nodes):.2f}"
           f" / {_range([n['final_format_rate'] for n in nodes])}")
    return seed.group(1) if seed else "0", ", ".join(_f3(n["final_eval_pass1"]) for n in nodes), fmt


def sapo_default_run(name: str = "sapo_default_run") -> str:
    """Per seed: mean held-out pass@1 at rounds 0, 50 and 100, the gain, each node at round 100, and the format."""
    data = _load(name)
    lines = [
        "| `--seed` | mean pass@1, round 0 | round 50 | round 100 | gain | per node at round 100 "
        "| format rate, lowest round / lowest 10-round mean / last round |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:
        seed, finals, fmt = _sapo_run_cells(run)
        by_round = run["mean_eval_pass1_by_round"]
        lines.append(f"| {seed} | {_f3(by_round['0'])} | {_f3(by_round['50'])} | {_f3(by_round['100'])} "
                     f"| {_signed(run['gain'])} | {finals} | {fmt} |")
    return "\n".join(lines)


def sapo_first_run(name: str = "sapo_first_run") -> str:
    """The default run from the shipped warm start, per seed (benchmarks/first_run.py): mean held-out pass@1 at
    every evaluated round, the gain, each node at the end, the format, and what it cost."""
    data = _load(name)
    rounds = sorted({int(r) for run in data["runs"] for r in run["mean_eval_pass1_by_round"]})
    lines = [
        "| `--seed` | " + " | ".join(f"mean pass@1, round {r}" if i == 0 else f"round {r}" for i, r in enumerate(rounds))
        + " | gain | per node at the end | format rate, lowest round / lowest 10-round mean / last round "
        "| seconds, start to end | written |",
        "|---|" + "---|" * (len(rounds) + 5),
    ]
    for run in data["runs"]:
        seed, finals, fmt = _sapo_run_cells(run)
        by_round = run["mean_eval_pass1_by_round"]
        cells = " | ".join(_f3(by_round[str(r)]) if str(r) in by_round else "—" for r in rounds)
        lines.append(f"| {seed} | {cells} | {_signed(run['gain'])} | {finals} | {fmt} | {run['wall_seconds']:.0f} "
                     f"| {run['bytes_written'] / 1e6:.1f} MB |")
    return "\n".join(lines)


def _mean_ci(stat: dict[str, float], digits: int) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['ci95']:.{digits}f}"


def sapo_experiment(name: str = "sapo_experiment") -> str:
    """The sharing experiment: per I/J configuration, cumulative own reward and its ratio to 8/0, final pass@1, and
    the SAPO paper's figures (arXiv 2509.08721)."""
    data = _load(name)
    baseline = data.get("baseline", "8/0")
    lines = [
        "| I / J | cumulative own reward | vs 8/0 | final held-out pass@1 | paper: cumulative reward | paper: vs 8/0 |",
        "|---|---|---|---|---|---|",
    ]
    for config, row in data["configurations"].items():
        ratio = row["ratio_to_baseline"]
        versus = "—" if config == baseline else f"{(ratio['mean'] - 1) * 100:+.0f}% ± {ratio['ci95'] * 100:.0f}%"
        paper_ratio = row.get("paper_ratio_to_baseline")
        paper_vs = "—" if config == baseline or paper_ratio is None else f"{(paper_ratio - 1) * 100:+.0f}%"
        paper = row.get("paper_cumulative_reward")
        lines.append(
            f"| {config} | {_mean_ci(row['cumulative_reward_own'], 2)} | {versus} "
            f"| {_mean_ci(row['final_eval_pass1'], 3)} | {'—' if paper is None else f'{paper:.2f}'} | {paper_vs} |")
    return "\n".join(lines)


def _ci_cell(stat: dict[str, float] | None, digits: int = 3, signed: bool = False) -> str:
    if not stat:
        return "—"
    value = f"{stat['mean']:+.{digits}f}" if signed else f"{stat['mean']:.{digits}f}"
    return value + (f" ± {stat['ci95']:.{digits}f}" if stat.get("ci95") is not None else "")


def sapo_specialists(name: str = "sapo_specialists") -> str:
    """The specialists scenario of the sharing experiment: per I/J configuration, held-out pass@1 on the families a
    node never draws itself (unseen) at round 0 and at the end, its change, the end against the baseline paired by
    seed, all families at the end, and what sharing carried (``swarmlm sapo experiment --scenario specialists``)."""
    spec = _load(name)["specialists"]
    base = spec["baseline"]
    own = "own family" if spec.get("set_apart_by", "draws") == "draws" else "its expert family"
    lines = [
        f"| I / J | unseen, round 0 | unseen, end | unseen, change | unseen end vs {base} | all families, end "
        f"| all end vs {base} | {own}, end | external groups / round | external share of the update |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config, row in spec["configurations"].items():
        versus = [("—" if config == base else _ci_cell(row.get(f"pass1_{p}_end_vs_baseline"), signed=True))
                  for p in ("unseen", "all")]
        lines.append(
            f"| {config} | {_ci_cell(row.get('pass1_unseen_start'))} | {_ci_cell(row.get('pass1_unseen_end'))} "
            f"| {_ci_cell(row.get('pass1_unseen_gain'), signed=True)} | {versus[0]} | {_ci_cell(row.get('pass1_all_end'))} "
            f"| {versus[1]} | {_ci_cell(row.get('pass1_own_end'))} | {_ci_cell(row.get('external_used_per_round'), 2)} "
            f"| {_ci_cell(row.get('external_loss_share_mean'), 2)} |")
    return "\n".join(lines)


def sapo_specialists_by_family(name: str = "sapo_specialists") -> str:
    """Per configuration and family: held-out pass@1 on the family of the nodes that draw it and of the others, at
    round 0 and at the end: whether what a family's specialists learned reached the rest."""
    data = _load(name)
    whose = "nodes drawing it" if data["specialists"].get("set_apart_by", "draws") == "draws" else "its experts"
    lines = [f"| I / J | family | {whose}: round 0 | end | the others: round 0 | end |", "|---|---|---|---|---|---|"]
    for config, row in data["specialists"]["configurations"].items():
        for family in data["settings"]["tasks"]:
            cells = [_ci_cell(row.get(f"family:{family}:{who}_{when}"))
                     for who in ("drawn", "others") for when in ("start", "end")]
            lines.append(f"| {config} | `{family}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The experts study's arms: (results JSON, what differs from the paper's update). Each JSON holds its arm's 8/0
# (the same runs for every arm of one learning rate: with J = 0 no external setting applies) and its sharing runs.
EXPERT_ARMS = [
    ("sapo_experts", "GRPO's group advantages, truncated weights (the defaults)"),
    ("sapo_experts_own_baseline", "`--grpo.external-advantage own_baseline`"),
    ("sapo_experts_own_baseline_no_weights", "`own_baseline`, `--grpo.external-weight none`"),
    ("sapo_experts_lr1e3", "the defaults at `--grpo.lr 1e-3`"),
    ("sapo_experts_lr1e3_own_baseline_no_weights", "`own_baseline`, `none`, at `--grpo.lr 1e-3`"),
]


def sapo_experts_arms() -> str:
    """The experts study, one row per arm and sharing configuration: how many seeds, held-out pass@1 on the
    families outside a node's warm start (unseen) and on all families at the end against the arm's 8/0 (paired by
    seed), the non-experts' pass@1 on `products` (the family its expert knows perfectly), and what sharing
    carried."""
    lines = ["| update | seeds | I / J | unseen, end | vs 8/0 | all families, end vs 8/0 | `products`, non-experts: 8/0 → sharing "
             "| external groups / round | external weight |", "|---|---|---|---|---|---|---|---|---|"]
    for name, label in EXPERT_ARMS:
        spec = _load(name)["specialists"]
        rows = spec["configurations"]
        base = rows[spec["baseline"]]
        for config, row in rows.items():
            if config == spec["baseline"]:
                continue
            lines.append(
                f"| {label} | {len(row['seeds'])} | {config} | {_ci_cell(row.get('pass1_unseen_end'))} "
                f"| {_ci_cell(row.get('pass1_unseen_end_vs_baseline'), signed=True)} "
                f"| {_ci_cell(row.get('pass1_all_end_vs_baseline'), signed=True)} "
                f"| {_ci_cell(base.get('family:products:others_end'))} → {_ci_cell(row.get('family:products:others_end'))} "
                f"| {_ci_cell(row.get('external_used_per_round'), 2)} | {_ci_cell(row.get('external_weight_mean'), 2)} |")
    return "\n".join(lines)


# run directories of the experts study (benchmarks/answer_likelihood.py's groups) -> what their update was
EXPERT_DIRS = {"experts-50": "group advantages, truncated weights (the defaults)", "experts-ob-50": "`own_baseline`",
               "experts-obnw-50": "`own_baseline`, weights `none`", "experts-lr-50": "the defaults at lr 1e-3",
               "experts-lr-obnw-50": "`own_baseline`, `none`, at lr 1e-3", "experts-ob-100": "`own_baseline`, 100 rounds",
               "experts-100": "the defaults, 100 rounds"}


def sapo_experts_answer_likelihood(name: str = "sapo_experts_answer_likelihood") -> str:
    """benchmarks/answer_likelihood.py over the experts study: per arm and configuration, the log-probability of
    the right answers on the families outside each node's warm start, at the start and the end, and the end's
    change against 8/0 paired by seed."""
    lines = ["| update | I / J | seeds | unseen families: answer log p at round 0 | at the end | end vs 8/0 |",
             "|---|---|---|---|---|---|"]
    for group, row in _load(name)["summary"].items():
        parts = group.split("/")
        study, split = parts[-3], parts[-1].replace("-", "/")
        if study not in EXPERT_DIRS or (split == "8/0" and study not in ("experts-50", "experts-lr-50", "experts-ob-100")):
            continue  # the other arms' 8/0 runs are copies of those (with J = 0 no external setting applies)
        start, end = row["unseen_answer_logp_start"], row["unseen_answer_logp_end"]
        versus = row.get("unseen_answer_logp_end_vs_8/0")
        lines.append(f"| {EXPERT_DIRS[study]} | {split} | {row['seeds']} | {_ci_cell(start, 2)} | {_ci_cell(end, 2)} "
                     f"| {_ci_cell(versus, 2, signed=True) if versus else '—'} |")
    return "\n".join(lines)


NOLOCO_METHODS = [("ddp", "DDP"), ("diloco", "DiLoCo (Nesterov 0.9)"), ("diloco-hb", "DiLoCo (heavy-ball 0.3)"),
                  ("noloco", "NoLoCo")]


def _cells(table: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for h_key in sorted(table, key=lambda k: int(k[1:])):
        for m_key in sorted(table[h_key], key=lambda k: int(k[1:])):
            out.append((h_key[1:], m_key[1:], table[h_key][m_key]))
    return out


def noloco_compare_ppl(name: str = "noloco_compare") -> str:
    """Final validation perplexity per method, H and M, and NoLoCo's ratio to each DiLoCo (``noloco compare``)."""
    table = _load(name)["table"]
    lines = [
        "| H | M | " + " | ".join(label for _, label in NOLOCO_METHODS)
        + " | NoLoCo / DiLoCo (Nesterov) | NoLoCo / DiLoCo (heavy-ball) |",
        "|---|---|" + "---|" * (len(NOLOCO_METHODS) + 2),
    ]
    for h, m, cell in _cells(table):
        ppl = []
        for key, _ in NOLOCO_METHODS:
            text = f"{cell[key]['final_val_ppl']:.2f} ± {cell[key]['final_val_ppl_ci95']:.2f}"
            ppl.append(f"**{text}**" if key == "noloco" else text)
        ratios = [f"{cell['noloco'][f'ratio_to_{b}']['mean']:.3f} ± {cell['noloco'][f'ratio_to_{b}']['ci95']:.3f}"
                  for b in ("diloco", "diloco-hb")]
        lines.append(f"| {h} | {m} | " + " | ".join(ppl + ratios) + " |")
    return "\n".join(lines)


def noloco_many_replicas(names: tuple[str, ...] = ("noloco_compare", "noloco_many_replicas"), h: str = "50") -> str:
    """NoLoCo against heavy-ball DiLoCo as M grows, at one H: perplexity (mean ± 95% interval over the seeds), the
    ratio, the replicas' spread around NoLoCo's last outer step, and what each method's outer steps cost (modelled
    communication per run, bytes each replica sent), from the default study and the many-replica one."""
    lines = ["| M | seeds | NoLoCo ppl | DiLoCo heavy-ball ppl | ratio | NoLoCo / DiLoCo all-reduce at its effective "
             "step | NoLoCo model std before / after its last outer step | simulated communication per run, NoLoCo / "
             "DiLoCo | sent per rank, NoLoCo / DiLoCo |",
             "|---|---|---|---|---|---|---|---|---|"]

    def ppl(cell: dict[str, Any]) -> str:
        ci = cell.get("final_val_ppl_ci95")
        return f"{cell['final_val_ppl']:.2f}" + (f" ± {ci:.2f}" if ci is not None else "")

    for name in names:
        for h_key, m, cell in _cells(_load(name)["table"]):
            if h_key != h or "noloco" not in cell or "diloco-hb" not in cell:
                continue
            n, d = cell["noloco"], cell["diloco-hb"]
            lines.append(
                f"| {m} | {len(n['final_val_ppl_seeds'])} | {ppl(n)} | {ppl(d)} | {_ci_cell(n['ratio_to_diloco-hb'])} "
                f"| {_ci_cell(n.get('ratio_to_diloco-matched'))} "
                f"| {n['last_model_std_before']:.4f} / {n['last_model_std_after']:.4f} "
                f"| {n['sim_comm_s']['calibrated']:.1f} / {d['sim_comm_s']['calibrated']:.1f} s "
                f"| {n['bytes_sent_per_rank'] / 1e6:.1f} / {d['bytes_sent_per_rank'] / 1e6:.1f} MB |")
    return "\n".join(lines)


def noloco_comparisons() -> str:
    """The study's comparisons (``comparisons`` in ``noloco compare``'s results): per H and M, each NoLoCo variant's
    final perplexity over its DiLoCo variant's, mean ± 95% interval over the seeds, and NoLoCo's over Nesterov
    DiLoCo's."""
    results = _load("noloco_compare")
    names = list(results.get("comparisons", {}))
    lines = ["| H | M | " + " | ".join(names) + " | against Nesterov DiLoCo |", "|---|---|" + "---|" * (len(names) + 1)]

    for h, m, row in _cells(results["table"]):
        ratios = [_ci_cell(results["comparisons"][name][f"H{h}"][f"M{m}"]) for name in names]
        lines.append(f"| {h} | {m} | " + " | ".join(ratios) + f" | {_ci_cell(row['noloco'].get('ratio_to_diloco'))} |")
    return "\n".join(lines)


def noloco_headline() -> str:
    """The README's NoLoCo table: final perplexity of NoLoCo and both DiLoCo baselines, and NoLoCo's ratios and
    simulated wall-clock speed-ups to a common target."""
    table = _load("noloco_compare")["table"]
    lines = [
        "| H | M | NoLoCo ppl | DiLoCo ppl (Nesterov / heavy-ball) | NoLoCo / DiLoCo ppl (Nesterov / heavy-ball) "
        "| simulated time to target, speed-up vs Nesterov / heavy-ball |",
        "|---|---|---|---|---|---|",
    ]
    for h, m, cell in _cells(table):
        nol = cell["noloco"]
        speed = nol.get("speedup_to_target_vs_diloco", {}).get("calibrated")
        speed_hb = nol.get("speedup_to_target_vs_diloco-hb", {}).get("calibrated")
        lines.append(
            f"| {h} | {m} | {nol['final_val_ppl']:.2f} | {cell['diloco']['final_val_ppl']:.2f} / "
            f"{cell['diloco-hb']['final_val_ppl']:.2f} | {nol['ratio_to_diloco']['mean']:.3f} / "
            f"{nol['ratio_to_diloco-hb']['mean']:.3f} | {speed['mean']:.2f}× / {speed_hb['mean']:.2f}× |")
    return "\n".join(lines)


def precision_learning(name: str) -> str:
    """A speed option against its baseline, paired node by node (``benchmarks/precision_learning.py``, whose
    table this is)."""
    spec = importlib.util.spec_from_file_location("precision_learning", ROOT / "benchmarks" / "precision_learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.table(_load(name))


RESULTS: dict[str, Callable[[], str]] = {
    "sapo_default_run": sapo_default_run,
    "sapo_first_run": sapo_first_run,
    "sapo_experiment": sapo_experiment,
    "sapo_experiment_amd_epyc": lambda: sapo_experiment("sapo_experiment_amd_epyc"),
    "sapo_specialists": sapo_specialists,
    "sapo_specialists_by_family": sapo_specialists_by_family,
    "sapo_experts": lambda: sapo_specialists("sapo_experts"),
    "sapo_experts_by_family": lambda: sapo_specialists_by_family("sapo_experts"),
    "sapo_experts_own_baseline": lambda: sapo_specialists("sapo_experts_own_baseline"),
    "sapo_experts_own_baseline_by_family": lambda: sapo_specialists_by_family("sapo_experts_own_baseline"),
    "sapo_experts_arms": sapo_experts_arms,
    "sapo_experts_own_baseline_100": lambda: sapo_specialists("sapo_experts_own_baseline_100"),
    "sapo_experts_own_baseline_100_by_family": lambda: sapo_specialists_by_family("sapo_experts_own_baseline_100"),
    "sapo_experts_100": lambda: sapo_specialists("sapo_experts_100"),
    "sapo_experts_100_by_family": lambda: sapo_specialists_by_family("sapo_experts_100"),
    "sapo_experts_answer_likelihood_100": lambda: sapo_experts_answer_likelihood("sapo_experts_answer_likelihood_100"),
    "sapo_experts_answer_likelihood": sapo_experts_answer_likelihood,
    "sapo_experts_xarch_own_baseline_100": lambda: sapo_specialists("sapo_experts_xarch_own_baseline_100"),
    "sapo_experts_xarch_own_baseline_100_by_family":
        lambda: sapo_specialists_by_family("sapo_experts_xarch_own_baseline_100"),
    "sapo_smollm2_specialists": lambda: sapo_specialists("sapo_smollm2_specialists"),
    "sapo_smollm2_specialists_by_family": lambda: sapo_specialists_by_family("sapo_smollm2_specialists"),
    "sapo_smollm2_specialists_own_baseline": lambda: sapo_specialists("sapo_smollm2_specialists_own_baseline"),
    "sapo_smollm2_specialists_own_baseline_by_family":
        lambda: sapo_specialists_by_family("sapo_smollm2_specialists_own_baseline"),
    "sapo_experts_answer_likelihood_lr1e3": lambda: sapo_experts_answer_likelihood("sapo_experts_answer_likelihood_lr1e3"),
    "sapo_bf16_learning": lambda: precision_learning("sapo_bf16_learning"),
    "sapo_bf16_decoding_learning": lambda: precision_learning("sapo_bf16_decoding_learning"),
    "noloco_compare_ppl": noloco_compare_ppl,
    "noloco_compare_ppl_3seeds": lambda: noloco_compare_ppl("noloco_compare_3seeds"),
    "noloco_headline": noloco_headline,
    "noloco_comparisons": noloco_comparisons,
    "noloco_many_replicas": noloco_many_replicas,
}

MARKER = re.compile(r"^<!-- results: ([a-z0-9_]+) -->$", re.MULTILINE)


def render_markers(markdown: str, page: str = "?") -> str:
    """Replace every ``<!-- results: NAME -->`` line with its table and ``<!-- cli-commands -->`` with the
    commands' table. An unknown NAME is an error, so a typo fails the (strict) build."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in RESULTS:
            raise ValueError(f"{page}: unknown results table {name!r}; known: {', '.join(sorted(RESULTS))}")
        return RESULTS[name]()

    markdown = MARKER.sub(table, markdown)
    if "<!-- cli-commands -->" in markdown:
        markdown = markdown.replace("<!-- cli-commands -->", cli_table())
    return markdown


# --------------------------------------------------------------------------------------------- MkDocs events


def on_config(config: Any) -> Any:
    """List the generated configuration pages in the navigation, under the entry titled ``NAV_TITLE``
    (whose page, the section's index, stays first)."""
    pages = [{f"swarmlm {' '.join(c.path)}": f"{CONFIG_DIR}/{command_slug(c.path)}.md"} for c in commands()]

    def visit(items: list[Any]) -> bool:
        for i, item in enumerate(items):
            if isinstance(item, dict):
                (title, value), = item.items()
                if title == NAV_TITLE and isinstance(value, str):
                    items[i] = {title: [value] + pages}
                    return True
                if isinstance(value, list) and visit(value):
                    return True
        return False

    if config.get("nav") and not visit(config["nav"]):
        raise ValueError(f"mkdocs.yml: no nav entry titled {NAV_TITLE!r} to list the configuration pages under")
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for command in commands():
        uri = f"{CONFIG_DIR}/{command_slug(command.path)}.md"
        files.append(File.generated(config, uri, content=config_page(command)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render_markers(markdown, page.file.src_uri)
