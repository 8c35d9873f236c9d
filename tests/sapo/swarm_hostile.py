"""A hostile swarm peer for the tests: one hivemind DHT peer with many identities (a Sybil), which
publishes every kind of bad record an open swarm must survive.

It is a real peer on the real DHT, not a mock: it signs what it is entitled to sign (records under
its own identities' subkeys, so they reach the honest nodes' own checks) and it tries what it is
not entitled to do (write under an honest peer's subkey, replace a round's dictionary with a plain
value, store oversized or non-bytes values, pre-fill future rounds, set far expirations), which
the honest peers' DHT validators must refuse.
"""

from __future__ import annotations

import json
from pathlib import Path

from swarmlm.sapo.transports.hivemind.clock import RoundClock, round_key
from swarmlm.sapo.transports.hivemind.dht_process import dht_class
from swarmlm.sapo.transports.hivemind.identity import load_identity

#: kinds published under the hostile's own (validly signed) identities: they reach the node's checks
SIGNED_KINDS = ("garbage", "oversized", "wrong_l", "forged_id", "bad_type", "stale", "future", "flood", "not_bytes")
#: the drop reason each kind must produce at an honest node (DHT-level or node-level)
EXPECTED_REASON = {
    "garbage": "malformed",
    "oversized": "oversized_message",
    "wrong_l": "wrong_group_size",
    "forged_id": "forged_node_id",
    "bad_type": "bad_type",
    "stale": "stale_round",
    "future": "future_round",
    "flood": "flood",
    "not_bytes": "bad_message",
    "forged_write": "bad_signature",
    "plain_value": "unsigned",
}


def _record(node_id: str, round: int, completions: list, family: str = "chain_sum") -> dict:
    return {"node_id": node_id, "round": round, "family": family, "question": "What is 2 + 3?", "answer": "5",
            "metadata": {}, "completions": completions, "model": "hostile"}


def _message(records: list[dict]) -> bytes:
    return json.dumps({"v": 1, "records": records}).encode()


class HostilePeer:
    """A DHT peer holding one identity per kind of attack."""

    def __init__(self, directory: Path, *, run: str, clock: RoundClock, initial_peers: list[str], max_message_bytes: int):
        from hivemind.dht.crypto import RSASignatureValidator
        from hivemind.dht.validation import RecordValidatorBase

        directory.mkdir(parents=True, exist_ok=True)
        self.run, self.clock, self.max_message_bytes = run, clock, max_message_bytes
        self.ids = {kind: load_identity(directory / f"{kind}.key") for kind in SIGNED_KINDS}
        signers = {ident.owner_subkey: RSASignatureValidator(ident.private_key) for ident in self.ids.values()}

        class SybilSigner(RecordValidatorBase):
            """Signs a record with the key its subkey names, when it holds that key; accepts everything."""

            def validate(self, record) -> bool:
                return True

            def sign_value(self, record) -> bytes:
                for owner, signer in signers.items():
                    if owner in record.subkey:
                        return signer.sign_value(record)
                return record.value

        # hivemind's DHT process (with swarmlm's fix for commands over 64 KB, so that it can send its oversized records)
        self.dht = dht_class()(initial_peers=initial_peers, start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                record_validators=[SybilSigner()])

    def attack(self, victim_id: str, victim_subkey: bytes, round: int | None = None) -> None:
        """Publish one of each bad record for ``round`` (default: the current global round), and the two
        illegal writes."""
        from hivemind.utils import get_dht_time

        g = self.clock.now() if round is None else round
        key = round_key(self.run, g)
        expiration = get_dht_time() + 30
        ok_completions = ["<answer>5</answer>", "<answer>4</answer>", "<answer>5</answer>", "<answer>6</answer>"]
        payloads = {
            "garbage": b"\x00\xff{this is not json",
            "oversized": _message([_record(self.ids["oversized"].peer_id, g, ["x" * self.max_message_bytes] * 2)]),
            "wrong_l": _message([_record(self.ids["wrong_l"].peer_id, g, ["<answer>5</answer>"] * 70)]),
            "forged_id": _message([_record(victim_id, g, ok_completions)]),
            "bad_type": _message([_record(self.ids["bad_type"].peer_id, g, [1, None, "a", "b"])]),
            "stale": _message([_record(self.ids["stale"].peer_id, g - 50, ok_completions)]),
            "future": _message([_record(self.ids["future"].peer_id, g + 50, ok_completions)]),
            "flood": _message([_record(self.ids["flood"].peer_id, g, ["a", "b"]) for _ in range(200)]),
            "not_bytes": {"records": "not bytes"},
        }
        futures = [self.dht.store(key, value, expiration, subkey=self.ids[kind].owner_subkey, return_future=True)
                   for kind, value in payloads.items()]
        # not entitled: a record under the victim's subkey (signed with nobody's key: the signer holds none for it),
        # and a plain value that would replace the whole round's dictionary
        futures.append(self.dht.store(key, _message([_record(victim_id, g, ok_completions)]), expiration,
                                      subkey=victim_subkey, return_future=True))
        futures.append(self.dht.store(key, b"plain value", expiration + 5, return_future=True))
        for fut in futures:
            try:
                fut.result(timeout=20)
            except Exception:
                pass

    def close(self) -> None:
        self.dht.shutdown()
