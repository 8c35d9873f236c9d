"""The documentation: the site builds strictly, the README stays a front door, and every command it shows exists.

* ``mkdocs build --strict`` (the ``test`` extra installs MkDocs, Material and mkdocstrings): a broken link, anchor,
  API reference or results marker fails the build, and so this test. A second build with one broken link shows
  that the strict build does fail.
* Every ```bash block of README.md and docs/**/*.md is read, and each ``swarmlm ...`` command in it (also as
  ``python -m swarmlm`` or ``torchrun ... -m swarmlm``) must name subcommands and ``--options`` that the
  command's own parser (:func:`swarmlm.cli.build_parser`) has; ``python benchmarks/X.py --opt`` must name a
  script that exists and an option the script defines. A block preceded by ``<!-- not checked: why -->`` is
  skipped. Running the commands at tiny sizes is the business of the smoke tests, not of this file.
* The README is at most 250 lines, and its headline tables are exactly what the docs render from
  ``docs/results/*.json``; its relative links resolve.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
NOT_CHECKED = "<!-- not checked"


def _hooks():
    spec = importlib.util.spec_from_file_location("swarmlm_docs_hooks", DOCS / "hooks" / "swarmlm_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_files() -> list[Path]:
    return [README] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


# ------------------------------------------------------------------------------------------------ the site


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


def test_mkdocs_build_strict(tmp_path):
    started = time.perf_counter()
    res = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    print(f"mkdocs build --strict: {time.perf_counter() - started:.1f} s")
    site = tmp_path / "site"
    # the generated configuration reference: a page per command, with its options
    simulate = (site / "reference" / "config" / "sapo-simulate" / "index.html").read_text()
    assert "--grpo.lr-schedule" in simulate and "--sharing.limits.max-round-records" in simulate
    assert "--host-maddrs" in (site / "reference" / "config" / "sapo-node" / "index.html").read_text()
    # results tables were rendered from their JSON, and no marker is left anywhere
    assert "127.47 ± 4.44" in (site / "results" / "sapo-experiment" / "index.html").read_text()
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "<!-- results:" not in text and "<!-- cli-commands -->" not in text, page
    # the API reference was generated from the docstrings
    assert "swarmlm.sapo.grpo" in (site / "reference" / "api" / "sapo" / "index.html").read_text()


def test_mkdocs_strict_build_fails_on_a_broken_link(tmp_path):
    """The strict build is a test only if it can fail: the same site with one link to a missing page does."""
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "src").symlink_to(ROOT / "src")
    page = copy / "docs" / "guides" / "tests.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    res = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    assert "no-such-page.md" in res.stdout + res.stderr


# ------------------------------------------------------------------------------------------------ the README


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; at most 250"
    block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert len(block) == 2 and block[0].endswith(" && swarmlm sapo simulate") and block[1] == "python -m pytest -q"
    assert "Does sharing help?" in README.read_text() and "docs/results/sharing.md" in README.read_text()
    assert (DOCS / "results" / "sharing.md").is_file()
    # the getting-started guide shows the same two lines
    guide = (DOCS / "guides" / "getting-started.md").read_text()
    assert "\n".join(block) in guide


def test_readme_headline_tables_are_the_results_files():
    """The README's tables are not typed in: each is exactly what the docs render from docs/results/*.json."""
    hooks = _hooks()
    text = README.read_text()
    for name in ("sapo_first_run", "noloco_headline"):
        assert hooks.RESULTS[name]() in text, f"README's {name} table differs from docs/results (render: {name})"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slugs(path: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    out, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            out.add(slugify(line.lstrip("#").strip().replace("`", ""), "-"))
    return out


def test_readme_links_resolve():
    broken = []
    for target in _LINK.findall(README.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else README
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _slugs(file):
            broken.append(target)
    assert not broken, f"README.md links to missing files or anchors: {broken}"


# ------------------------------------------------------------------------------------------------ commands


@dataclass
class Block:
    file: Path
    line: int  # of the opening fence, 1-based
    text: str


def bash_blocks(path: Path) -> list[Block]:
    """The ```bash blocks of a markdown file, less those marked ``<!-- not checked ... -->`` just before."""
    blocks, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            previous = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            if not previous.strip().startswith(NOT_CHECKED):
                blocks.append(Block(path, i + 1, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


SEPARATORS = {";", "&", "&&", "|", "||", "(", ")", "`", ";;", "|&"}


def _one_line(text: str) -> str:
    """The snippet with comments dropped and every newline outside quotes turned into ``;`` (a quoted argument
    may span lines: ``python -c "..."``)."""
    out, quote, i, depth = [], None, 0, 0
    while i < len(text):
        char = text[i]
        if not quote and char == "$" and text[i + 1:i + 2] == "(":  # a command substitution: its own command
            out.append(";")
            depth += 1
            i += 2
            continue
        if not quote and char == ")" and depth:
            char, depth = ";", depth - 1
        elif quote:
            if char == quote:
                quote = None
            elif char == "\\" and quote == '"' and i + 1 < len(text):
                out.append(char)
                i += 1
                char = text[i]
        elif char in "'\"":
            quote = char
        elif char == "\\" and text[i + 1:i + 2] == "\n":  # a continued line
            i += 2
            continue
        elif char == "#" and (not out or out[-1] in " \t;\n"):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif char == "\n":
            char = ";"
        out.append(char)
        i += 1
    return "".join(out)


def commands_of(text: str) -> list[list[str]]:
    """The simple commands of a shell snippet, as token lists: lines joined at ``\\``, comments dropped, split at
    newlines, ``;``, ``&&``, ``|``, ``$(``...``)``."""
    lexer = shlex.shlex(_one_line(text), posix=True, punctuation_chars=True)
    lexer.commenters = ""
    lexer.wordchars += "$:,@%+[]{}!^"  # $HEAD:29400, 1e-6,1e-5 and [a,b] stay words
    try:
        tokens = list(lexer)
    except ValueError as err:  # an unbalanced quote
        return [[f"<unparsable: {err}>"]]
    out: list[list[str]] = []
    current: list[str] = []
    for token in tokens:
        if token in SEPARATORS or set(token) <= set(";&|()"):
            if current:
                out.append(current)
            current = []
        else:
            current.append(token)
    if current:
        out.append(current)
    return out


def _strip_env(tokens: list[str]) -> list[str]:
    i = 0
    while i < len(tokens) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[i]):
        i += 1
    while i < len(tokens) and tokens[i] in ("time", "nohup", "exec", "env"):
        i += 1
    return tokens[i:]


def swarmlm_args(tokens: list[str]) -> list[str] | None:
    """The arguments of a ``swarmlm`` invocation in this command, or None if it is not one."""
    tokens = _strip_env(tokens)
    if not tokens:
        return None
    if tokens[0] == "swarmlm" or tokens[0].endswith("/swarmlm"):
        return tokens[1:]
    if Path(tokens[0]).name in ("python", "python3", "torchrun") or tokens[0].startswith("python3."):
        for i in range(1, len(tokens) - 1):
            if tokens[i] == "-m":
                return tokens[i + 2:] if tokens[i + 1] == "swarmlm" else None
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return None


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    action = parser._option_string_actions.get(option)
    return action is not None and action.nargs != 0


def check_swarmlm(args: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with one ``swarmlm ARGS`` invocation: unknown subcommands or options."""
    errors, path, i = [], [], 0
    current = parser
    while (choices := _subparsers(current)) is not None:
        while i < len(args) and args[i].startswith("-"):  # options of this level (--log-level INFO)
            option = args[i].split("=", 1)[0]
            if option not in current._option_string_actions:
                errors.append(f"unknown option {option} of 'swarmlm{''.join(' ' + p for p in path)}'")
            i += 2 if _takes_value(current, option) and "=" not in args[i] else 1
        if i >= len(args):
            if not errors and "-h" not in args and "--help" not in args:
                errors.append(f"'swarmlm{''.join(' ' + p for p in path)}' needs a subcommand: {', '.join(choices)}")
            return errors
        if args[i] not in choices:
            errors.append(f"unknown subcommand '{args[i]}' of 'swarmlm{''.join(' ' + p for p in path)}' "
                          f"(known: {', '.join(choices)})")
            return errors
        path.append(args[i])
        current = choices[args[i]]
        i += 1
    known = set(current._option_string_actions)
    for token in args[i:]:
        if token.startswith("--"):
            option = token.split("=", 1)[0]
            if option not in known:
                errors.append(f"'swarmlm {' '.join(path)}' has no option {option}")
    return errors


def check_pip_extras(tokens: list[str]) -> list[str]:
    """``pip install -e ".[a,b]"``: every extra is one that pyproject.toml defines."""
    tokens = _strip_env(tokens)
    if len(tokens) < 3 or Path(tokens[0]).name not in ("pip", "pip3") or tokens[1] != "install":
        return []
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras = set(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.MULTILINE))  # (no tomllib before Python 3.11)
    errors = []
    for token in tokens[2:]:
        match = re.fullmatch(r"\.\[([^\]]*)\]", token)
        if match:
            errors += [f"pyproject.toml has no extra '{e}' ({token})" for e in match.group(1).split(",")
                       if e.strip() not in extras]
    return errors


def check_script(tokens: list[str]) -> list[str]:
    """``python benchmarks/X.py --opt`` / ``bash benchmarks/gpu/X.sh``: the script exists; a Python script defines
    each ``--option`` named (as a string literal, where argparse is told of it)."""
    tokens = _strip_env(tokens)
    if len(tokens) < 2 or Path(tokens[0]).name not in ("python", "python3", "bash", "sh"):
        return []
    script = next((t for t in tokens[1:] if not t.startswith("-")), None)
    if script is None or not script.startswith(("benchmarks/", "tests/", "src/")):
        return []
    path = ROOT / script
    if not path.is_file():
        return [f"no such script: {script}"]
    if path.suffix != ".py":
        return []
    source = path.read_text()
    errors = []
    for token in tokens[tokens.index(script) + 1:]:
        if token.startswith("--"):
            option = token.split("=", 1)[0]
            if f'"{option}"' not in source and f"'{option}'" not in source:
                errors.append(f"{script} defines no option {option}")
    return errors


def check_block(text: str, parser: argparse.ArgumentParser) -> tuple[list[str], int]:
    errors, checked = [], 0
    for tokens in commands_of(text):
        if tokens and tokens[0].startswith("<unparsable"):
            errors.append(tokens[0])
            continue
        args = swarmlm_args(tokens)
        if args is not None:
            checked += 1
            errors += check_swarmlm(args, parser)
        else:
            script_errors = check_script(tokens) + check_pip_extras(tokens)
            checked += 1 if script_errors or "benchmarks/" in " ".join(tokens[:3]) else 0
            errors += script_errors
    return errors, checked


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from swarmlm.cli import build_parser

    return build_parser()


def test_every_command_in_the_docs_exists(parser):
    problems, checked = [], 0
    for path in markdown_files():
        for block in bash_blocks(path):
            errors, n = check_block(block.text, parser)
            checked += n
            problems += [f"{path.relative_to(ROOT)}:{block.line}: {e}" for e in errors]
    assert not problems, "commands in the docs that do not exist (fix them, or mark the block '<!-- not checked: " \
                         "why -->'):\n  " + "\n  ".join(problems)
    assert checked >= 40, f"only {checked} commands found in the docs' bash blocks: is the extraction broken?"


def test_the_command_check_can_fail(parser, tmp_path):
    """The checker finds a misspelt subcommand, a misspelt option, an option of another subcommand, and the same
    inside ``torchrun -m swarmlm``, ``$(...)`` and a continued line; it passes the right spellings."""
    bad = """
swarmlm sapo simlate --rounds 3
OMP_NUM_THREADS=1 swarmlm sapo simulate --rouns 3 --grpo.lr 1e-4
WS=$(swarmlm warmstart --steps 40 --host-maddrs x)
torchrun --nproc-per-node 2 -m swarmlm noloco train \\
    --method noloco --outer.evry 50
python benchmarks/sapo_soak.py --no-such-flag 1
python benchmarks/no_such_benchmark.py
pip install -e ".[swarm,no-such-extra]"
"""
    errors, _ = check_block(bad, parser)
    text = "\n".join(errors)
    assert "unknown subcommand 'simlate'" in text
    assert "no option --rouns" in text and "--grpo.lr" not in text
    assert "'swarmlm warmstart' has no option --host-maddrs" in text and "--steps" not in text
    assert "no option --outer.evry" in text and "--method" not in text
    assert "defines no option --no-such-flag" in text and "no such script: benchmarks/no_such_benchmark.py" in text
    assert "no extra 'no-such-extra'" in text and "extra 'swarm'" not in text
    good = "swarmlm --log-level DEBUG sapo node --initial-peers '[a, b]' --model.name tiny-llama  # a comment --nope\n"
    assert check_block(good, parser) == ([], 1)
    marked = tmp_path / "marked.md"
    marked.write_text("<!-- not checked: a typo on purpose -->\n```bash\nswarmlm sapo simlate\n```\n"
                      "```bash\nswarmlm models\n```\n")
    assert [b.text for b in bash_blocks(marked)] == ["swarmlm models"]
