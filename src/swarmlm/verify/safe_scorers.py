"""Our own scorers for the reasoning-gym families whose scorer evaluates text or is unbounded.

Each function has the signature ``score(dataset, answer, entry) -> float``: ``dataset`` is the receiving node's
own reasoning-gym dataset of that family (for its config), ``answer`` the extracted answer or None, ``entry``
the item (question, answer, metadata). Each reproduces reasoning-gym 0.1.25's ``score_answer`` of the family,
partial credit included, on every answer a model writes, with the evaluating or unbounded step replaced:

* ``eval(text)`` of a list literal -> :func:`~swarmlm.verify.safe_parsing.parse_python_literal`;
* ``sympy.parse_expr(text)`` of arithmetic -> :func:`~swarmlm.verify.safe_parsing.parse_arithmetic`;
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

from swarmlm.verify.scorer_audit import allowed_families, audit_of
from swarmlm.verify.safe_parsing import (
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
    where reasoning-gym falls back to ``eval``, and whose numbers must equal the reference's exactly (as Decimals:
    reasoning-gym accepted any number within 1 of it, 37.9 for 37.0)."""
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
        for user, expected in zip(user_answer, expected_answer):  # exactly (reasoning-gym allowed 1 of difference)
            mine = exact_decimal(user if isinstance(user, str) else json.dumps(user))
            if mine is None or mine != exact_decimal(str(expected)):
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


# ----------------------------------------------------------------------------- exact full marks
# reasoning-gym's scorers of these families gave full marks to wrong answers: a common prefix ("0" for 0.171875),
# bool("False"), a float sum of per-position credits that reaches 0.9999999999999999 for the right word plus junk,
# a tolerance (9.7 for 9.701), an unanchored pattern (trailing "0" or "x"), extra words after the right ones. Ours
# give 1.0 only to an answer that is exactly right (compared as text, integers, Decimals or Fractions, never a
# float against a threshold); a wrong answer keeps reasoning-gym's partial credit, counted exactly, but at most
# PARTIAL_CAP, so that no wrong answer passes for a right one.
PARTIAL_CAP = 0.5
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_MAX_EXACT_CHARS = 4096  # longer answers are never exactly right in these families


def exact_decimal(text: str | None) -> decimal.Decimal | None:
    """``text`` as a Decimal when it is a plain decimal literal (sign, digits, one point; no exponent, no NaN,
    no underscores, surrounding whitespace allowed), else None. Exact: no rounding, no float."""
    if not isinstance(text, str) or len(text) > _MAX_EXACT_CHARS:
        return None
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    return decimal.Decimal(text)


def exact_fraction(text: str | None) -> Fraction | None:
    """``text`` as a Fraction when it is a plain decimal literal or ``a/b`` of two of them, else None."""
    if not isinstance(text, str) or len(text) > _MAX_EXACT_CHARS:
        return None
    parts = text.split("/")
    if len(parts) > 2:
        return None
    values = [exact_decimal(p) for p in parts]
    if any(v is None for v in values) or (len(values) == 2 and values[1] == 0):
        return None
    out = Fraction(values[0])
    return out / Fraction(values[1]) if len(values) == 2 else out


def _capped(score: float) -> float:
    return min(float(score), PARTIAL_CAP)


def score_coin_flip(dataset: Any, answer: str | None, entry: dict[str, Any], tol: float = 1e-4) -> float:
    """1.0 for exactly the probability (a decimal literal or a fraction ``a/b``); otherwise the
    partial credit reasoning-gym gives (within 1e-4, or the common prefix of the two values printed with 10
    significant digits over the shorter one), at most ``PARTIAL_CAP``. Huge exponents are not expanded
    (:func:`fraction_to_float`)."""
    if answer is None or len(answer.strip()) == 0:
        return 0.0
    mine, theirs = exact_fraction(answer), exact_fraction(entry["answer"])  # a probability: no thousands separators
    if mine is not None and mine == theirs:
        return 1.0
    return _capped(_coin_flip_partial(answer, entry["answer"], tol))


def _coin_flip_partial(answer: str, oracle_answer: str, tol: float) -> float:
    answer = answer.replace(",", "")
    oracle_answer = oracle_answer.replace(",", "")
    try:
        answer_float = fraction_to_float(answer)
        oracle_answer_float = fraction_to_float(oracle_answer)
    except (ValueError, ZeroDivisionError, OverflowError):
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


def score_decimal_arithmetic(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for exactly the reference value (a decimal literal, compared as Decimals: "1.50" is 1.5); ``PARTIAL_CAP``
    within reasoning-gym's tolerance (one unit of ``max_num_decimal_places``, computed exactly); else 0. Where
    reasoning-gym gives full marks within the tolerance (9.7 for 9.701)."""
    mine, theirs = exact_decimal(answer), exact_decimal(entry["answer"])
    if mine is None or theirs is None:
        return 0.0
    if mine == theirs:
        return 1.0
    with decimal.localcontext(decimal.Context(prec=_MAX_EXACT_CHARS + 8)):
        close = abs(mine - theirs) <= decimal.Decimal(1).scaleb(-dataset.config.max_num_decimal_places)
    return PARTIAL_CAP if close else 0.0


def score_number_format(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for exactly the metadata solution (a decimal literal); ``PARTIAL_CAP`` within reasoning-gym's 0.01;
    else 0 (reasoning-gym gives full marks within 0.01: 578275728.51 for 578275728.514)."""
    mine, theirs = exact_decimal(answer), exact_decimal(str(entry["metadata"]["solution"]))
    if mine is None or theirs is None:
        return 0.0
    if mine == theirs:
        return 1.0
    with decimal.localcontext(decimal.Context(prec=_MAX_EXACT_CHARS + 8)):
        close = abs(mine - theirs) <= decimal.Decimal("0.01")
    return PARTIAL_CAP if close else 0.0


def score_spell_backward(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's rule, counted in integers: 1.0 when the answer equals the word reversed (case ignored);
    else one n-th per matching leading position, and 0.8 when all n positions match but the answer goes on.
    reasoning-gym sums floats, so six matches of 1/6 make 0.9999999999999999, which missed its own 0.8 cap and
    passed for full marks."""
    if not isinstance(answer, str):
        return 0.0
    expected, answer = entry["answer"].lower(), answer.lower()
    if expected == answer:
        return 1.0
    if not expected:
        return 0.0
    matches = sum(1 for a, b in zip(expected, answer) if a == b)
    return 0.8 if matches == len(expected) else matches / len(expected)


def score_letter_jumble(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for the sentence (case and surrounding whitespace ignored); else reasoning-gym's per-word credit
    counted in integers, at most ``PARTIAL_CAP`` (extra words after the right ones made reasoning-gym's sum 1.0)."""
    if not isinstance(answer, str):
        return 0.0
    expected, answer = entry["answer"].strip().lower(), answer.strip().lower()
    if answer == expected:
        return 1.0
    words, theirs = expected.split(), answer.split()
    if not words:
        return 0.0
    return _capped(sum(1 for i, w in enumerate(words) if i < len(theirs) and theirs[i] == w) / len(words))


def score_word_sorting(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for exactly the sorted words (split at commas); else reasoning-gym's credit (positions right, or 0.2
    for the right words in another order), at most ``PARTIAL_CAP`` (a trailing ",0" made it 1.0)."""
    oracle = list(entry["metadata"]["sorted_words"])
    if not answer:
        return 0.0
    parsed = [word.strip() for word in re.split(r",\s*", answer)]
    if parsed == oracle:
        return 1.0
    if not oracle:
        return 0.0
    credit = sum(1 for i, word in enumerate(parsed) if i < len(oracle) and word == oracle[i]) / len(oracle)
    if sorted(parsed) == sorted(oracle):
        credit = max(credit, 0.2)
    return _capped(credit)


_BOOLEANS = {"true": True, "false": False}


def score_game_of_life_halting(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 when the answer is ``True`` or ``False`` (case and surrounding whitespace ignored) and equals the
    reference; else 0. reasoning-gym compares ``bool(answer)``, true for any non-empty text, "False" included."""
    if not isinstance(answer, str):
        return 0.0
    mine = _BOOLEANS.get(answer.strip().lower())
    theirs = _BOOLEANS.get(str(entry["answer"]).strip().lower())
    return 1.0 if mine is not None and mine == theirs else 0.0


_FRACTION_FORM = re.compile(r"(\$?)(?:\\d?frac\{\d+\}\{\d+\}|\d+\s*/\s*\d+)\1")  # "$" on both sides or neither


def score_fraction_simplification(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's credit (1.0 simplified, 0.1 right but not simplified, less otherwise) for an answer that is
    a fraction and nothing else (``\\frac{a}{b}``, ``\\dfrac{a}{b}`` or ``a/b``, in ``$`` or not, surrounding
    whitespace allowed); anything around it (reasoning-gym searched for the pattern, so "a/b0" scored 1.0) at most 0.01."""
    if not isinstance(answer, str) or len(answer) > _MAX_EXACT_CHARS:
        return 0.0
    score = float(type(dataset).score_answer(dataset, answer, entry))
    if _FRACTION_FORM.fullmatch(answer.strip()):
        return score
    return min(score, 0.01)


_TIME_RE = re.compile(r"(\d{1,6}):(\d{2})(?::(\d{2})(?:\.(\d{3}))?)?")
_DAYS_RE = re.compile(r"(\d{1,9})\s+days?")


def _exact_duration(text: str) -> tuple[int, int] | None:
    """("D days", "HH:MM[:SS[.mmm]]" or "D days, HH:MM[:SS[.mmm]]") as (days, milliseconds), else None."""
    text = " ".join(text.split())
    days, _, clock = text.partition(", ") if ", " in text else ((text, "", "") if "day" in text else ("", "", text))
    total_days = 0
    if days:
        m = _DAYS_RE.fullmatch(days)
        if not m:
            return None
        total_days = int(m.group(1))
    if not clock:
        return (total_days, 0) if days else None
    m = _TIME_RE.fullmatch(clock)
    if not m:
        return None
    h, mi, sec, ms = (int(g) if g else 0 for g in m.groups())
    if mi >= 60 or sec >= 60:
        return None
    return total_days, ((h * 60 + mi) * 60 + sec) * 1000 + ms


def score_time_intervals(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for exactly the duration, written as the reference is (days, and a clock with as many fields); else
    reasoning-gym's credit, at most ``PARTIAL_CAP``. reasoning-gym reads only the first word of "D days" and the
    first fields of a clock, so trailing junk or an extra field scored 1.0."""
    if not isinstance(answer, str) or len(answer) > _MAX_EXACT_CHARS:
        return 0.0
    expected = str(entry["answer"])
    mine, theirs = _exact_duration(answer), _exact_duration(expected)
    shape = lambda t: re.sub(r"\d+", "#", " ".join(t.split()))  # noqa: E731  (units and fields as the reference's)
    if mine is not None and mine == theirs and shape(answer) == shape(expected):
        return 1.0
    return _capped(type(dataset).score_answer(dataset, answer, entry))


_KNIGHTS_WORD = re.compile(r"[a-z]+")


def _knights_assignments(text: str, roles: set[str]) -> frozenset[tuple[str, str]] | None:
    """"A is a R1, B is an R2, and C is a R3." as {(a, r1), ...}; None for anything else (a clause that is not
    "<name> is a|an <role>", words left over)."""
    words = text.lower().replace(",", " , ").replace(".", " . ").split()
    if words and words[-1] == ".":
        words.pop()
    out, i = set(), 0
    while i < len(words):
        if out:  # between clauses: ",", "and" or ", and"
            if words[i] == ",":
                i += 1
            if i < len(words) and words[i] == "and":
                i += 1
        clause = words[i:i + 4]
        if (len(clause) != 4 or not _KNIGHTS_WORD.fullmatch(clause[0]) or clause[1] != "is" or clause[2] not in ("a", "an")
                or clause[3] not in roles):
            return None
        out.add((clause[0], clause[3]))
        i += 4
    return frozenset(out) if out else None


def score_knights_knaves(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """1.0 for exactly the reference's (name, role) pairs, in any order, written as clauses "<name> is a <role>"
    joined by commas and "and" and nothing else; else reasoning-gym's credit, at most ``PARTIAL_CAP``
    (reasoning-gym drops every word it does not know, so junk around the right pairs scored 1.0)."""
    if not isinstance(answer, str) or not answer or len(answer) > _MAX_EXACT_CHARS:
        return 0.0
    terms = entry["metadata"].get("knight_knave_terms") or {}
    roles = {str(terms[k]).lower() for k in ("knight", "knave") if k in terms}
    mine, theirs = _knights_assignments(answer, roles), _knights_assignments(str(entry["answer"]), roles)
    if mine is not None and mine == theirs:
        return 1.0
    return _capped(type(dataset).score_answer(dataset, answer, entry))


_HANOI_MOVE = re.compile(r"Move disk \d{1,4} from Peg \d{1,4} to Peg \d{1,4}")


def score_tower_of_hanoi(dataset: Any, answer: str | None, entry: dict[str, Any]) -> float:
    """reasoning-gym's score when every non-blank line is exactly one move ("Move disk d from Peg a to Peg b",
    surrounding whitespace allowed); else at most ``PARTIAL_CAP`` (its line pattern is not anchored, so junk before
    or after a move was ignored)."""
    if not isinstance(answer, str):
        return 0.0
    score = float(type(dataset).score_answer(dataset, answer, entry))
    lines = [line.strip() for line in answer.splitlines() if line.strip()]
    if lines and all(_HANOI_MOVE.fullmatch(line) for line in lines):
        return score
    return _capped(score)


#: the families whose reasoning-gym scorer gave full marks to wrong answers, and ours does not (scores may differ
#: from reasoning-gym's on wrong answers: never higher, and capped)
EXACT_FAMILIES = frozenset({"coin_flip", "decimal_arithmetic", "number_sorting", "spell_backward", "letter_jumble",
                            "word_sorting", "game_of_life_halting", "fraction_simplification", "number_format",
                            "time_intervals", "knights_knaves", "tower_of_hanoi"})

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
    "spell_backward": score_spell_backward,
    "letter_jumble": score_letter_jumble,
    "word_sorting": score_word_sorting,
    "game_of_life_halting": score_game_of_life_halting,
    "fraction_simplification": score_fraction_simplification,
    "number_format": score_number_format,
    "time_intervals": score_time_intervals,
    "knights_knaves": score_knights_knaves,
    "tower_of_hanoi": score_tower_of_hanoi,
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
