"""Who sent a record: a node's identity is one libp2p identity file, an RSA private key.

It fixes the node's p2p peer id (so it is the same across restarts) and it signs the node's records. The
node id carried in the records is that peer id. A receiver derives the sender's peer id from the public key
in the subkey, the key that the signature was checked against, never from what the payload claims; the node
then drops any record whose ``node_id`` differs (``forged_node_id``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmlm.sapo.transports.hivemind import require_hivemind

log = logging.getLogger(__name__)

_OWNER_RE = re.compile(rb"^\[owner:(ssh-rsa [A-Za-z0-9+/]+={0,2})\]$")


@dataclass(frozen=True)
class Identity:
    """A node's persistent identity: the libp2p key file, the private key that signs its records,
    its peer id, and the DHT subkey it publishes under."""

    path: Path
    private_key: Any  # hivemind.utils.crypto.RSAPrivateKey
    peer_id: str
    owner_subkey: bytes


def load_identity(path: str | Path, *, create: bool = True) -> Identity:
    """Read the identity file at ``path``, creating a new key there first if it does not exist."""
    require_hivemind()
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.p2p import P2P, PeerID
    from hivemind.proto import crypto_pb2
    from hivemind.utils.crypto import RSAPrivateKey

    path = Path(path).expanduser()
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"identity file {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))  # an RSA key in libp2p's format, mode 0400
        log.info("created a new identity in %s", path)
    raw = path.read_bytes()
    try:
        proto = crypto_pb2.PrivateKey.FromString(raw)
        if proto.key_type != crypto_pb2.KeyType.RSA:
            raise ValueError("not an RSA key")
        key = RSAPrivateKey.__new__(RSAPrivateKey)
        key.__setstate__({"_private_key": proto.data})  # the class's own unpickling path: DER -> key
        peer_id = PeerID.from_identity(raw).to_base58()
    except Exception as err:
        raise ValueError(f"{path} is not an identity file (an RSA private key in libp2p's format): {err}") from None
    owner = RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", key.get_public_key().to_bytes())
    return Identity(path, key, peer_id, owner)


def peer_id_of_public_key(ssh_public_key: bytes) -> str:
    """The libp2p peer id of an RSA public key in OpenSSH form, as libp2p derives it: the sha2-256
    multihash of the protobuf-encoded DER key, in base58."""
    require_hivemind()
    import base58
    import multihash
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from hivemind.proto import crypto_pb2

    public = serialization.load_ssh_public_key(ssh_public_key)
    if not isinstance(public, rsa.RSAPublicKey):
        raise ValueError("not an RSA key")
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return base58.b58encode(digest).decode()


def owner_public_key(subkey: Any) -> bytes | None:
    """The public key of a well-formed owner subkey ``b"[owner:ssh-rsa …]"``, else None."""
    if not isinstance(subkey, bytes) or len(subkey) > 4096:
        return None
    match = _OWNER_RE.match(subkey)
    return match.group(1) if match else None


_PEER_IDS: OrderedDict[bytes, str | None] = OrderedDict()


def _peer_id_cached(public_key: bytes) -> str | None:
    """peer_id_of_public_key, remembered for the last 4096 keys (None for a key that is not one)."""
    if public_key in _PEER_IDS:
        _PEER_IDS.move_to_end(public_key)
        return _PEER_IDS[public_key]
    try:
        peer = peer_id_of_public_key(public_key)
    except Exception:
        peer = None
    _PEER_IDS[public_key] = peer
    if len(_PEER_IDS) > 4096:
        _PEER_IDS.popitem(last=False)
    return peer


def sender_peer_id(subkey: Any) -> str | None:
    """The peer id of the owner of a DHT subkey, or None where the subkey names no owner key."""
    key = owner_public_key(subkey)
    return None if key is None else _peer_id_cached(key)
