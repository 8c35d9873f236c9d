"""The audit of reasoning-gym's scorers, as data: which families a node may score, and with which scorer.

reasoning-gym 0.1.25 registers 106 families. Each family's ``score_answer`` (and everything it calls) was read
for three things: whether it evaluates text (``eval``, ``exec``, ``compile``, sympy's ``parse_expr`` /
``sympify``, or anything that executes the answer, the entry's ``answer`` field or a metadata field); whether
its time or memory is bounded on small hostile inputs (huge exponents, long repetition counts, deep nesting,
exponential enumeration, regular expressions that backtrack); and whether it raises on odd answers.

Every family gets one verdict:

* ``reasoning_gym`` - safe as is: the library's scorer only compares strings or parses literals
  (``int``/``float``/``Decimal``/``json``) of bounded size; it is used unchanged.
* ``ours`` - the library's scorer evaluates text or is unbounded; :mod:`swarmlm.verify.safe_scorers` has a
  scorer of our own with the same scores on honest answers.
* ``refused`` - the family cannot be put in a task mix nor scored for a peer (a config error says so).
  A family that was not audited in depth is refused too.

Every scorer, whatever its verdict, still runs inside the bounded worker pool
(:mod:`swarmlm.verify.scoring_pool`), under a time and a memory limit. ``docs/security/scorer_audit.md`` is
rendered from this table (:func:`render_audit_markdown`); a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["reasoning_gym", "ours", "refused"]

AUDITED_VERSION = "0.1.25"


@dataclass(frozen=True)
class FamilyAudit:
    verdict: Verdict
    scorer: str  # what the scorer does with the answer, the entry's answer and the metadata
    finding: str = ""  # why the verdict: the hazards found, or why none


_BASE = ("base class: 1.0 if answer == entry answer; else len(entry answer)/len(answer) when the entry answer "
         "is a substring of the answer; no parsing")
_BASE_FINDING = "string comparison only; linear in the answer length"

_BASE_FAMILIES = (
    "aiw", "arc_1d", "base_conversion", "basic_arithmetic", "bf", "binary_alternation", "caesar_cipher",
    "count_bits", "count_primes", "course_schedule", "gcd", "largest_island", "lcm",
    "leg_counting", "letter_counting", "mahjong_puzzle", "maze", "modulo_grid",
    "number_filtering", "number_sequence", "rotate_matrix", "rotten_oranges", "simple_equations",
    "simple_geometry", "string_manipulation", "string_splitting", "string_synthesis", "syllogism",
    "word_sequence_reversal",
)

_NOT_AUDITED = "not audited in depth (refused until it is)"
_HASH_DEPENDENT = ("items depend on Python's string-hash randomisation (set order): two processes generate different "
                   "items from one (seed, index), so no receiver can regenerate them")

AUDIT: dict[str, FamilyAudit] = {name: FamilyAudit("reasoning_gym", _BASE, _BASE_FINDING) for name in _BASE_FAMILIES}
AUDIT.update({
    # ---------------------------------------------------------------- the families of the two presets
    "chain_sum": FamilyAudit(
        "reasoning_gym", "utils.compute_decimal_reward: strips commas, Decimal(answer) == Decimal(entry answer), "
        "else the substring credit of the base class",
        "Decimal() is a literal parser; comparison of Decimals with huge exponents is O(1) (measured < 0.1 ms on "
        "'1e999999999', 8000-digit and 'sNaN' answers)"),
    "products": FamilyAudit("reasoning_gym", "as chain_sum (utils.compute_decimal_reward)", "as chain_sum"),
    "spell_backward": FamilyAudit(
        "ours", "lower-cases both; 1.0 if equal; else credit per matching leading position of the entry "
        "answer (0.8 cap)", "LENIENT: the credit is a float sum, so the right word plus junk scores 0.9999999999999999, "
        "missing the 0.8 cap and passing for full marks. Ours counts matches in integers"),
    "fraction_simplification": FamilyAudit(
        "ours", "regex for \\frac{a}{b} or 'a/b', int() of both parts, compared with metadata "
        "simplified_numerator/denominator (1.0), numerator/denominator (0.1); 0.05 / 0.01 otherwise",
        "LENIENT: the pattern is searched, not matched whole, so the fraction plus a trailing '0' or 'x' scores 1.0. "
        "Ours: reasoning-gym's credit only for an answer that is the fraction and nothing else, else at most 0.01"),
    "decimal_arithmetic": FamilyAudit(
        "ours", "Decimal(answer) - Decimal(entry answer) within 10^-max_num_decimal_places",
        "LENIENT: full marks within the tolerance (9.7 for 9.701); and the subtraction ran in the process's current "
        "decimal context, which the generator mutates. Ours: 1.0 only for the exact value (Decimal literals, no "
        "exponent), 0.5 within the tolerance (computed exactly), else 0"),
    "calendar_arithmetic": FamilyAudit(
        "ours", "weekday tasks: string comparison; counting tasks: int(answer), exp(-5 * relative error); leap "
        "year: case-insensitive comparison",
        "an answer of ~310+ digits makes abs(a - b) / b raise OverflowError, which the scorer does not catch (the "
        "node crashed scoring its own completion). Ours catches it: score 0 (exp of -huge)"),
    "propositional_logic": FamilyAudit(
        "ours", "upper-case letters of the answer must be metadata variables; the answer and metadata premises "
        "are parsed by a recursive hand-written parser; validity and triviality by enumerating all 2^n "
        "assignments of the variables found",
        "no eval, but unbounded: lower-case names are variables too, so 'a ∨ b ∨ ... ' with 18 names took 13 s "
        "and 30 names never finishes (2^30 dict assignments); '¬' * 2000 + 'P' raises RecursionError, uncaught. "
        "Ours: the same grammar with depth (48), size (512 parts) and variable (16) bounds, truth tables as bit "
        "masks"),
    "binary_matrix": FamilyAudit(
        "ours", "1.0 if answer == entry answer; else eval(answer) formatted as a matrix, 0.1 if it matches",
        "CODE EXECUTION: eval() of the answer. Ours reads Python list literals with a bounded parser"),
    # ---------------------------------------------------------------- other families: evaluate text
    "spiral_matrix": FamilyAudit(
        "ours", "1.0 for the exact text; 0.1 if ' '.join(str(x) for x in eval(answer)) matches",
        "CODE EXECUTION: eval() of the answer. Ours: bounded literal parser"),
    "string_insertion": FamilyAudit(
        "ours", "1.0 for the exact text; 0.1 if ''.join(eval(answer)) matches",
        "CODE EXECUTION: eval() of the answer. Ours: bounded literal parser"),
    "n_queens": FamilyAudit(
        "ours", "1.0 if the answer is in metadata valid_answers; 0.5 if eval(answer) formatted as a board is",
        "CODE EXECUTION: eval() of the answer. Ours: bounded literal parser"),
    "number_sorting": FamilyAudit(
        "ours", "json.loads of the answer (quotes swapped); the entry answer by json.loads, falling back to "
        "eval(entry answer) - always taken, the reference is a Python list literal; float() comparison, sortedness",
        "CODE EXECUTION: eval() of the entry's answer field; LENIENT: each number may be off by 1 (37.9 for 37.0). "
        "Ours: bounded literal parser for the reference, numbers compared exactly as Decimals"),
    "countdown": FamilyAudit(
        "ours", "float(sympy.parse_expr(answer)); the integers of the answer must be metadata numbers; np.isclose "
        "to metadata target: 1.0 / 0.05 / 0.01",
        "CODE EXECUTION: sympy.parse_expr evaluates Python. Ours: hand-written + - * / ( ) grammar, exact "
        "Fractions, sympy's zoo/nan rules; '**', names and exponents score as unparseable (0.01)"),
    "puzzle24": FamilyAudit(
        "ours", "int(sympy.parse_expr(answer)) == 24, four integers within the config range: 1.0, else 0.01",
        "CODE EXECUTION: sympy.parse_expr. Ours: the arithmetic grammar as countdown"),
    "bitwise_arithmetic": FamilyAudit(
        "refused", "eval(metadata problem), int(answer, 0)",
        "CODE EXECUTION: eval() of a metadata field"),
    "polynomial_multiplication": FamilyAudit(
        "refused", "sympy.parse_expr(answer) == sympy.parse_expr(entry answer)", "CODE EXECUTION: sympy.parse_expr"),
    "simple_integration": FamilyAudit(
        "refused", "sympy.parse_expr(answer), diff, parse_expr(metadata integrand), simplify",
        "CODE EXECUTION: sympy.parse_expr; simplify is unbounded"),
    "intermediate_integration": FamilyAudit(
        "refused", "as simple_integration", "CODE EXECUTION: sympy.parse_expr; simplify is unbounded"),
    "codeio": FamilyAudit(
        "refused", "string / JSON comparison", "the generator executes code (exec) from its data files"),
    "composite": FamilyAudit(
        "refused", "forwards to the family named by metadata source_dataset",
        "a metadata field chooses the scorer; not a family of its own"),
    # ---------------------------------------------------------------- other families: unbounded
    "coin_flip": FamilyAudit(
        "ours", "float(Fraction(answer)) within 1e-4 of the entry answer: 1.0; else common prefix of the two "
        "values printed with 10 digits over the shorter (so '0' scores 1.0 on '0.234375')",
        "DENIAL OF SERVICE: Fraction('1e999999999') builds a billion-digit integer; '1e400' raises "
        "OverflowError, uncaught. LENIENT: '0', '0.' and '0.17' score 1.0 against 0.171875 (prefix rule, "
        "tolerance). Ours: 1.0 only for the exact value (a decimal or a/b, as Fractions), reasoning-gym's credit "
        "otherwise at most 0.5, exponents never expanded"),
    "rubiks_cube": FamilyAudit(
        "refused", "expands 'R100000' into 100000 moves and applies them to a cube",
        "DENIAL OF SERVICE: 'R100000' took 11.6 s, longer counts are unbounded"),
    "quantum_lock": FamilyAudit(
        "refused", "simulates the answer's button presses with metadata buttons (add/multiply big integers)",
        "DENIAL OF SERVICE: multiplying by metadata values per press grows integers without bound"),
    # ---------------------------------------------------------------- other families: safe as is
    "ab": FamilyAudit("reasoning_gym", "answer == entry answer", "comparison only"),
    "circuit_logic": FamilyAudit("reasoning_gym", "equality, or equality after strip with length credit", "comparison only"),
    "color_cube_rotation": FamilyAudit("reasoning_gym", "case-insensitive equality: 1.0 / 0.01", "comparison only"),
    "dice": FamilyAudit("reasoning_gym", "case-insensitive equality without newlines", "comparison only"),
    "emoji_mystery": FamilyAudit("reasoning_gym", "equality, else per-character credit at equal length", "linear"),
    "family_relationships": FamilyAudit("reasoning_gym", "case-insensitive equality", "comparison only"),
    "figlet_font": FamilyAudit("reasoning_gym", "equality, else 0.1 per matching position", "linear"),
    "needle_haystack": FamilyAudit("reasoning_gym", "case-insensitive equality without spaces", "comparison only"),
    "path_star": FamilyAudit("reasoning_gym", "equality after collapsing whitespace", "linear"),
    "self_reference": FamilyAudit("reasoning_gym", "answer == str(entry answer)", "comparison only"),
    "sentence_reordering": FamilyAudit("reasoning_gym", "equality, else per-word credit", "linear"),
    "zebra_puzzles": FamilyAudit("reasoning_gym", "case-insensitive equality without newlines", "comparison only"),
    "decimal_chain_sum": FamilyAudit("reasoning_gym", "Decimal(answer) == Decimal(entry answer)", "literal parser, O(1) compare"),
    "game_of_life_halting": FamilyAudit("ours", "bool(answer) == bool(entry answer)",
                                        "LENIENT: bool('False') is true, so any non-empty answer scores 1.0 when the "
                                        "answer is True. Ours: 'True' / 'False' (case ignored) compared as booleans"),
    "number_format": FamilyAudit("ours", "float(answer) within 1e-2 of metadata solution",
                                 "LENIENT: full marks within 0.01 (578275728.51 for 578275728.514). Ours: 1.0 for the "
                                 "exact value (Decimal literals), 0.5 within 0.01, else 0"),
    "palindrome_generation": FamilyAudit("reasoning_gym", "palindrome check, sorted letters vs metadata letters", "O(n log n)"),
    "word_sorting": FamilyAudit("ours", "re.split(r',\\s*') of the answer vs metadata sorted_words",
                                "LENIENT: credit per right position over the reference's length, so extra words after "
                                "the right ones score 1.0. Ours: 1.0 only for exactly the words, credit at most 0.5"),
    "tsumego": FamilyAudit("reasoning_gym", "equality, substring credit, anchored regex for 'C4'", "linear"),
    "futoshiki": FamilyAudit("reasoning_gym", "equality per line, else digits per line vs metadata solution", "linear"),
    "sudoku": FamilyAudit("reasoning_gym", "as futoshiki", "linear"),
    "mini_sudoku": FamilyAudit("reasoning_gym", "as futoshiki", "linear"),
    "rectangle_count": FamilyAudit("reasoning_gym", "int(answer) distance to int(entry answer)", "int() capped at 4300 digits"),
    "time_intervals": FamilyAudit("ours", "int() of day / time fields, difference credit",
                                  "LENIENT: only the first word of 'D days' and the first fields of a clock are read, "
                                  "so trailing junk or an extra field scores 1.0. Ours: 1.0 only for the duration "
                                  "written as the reference is (anchored), credit otherwise at most 0.5"),
    "manipulate_matrix": FamilyAudit("reasoning_gym", "equality, whitespace-normalised equality, substring credit", "split / join only"),
    "letter_jumble": FamilyAudit("ours", "equality, else per-word credit",
                                 "LENIENT: the per-word credit is a float sum capped at 1.0, so the right words plus "
                                 "more score 1.0 (or 0.9999999999999999). Ours: integer count, at most 0.5"),
    "knights_knaves": FamilyAudit("ours", "answer normalised to (name, role) pairs, set comparison",
                                  "LENIENT: every unknown word is dropped, so junk around the right pairs scores 1.0. "
                                  "Ours: 1.0 only for clauses '<name> is a <role>' joined by ',' / 'and' and nothing "
                                  "else, reasoning-gym's credit otherwise at most 0.5"),
    "prime_factorization": FamilyAudit("reasoning_gym", "int() of '×'-separated factors, sorted / product comparison",
                                       "int() capped at 4300 digits; products bounded by the answer length"),
    # ---------------------------------------------------------------- other families: generator unusable for streams
    "acre": FamilyAudit("refused", _BASE, "the scorer is safe, but the dataset generates all `size` items when it is "
                        "created: a stream's dataset (10^7 items) never finishes"),
    "list_functions": FamilyAudit("refused", _BASE, "the scorer is safe, but creating a dataset draws `size` task "
                                  "indices: 1.2 s and ~80 MB per stream, for every peer's seed"),
    "isomorphic_strings": FamilyAudit("refused", _BASE, _HASH_DEPENDENT),
    "ransom_note": FamilyAudit("refused", _BASE, _HASH_DEPENDENT),
    "knight_swap": FamilyAudit("refused", "'No', or json.loads list of moves replayed on metadata board",
                               "the scorer is safe (linear in the moves); " + _HASH_DEPENDENT),
    "word_ladder": FamilyAudit("refused", "comma-split words, one-letter steps, vocabulary lookup",
                               "the scorer is safe, but the dataset refuses a stream's size (ValueError: Dataset size "
                               "too large for this algorithm and constraints)"),
    "shortest_path": FamilyAudit("reasoning_gym", "direction words walked on metadata matrix", "linear in the answer"),
    "palindrome_partitioning": FamilyAudit("reasoning_gym", "json.loads(answer) as a set of tuples vs metadata solution",
                                           "json is a literal parser; RecursionError on deep nesting is caught"),
    "group_anagrams": FamilyAudit("reasoning_gym", "json.loads(answer), sorted nested lists vs metadata solution",
                                  "json is a literal parser; errors caught"),
    "game_of_life": FamilyAudit("reasoning_gym", "json.loads of answer and entry answer, cell-wise comparison",
                                "loops bounded by the entry's grid"),
    "tower_of_hanoi": FamilyAudit("ours", "one regex-parsed move per line replayed on pegs",
                                  "LENIENT: the line pattern is not anchored, so junk before or after each move is "
                                  "ignored. Ours: full marks only when every non-blank line is exactly one move"),
    "advanced_geometry": FamilyAudit("refused", "float() of the answer (and of 'x, y'), np.round comparison with the entry",
                                     "LENIENT: text after ')' and a missing '(' are ignored, values equal after np.round "
                                     "score 1.0 ('24.63°0' for 24.63°); the right answer is a real number the question "
                                     "asks to round, and which roundings count as right is not written down, so no "
                                     "exact scorer of ours replaces it yet"),
    "complex_arithmetic": FamilyAudit("refused", "complex()/float() of the normalised answer, exp(-distance) to metadata result",
                                      "LENIENT: the score is exp(-distance) of floats, so an answer off by 1e-11 scores "
                                      "0.99999999999, full marks by any float threshold; the reference rounds a real "
                                      "result and its rounding rule is not written down, so no exact scorer of ours "
                                      "replaces it yet"),
})

for _name in ("arc_agi", "rearc", "boxnet", "cryptarithm", "graph_color", "gsm_symbolic", "jugs", "kakurasu", "survo",
              "polynomial_equations", "pool_matrix", "power_function", "rush_hour", "sokoban"):
    AUDIT.setdefault(_name, FamilyAudit("refused", "", _NOT_AUDITED))


def audit_of(family: str) -> FamilyAudit:
    """The family's audit entry; a family missing from the table is refused."""
    return AUDIT.get(family, FamilyAudit("refused", "", _NOT_AUDITED))


def allowed_families() -> list[str]:
    """Every family a task mix may contain (verdict ``reasoning_gym`` or ``ours``), sorted."""
    return sorted(name for name, entry in AUDIT.items() if entry.verdict != "refused")


_VERDICT_TEXT = {"reasoning_gym": "safe as is", "ours": "safe scorer of ours", "refused": "refused"}


def render_audit_markdown(registered: list[str]) -> str:
    """The table of ``docs/security/scorer_audit.md``: one row per registered family."""
    rows = ["| family | what the scorer does with the answer / entry answer / metadata | finding | verdict |",
            "|---|---|---|---|"]
    for name in sorted(registered):
        entry = audit_of(name)
        cells = [f"`{name}`", entry.scorer or "-", entry.finding or "-", _VERDICT_TEXT[entry.verdict]]
        rows.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m swarmlm.verify.scorer_audit: the table of docs/security/scorer_audit.md
    from reasoning_gym.factory import DATASETS

    print(render_audit_markdown(sorted(DATASETS)))
