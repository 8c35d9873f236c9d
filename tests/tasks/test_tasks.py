"""Tasks: answer extraction, per-node question streams, the fixed held-out set, and the verifiers."""

from __future__ import annotations

import json

import pytest
import reasoning_gym

from swarmlm.config import ConfigError, validate_config
from swarmlm.models import build_byte_tokenizer
from swarmlm.sapo.node import node_seed
from swarmlm.tasks import TaskConfig, TaskSource, build_prompt, eval_questions, extract_answer, format_answer
from swarmlm.tasks.reasoning_gym_tasks import STREAM_STRIDE


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
def test_node_streams_are_deterministic_and_differ_between_nodes():
    config = TaskConfig()
    a1 = [q.question for q in TaskSource(config, node_seed=node_seed(0, 0)).sample(12)]
    a2 = [q.question for q in TaskSource(config, node_seed=node_seed(0, 0)).sample(12)]
    b = [q.question for q in TaskSource(config, node_seed=node_seed(0, 1)).sample(12)]
    assert a1 == a2
    assert a1 != b
    # consecutive batches of one node are different questions, not a repeat
    src = TaskSource(config, node_seed=3)
    assert [q.question for q in src.sample(8)] != [q.question for q in src.sample(8)]


def test_stream_state_survives_a_json_round_trip():
    """What a node checkpoint stores: the stream continues exactly where it stopped."""
    config = TaskConfig()
    src = TaskSource(config, node_seed=9)
    src.sample(5)
    state = json.loads(json.dumps(src.state()))
    expected = [q.question for q in src.sample(6)]
    resumed = TaskSource(config, node_seed=9)
    resumed.load_state(state)
    assert [q.question for q in resumed.sample(6)] == expected


def test_eval_set_is_fixed():
    config = TaskConfig(eval_size=16)
    a, b = eval_questions(config), eval_questions(config)
    assert [q.question for q in a] == [q.question for q in b] and len(a) == 16
    assert {q.family for q in a} <= {f.name for f in config.resolved_families()}
    assert len({q.family for q in a}) > 1


def test_eval_and_node_streams_draw_from_disjoint_seeds(monkeypatch):
    """reasoning-gym seeds item i of a dataset with seed + i. Record every dataset created (the real function
    is called) and check that the seed ranges a run can reach never overlap: not between the evaluation set
    and any node, nor between two nodes or two families of one node."""
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
    for base in (0, 1, 42, 12345):
        for k in range(8):
            TaskSource(config, node_seed=node_seed(base, k))
    stream_ranges = [(seed, seed + STREAM_STRIDE) for _, seed, _ in created]
    assert len(stream_ranges) == 4 * 8 * len(config.resolved_families())
    ranges = sorted(eval_ranges + stream_ranges)
    for (lo1, hi1), (lo2, hi2) in zip(ranges, ranges[1:]):
        assert hi1 <= lo2, f"seed ranges [{lo1}, {hi1}) and [{lo2}, {hi2}) overlap"


# ----------------------------------------------------------------------------- verifiers
@pytest.mark.parametrize("preset", ["easy", "paper"])
def test_scorer_gives_one_for_the_right_answer_and_less_for_a_wrong_one(preset):
    config = TaskConfig(preset=preset)
    src = TaskSource(config, node_seed=5)
    checked = set()
    for q in src.sample(60):
        if q.answer is None:  # e.g. propositional_logic: any valid conclusion, no reference answer
            continue
        assert src.score(q.family, q.answer, q.entry) == 1.0, (q.family, q.question, q.answer)
        assert src.score(q.family, "definitely wrong ###", q.entry) < 1.0
        # no answer at all: 0, except where the task's own scorer gives a token credit
        # (reasoning-gym's fraction_simplification gives 0.01)
        assert src.score(q.family, None, q.entry) <= 0.01
        checked.add(q.family)
    assert len(checked) >= len(config.resolved_families()) - 1


def test_scores_the_answer_extracted_from_a_completion():
    src = TaskSource(TaskConfig(), node_seed=2)
    q = src.sample(1)[0]
    good = f"Let me think.\n<answer>{q.answer}</answer>"
    assert src.score(q.family, extract_answer(good), q.entry) == 1.0
    assert src.score(q.family, extract_answer(f"<answer>{q.answer}</answer> <answer>nope</answer>"), q.entry) < 1.0


def test_families_outside_the_mix_are_scored_only_when_allowed():
    easy = TaskSource(TaskConfig(), node_seed=1)
    paper = TaskSource(TaskConfig(preset="paper"), node_seed=1)
    q = next(q for q in paper.sample(40) if q.family == "base_conversion")
    assert not easy.can_score("base_conversion")
    with pytest.raises(ValueError, match="not scored by this node"):
        easy.score(q.family, q.answer, q.entry)
    widened = TaskSource(validate_config(TaskConfig, {"allow_families": [{"name": "base_conversion"}]}), node_seed=1)
    assert widened.can_score("base_conversion")
    assert widened.score(q.family, q.answer, q.entry) == 1.0
    assert not easy.can_score("no_such_family")


def test_weighted_mix():
    config = validate_config(TaskConfig, {"families": [{"name": "chain_sum", "weight": 1},
                                                       {"name": "products", "weight": 99}]})
    families = [q.family for q in TaskSource(config, node_seed=0).sample(200)]
    assert families.count("products") > 180 and set(families) <= {"chain_sum", "products"}


def test_unknown_family_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reasoning-gym dataset 'no_such'"):
        validate_config(TaskConfig, {"families": [{"name": "no_such"}]})
    with pytest.raises(ConfigError, match="allowed values: 'easy', 'paper'"):
        validate_config(TaskConfig, {"preset": "hard"})
