"""The swarm's DHT key layout: one key per (global round, peer), so that no peer shares a key with another.

* ``swarmlm/sapo/{run}/round/{g}/peer/{peer_id}`` holds peer ``peer_id``'s message for global round ``g``, under
  the subkey ``[owner:<its public key>]`` and signed with that key. Honest peers' validators refuse any record
  under it that is not signed by ``peer_id`` itself (:mod:`.validators`), so no set of other identities can add
  to it, crowd it, or push it past hivemind's reply limit: each read returns one peer's message and nothing else.
  A round has no shared key that could fill up, and pre-filling a future round locks nobody out.
* Who published in a round is not looked up under a shared key either: a node reads the keys of the peers its
  DHT knows (its routing table, which Kademlia keeps filled through lookups and bucket refreshes) and of the
  peers it has heard from. An identity that is not a DHT peer is never read, so identities cost DHT peers
  (processes with their own keys and addresses), not key pairs.
* ``swarmlm/sapo/{run}/addresses/{peer_id}`` holds the addresses ``peer_id`` listens on (JSON, small), under its
  owner subkey too: what other nodes keep in their peer books, so that a restarted node can rejoin through any
  peer it knew, not only through its initial peers.
* ``swarmlm/sapo/{run}/round/{g}/digest/{peer_id}`` holds the digest of ``peer_id``'s message of round ``g``
  (:func:`message_digest`: its SHA-256 and its length, 40 bytes), signed the same way and stored after the
  message. A reader looks up the digests first and fetches only the messages whose digest it has not read
  before and whose length fits its budget, so a message of megabytes crosses the network once, not at every read.
"""

from __future__ import annotations

import hashlib

MAX_ADDRESS_BYTES = 2048  # a peer's list of addresses (the value under its address key)
DIGEST_BYTES = 40  # a message's SHA-256 and its length (8 bytes, big-endian)


def message_key(run: str, round: int, peer_id: str) -> str:
    """The DHT key of ``peer_id``'s message for global round ``round`` of swarm ``run``."""
    return f"swarmlm/sapo/{run}/round/{round}/peer/{peer_id}"


def address_key(run: str, peer_id: str) -> str:
    """The DHT key of the addresses ``peer_id`` listens on, in swarm ``run``."""
    return f"swarmlm/sapo/{run}/addresses/{peer_id}"


def digest_key(run: str, round: int, peer_id: str) -> str:
    """The DHT key of the digest of ``peer_id``'s message for global round ``round`` (:func:`message_digest`)."""
    return f"swarmlm/sapo/{run}/round/{round}/digest/{peer_id}"


def message_digest(payload: bytes) -> bytes:
    """What a peer stores under its digest key: the SHA-256 of its message, then the message's length."""
    return hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "big")


def digest_length(digest: object) -> int | None:
    """The message length a digest states, or None when ``digest`` is not a digest."""
    if not isinstance(digest, (bytes, bytearray)) or len(digest) != DIGEST_BYTES:
        return None
    return int.from_bytes(digest[32:], "big")
