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
"""

from __future__ import annotations

MAX_ADDRESS_BYTES = 2048  # a peer's list of addresses (the value under its address key)


def message_key(run: str, round: int, peer_id: str) -> str:
    """The DHT key of ``peer_id``'s message for global round ``round`` of swarm ``run``."""
    return f"swarmlm/sapo/{run}/round/{round}/peer/{peer_id}"


def address_key(run: str, peer_id: str) -> str:
    """The DHT key of the addresses ``peer_id`` listens on, in swarm ``run``."""
    return f"swarmlm/sapo/{run}/addresses/{peer_id}"
