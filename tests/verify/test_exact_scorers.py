"""Full marks only for a right answer, in every family a node can allow (``scorer_audit.allowed_families``).

For each allowable family, real items of the training streams' dataset (its default config) and, for each, the
adversarial wrong answers a peer would try: prefixes and truncations, trailing junk, the right answer after junk,
booleans and empty strings, near-miss numbers (one digit off, a tail of zeros and a 1, off by 10^-k), the right word
plus junk. None may score full marks (1.0, nor anything a float threshold would round to it). Variants that are
still right (case, surrounding whitespace, a final period, the same numbers written with other leading or trailing
zeros) are left out. The reference answer itself must keep full marks.
"""

from __future__ import annotations

import decimal
import re

import pytest
import reasoning_gym

from swarmlm.tasks.provenance import DATASET_SIZE, TRAIN_SEED
from swarmlm.verify.safe_scorers import PARTIAL_CAP, scorer_for
from swarmlm.verify.scorer_audit import allowed_families, audit_of

FULL_MARKS = 1.0 - 1e-9  # swarmlm.sapo.node's threshold for a correct answer
ITEMS = 8
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_NO_ANSWER = {"propositional_logic"}  # its items carry no reference answer (any valid conclusion is right)


def wrong_answers(right: str) -> set[str]:
    out: set[str] = set()
    for k in range(1, len(right)):
        out.update((right[:k], right[k:]))  # prefixes and truncations
    for junk in ("0", "x", " junk", "°0", "a", ".", "00", " 0", "!", "\n0", ",0", "1", " and more", ")"):
        out.add(right + junk)  # trailing junk, the right word plus junk
    for junk in ("a", "0", "x ", "(", "no "):
        out.add(junk + right)
    out.update(("True", "False", "true", "false", "0", "1", "yes", "no", "", " ", "None", "[]", "{}"))
    for m in _NUMBER.finditer(right):  # near misses
        digits = m.group()
        for i, ch in enumerate(digits):
            if ch.isdigit():
                for other in {str((int(ch) + 1) % 10), str((int(ch) + 9) % 10)}:
                    out.add(right[:m.start() + i] + other + right[m.start() + i + 1:])
        out.add(right[:m.end()] + ("" if "." in digits else ".") + "0000000001" + right[m.end():])
        try:
            value = decimal.Decimal(digits)
        except decimal.InvalidOperation:
            continue
        for k in range(1, 12):
            out.add(right[:m.start()] + str(value - decimal.Decimal(1).scaleb(-k)) + right[m.end():])
    out.discard(right)
    return out


def still_right(right: str, answer: str) -> bool:
    """The same answer written otherwise: case, whitespace, a final period, or equal numbers (leading or trailing
    zeros) with the same text around them."""
    norm = lambda t: " ".join(t.split()).lower().rstrip(".")  # noqa: E731
    if norm(answer) == norm(right):
        return True
    a, b = _NUMBER.findall(right), _NUMBER.findall(answer)
    return (len(a) == len(b) and all(decimal.Decimal(x) == decimal.Decimal(y) for x, y in zip(a, b))
            and _NUMBER.sub("#", norm(right)) == _NUMBER.sub("#", norm(answer)))


@pytest.fixture(scope="module")
def datasets():
    return {}


@pytest.mark.parametrize("family", allowed_families())
def test_no_wrong_answer_gets_full_marks(family, datasets):
    ds = reasoning_gym.create_dataset(family, seed=TRAIN_SEED, size=DATASET_SIZE)
    score = scorer_for(family)
    tried = 0
    for i in range(ITEMS):
        entry = ds[TRAIN_SEED + i * 7919]
        right = entry.get("answer")
        if family in _NO_ANSWER or right is None:
            continue
        right = str(right)
        assert score(ds, right, entry) == 1.0, (family, right)
        for answer in wrong_answers(right):
            if still_right(right, answer):
                continue
            try:
                got = score(ds, answer, entry)
            except Exception:  # the verifier scores an answer its scorer raises on as 0
                got = 0.0
            tried += 1
            assert got < FULL_MARKS, (family, right, answer, got)
    assert tried >= 10 * ITEMS or family in _NO_ANSWER


def _dataset(family: str, **config):
    return reasoning_gym.create_dataset(family, seed=1, size=10, **config)


@pytest.mark.parametrize("family,answer,entry,expected", [
    # the issue's examples: each scored 1.0 by reasoning-gym's scorer
    ("coin_flip", "0", {"answer": "0.171875"}, PARTIAL_CAP),  # a common prefix: 1.0 in reasoning-gym
    ("coin_flip", "0.", {"answer": "0.171875"}, PARTIAL_CAP),
    ("coin_flip", "0.17", {"answer": "0.171875"}, PARTIAL_CAP),
    ("coin_flip", "11/64", {"answer": "0.171875"}, 1.0),
    ("coin_flip", "0.1718750", {"answer": "0.171875"}, 1.0),
    ("game_of_life_halting", "False", {"answer": "True"}, 0.0),
    ("game_of_life_halting", "no", {"answer": "True"}, 0.0),
    ("game_of_life_halting", " true ", {"answer": "True"}, 1.0),
    ("spell_backward", "ezworfx", {"answer": "ezworf"}, 0.8),
    ("spell_backward", "EZWORF", {"answer": "ezworf"}, 1.0),
    ("spell_backward", "ezwoxx", {"answer": "ezworf"}, 4 / 6),
    ("letter_jumble", "Earth Chronicle Unfortunately it was 0", {"answer": "Earth Chronicle Unfortunately it was"},
     PARTIAL_CAP),
    ("word_sorting", "with, desirous, coachman, Never,0",
     {"answer": "with, desirous, coachman, Never", "metadata": {"sorted_words": ["with", "desirous", "coachman", "Never"]}},
     PARTIAL_CAP),
    ("word_sorting", "desirous, with, coachman, Never",
     {"answer": "with, desirous, coachman, Never", "metadata": {"sorted_words": ["with", "desirous", "coachman", "Never"]}},
     0.5),
])
def test_the_lenient_cases_score_exactly(family, answer, entry, expected):
    entry = {"question": "", "metadata": {}, **entry}
    assert scorer_for(family)(_dataset(family), answer, entry) == pytest.approx(expected, abs=0)


def _item_of(family: str, pick, **config):
    ds = reasoning_gym.create_dataset(family, seed=TRAIN_SEED, size=DATASET_SIZE, **config)
    for i in range(200):
        entry = ds[TRAIN_SEED + i]
        if pick(entry):
            return ds, entry
    raise AssertionError(f"no {family} item found")


def test_near_misses_and_junk_of_the_reference_families():
    ds, e = _item_of("decimal_arithmetic", lambda e: True)
    right = decimal.Decimal(e["answer"])
    tol = decimal.Decimal(1).scaleb(-ds.config.max_num_decimal_places)
    score = scorer_for("decimal_arithmetic")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, e["answer"] + "0", e) == 1.0  # the same value
    assert score(ds, str(right - tol), e) == PARTIAL_CAP  # within reasoning-gym's tolerance: 1.0 there
    assert score(ds, str(right - 2 * tol), e) == 0.0
    assert score(ds, e["answer"] + "e0", e) == 0.0 and score(ds, "NaN", e) == 0.0
    ds, e = _item_of("fraction_simplification", lambda e: "frac" in e["answer"])
    score = scorer_for("fraction_simplification")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, e["answer"].strip("$"), e) == 1.0
    for junk in (" 0", "x", "0", "°"):
        assert score(ds, e["answer"] + junk, e) <= 0.01, junk
    ds, e = _item_of("number_format", lambda e: True)
    score = scorer_for("number_format")
    solution = decimal.Decimal(str(e["metadata"]["solution"]))
    assert score(ds, str(solution), e) == 1.0 and score(ds, str(solution + decimal.Decimal("0.005")), e) == PARTIAL_CAP
    ds, e = _item_of("time_intervals", lambda e: e["metadata"]["task_type"] == "date")
    score = scorer_for("time_intervals")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, e["answer"] + " 5 hours", e) <= PARTIAL_CAP
    assert score(ds, e["answer"].split()[0], e) <= PARTIAL_CAP  # reasoning-gym reads only the number
    ds, e = _item_of("time_intervals", lambda e: e["metadata"]["task_type"] == "time")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, e["answer"] + ":99", e) <= PARTIAL_CAP
    ds, e = _item_of("knights_knaves", lambda e: True)
    score = scorer_for("knights_knaves")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, e["answer"].rstrip("."), e) == 1.0
    assert score(ds, "x " + e["answer"], e) <= PARTIAL_CAP and score(ds, e["answer"] + " junk", e) <= PARTIAL_CAP
    clauses = e["answer"].rstrip(".").split(", and ")
    assert score(ds, " and ".join(reversed(clauses)), e) == 1.0  # any order
    ds, e = _item_of("tower_of_hanoi", lambda e: True)
    score = scorer_for("tower_of_hanoi")
    assert score(ds, e["answer"], e) == 1.0 and score(ds, "junk " + e["answer"], e) <= PARTIAL_CAP
    ds, e = _item_of("number_sorting", lambda e: True)
    score = scorer_for("number_sorting")
    nums = [float(x) for x in re.findall(r"-?\d+\.?\d*", e["answer"])]
    assert score(ds, e["answer"], e) == 1.0
    assert score(ds, str([str(round(n + 0.9, 2)) for n in nums]).replace("'", '"'), e) == 0.0  # within 1: 1.0 there


@pytest.mark.parametrize("family", ["advanced_geometry", "complex_arithmetic"])
def test_a_family_whose_scorer_cannot_be_made_exact_is_refused_saying_why(family):
    assert family not in allowed_families()
    with pytest.raises(ValueError, match=f"family '{family}' is refused by the scorer audit .*LENIENT"):
        scorer_for(family)
    assert "exact scorer" in audit_of(family).finding
