"""Tasks: answer extraction, per-node question streams, the fixed held-out set, and the verifiers."""

from __future__ import annotations


import pytest
import reasoning_gym

from swarmlm.config import ConfigError, validate_config
from swarmlm.models import build_byte_tokenizer
from swarmlm.tasks import TaskConfig, TaskSource, build_prompt, eval_questions, extract_answer, format_answer
from swarmlm.tasks.provenance import DATASET_SIZE, TRAIN_SEED, is_stream_item
from swarmlm.verify.verifier import score_in_process


# ----------------------------------------------------------------------------- answer format
@pytest.mark.parametrize("completion,expected", [
    ("<answer>5</answer>", "5"),
    ("I think <answer>3</answer>, no wait: <answer> 7 </answer>", "7"),     # the LAST span, stripped
    ("no tags here", None),
    ("", None),
    ("<answer>unclosed", None),
    ("<answer></answer>", ""),
    ("<answer>line one\nline two</answer>", "line one\nline two"),         # multiline content
    ("<answer>a</answer>\n\nthen\n<answer>\nb\n</answer>\ntrailing", "b"),
    ("<answer>x</answer><answer>y", "x"),                                   # an unclosed last tag is not a span
    ("<ANSWER>5</ANSWER>", None),
])
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_format_answer_round_trips():
    assert extract_answer("reasoning... " + format_answer("42")) == "42"


def test_plain_prompt_holds_question_and_instruction():
    prompt = build_prompt("What is 2 + 2?", build_byte_tokenizer())  # no chat template: plain style
    assert prompt.startswith("What is 2 + 2?") and "<answer></answer>" in prompt


# ----------------------------------------------------------------------------- streams and evaluation set
def test_node_streams_are_deterministic_and_differ_between_nodes_and_rounds():
    config = TaskConfig()
    a1 = [q.question for q in TaskSource(config, stream="swarm/node-0").sample(12, round=3)]
    a2 = [q.question for q in TaskSource(config, stream="swarm/node-0").sample(12, round=3)]
    b = [q.question for q in TaskSource(config, stream="swarm/node-1").sample(12, round=3)]
    assert a1 == a2
    assert a1 != b
    # consecutive rounds of one node, and later slots of one round, are new questions, not a repeat
    src = TaskSource(config, stream="swarm/node-0")
    assert [q.question for q in src.sample(8, round=3)] != [q.question for q in src.sample(8, round=4)]
    assert [q.question for q in src.sample(8, round=3, first_slot=8)] != a1[:8]
    assert [q.question for q in src.sample(4, round=3, first_slot=8)] == a1[8:12]


def test_a_question_is_bound_to_its_stream_round_and_slot():
    """What a receiver checks: the question a record carries is the one its sender's stream draws for that
    round and slot, so neither another node's question nor an old one can be passed off as the sender's own."""
    src = TaskSource(TaskConfig(), stream="swarm/node-0")
    q = src.question(7, 2)
    assert is_stream_item(q.provenance, "swarm/node-0", 7, 2)
    assert not is_stream_item(q.provenance, "swarm/node-1", 7, 2)  # re-signed by another node
    assert not is_stream_item(q.provenance, "swarm/node-0", 8, 2)  # published again in a later round
    assert not is_stream_item(q.provenance, "swarm/node-0", 7, 3)  # under another slot
    assert not is_stream_item(q.provenance, "other-swarm/node-0", 7, 2)


def test_eval_set_is_fixed():
    config = TaskConfig(eval_size=16)
    a, b = eval_questions(config), eval_questions(config)
    assert [q.question for q in a] == [q.question for q in b] and len(a) == 16
    assert {q.family for q in a} <= {f.name for f in config.resolved_families()}
    assert len({q.family for q in a}) > 1


def test_eval_and_training_questions_draw_from_disjoint_seeds(monkeypatch):
    """reasoning-gym seeds item i of a dataset with seed + i. Record every dataset created (the real function
    is called) and check that the seeds the held-out set uses never fall in the training datasets' range."""
    created = []
    real = reasoning_gym.create_dataset

    def spy(name, **kwargs):
        created.append((name, kwargs["seed"], kwargs["size"]))
        return real(name, **kwargs)

    monkeypatch.setattr(reasoning_gym, "create_dataset", spy)
    config = TaskConfig(preset="paper", eval_size=8)
    eval_questions(config)
    eval_ranges = [(seed, seed + size) for _, seed, size in created]
    assert len(eval_ranges) == len(config.resolved_families())
    created.clear()
    TaskSource(config, stream="swarm/node-0")
    assert {(seed, size) for _, seed, size in created} == {(TRAIN_SEED, DATASET_SIZE)}
    for lo, hi in eval_ranges:
        assert hi <= TRAIN_SEED or lo >= TRAIN_SEED + DATASET_SIZE, (lo, hi)


# ----------------------------------------------------------------------------- verifiers
@pytest.mark.parametrize("preset", ["arithmetic", "easy", "paper"])
def test_scorer_gives_one_for_the_right_answer_and_less_for_a_wrong_one(preset):
    config = TaskConfig(preset=preset)
    src = TaskSource(config, stream="test/5")
    checked = set()
    for q in src.sample(60, round=0):
        if q.answer is None:  # e.g. propositional_logic: any valid conclusion, no reference answer
            continue
        assert score_in_process(src, q.family, q.answer, q.entry) == 1.0, (q.family, q.question, q.answer)
        assert score_in_process(src, q.family, "definitely wrong ###", q.entry) < 1.0
        # no answer at all: 0, except where the task's own scorer gives a token credit
        # (reasoning-gym's fraction_simplification gives 0.01)
        assert score_in_process(src, q.family, None, q.entry) <= 0.01
        checked.add(q.family)
    assert len(checked) >= len(config.resolved_families()) - 1


def test_scores_the_answer_extracted_from_a_completion():
    src = TaskSource(TaskConfig(), stream="test/2")
    q = src.sample(1, round=0)[0]
    good = f"Let me think.\n<answer>{q.answer}</answer>"
    assert score_in_process(src, q.family, extract_answer(good), q.entry) == 1.0
    assert score_in_process(src, q.family, extract_answer(f"<answer>{q.answer}</answer> <answer>nope</answer>"), q.entry) < 1.0


def test_families_outside_the_mix_are_scored_only_when_allowed():
    easy = TaskSource(TaskConfig(), stream="test/1")
    paper = TaskSource(TaskConfig(preset="paper"), stream="test/1")
    q = next(q for q in paper.sample(40, round=0) if q.family == "base_conversion")
    assert not easy.can_score("base_conversion")
    with pytest.raises(ValueError, match="not scored by this node"):
        score_in_process(easy, q.family, q.answer, q.entry)
    widened = TaskSource(validate_config(TaskConfig, {"allow_families": [{"name": "base_conversion"}]}), stream="test/1")
    assert widened.can_score("base_conversion")
    assert score_in_process(widened, q.family, q.answer, q.entry) == 1.0
    assert not easy.can_score("no_such_family")


def test_weighted_mix():
    config = validate_config(TaskConfig, {"families": [{"name": "chain_sum", "weight": 1},
                                                       {"name": "products", "weight": 99}]})
    families = [q.family for q in TaskSource(config, stream="test/0").sample(200, round=0)]
    assert families.count("products") > 180 and set(families) <= {"chain_sum", "products"}


def test_unknown_family_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reasoning-gym dataset 'no_such'"):
        validate_config(TaskConfig, {"families": [{"name": "no_such"}]})
    with pytest.raises(ConfigError, match="allowed values: 'arithmetic', 'easy', 'paper'"):
        validate_config(TaskConfig, {"preset": "hard"})
