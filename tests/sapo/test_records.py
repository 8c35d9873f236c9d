"""Records from the network: every malformed, oversized, wrong-L, forged or stale record is dropped with its
reason counted, nothing raises, and valid records come through unchanged."""

from __future__ import annotations

import copy
import json
import logging
import random
import pytest

from swarmlm.sapo.records import (DropCounter, RecordLimits, RolloutRecord, check_record, decode_message, encode_message,
                                  round_message)
from swarmlm.tasks.provenance import TRAIN_SEED, Provenance

SENDER = "node-1"
KNOWN = {"chain_sum", "basic_arithmetic"}
ROUND = 5


PROVENANCE = Provenance("chain_sum", TRAIN_SEED, 1234, "c" * 32)


def record(**overrides) -> RolloutRecord:
    base = dict(node_id=SENDER, round=ROUND, slot=0, family="chain_sum", question="What is 2 + 3? Ünïcode ✓",
                provenance=PROVENANCE,
                completions=["<answer>5</answer>", "think… <answer>6</answer>", "", "<answer>5</answer>"],
                model="tiny-qwen2")
    base.update(overrides)
    return RolloutRecord(**base)


def raw(**overrides) -> dict:
    out = record().to_json()
    out.update(overrides)
    return out


def message(*records) -> bytes:
    return json.dumps({"v": 2, "records": list(records)}).encode()


def decode(payload, limits: RecordLimits | None = None, rounds=(ROUND, ROUND), sender=SENDER):
    drops = DropCounter()
    got = decode_message(payload, limits or RecordLimits(), sender=sender, rounds=rounds,
                         known_family=lambda f: f in KNOWN, drops=drops)
    return got, drops


def assert_dropped(payload, reason, **kw):
    got, drops = decode(payload, **kw)
    assert got == []
    assert dict(drops.counts) == {reason: 1}, drops.counts
    return drops


# ----------------------------------------------------------------------------- valid
def test_valid_records_pass_through_unchanged():
    records = [record(), record(question="q2", slot=1, completions=["a", "b"]),
               record(family="basic_arithmetic", provenance=Provenance("basic_arithmetic", TRAIN_SEED, 7, "d" * 32))]
    got, drops = decode(encode_message(records))
    assert got == records
    assert drops.total() == 0


def test_round_window_accepts_recent_rounds():
    got, drops = decode(encode_message([record(round=3), record(round=5)]), rounds=(3, 5))
    assert [r.round for r in got] == [3, 5] and drops.total() == 0


# ----------------------------------------------------------------------------- whole-message failures
@pytest.mark.parametrize("payload,reason", [
    (b"\xff\xfe\x00garbage", "malformed"),                      # not UTF-8
    (b'{"v": 1, "records": [', "malformed"),                    # truncated JSON
    (b"not json at all", "malformed"),
    (b"[" * 50_000 + b"]" * 50_000, "malformed"),               # nesting deeper than the JSON parser allows
    (b'[{"v": 1}]', "bad_message"),                             # not an object
    (b'{"v": 3, "records": []}', "bad_message"),                # unknown wire version
    (b'{"v": 1, "records": []}', "bad_message"),                # the old wire version (answers and metadata)
    (b'{"v": 2, "records": {"a": 1}}', "bad_message"),          # records not a list
    (b'{"records": []}', "bad_message"),
    ("a str, not bytes", "bad_message"),
    (None, "bad_message"),
])
def test_bad_messages_are_dropped_whole(payload, reason):
    assert_dropped(payload, reason)


def test_oversized_message():
    limits = RecordLimits(max_message_bytes=4096)
    big = encode_message([record(completions=["x" * 3000, "y" * 3000])])
    assert len(big) > 4096
    assert_dropped(big, "oversized_message", limits=limits)


def test_too_many_records_in_one_message():
    limits = RecordLimits(max_records_per_message=3)
    assert_dropped(encode_message([record()] * 4), "too_many_records", limits=limits)
    got, drops = decode(encode_message([record()] * 3), limits=limits)
    assert len(got) == 3 and drops.total() == 0


# ----------------------------------------------------------------------------- per-record failures
BAD_RECORDS = {
    "not an object": ([1, 2], "not_an_object"),
    "a string record": ("record", "not_an_object"),
    "missing field": ({k: v for k, v in raw().items() if k != "model"}, "bad_fields"),
    "extra field": (raw(rewards=[1, 0, 0, 1]), "bad_fields"),
    "None completion": (raw(completions=["a", None, "c", "d"]), "bad_type"),
    "int completion": (raw(completions=["a", 3, "c", "d"]), "bad_type"),
    "completions a string": (raw(completions="abcd"), "bad_type"),
    "completions None": (raw(completions=None), "bad_type"),
    "int question": (raw(question=42), "bad_type"),
    "None question": (raw(question=None), "bad_type"),
    "answers are not sent": (raw(answer="5"), "bad_fields"),
    "metadata is not sent": (raw(metadata={}), "bad_fields"),
    "float slot": (raw(slot=0.0), "bad_type"),
    "negative slot": (raw(slot=-1), "bad_type"),
    "slot too high": (raw(slot=4096), "bad_type"),
    "provenance None": (raw(provenance=None), "bad_provenance"),
    "provenance a list": (raw(provenance=[1, 2]), "bad_provenance"),
    "provenance with a str index": (raw(provenance=dict(PROVENANCE.to_json(), index="3")), "bad_provenance"),
    "provenance with an extra field": (raw(provenance=dict(PROVENANCE.to_json(), answer="5")), "bad_provenance"),
    "provenance of another family": (raw(provenance=dict(PROVENANCE.to_json(), family="products")), "bad_provenance"),
    "lone surrogate in a completion": (raw(completions=["a", "\ud800", "c", "d"]), "invalid_unicode"),
    "lone surrogate in the question": (raw(question="What is \udfff?"), "invalid_unicode"),
    "lone surrogate in the model name": (raw(model="\ud83d"), "invalid_unicode"),
    "lone surrogate in a key": (dict(raw(), **{"\ud800": 1}), "bad_fields"),
    "float round": (raw(round=5.0), "bad_type"),
    "bool round": (raw(round=True), "bad_type"),
    "str round": (raw(round="5"), "bad_type"),
    "int node_id": (raw(node_id=1), "bad_type"),
    "empty node_id": (raw(node_id=""), "bad_type"),
    "int family": (raw(family=3), "bad_type"),
    "None model": (raw(model=None), "bad_type"),
    "L = 1": (raw(completions=["only one"]), "wrong_group_size"),
    "L = 0": (raw(completions=[]), "wrong_group_size"),
    "L = 65": (raw(completions=["c"] * 65), "wrong_group_size"),
    "forged node_id": (raw(node_id="node-2"), "forged_node_id"),
    "stale round": (raw(round=ROUND - 1), "stale_round"),
    "future round": (raw(round=ROUND + 1), "future_round"),
    "foreign family": (raw(family="no_such_family", provenance=dict(PROVENANCE.to_json(), family="no_such_family")),
                       "foreign_family"),
    "oversized completion": (raw(completions=["a", "x" * 8193]), "oversized"),
    "oversized question": (raw(question="q" * 8193), "oversized"),
    "oversized family name": (raw(family="f" * 129), "oversized"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_record_is_dropped_with_its_reason(case):
    bad, reason = BAD_RECORDS[case]
    assert_dropped(message(bad), reason)
    # and it does not take the valid records of the same message with it
    got, drops = decode(message(raw(), bad, raw(question="other")))
    assert [r.question for r in got] == [record().question, "other"]
    assert dict(drops.counts) == {reason: 1}


def test_lone_surrogates_sent_as_json_escapes_are_refused():
    """``"\\ud800"`` is valid JSON and decodes to a string no tokenizer can encode: refused before any tokenizer."""
    payload = message(raw()).replace(b'"think\\u2026 <answer>6</answer>"', b'"think \\ud800 <answer>6</answer>"')
    assert b"\\ud800" in payload
    drops = assert_dropped(payload, "invalid_unicode")
    assert drops.total() == 1


def test_group_size_allow_list():
    limits = RecordLimits(group_sizes=[4, 8])
    assert_dropped(message(raw(completions=["a", "b", "c"])), "wrong_group_size", limits=limits)
    got, drops = decode(message(raw()), limits=limits)
    assert len(got) == 1 and drops.total() == 0


def test_limits_are_configurable():
    limits = RecordLimits(max_completion_chars=10, max_group_size=3, min_group_size=3)
    assert_dropped(message(raw(completions=["a", "b", "01234567890"])), "oversized", limits=limits)
    assert_dropped(message(raw()), "wrong_group_size", limits=limits)  # 4 > 3
    got, _ = decode(message(raw(completions=["a", "b", "0123456789"])), limits=limits)
    assert len(got) == 1


def test_reasons_are_counted_per_reason():
    drops = DropCounter()
    limits = RecordLimits()
    for payload in [message(raw(round=1)), message(raw(round=1), raw(node_id="x")), b"{", message(raw())]:
        decode_message(payload, limits, sender=SENDER, rounds=(ROUND, ROUND), known_family=lambda f: f in KNOWN,
                       drops=drops)
    assert dict(drops.counts) == {"stale_round": 2, "forged_node_id": 1, "malformed": 1}
    assert drops.total() == 4


def test_check_record_returns_reason_and_detail():
    rec, reason, detail = check_record(raw(completions=["a"]), RecordLimits(), sender=SENDER, rounds=(5, 5),
                                       known_family=lambda f: True)
    assert rec is None and reason == "wrong_group_size" and "L=1" in detail
    rec, reason, detail = check_record(raw(), RecordLimits(), sender=SENDER, rounds=(5, 5), known_family=lambda f: True)
    assert rec == record() and reason == "" and detail == ""


def test_fuzzed_messages_never_raise():
    """Random byte edits of a valid message: each either decodes to records or is dropped with a reason."""
    rng = random.Random(0)
    base = bytearray(encode_message([record(), record(question="second")]))
    limits = RecordLimits()
    for _ in range(400):
        payload = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            op = rng.random()
            pos = rng.randrange(len(payload))
            if op < 0.5:
                payload[pos] = rng.randrange(256)
            elif op < 0.75:
                del payload[pos]
            else:
                payload.insert(pos, rng.choice(b'{}[]",:0123456789-eE.tfnul\\'))
        got, drops = decode(bytes(payload), limits=limits)
        assert len(got) + drops.total() >= 1
        for r in got:
            assert isinstance(r, RolloutRecord) and all(isinstance(c, str) for c in r.completions)


def test_decoding_does_not_mutate_or_alias_the_input():
    raw_record = raw()
    keep = copy.deepcopy(raw_record)
    rec, _, _ = check_record(raw_record, RecordLimits(), sender=SENDER, rounds=(5, 5), known_family=lambda f: True)
    rec.completions.append("more")
    assert raw_record == keep


def test_a_rounds_message_keeps_its_newest_records_within_the_limits():
    recs = [record(slot=k, completions=[f"<answer>{k}</answer>" + "x" * 300] * 4) for k in range(10)]
    by_count = RecordLimits(max_records_per_message=3)
    got, _ = decode(round_message(recs, by_count), by_count)
    assert [r.slot for r in got] == [7, 8, 9]
    one = len(encode_message(recs[:1]))
    by_bytes = RecordLimits(max_message_bytes=max(1024, int(4.5 * one)))
    payload = round_message(recs, by_bytes)
    got, drops = decode(payload, by_bytes)
    assert len(payload) <= by_bytes.max_message_bytes and drops.total() == 0
    assert [r.slot for r in got] == list(range(10 - len(got), 10)) and 2 <= len(got) < 10


def test_duplicates_log_at_info_and_hostile_drops_warn(caplog):
    """A duplicate (a sender's, or this node's own, completions for the same question again) is logged at INFO, as
    a copier's attempts would be; a malformed message from a peer is a warning."""
    drops = DropCounter()
    with caplog.at_level(logging.DEBUG, logger="swarmlm.sapo.records"):
        drops.drop("duplicate", SENDER, "a group seen before")
        drops.drop("malformed", SENDER, "not JSON")
    levels = {r.getMessage().split(": ")[1].split(" ")[0]: r.levelno for r in caplog.records}
    assert levels == {"duplicate": logging.INFO, "malformed": logging.WARNING}
    assert dict(drops.counts) == {"duplicate": 1, "malformed": 1}
