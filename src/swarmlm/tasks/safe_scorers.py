"""Our own scorers for the reasoning-gym families whose scorer evaluates text or is unbounded.

Each function has the signature ``score(dataset, answer, entry) -> float``: ``dataset`` is the receiving node's
own reasoning-gym dataset of that family (for its config), ``answer`` the extracted answer or None, ``entry``
the item (question, answer, metadata). Each reproduces reasoning-gym 0.1.25's ``score_answer`` of the family,
partial credit included, on every answer a model writes, with the evaluating or unbounded step replaced:

* ``eval(text)`` of a list literal -> :func:`~swarmlm.tasks.safe_parsing.parse_python_literal`;
* ``sympy.parse_expr(text)`` of arithmetic -> :func:`~swarmlm.tasks.safe_parsing.parse_arithmetic`;
* propositional formulas -> reasoning-gym's grammar re-implemented with depth, size and variable bounds, and
  truth tables computed as bit masks (one big-integer operation per connective);
* numeric steps that overflow or grow without bound -> checked first.

Where the two differ (only on text outside the grammar or beyond a bound, e.g. ``[[0]*3]*3`` or ``2**3``)
ours gives the score reasoning-gym gives to an answer it cannot parse. ``docs/security/scorer_audit.md`` lists
the differences family by family.
"""

from __future__ import annotations

import decimal
import json
import re
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from swarmlm.tasks.scorer_audit import allowed_families, audit_of
from swarmlm.tasks.safe_parsing import (
    arithmetic_to_float,
    arithmetic_to_int,
    parse_arithmetic,
    parse_python_literal,
)

SafeScoreFn = Callable[[Any, "str | None", dict[str, Any]], float]


# ----------------------------------------------------------------------------- eval() of list literals
def score_binary_matrix(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for the exact matrix text; 0.1 for a Python list literal of the right matrix; else 0."""
    oracle_answer = entry["answer"]
    if answer is not None:
        if answer == oracle_answer:
            return 1.0
        try:
            text = dataset._matrix_to_str(parse_python_literal(answer))  # reasoning-gym's own formatting
            if text == oracle_answer:
                return 0.1
        except Exception:
            return 0.0
    return 0.0


def score_spiral_matrix(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for the exact spiral order; 0.1 for a Python list literal of it; else 0."""
    oracle_answer = entry["answer"].strip()
    if answer is not None and len(answer) > 0:
        answer = answer.strip()
        if answer == oracle_answer:
            return 1.0
        try:
            if " ".join(str(item) for item in parse_python_literal(answer)) == oracle_answer:
                return 0.1
        except Exception:
            pass
    return 0.0


def score_string_insertion(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for the exact string; 0.1 for a Python list literal of its characters; else 0."""
    oracle_answer = entry["answer"]
    if isinstance(answer, str):
        if answer == oracle_answer:
            return 1.0
        try:
            if "".join(parse_python_literal(answer)) == oracle_answer:
                return 0.1
        except Exception:
            pass
    return 0.0


def score_n_queens(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for a valid board as text; 0.5 for a valid board as a Python list literal; else 0."""
    if isinstance(answer, str):
        valid_solutions = entry["metadata"]["valid_answers"]
        if answer in valid_solutions:
            return 1.0
        try:
            if dataset._board_to_string(parse_python_literal(answer)) in valid_solutions:
                return 0.5
        except Exception:
            pass
    return 0.0


def score_number_sorting(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's number_sorting, whose reference answer (a Python list literal) is read by our parser
    where reasoning-gym falls back to ``eval``."""
    if answer is None:
        return 0.0
    try:
        try:
            user_answer = json.loads(answer.replace("'", '"'))
        except json.JSONDecodeError:
            return 0.0
        if not isinstance(user_answer, list):
            return 0.0
        try:
            expected_answer = json.loads(entry["answer"])
        except json.JSONDecodeError:
            expected_answer = parse_python_literal(entry["answer"])
        if len(user_answer) != len(expected_answer):
            return 0.0
        user_floats = [float(num) for num in user_answer]
        expected_floats = [float(num) for num in expected_answer]
        if entry["metadata"]["direction"] == "ascending":
            is_correctly_sorted = user_floats == sorted(user_floats)
        else:
            is_correctly_sorted = user_floats == sorted(user_floats, reverse=True)
        if not is_correctly_sorted:
            return 0.0
        for user, expected in zip(user_floats, expected_floats):
            if abs(user - expected) > 1:
                return 0.0
        return 1.0
    except Exception:
        return 0.0


# ----------------------------------------------------------------------------- sympy.parse_expr of arithmetic
_INT_RE = re.compile(r"\b\d+\b")


def score_countdown(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for an expression that uses exactly the given numbers and reaches the target; 0.05 for one that
    parses but misses; 0.01 otherwise."""
    reward = 0.01
    if answer is None or not answer.strip():
        return reward
    try:
        user_answer = arithmetic_to_float(parse_arithmetic(answer))
        used_numbers = [int(m) for m in _INT_RE.findall(answer)]
        if sorted(used_numbers) != sorted(entry["metadata"]["numbers"]):
            return 0.05
        if np.isclose(user_answer, entry["metadata"]["target"], atol=1e-6):
            return 1.0
        return 0.05 if answer else 0.01
    except Exception:
        return 0.01


def score_puzzle24(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for an expression of four numbers in the configured range whose value (truncated) is 24; else 0.01."""
    reward = 0.01
    if answer is not None:
        try:
            answer = answer.strip()
            solved = arithmetic_to_int(parse_arithmetic(answer)) == 24
            used_numbers = [int(num) for num in _INT_RE.findall(answer)]
            config = dataset.config
            if len(used_numbers) != 4:
                reward = 0.01
            elif any(num > config.max_value or num < config.min_value for num in used_numbers):
                reward = 0.01
            elif not solved:
                reward = 0.01
            else:
                reward = 1.0
        except Exception:
            reward = 0.01
    return reward


# ----------------------------------------------------------------------------- unbounded numerics
def score_calendar_arithmetic(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's scorer, except that a count so far off that its relative error overflows a float
    scores 0 (``exp(-5 * error)`` is 0 there) instead of raising OverflowError."""
    try:
        return type(dataset).score_answer(dataset, answer, entry)
    except OverflowError:
        return 0.0


def score_decimal_arithmetic(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's scorer under the decimal context its generator uses (precision from the config), not
    whatever context the process happens to have, so that scores do not depend on what ran before."""
    with decimal.localcontext(decimal.Context(prec=dataset.config.precision)):
        return type(dataset).score_answer(dataset, answer, entry)


_EXPONENT_RE = re.compile(r"[eE]([-+]?\d+(?:_\d+)*)\s*\Z")
_MAX_DECIMAL_EXPONENT = 4000


def fraction_to_float(text: str) -> float:
    """``float(Fraction(text))`` without expanding a huge decimal exponent (``Fraction("1e999999999")`` builds
    a billion-digit integer). Same value and same exceptions: ValueError for a malformed literal,
    ZeroDivisionError, OverflowError for a finite value too large for a float."""
    match = _EXPONENT_RE.search(text)
    if match:
        exponent = int(match.group(1))
        if abs(exponent) > _MAX_DECIMAL_EXPONENT:
            mantissa = Fraction(text[:match.start()] + "e0")  # the same syntax check Fraction(text) makes
            if mantissa == 0:
                return 0.0
            if exponent > 0:
                raise OverflowError("integer division result too large for a float")
            return -0.0 if mantissa < 0 else 0.0  # at most ~2e3 digits of mantissa: underflows to zero
    return float(Fraction(text))


def score_coin_flip(dataset: Any, answer: str | None, entry: dict[str, Any], tol: float = 1e-4) -> float:
    """1.0 within 1e-4 of the probability; otherwise the length of the common prefix of the two values printed
    with 10 significant digits over the shorter one (as reasoning-gym: a prefix such as "0" of "0.234375"
    scores 1.0). Answers are read as ``Fraction(text)`` but a huge exponent is not expanded
    (:func:`fraction_to_float`); a value too large for a float scores 0 where reasoning-gym raises."""
    oracle_answer = entry["answer"]
    if answer is None or len(answer.strip()) == 0:
        return 0.0
    answer = answer.replace(",", "")
    oracle_answer = oracle_answer.replace(",", "")
    try:
        answer_float = fraction_to_float(answer)
        oracle_answer_float = fraction_to_float(oracle_answer)
    except (ValueError, ZeroDivisionError):
        return 0.0
    except OverflowError:
        return 0.0
    if abs(answer_float - oracle_answer_float) <= tol:
        return 1.0
    answer_str = f"{answer_float:.10g}"
    oracle_answer_str = f"{oracle_answer_float:.10g}"
    match_len = 0
    for a_char, o_char in zip(answer_str, oracle_answer_str):
        if a_char != o_char:
            break
        match_len += 1
    return match_len / min(len(oracle_answer_str), len(answer_str))


# ----------------------------------------------------------------------------- propositional logic
PROP_MAX_DEPTH = 48
PROP_MAX_NODES = 512
PROP_MAX_VARIABLES = 16
_PROP_BINARY = ("↔", "→", "∨", "∧")  # lowest precedence first, as reasoning-gym splits
_NOT = "¬"


class _TooComplex(Exception):
    """A formula beyond the bounds; scored as an answer that cannot be parsed."""


def _parse_formula(expr: str, depth: int, counter: list[int]) -> tuple:
    """reasoning-gym's ``parse_expr`` for propositional formulas (outer parentheses, then the right-most
    connective of the lowest precedence at parenthesis level 0, then negation, else the whole text is a
    variable), as tuples: ``("var", name)``, ``("¬", a)``, ``(op, a, b)``."""
    if depth > PROP_MAX_DEPTH:
        raise _TooComplex("nested too deeply")
    counter[0] += 1
    if counter[0] > PROP_MAX_NODES:
        raise _TooComplex("too many parts")
    expr = expr.strip()
    if not expr:
        raise ValueError("Empty expression")
    if expr[0] == "(" and expr[-1] == ")":
        level, enclosed = 0, True
        for char in expr[1:-1]:
            if char == "(":
                level += 1
            elif char == ")":
                level -= 1
                if level < 0:
                    enclosed = False
                    break
        if level == 0 and enclosed:
            return _parse_formula(expr[1:-1], depth + 1, counter)
    for op in _PROP_BINARY:
        level = 0
        for i in range(len(expr) - 1, -1, -1):
            char = expr[i]
            if char == ")":
                level += 1
            elif char == "(":
                level -= 1
            elif level == 0 and char == op:
                return (op, _parse_formula(expr[:i], depth + 1, counter), _parse_formula(expr[i + 1:], depth + 1, counter))
    if expr.startswith(_NOT):
        return (_NOT, _parse_formula(expr[1:], depth + 1, counter))
    return ("var", expr)


def _variables(node: tuple, out: set[str]) -> set[str]:
    if node[0] == "var":
        out.add(node[1])
    else:
        for child in node[1:]:
            _variables(child, out)
    return out


def _truth_table(node: tuple, masks: dict[str, int], full: int) -> int:
    """The formula's value under every assignment at once: bit i is its value under assignment i."""
    kind = node[0]
    if kind == "var":
        return masks[node[1]]
    if kind == _NOT:
        return full & ~_truth_table(node[1], masks, full)
    a, b = _truth_table(node[1], masks, full), _truth_table(node[2], masks, full)
    if kind == "∧":
        return a & b
    if kind == "∨":
        return a | b
    if kind == "→":
        return (full & ~a) | b
    return full & ~(a ^ b)  # ↔


def _variable_masks(names: list[str]) -> tuple[dict[str, int], int]:
    rows = 1 << len(names)
    full = (1 << rows) - 1
    masks = {}
    for j, name in enumerate(names):
        period = 1 << (j + 1)
        block = ((1 << (1 << j)) - 1) << (1 << j)  # assignment i sets variable j when bit j of i is 1
        masks[name] = block * (full // ((1 << period) - 1))
    return masks, full


_UPPER_RE = re.compile(r"([A-Z])")


def score_propositional_logic(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for a non-trivial conclusion that follows from the premises, 0.25 for a trivial one (a variable
    or a tautology), 0.05 for one that does not follow, 0 for one that cannot be parsed or uses an upper-case
    letter that is not a variable of the question. Formulas nested deeper than 48, with more than 512 parts
    or 16 variables score 0 (reasoning-gym recurses or enumerates 2^n assignments without a bound)."""
    if not isinstance(answer, str):
        return 0.0
    try:
        valid_vars = set(entry["metadata"]["variables"])
        if any(var not in valid_vars for var in _UPPER_RE.findall(answer)):
            return 0.0
        premises = [_parse_formula(p, 0, [0]) for p in entry["metadata"]["premises"]]
        conclusion = _parse_formula(answer, 0, [0])
        names: set[str] = set()
        for formula in premises + [conclusion]:
            _variables(formula, names)
        if len(names) > PROP_MAX_VARIABLES:
            return 0.0
        masks, full = _variable_masks(sorted(names))
        premises_hold = full
        for formula in premises:
            premises_hold &= _truth_table(formula, masks, full)
        conclusion_holds = _truth_table(conclusion, masks, full)
        if premises_hold & ~conclusion_holds & full:
            return 0.05
        if conclusion[0] == "var" or conclusion_holds == full:
            return 0.25
        return 1.0
    except _TooComplex:
        return 0.0
    except (ValueError, KeyError, AttributeError):
        return 0.0


SAFE_SCORERS: dict[str, SafeScoreFn] = {
    "binary_matrix": score_binary_matrix,
    "spiral_matrix": score_spiral_matrix,
    "string_insertion": score_string_insertion,
    "n_queens": score_n_queens,
    "number_sorting": score_number_sorting,
    "countdown": score_countdown,
    "puzzle24": score_puzzle24,
    "calendar_arithmetic": score_calendar_arithmetic,
    "decimal_arithmetic": score_decimal_arithmetic,
    "coin_flip": score_coin_flip,
    "propositional_logic": score_propositional_logic,
}


def _library_scorer(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    return type(dataset).score_answer(dataset, answer, entry)


def scorer_for(family: str) -> SafeScoreFn:
    """The scorer a node uses for ``family``: ours, or reasoning-gym's where the audit found it safe.
    Raises ValueError for a refused family."""
    audit = audit_of(family)
    if audit.verdict == "ours":
        return SAFE_SCORERS[family]
    if audit.verdict == "reasoning_gym":
        return _library_scorer
    raise ValueError(f"family '{family}' is refused by the scorer audit ({audit.finding}); "
                     f"allowed families: {', '.join(allowed_families())}")
