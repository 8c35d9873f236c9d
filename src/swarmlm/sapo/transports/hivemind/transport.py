"""Rollout sharing over the hivemind DHT: the transport of an open, asynchronous swarm.

What lives in the DHT
---------------------
* key ``swarmlm/sapo/{run}/round/{g}``: one dictionary per *global* round ``g`` (see :class:`RoundClock`);
* subkey ``b"[owner:ssh-rsa …]"``: the publisher's RSA public key. hivemind's
  :class:`~hivemind.dht.crypto.RSASignatureValidator` then accepts a value under that subkey only if it is
  signed with the matching private key, so nobody can write or overwrite a record under another
  peer's subkey;
* value: the node's message for the round (:func:`swarmlm.sapo.records.encode_message`), signed, and
  expiring ``ttl`` seconds later (the staleness window plus two rounds).

Who sent it
-----------
A node's identity is one libp2p identity file, an RSA private key: it fixes the node's p2p peer id
(so it is the same across restarts) and it signs the node's records. The node id carried in the
records is that peer id. A receiver derives the sender's peer id from the public key in the subkey,
the key that the signature was checked against, never from what the payload claims; the node then
drops any record whose ``node_id`` differs (``forged_node_id``).

What the DHT refuses
--------------------
Every honest peer runs :class:`SwarmRecordValidator` on what others ask it to store and on what other
peers return to its queries. Under this run's round keys it refuses unsigned or plain values (a plain
value would replace every peer's record of the round), values that are not bytes, values over the
size cap, rounds more than one ahead of its clock, and on any key, expirations too far in the future.
Refusals are counted by reason and reach the node's ``drops`` like the node's own checks.

The round clock (SPEC A.6: key records by the global round, never a local counter)
-------------------------------------------------------------------------------------
``g = floor((unix_time - epoch) / round_length)``. Every peer computes the same ``g`` from its own clock
with no coordinator and no message: two swarm-wide constants (``round_length``, ``epoch``) and a clock
kept by NTP. A node that restarts, joins late or runs slowly publishes under the round the rest of
the swarm is reading, and no peer can move the swarm's round (a round "seen in the DHT" could be
pushed forward by any hostile peer). A node's own training step counter stays local: it counts
its optimizer steps and checkpoints, not the swarm's time.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import re
import signal
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from swarmlm.sapo.records import DropCounter
from swarmlm.sapo.transports.base import Received, RolloutTransport

log = logging.getLogger(__name__)

#: rounds ahead of this node's clock still accepted: a peer whose clock runs slightly ahead, or one that
#: started its step just after the tick
FUTURE_ROUNDS = 1
_OWNER_RE = re.compile(rb"^\[owner:(ssh-rsa [A-Za-z0-9+/]+={0,2})\]$")


def require_hivemind():
    """Import hivemind, or say how to get it (it is the optional ``swarm`` extra)."""
    try:
        import hivemind
    except ImportError as err:  # pragma: no cover - the test environment has it
        raise ImportError("the decentralized swarm needs hivemind: pip install 'swarmlm[swarm]'") from err
    return hivemind


# ---------------------------------------------------------------------------------------------- clock
@dataclass(frozen=True)
class RoundClock:
    """The swarm's global round: ``floor((time - epoch) / round_length)``, the same on every machine."""

    round_length: float
    epoch: float = 0.0

    def __post_init__(self) -> None:
        if not self.round_length > 0:
            raise ValueError("round_length must be positive")

    def round_at(self, unix_time: float) -> int:
        return max(0, math.floor((unix_time - self.epoch) / self.round_length))

    def now(self) -> int:
        return self.round_at(time.time())


def round_key(run: str, round: int) -> str:
    return f"swarmlm/sapo/{run}/round/{round}"


# ---------------------------------------------------------------------------------------------- identity
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


# ---------------------------------------------------------------------------------------------- validators
#: validators of the transports of this process, by token: after the DHT process forks, its copy of
#: this registry points at its copies of the validators, so a coroutine run there can read their counts
_VALIDATORS: dict[str, Any] = {}


def make_validators(identity: Identity, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int,
                    max_ttl: float, token: str) -> list:
    """The record validators of one node's DHT: hivemind's signature check (counting what it refuses),
    then the swarm's rules (:class:`SwarmRecordValidator`)."""
    classes = _validator_classes()
    rules = classes["rules"](run, clock, back_rounds=back_rounds, max_value_bytes=max_value_bytes, max_ttl=max_ttl,
                             token=token)
    return [classes["signature"](identity.private_key, rules), rules]


_CLASSES: dict[str, type] = {}


def _validator_classes() -> dict[str, type]:
    """The validator classes, defined on first use because their hivemind base classes are optional."""
    if "rules" in _CLASSES:
        return _CLASSES
    require_hivemind()
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import RecordValidatorBase

    class SwarmRecordValidator(RecordValidatorBase):
        """This run's rules for its round keys (see the module docstring), applied by hivemind to every
        record this peer is asked to store and every record other peers return to it. It runs inside the
        DHT process, after the signature check; refusals are counted by reason, each distinct record once."""

        def __init__(self, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int, max_ttl: float,
                     token: str):
            self.run, self.clock = run, clock
            self.back_rounds, self.max_value_bytes, self.max_ttl = back_rounds, max_value_bytes, max_ttl
            # no record may expire later than max_ttl from now, so keys further ahead than this hold nothing
            self.ahead_rounds = math.ceil(max_ttl / clock.round_length) + FUTURE_ROUNDS + 1
            self.counts: Counter = Counter()
            self._seen_bad: OrderedDict[bytes, None] = OrderedDict()
            self._ids: dict[bytes, int] = {}
            self._span: tuple[int, int] | None = None
            _VALIDATORS[token] = self

        def _round_of(self, key_id: bytes, now_round: int) -> int | None:
            lo, hi = now_round - self.back_rounds, now_round + self.ahead_rounds
            if self._span != (lo, hi):
                keep = {k: r for k, r in self._ids.items() if lo <= r <= hi}
                have = set(keep.values())
                for r in range(max(0, lo), hi + 1):
                    if r not in have:
                        keep[DHTID.generate(source=round_key(self.run, r)).to_bytes()] = r
                self._ids, self._span = keep, (lo, hi)
            return self._ids.get(key_id)

        def reject(self, reason: str, record) -> bool:
            fingerprint = hashlib.sha1(record.key + record.subkey + record.value[:4096]
                                       + repr(record.expiration_time).encode()).digest()
            if fingerprint not in self._seen_bad:
                self._seen_bad[fingerprint] = None
                if len(self._seen_bad) > 4096:
                    self._seen_bad.popitem(last=False)
                self.counts[reason] += 1
            return False

        def validate(self, record) -> bool:
            now = time.time()
            if record.expiration_time > now + self.max_ttl:
                return self.reject("bad_expiration", record)
            now_round = self.clock.round_at(now)
            rnd = self._round_of(record.key, now_round)
            if rnd is None:
                return True  # not one of this run's round keys
            if rnd > now_round + FUTURE_ROUNDS:
                return self.reject("future_round", record)
            if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
                return self.reject("unsigned", record)  # a plain value would replace every peer's record
            try:
                subkey = DHTProtocol.serializer.loads(record.subkey)
            except Exception:
                return self.reject("unsigned", record)
            if owner_public_key(subkey) is None:
                return self.reject("unsigned", record)
            try:
                value = DHTProtocol.serializer.loads(record.value)
            except Exception:
                return self.reject("bad_message", record)
            if not isinstance(value, bytes):
                return self.reject("bad_message", record)
            if len(value) > self.max_value_bytes:
                return self.reject("oversized_message", record)
            return True

        def take_counts(self) -> dict[str, int]:
            out, self.counts = dict(self.counts), Counter()
            return out

    class CountingSignatureValidator(RSASignatureValidator):
        """hivemind's signature check (a record under an owner subkey must be signed by that owner),
        counting the records it refuses as ``bad_signature``."""

        def __init__(self, private_key, rules):
            super().__init__(private_key)
            self.rules = rules

        def validate(self, record) -> bool:
            try:
                ok = super().validate(record)
            except Exception:  # e.g. a malformed public key in a hostile subkey
                ok = False
            return ok or self.rules.reject("bad_signature", record)

    _CLASSES.update(rules=SwarmRecordValidator, signature=CountingSignatureValidator)
    return _CLASSES


async def _take_dht_state(_dht, node, token: str) -> tuple[dict[str, int], int]:
    """Run inside the DHT process: the validator's refusals since the last call, and the routing table size."""
    validator = _VALIDATORS.get(token)
    counts = validator.take_counts() if validator is not None else {}
    return counts, len(node.protocol.routing_table.uid_to_peer_id)


async def _routing_table_size(_dht, node) -> int:
    return len(node.protocol.routing_table.uid_to_peer_id)


async def _rejoin(_dht, node, peer_ids: list[str]) -> int:
    """Run inside the DHT process of a peer that lost every neighbour: ping the initial peers again (libp2p
    still knows their addresses) and, if one answers, look up this peer's neighbourhood anew."""
    import asyncio

    from hivemind.p2p import PeerID

    answers = await asyncio.gather(*(node.protocol.call_ping(PeerID.from_base58(p)) for p in peer_ids),
                                   return_exceptions=True)
    answered = sum(1 for a in answers if a is not None and not isinstance(a, BaseException))
    if answered:
        await node.find_nearest_nodes([node.node_id])
    return answered


# ---------------------------------------------------------------------------------------------- DHT process
def _kill_children_and_exit() -> None:
    """The node process is gone: take this process's children (the p2p daemon) down, then exit."""
    me = os.getpid()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue
    os._exit(0)


class _BlockingReceiver:
    """The DHT process's end of hivemind's command pipe, received from in blocking mode.

    hivemind 1.1.12 watches that pipe with uvloop, which makes the descriptor non-blocking; a command
    larger than the pipe's buffer (a ``store`` of a message over ~64 KB) then fails half-read with
    EAGAIN and the DHT process drops it (and every command after it). ``recv`` is only called once the
    pipe is readable, so a blocking read just waits for the rest of the message being written.
    """

    def __init__(self, connection):
        self._connection = connection

    def recv(self):
        fd = self._connection.fileno()
        was_blocking = os.get_blocking(fd)
        os.set_blocking(fd, True)
        try:
            return self._connection.recv()
        finally:
            os.set_blocking(fd, was_blocking)

    def __getattr__(self, name: str):
        return getattr(self._connection, name)


def dht_class():
    """hivemind's DHT process, which also exits (with its p2p daemon) when the node process dies, and
    which can receive commands of any size (see :class:`_BlockingReceiver`).

    hivemind runs the DHT in a daemonic child process, but a SIGKILLed parent never reaps it: the
    orphan would keep the node's peer id alive, and the restarted node would find its identity taken.
    """
    if "dht" in _CLASSES:
        return _CLASSES["dht"]
    from hivemind import DHT

    class _OwnedDHT(DHT):
        def run(self) -> None:
            self._inner_pipe = _BlockingReceiver(self._inner_pipe)
            parent = os.getppid()

            def watch() -> None:
                while True:
                    time.sleep(1.0)
                    if os.getppid() != parent:
                        _kill_children_and_exit()

            threading.Thread(target=watch, daemon=True, name="swarmlm-parent-watch").start()
            super().run()

    _CLASSES["dht"] = _OwnedDHT
    return _OwnedDHT


def check_multiaddrs(addresses: Sequence[str], *, need_peer_id: bool, what: str) -> list[str]:
    """Parse each multiaddr, saying which one is wrong and what a right one looks like."""
    require_hivemind()
    from hivemind.utils.multiaddr import Multiaddr

    out = []
    for addr in addresses:
        try:
            parsed = Multiaddr(str(addr))
            if need_peer_id:
                parsed["p2p"]
        except Exception:
            example = "/ip4/203.0.113.7/tcp/31337/p2p/QmPeerId..." if need_peer_id else "/ip4/0.0.0.0/tcp/31337"
            raise ValueError(f"{what} {addr!r} is not a valid multiaddr; expected something like {example}") from None
        out.append(str(parsed))
    return out


class BootstrapError(RuntimeError):
    """The DHT could not start or reach any initial peer."""


def _explain(err: BaseException, initial_peers: Sequence[str]) -> str:
    text = str(err).strip() or type(err).__name__
    if "already taken" in text:
        return (f"another peer is using this identity ({text}); is a previous run of this node still alive? "
                "Stop it, or give this node its own --identity file")
    if initial_peers and ("bootstrap" in text or "none of the initial_peers" in text or "connect" in text):
        return f"none of the initial peers {list(initial_peers)} could be reached ({text.splitlines()[-1][:200]})"
    if isinstance(err, TimeoutError) or "Timeout" in type(err).__name__:
        return f"the DHT did not start in time ({text[:200]})"
    return f"the DHT failed to start: {type(err).__name__}: {text[:300]}"


# ---------------------------------------------------------------------------------------------- transport
@dataclass
class _Counters:
    published: int = 0
    publish_skipped: int = 0
    publish_failures: int = 0
    get_timeouts: int = 0
    get_errors: int = 0
    dht_rejected: int = 0
    bootstrap_attempts: int = 0
    rejoin_attempts: int = 0
    routing_table: int = 0
    last_collect_messages: int = 0


class HivemindTransport(RolloutTransport):
    """Each node runs a hivemind DHT peer; see the module docstring for the layout and the rules.

    ``publish`` stores the round's message and returns without waiting for the store to finish.
    ``collect(g, timeout)`` reads the keys of rounds ``g - staleness_rounds … g + 1`` and returns every
    other peer's message it has not returned before (each peer's message at most once). With
    ``wait_for_peers`` it keeps polling, until the timeout at most, while a peer that published within
    the staleness window has not yet published anything new and is due to (its last message is less
    than two of its usual intervals old). A peer that stopped is waited for during two of its
    intervals at most, one silent for the whole window is forgotten, and with no such peer (a lone
    node) ``collect`` returns at once.

    Without reachable initial peers the node trains alone: ``publish`` skips, ``collect`` returns
    nothing, and a background thread retries with exponential back-off until a peer answers.
    """

    future_rounds = FUTURE_ROUNDS

    def __init__(self, identity: Identity, *, run: str, clock: RoundClock, staleness_rounds: int,
                 initial_peers: Sequence[str] = (), host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
                 announce_maddrs: Sequence[str] = (), max_value_bytes: int = 2_000_000, max_peers_per_round: int = 256,
                 poll_interval: float = 0.5, wait_for_peers: bool = False, startup_timeout: float = 60.0,
                 retry_initial: float = 2.0, retry_max: float = 60.0,
                 on_connected: Callable[[str, list[str]], None] | None = None, dht_options: dict | None = None):
        require_hivemind()
        self.identity = identity
        self.node_id = identity.peer_id
        self.run, self.clock, self.staleness_rounds = run, clock, staleness_rounds
        self.initial_peers = check_multiaddrs(initial_peers, need_peer_id=True, what="initial peer")
        self.host_maddrs = check_multiaddrs(host_maddrs, need_peer_id=False, what="host address")
        self.announce_maddrs = check_multiaddrs(announce_maddrs, need_peer_id=False, what="announce address")
        self.max_value_bytes, self.max_peers_per_round = max_value_bytes, max_peers_per_round
        self.poll_interval, self.wait_for_peers = poll_interval, wait_for_peers
        self.startup_timeout, self.retry_initial, self.retry_max = startup_timeout, retry_initial, retry_max
        self.on_connected = on_connected
        self.dht_options = dict(dht_options or {})
        self.ttl = (staleness_rounds + 2) * clock.round_length
        self.max_ttl = 2 * self.ttl + 60.0
        #: where refusals and bad messages are counted; the node runner points this at the node's counter
        self.drops = DropCounter()
        self.counters = _Counters()
        self._token = f"{identity.peer_id}-{os.getpid()}-{id(self)}"
        self._validators = make_validators(identity, run, clock, back_rounds=staleness_rounds + 2,
                                           max_value_bytes=max_value_bytes, max_ttl=self.max_ttl, token=self._token)
        self._seen: dict[int, dict[str, float]] = {}  # round -> sender -> newest expiration returned
        self._flooded: dict[int, set[str]] = {}  # round -> senders refused for the per-round cap
        self._overflow: dict[int, int] = {}  # round -> entries beyond what is even looked at
        self._live: dict[str, int] = {}  # sender -> newest round it published in (within the window)
        self._last_new: dict[str, float] = {}  # sender -> when its newest message was first seen (monotonic)
        self._interval: dict[str, float] = {}  # sender -> running mean of the time between its messages
        self._peers_seen: set[str] = set()
        self._pending_stores: list[Any] = []
        self._dht = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._retry_thread: threading.Thread | None = None
        self._last_error = ""
        self._last_io = self._last_wait = 0.0  # the last collect: seconds reading the DHT, seconds waiting for peers
        self._next_rejoin, self._rejoin_delay = 0.0, 0.0
        try:
            dht = self._create_dht()
        except BootstrapError as err:
            if not self.initial_peers:
                raise
            self._last_error = str(err)
            log.error("could not join the swarm: %s. Training alone meanwhile; retrying in %gs.", err, retry_initial)
            self._retry_thread = threading.Thread(target=self._retry_loop, daemon=True, name="swarmlm-dht-retry")
            self._retry_thread.start()
        else:
            self._connected(dht)

    # ------------------------------------------------------------------ DHT life cycle
    def _create_dht(self):
        self.counters.bootstrap_attempts += 1
        dht = dht_class()(
            initial_peers=self.initial_peers or None, start=False, identity_path=str(self.identity.path),
            host_maddrs=self.host_maddrs, announce_maddrs=self.announce_maddrs or None,
            record_validators=self._validators, **self.dht_options)
        try:
            dht.run_in_background(await_ready=True, timeout=self.startup_timeout)
        except BaseException as err:
            try:
                dht.shutdown()
            except Exception:
                pass
            if dht.is_alive():
                dht.terminate()
            if isinstance(err, KeyboardInterrupt):
                raise
            raise BootstrapError(_explain(err, self.initial_peers)) from err
        return dht

    def _connected(self, dht) -> None:
        with self._lock:
            if self._stop.is_set():
                dht.shutdown()
                return
            self._dht = dht
        try:
            maddrs = [str(m) for m in dht.get_visible_maddrs()]
        except Exception:  # a peer with no public address still works as a client
            maddrs = []
        log.info("DHT peer %s up; addresses: %s", self.node_id, " ".join(maddrs) or "(none)")
        if self.on_connected is not None:
            self.on_connected(self.node_id, maddrs)

    def _retry_loop(self) -> None:
        delay = self.retry_initial
        while not self._stop.wait(delay):
            try:
                dht = self._create_dht()
            except BootstrapError as err:
                delay = min(delay * 2, self.retry_max)
                self._last_error = str(err)
                log.warning("still cannot join the swarm: %s. Training alone; next try in %gs.", err, delay)
                continue
            log.info("joined the swarm after %d attempts", self.counters.bootstrap_attempts)
            self._last_error = ""
            self._connected(dht)
            return

    @property
    def connected(self) -> bool:
        return self._dht is not None

    def await_peers(self, count: int, timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) until this peer knows ``count`` other peers; returns how many it knows."""
        deadline = time.monotonic() + timeout
        known = 0
        while True:
            dht = self._dht
            if dht is not None:
                try:
                    known = dht.run_coroutine(_routing_table_size, return_future=True).result(timeout=5.0)
                except Exception as err:
                    log.debug("routing table size: %s", err)
            if known >= count or time.monotonic() >= deadline or self._stop.is_set():
                return known
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            dht, self._dht = self._dht, None
        if dht is not None:
            try:
                dht.shutdown()
            except Exception as err:  # pragma: no cover
                log.debug("DHT shutdown: %s", err)
        _VALIDATORS.pop(self._token, None)

    # ------------------------------------------------------------------ the interface
    def global_round(self, local_round: int) -> int:
        return self.clock.now()

    def publish(self, round: int, payload: bytes) -> None:
        dht = self._dht
        self._reap_stores()
        if dht is None:
            self.counters.publish_skipped += 1
            return
        from hivemind.utils import get_dht_time

        self._pending_stores.append(dht.store(round_key(self.run, round), payload, get_dht_time() + self.ttl,
                                              subkey=self.identity.owner_subkey, return_future=True))
        self.counters.published += 1

    def collect(self, round: int, timeout: float) -> list[Received]:
        started = time.monotonic()
        deadline = started + timeout
        self._last_wait = 0.0
        dht = self._dht
        if dht is None:
            self._last_io = 0.0
            return []
        self._absorb_dht_state(dht, deadline)
        first = round - self.staleness_rounds
        rounds = range(first, round + self.future_rounds + 1)
        self._forget_before(first)
        heard: set[str] = set()
        out: list[Received] = []
        while True:
            out.extend(self._poll(dht, rounds, deadline, heard))
            if not self.wait_for_peers:
                break
            now = time.monotonic()
            waiting = [p for p, r in self._live.items() if r >= first and p not in heard and self._due(p, now)]
            if not waiting or time.monotonic() + self.poll_interval >= deadline:
                break
            time.sleep(self.poll_interval)
            self._last_wait += self.poll_interval
        self._last_io = time.monotonic() - started - self._last_wait
        self.counters.last_collect_messages = len(out)
        return out

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"dht_io_seconds": self._last_io, "dht_wait_seconds": self._last_wait, "dht_live_peers": len(self._live),
                "dht_connected": self.connected, "peers_seen": len(self._peers_seen), "dht_routing_table": c.routing_table,
                "dht_published": c.published, "dht_publish_skipped": c.publish_skipped,
                "dht_publish_failures": c.publish_failures, "dht_get_timeouts": c.get_timeouts,
                "dht_rejected": c.dht_rejected, "dht_bootstrap_attempts": c.bootstrap_attempts,
                "dht_rejoin_attempts": c.rejoin_attempts}

    # ------------------------------------------------------------------ internals
    def _reap_stores(self) -> None:
        still = []
        for fut in self._pending_stores:
            if not fut.done():
                still.append(fut)
                continue
            try:
                ok = fut.result(timeout=0)
            except Exception:
                ok = False
            if not ok:
                self.counters.publish_failures += 1
        self._pending_stores = still[-64:]

    def _absorb_dht_state(self, dht, deadline: float) -> None:
        """Move the DHT's refusals into the node's drop counter; refresh the routing-table size."""
        try:
            fut = dht.run_coroutine(partial(_take_dht_state, token=self._token), return_future=True)
            counts, table = fut.result(timeout=max(0.05, min(2.0, deadline - time.monotonic())))
        except Exception as err:
            log.debug("could not read the DHT's counters: %s", err)
            return
        self.counters.routing_table = table
        if table > 0:
            self._rejoin_delay = 0.0
        elif self.initial_peers:
            self._maybe_rejoin(dht)
        for reason, n in counts.items():
            self.drops.counts[reason] += n
            self.counters.dht_rejected += n
            log.warning("the DHT refused %d record(s) from peers: %s", n, reason)

    def _maybe_rejoin(self, dht) -> None:
        """Every neighbour is gone (they left, or the bootstrap peer restarted): ask the initial peers again,
        without waiting for the answer, at most once per back-off period."""
        now = time.monotonic()
        if now < self._next_rejoin:
            return
        self._rejoin_delay = min(self._rejoin_delay * 2, self.retry_max) if self._rejoin_delay else self.retry_initial
        self._next_rejoin = now + self._rejoin_delay
        log.warning("this peer knows no other peer; asking the initial peers again (next try in %gs)", self._rejoin_delay)
        from hivemind.utils.multiaddr import Multiaddr

        peer_ids = [Multiaddr(a)["p2p"] for a in self.initial_peers]
        dht.run_coroutine(partial(_rejoin, peer_ids=peer_ids), return_future=True)
        self.counters.rejoin_attempts += 1

    def _due(self, peer: str, now: float) -> bool:
        """Whether ``peer`` is expected to publish soon: its last new message is less than two of its usual
        intervals old. A peer that stopped (finished, killed, partitioned) is then waited for during two of
        its intervals at most, not for the whole staleness window."""
        last = self._last_new.get(peer)
        return last is not None and now - last < 2.0 * self._interval.get(peer, self.clock.round_length)

    def _heard_new(self, peer: str) -> None:
        now = time.monotonic()
        last = self._last_new.get(peer)
        if last is not None:
            gap = now - last
            old = self._interval.get(peer)
            self._interval[peer] = gap if old is None else 0.7 * old + 0.3 * gap
        self._last_new[peer] = now

    def _forget_before(self, first: int) -> None:
        for table in (self._seen, self._flooded, self._overflow):
            for r in [r for r in table if r < first - 1]:
                del table[r]
        for p in [p for p, r in self._live.items() if r < first]:
            del self._live[p]
            self._last_new.pop(p, None)
            self._interval.pop(p, None)

    def _sender_of(self, subkey: Any) -> str | None:
        key = owner_public_key(subkey)
        if key is None:
            return None
        return _peer_id_cached(key)

    def _poll(self, dht, rounds: range, deadline: float, heard: set[str]) -> list[Received]:
        futures = [(r, dht.get(round_key(self.run, r), latest=True, return_future=True)) for r in rounds]
        out: list[Received] = []
        for r, fut in futures:
            try:
                found = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as err:
                fut.cancel()
                if "Timeout" in type(err).__name__:
                    self.counters.get_timeouts += 1
                else:
                    self.counters.get_errors += 1
                    log.debug("DHT get of round %d failed: %s", r, err)
                continue
            if found is None:
                continue
            entries = found.value
            if not isinstance(entries, dict):  # a plain value: the DHT's validator should have refused it
                self.drops.drop("unsigned", "?", f"round {r} holds a plain value")
                continue
            items = list(entries.items())
            seen = self._seen.setdefault(r, {})
            flooded = self._flooded.setdefault(r, set())
            cap = self.max_peers_per_round
            if len(items) > cap:  # more peers than a round may hold: a Sybil flood, or a very large swarm
                random.shuffle(items)
                overflow = max(0, len(items) - 8 * cap)
                if overflow > self._overflow.get(r, 0):  # not even looked at; counted once per round
                    self.drops.counts["flood"] += overflow - self._overflow.get(r, 0)
                    self._overflow[r] = overflow
                    log.warning("round %d holds %d peers' records; ignoring %d unread", r, len(items), overflow)
                items = items[: 8 * cap]
                # peers already heard from within the window come first, so a burst of new identities cannot crowd them out
                items.sort(key=lambda kv: self._sender_of(kv[0]) not in self._live)
            for subkey, item in items:
                sender = self._sender_of(subkey)
                if sender is None:
                    self.drops.drop("unsigned", "?", "subkey without an owner key")
                    continue
                if sender == self.node_id:
                    continue
                expiration = float(item.expiration_time)
                if seen.get(sender, -math.inf) >= expiration:
                    self._live[sender] = max(r, self._live.get(sender, r))
                    continue  # returned before
                if sender not in seen and len(seen) >= cap:
                    if sender not in flooded:  # each refused peer counted once per round
                        flooded.add(sender)
                        self.drops.drop("flood", sender, f"more than {cap} peers in round {r}")
                    continue
                seen[sender] = expiration
                self._live[sender] = max(r, self._live.get(sender, r))
                self._heard_new(sender)
                if len(self._peers_seen) < 100_000:
                    self._peers_seen.add(sender)
                if not isinstance(item.value, (bytes, bytearray)):
                    self.drops.drop("bad_message", sender, f"payload is {type(item.value).__name__}")
                    continue
                out.append(Received(sender, r, bytes(item.value)))
                heard.add(sender)
        return out


_PEER_IDS: OrderedDict[bytes, str | None] = OrderedDict()


def _peer_id_cached(public_key: bytes) -> str | None:
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


__all__ = ["BootstrapError", "HivemindTransport", "Identity", "RoundClock", "load_identity", "make_validators",
           "owner_public_key", "peer_id_of_public_key", "round_key"]
