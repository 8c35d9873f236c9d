"""Rollout sharing over the hivemind DHT: the transport of an open, asynchronous swarm.

What lives in the DHT
---------------------
* key ``swarmlm/sapo/{run}/round/{g}``: one dictionary per *global* round ``g`` (:mod:`.clock`);
* subkey ``b"[owner:ssh-rsa …]"``: the publisher's RSA public key. hivemind's
  :class:`~hivemind.dht.crypto.RSASignatureValidator` then accepts a value under that subkey only if it is
  signed with the matching private key, so nobody can write or overwrite a record under another
  peer's subkey (:mod:`.identity`);
* value: the node's message for the round (:func:`swarmlm.sapo.records.encode_message`), signed, and
  expiring ``ttl`` seconds later (the staleness window plus two rounds).

The modules, by concern: :mod:`.clock` (the swarm's global round), :mod:`.identity` (a peer's key, id and
subkey), :mod:`.validators` (what this peer's DHT refuses to store or accept), :mod:`.dht_process` (hivemind's
DHT process, made to die with its node and to take commands of any size) and :mod:`.transport`
(:class:`~.transport.HivemindTransport`, the :class:`~swarmlm.sapo.transports.base.RolloutTransport`).
hivemind is the optional ``swarm`` extra: every module imports it only when it is used.
"""

from __future__ import annotations


def require_hivemind():
    """Import hivemind, or say how to get it (it is the optional ``swarm`` extra)."""
    try:
        import hivemind
    except ImportError as err:  # pragma: no cover - the test environment has it
        raise ImportError("the decentralized swarm needs hivemind: pip install 'swarmlm[swarm]'") from err
    return hivemind
