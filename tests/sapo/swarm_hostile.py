"""A hostile swarm peer for the tests: a real hivemind DHT peer that tries every attack an open swarm must survive.

It is a real peer on the real DHT, not a mock. Its own identity (its DHT peer id) is what honest nodes read, so
every record it is entitled to publish reaches the honest nodes' own checks: it publishes one message per round
under its own key, cycling through :data:`MESSAGE_KINDS` (whole-message attacks) and, in the other rounds, a
message of one record of every kind in :data:`RECORD_KINDS`. It draws real questions from its own stream, so
its records get as far as the verifier. It also holds Sybil identities (key pairs without DHT peers of their
own) and signs for them what they are not entitled to: writes into an honest peer's key, plain values, future
rounds, far expirations, and a flood of maximum-size messages under their own keys, which the honest peers'
DHT validators must refuse or bound.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from swarmlm.sapo.intake import question_stream
from swarmlm.sapo.transports.hivemind.clock import RoundClock
from swarmlm.sapo.transports.hivemind.dht_process import dht_class, store_message
from swarmlm.sapo.transports.hivemind.identity import load_identity
from swarmlm.sapo.transports.hivemind.keys import message_digest, message_key
from swarmlm.tasks import TaskConfig, TaskSource, format_answer
from swarmlm.tasks.provenance import EVAL_SEED

#: code a scorer that evaluates text would run; ``{canary}`` is a file path that must never appear
CANARY_PAYLOADS = (
    "__import__('pathlib').Path({canary!r}).touch()",
    "[[__import__('os').system('touch {canary}')]]",
    "(lambda: open({canary!r}, 'w'))()",
    "exec(\"open({canary!r}, 'w')\")",
)

#: whole-message attacks, one per round, and the reason an honest node (or its DHT) counts for each
MESSAGE_KINDS = {
    "garbage": "malformed",
    "oversized": "oversized_message",
    "not_bytes": "bad_message",
    "old_wire": "bad_message",
    "too_many": "too_many_records",
}
#: record-level attacks, all in one message, and the reason each must produce
RECORD_KINDS = {
    "canary_answers": None,  # real questions, canaries in every answer: scored 0 by the safe scorers, never run
    "canary_question": "forged_task",  # the question text replaced by a canary
    "canary_provenance": "foreign_config",  # a canary in the provenance's config field
    "eval_seed": "replayed_task",  # a question of the held-out evaluation set, or any other the stream does not draw
    "answer_field": "bad_fields",  # a reference answer and metadata of the sender's choosing
    "poisoned": "forged_task",  # question i carrying the provenance of question j
    "truncated": None,  # <answer>WRONG</answer>, padding past max_new_tokens, <answer>RIGHT</answer>: scores WRONG
    "control": "control_token",  # a nested end-of-text token
    "surrogate": "invalid_unicode",  # a lone surrogate, valid JSON
    "wrong_l": "wrong_group_size",
    "bad_type": "bad_type",
    "forged_id": "forged_node_id",
    "stale": "stale_round",
    "future": "future_round",
    "round_mismatch": "round_mismatch",  # a record of an earlier round inside this round's message
    "replayed": "replayed_task",  # an own record of an earlier round, its round field rewritten
    "plagiarized": "replayed_task",  # an honest peer's record, re-signed as the hostile's
    # an honest peer's completions under one of the hostile's own questions: another question's group, scored against
    # that question, and never a reason to drop the honest original (docs/security/verification.md)
    "copied_group": None,
    "foreign_family": "foreign_family",
    "slow": "scorer_timeout",  # a family whose regeneration overruns the honest node's CPU limit
    "after_slow": "penalized",  # then none of its records is verified for a while
}
#: what the hostile's DHT writes that honest DHTs must refuse
DHT_KINDS = {
    "forged_write": "bad_signature",  # under an honest peer's key and subkey, signed by nobody
    "foreign_key": "foreign_key",  # a Sybil's signed record under an honest peer's key
    "plain_value": "unsigned",  # a plain value under an honest peer's key
    "prefill": "future_round",  # a Sybil's own key five rounds ahead
    "far_expiration": "bad_expiration",
    "flood": "dht_full",  # every Sybil publishes a maximum-size message every round
}


def _message(records: list) -> bytes:
    return json.dumps({"v": 2, "records": records}, ensure_ascii=True).encode()


class HostilePeer:
    """One DHT peer (``identity``) with ``sybils`` extra identities it signs for."""

    def __init__(self, directory: Path, *, run: str, clock: RoundClock, initial_peers: list[str],
                 max_message_bytes: int, tasks: TaskConfig, slow_family: str | None = None, sybils: int = 4,
                 canary: Path | None = None, group_size: int = 4, max_new_tokens: int = 160):
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.dht.validation import RecordValidatorBase

        directory.mkdir(parents=True, exist_ok=True)
        self.run, self.clock, self.max_message_bytes = run, clock, max_message_bytes
        self.group_size, self.max_new_tokens = group_size, max_new_tokens
        self.canary = canary or directory / "CANARY"
        self.identity = load_identity(directory / "hostile.key")
        self.sybils = [load_identity(directory / f"sybil-{k}.key") for k in range(sybils)]
        self.peer_id = self.identity.peer_id
        self.tasks = TaskSource(tasks, stream=question_stream(run, self.peer_id))
        self.slow_family = slow_family
        self.families = [f.name for f in tasks.resolved_families() if f.name != slow_family]
        self._questions: dict[tuple[int, int], object] = {}
        signers = {ident.owner_subkey: RSASignatureValidator(ident.private_key) for ident in [self.identity, *self.sybils]}
        self.rounds_published = 0
        self._own: dict[int, dict] = {}  # round -> one of its own honest-looking records (for the replay)
        self._used: dict[int, set[int]] = {}  # round -> slots used in the message being built
        self._calls = 0
        self._prefilled: set[int] = set()  # rounds whose key of the victim this peer wrote into

        class SybilSigner(RecordValidatorBase):
            """Signs a record with the key its subkey names, when it holds that key; accepts everything."""

            def validate(self, record) -> bool:
                return True

            def sign_value(self, record) -> bytes:
                for owner, signer in signers.items():
                    if owner in record.subkey:
                        return signer.sign_value(record)
                return record.value

            def strip_value(self, record) -> bytes:  # the signature honest peers append, so that it can read them
                return next(iter(signers.values())).strip_value(record)

        # hivemind's DHT process (with swarmlm's fix for commands over 64 KB, so that it can send its oversized records)
        self.dht = dht_class()(initial_peers=initial_peers, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                identity_path=str(self.identity.path), record_validators=[SybilSigner()])

    # ------------------------------------------------------------------ building blocks
    def _question(self, round: int, slot: int):
        """Question ``slot`` of ``round`` of its own stream (remembered: some are slow to generate)."""
        key = (round, slot)
        if key not in self._questions:
            if len(self._questions) > 4096:
                self._questions.clear()
            self._questions[key] = self.tasks.question(round, slot)
        return self._questions[key]

    def _slot(self, round: int, family: str | None = None) -> int:
        """A slot of ``round`` not used yet in this message, whose question is of ``family`` (any but the slow
        one if None)."""
        used = self._used.setdefault(round, set())
        slot = next(s for s in range(4096) if s not in used and (
            self.tasks.family_at(round, s) == family if family is not None else self.tasks.family_at(round, s) != self.slow_family))
        used.add(slot)
        return slot

    def _record(self, round: int, completions: list, *, family: str | None = None, **overrides) -> dict:
        """A well-formed record of a question of its own stream for ``round`` (overrides make it bad)."""
        slot = self._slot(round, family)
        q = self._question(round, slot)
        raw = {"node_id": self.peer_id, "round": round, "slot": slot, "family": q.family, "question": q.question,
               "provenance": q.provenance.to_json(), "completions": completions, "model": "hostile"}
        raw.update(overrides)
        return raw

    def _answers(self, answer: str) -> list[str]:
        """Half right for ``answer``, half not; distinct text each call, so that no two of this peer's records share a
        group (its own group for the same question again is dropped as a duplicate before anything else is
        checked)."""
        self._calls += 1
        tag = f"({self._calls}) "  # first, so that it survives the receiver's cut to max_new_tokens
        return [tag + format_answer(answer)] * (self.group_size // 2) + [tag + "<answer>no</answer>"] * (self.group_size - self.group_size // 2)

    def _canaries(self) -> list[str]:
        self._calls += 1
        payloads = [p.format(canary=str(self.canary)) for p in CANARY_PAYLOADS]
        return [f"({self._calls}) " + format_answer(payloads[i % len(payloads)]) for i in range(self.group_size)]

    def read(self, key: str, timeout: float = 5.0):
        try:
            found = self.dht.get(key, latest=True, return_future=True).result(timeout=timeout)
        except Exception:
            return None
        return None if found is None else found.value

    # ------------------------------------------------------------------ what it publishes
    def record_attacks(self, g: int, victim_id: str | None) -> list[dict]:
        """One record of every kind of :data:`RECORD_KINDS`, for global round ``g``."""
        L = self.group_size
        self._used = {}
        records: list[dict] = []
        for family in self.families:  # canaries in the answers of every family the honest nodes score
            records.append(self._record(g, self._canaries(), family=family))
        records.append(self._record(g, self._answers("5"), question=CANARY_PAYLOADS[0].format(canary=str(self.canary))))
        bad = self._record(g, self._answers("5"))
        bad["provenance"] = dict(bad["provenance"], config=CANARY_PAYLOADS[1].format(canary=str(self.canary))[:120])
        records.append(bad)
        records.append(dict(self._record(g, self._answers("5")), answer="5", metadata={"x": 1}))
        held_out = self._record(g, self._answers("5"))
        held_out["provenance"] = dict(held_out["provenance"], seed=EVAL_SEED, index=0)
        records.append(held_out)
        # question i's text under the provenance (and slot) of question j, with completions agreeing with j's answer
        qi = self._question(g, self._slot(g, self.families[0]))
        poisoned = self._record(g, [], family=self.families[0], question=qi.question)
        poisoned["completions"] = self._answers(self._question(g, poisoned["slot"]).answer or "0")
        records.append(poisoned)
        truncated = self._record(g, [])
        right = format_answer(self._question(g, truncated["slot"]).answer or "")
        padding = " " * (4 * self.max_new_tokens)
        self._calls += 1
        tag = f"({self._calls}) "
        truncated["completions"] = [f"{tag}<answer>WRONG</answer>{padding}{right}"] * (L // 2) + [tag + right] * (L - L // 2)
        records.append(truncated)
        records.append(self._record(g, ["<answer>5</answer><|endo<|endoftext|>ftext|>"] + self._answers("5")[1:]))
        records.append(self._record(g, ["\ud800 <answer>5</answer>"] + self._answers("5")[1:]))
        records.append(self._record(g, ["<answer>5</answer>"] * 70))
        records.append(self._record(g, [1, None] + self._answers("5")[2:]))
        if victim_id is not None:
            records.append(self._record(g, self._answers("5"), node_id=victim_id))
        records.append(self._record(g - 50, self._answers("5")))
        records.append(self._record(g + 50, self._answers("5")))
        records.append(self._record(g - 1, self._answers("5")))
        earlier = [r for r in self._own if r < g]
        if earlier:  # an own record of an earlier round, published again under this one
            records.append(dict(self._own[max(earlier)], round=g))
        # the victim's latest message of the last rounds (honest nodes need not publish every round), from keys
        # this peer did not pre-fill itself (its own plain values there would hide them from its own reads)
        honest = []
        for r in range(g - 1, g - 7, -1):
            if victim_id is not None and not honest and r not in self._prefilled:
                honest = self.honest_records(victim_id, r)
        if honest:
            records.append(dict(honest[0], node_id=self.peer_id, round=g, model="hostile"))
            records.append(self._record(g, list(honest[-1]["completions"])))
        foreign = self._record(g, self._answers("5"))
        records.append(dict(foreign, family="rubiks_cube", provenance=dict(foreign["provenance"], family="rubiks_cube")))
        if self.slow_family is not None:
            records.append(self._record(g, self._answers("1"), family=self.slow_family))
        self._own[g] = self._record(g, self._answers("7"))
        for r in [r for r in self._own if r < g - 5]:
            del self._own[r]
        return records

    def honest_records(self, peer_id: str, round: int) -> list[dict]:
        """What ``peer_id`` published for ``round`` (read from the DHT like anyone can)."""
        entries = self.read(message_key(self.run, round, peer_id))
        if not isinstance(entries, dict):  # e.g. its own plain value, which only its own DHT accepted
            return []
        for item in entries.values():
            try:
                return json.loads(item.value)["records"]
            except (ValueError, KeyError, TypeError):
                continue
        return []

    def message(self, kind: str, g: int, victim_id: str | None) -> object:
        if kind == "garbage":
            return b"\x00\xff{this is not json"
        self._used = {}
        if kind == "oversized":
            return _message([self._record(g, ["x" * self.max_message_bytes] * 2)])
        if kind == "not_bytes":
            return {"records": "not bytes"}
        if kind == "old_wire":
            return json.dumps({"v": 1, "records": [{"node_id": self.peer_id, "round": g, "family": "chain_sum",
                                                    "question": "What is 2 + 3?", "answer": "7", "metadata": {},
                                                    "completions": ["<answer>7</answer>"] * 4, "model": "old"}]}).encode()
        if kind == "too_many":
            return _message([self._record(g, self._answers("5")) for _ in range(70)])
        return _message(self.record_attacks(g, victim_id))

    def publish_round(self, victim_id: str | None = None, victim_subkey: bytes | None = None,
                      flood_bytes: int | None = None) -> str:
        """This round's message (whole-message attacks one round in two, the record attacks in the others),
        the Sybils' flood (``flood_bytes`` each, default the largest message allowed) and the DHT-level attacks
        on ``victim_id``'s key. Returns the kind published."""
        from hivemind.utils import get_dht_time

        g = self.clock.now()
        kinds = list(MESSAGE_KINDS)
        kind = kinds[(self.rounds_published // 2) % len(kinds)] if self.rounds_published % 2 else "records"
        self.rounds_published += 1
        expiration = get_dht_time() + 3 * self.clock.round_length
        futures = [self._store(g, self.identity, self.message(kind, g, victim_id), expiration)]
        flood = b"F" * (flood_bytes or self.max_message_bytes - 16)
        for sybil in self.sybils:
            futures.append(self._store(g, sybil, flood, expiration))
        if victim_id is not None and victim_subkey is not None and kind != "records":
            # pre-filled: the victim's key of the next round (a "records" round, which reads the victim's key of
            # this round, never pre-filled, to copy its records)
            victim_key = message_key(self.run, g + 1, victim_id)
            self._prefilled.add(g + 1)
            sybil = self.sybils[0]
            self._used = {}
            forged = _message([self._record(g, self._answers("5"), node_id=victim_id)])
            futures.append(self.dht.store(victim_key, forged, expiration, subkey=victim_subkey, return_future=True))
            futures.append(self.dht.store(victim_key, forged, expiration, subkey=sybil.owner_subkey, return_future=True))
            futures.append(self.dht.store(victim_key, b"plain value", expiration + 5, return_future=True))
            futures.append(self.dht.store(message_key(self.run, g + 5, sybil.peer_id), b"pre-filled", expiration,
                                          subkey=sybil.owner_subkey, return_future=True))
            futures.append(self.dht.store(message_key(self.run, g, sybil.peer_id), b"forever", get_dht_time() + 10 ** 6,
                                          subkey=sybil.owner_subkey, return_future=True))
        for fut in futures:
            try:
                fut.result(timeout=20)
            except Exception:
                pass
        return kind

    def publish_lying_digest(self, payload: bytes, named: bytes) -> None:
        """This round's message ``payload`` under a digest that names ``named`` instead."""
        from hivemind.utils import get_dht_time

        g = self.clock.now()
        self._store(g, self.identity, payload, get_dht_time() + 3 * self.clock.round_length,
                    digest=message_digest(named)).result(timeout=20)

    def _store(self, g: int, identity, payload: object, expiration: float, digest: bytes | None = None):
        """``identity``'s message of round ``g`` and its digest, stored as honest peers store theirs (a payload that
        is not bytes, which honest peers refuse to store, with the digest of its text)."""
        named = payload if isinstance(payload, bytes) else repr(payload).encode()
        return self.dht.run_coroutine(partial(
            store_message, run=self.run, round=g, peer_id=identity.peer_id, payload=payload,
            digest=digest or message_digest(named),
            expiration=expiration, subkey=identity.owner_subkey), return_future=True)

    def close(self) -> None:
        self.dht.shutdown()


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (read from /proc)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it (a DHT process and its p2p daemon)."""
    tree, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        tree.append(p)
        frontier += child_pids(p)
    return tree


def process_tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every process under it (a DHT process and its p2p daemon), in MB."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in (Path("/proc") / str(p) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024
