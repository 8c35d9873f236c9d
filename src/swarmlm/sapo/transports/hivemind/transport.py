"""The :class:`~swarmlm.sapo.transports.base.RolloutTransport` of the open swarm, over a hivemind DHT peer of
this node's own (:mod:`.keys` for the key layout, and the sibling modules for each concern)."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from swarmlm.sapo.records import DropCounter
from swarmlm.sapo.transports.base import Received, RolloutTransport
from swarmlm.sapo.transports.hivemind import require_hivemind
from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock
from swarmlm.sapo.transports.hivemind.dht_process import (dht_class, fetch_values, read_dht_state, refresh_routing,
                                                          rejoin, routing_table_size, store_message)
from swarmlm.sapo.transports.hivemind.identity import Identity, sender_peer_id
from swarmlm.sapo.transports.hivemind.keys import (MAX_ADDRESS_BYTES, address_key, digest_key, digest_length,
                                                   message_digest, message_key)
from swarmlm.sapo.transports.hivemind.validators import forget_validators, make_validators

log = logging.getLogger(__name__)

#: in how many reads at most within one round of this node's clock one message (a round, a peer) is fetched (each
#: read tries twice at most): a peer whose digest keeps changing, or never names its message, costs that much
MAX_FETCHES_PER_ROUND = 3


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


@dataclass
class _Counters:
    published: int = 0
    publish_skipped: int = 0
    publish_failures: int = 0
    get_timeouts: int = 0
    dht_rejected: int = 0
    bootstrap_attempts: int = 0
    rejoin_attempts: int = 0
    routing_table: int = 0
    kept_bytes: int = 0
    peers_read: int = 0


def _peer_book_addresses(path: Path | None, limit: int = 16) -> list[str]:
    """Dialable addresses (``…/p2p/<peer id>``) of the peers a node knew last time (its peer book)."""
    if path is None or not path.is_file():
        return []
    try:
        book = json.loads(path.read_text())
        entries = sorted(book.get("peers", {}).items(), key=lambda kv: -float(kv[1].get("seen", 0)))
    except (OSError, ValueError, AttributeError, TypeError):
        log.warning("peer book %s is unreadable; ignoring it", path)
        return []
    out = []
    for peer, entry in entries[:limit]:
        for addr in entry.get("addrs", [])[:2]:
            if isinstance(addr, str) and isinstance(peer, str) and "/p2p/" not in addr:
                out.append(f"{addr}/p2p/{peer}")
    return out


class HivemindTransport(RolloutTransport):
    """Each node runs a hivemind DHT peer; see :mod:`.keys` for the layout and :mod:`.validators` for the rules.

    ``publish`` stores the round's message under this node's own key of the round and returns without
    waiting for the store to finish. ``collect(g, timeout)`` reads, for rounds ``g - staleness_rounds … g + 1``,
    the keys of at most ``max_peers_per_round`` peers: those heard from within the window first (most recent
    first), then the other peers of the routing table in a random order. Each read looks up the small digests
    of those keys (:func:`.keys.digest_key`) and fetches only the messages whose digest it has not returned
    before (each peer's message of a round at most once, a newer one again), at most ``max_round_bytes`` in all
    by the lengths the digests state (the rest counted as ``round_cap`` and never fetched): every peer's message
    of round ``g`` first, then older rounds', then the next round's, the smaller first within a round, so that a
    peer publishing ahead or large cannot push an honest peer's current message out. A message crosses the
    network once, not at every read, and is returned only if it is the one its digest names. An old round's
    key is read until its message is found, the current and next rounds' on every read. With ``wait_for_peers``
    it keeps polling, until the timeout at most, while a peer that published within the staleness window has not yet published anything new and is
    due to (its last message is less than two of its usual intervals old). A peer that stopped is waited for
    during two of its intervals at most, one silent for the whole window is forgotten, and with no such peer
    (a lone node) ``collect`` returns at once.

    Without reachable initial peers the node trains alone: ``publish`` skips, ``collect`` returns nothing,
    and a background thread retries with exponential back-off until a peer answers. Every node announces the
    addresses it listens on under its own key (:func:`.keys.address_key`); the addresses of the peers it
    hears from are kept in ``peer_book`` (a JSON file), so a restarted node can rejoin through any of them, and
    a node that lost every neighbour asks them as well as its initial peers.
    """

    future_rounds = FUTURE_ROUNDS

    def __init__(self, identity: Identity, *, run: str, clock: RoundClock, staleness_rounds: int,
                 initial_peers: Sequence[str] = (), host_maddrs: Sequence[str] = ("/ip4/0.0.0.0/tcp/0",),
                 announce_maddrs: Sequence[str] = (), max_value_bytes: int = 2_000_000, max_peers_per_round: int = 256,
                 max_round_bytes: int = 16_000_000, dht_round_bytes: int = 32_000_000, poll_interval: float = 0.5,
                 wait_for_peers: bool = False, startup_timeout: float = 60.0, retry_initial: float = 2.0,
                 retry_max: float = 60.0, peer_book: str | Path | None = None,
                 on_connected: Callable[[str, list[str]], None] | None = None, dht_options: dict | None = None,
                 start: bool = True):
        require_hivemind()
        self.identity = identity
        self.node_id = identity.peer_id
        self.run, self.clock, self.staleness_rounds = run, clock, staleness_rounds
        self.initial_peers = check_multiaddrs(initial_peers, need_peer_id=True, what="initial peer")
        self.host_maddrs = check_multiaddrs(host_maddrs, need_peer_id=False, what="host address")
        self.announce_maddrs = check_multiaddrs(announce_maddrs, need_peer_id=False, what="announce address")
        self.max_value_bytes, self.max_peers_per_round = max_value_bytes, max_peers_per_round
        self.max_round_bytes = max_round_bytes
        self.poll_interval, self.wait_for_peers = poll_interval, wait_for_peers
        self.startup_timeout, self.retry_initial, self.retry_max = startup_timeout, retry_initial, retry_max
        self.peer_book = Path(peer_book) if peer_book is not None else None
        self.on_connected = on_connected
        # values found are not cached (every read asks for the latest)
        self.dht_options = {"cache_locally": False, "cache_on_store": False, **(dht_options or {})}
        # routing buckets are refreshed this often, so that a node keeps finding peers (and is found) after the
        # one it joined through has left
        self.refresh_seconds = max(10.0, 2 * clock.round_length)
        self._next_refresh = 0.0
        self.ttl = (staleness_rounds + 2) * clock.round_length
        self.max_ttl = 2 * self.ttl + 60.0
        #: where refusals and bad messages are counted; the volunteer process points this at its node's counter
        self.drops = DropCounter()
        #: the peers whose records this node accepted recently; the volunteer points this at its node's standing
        self.trusted: Callable[[], list[str]] = lambda: sorted(self._live)
        self.counters = _Counters()
        self._token = f"{identity.peer_id}-{os.getpid()}-{id(self)}"
        self._validators = make_validators(identity, run, clock, back_rounds=staleness_rounds + 2,
                                           max_value_bytes=max_value_bytes, max_ttl=self.max_ttl,
                                           round_bytes=dht_round_bytes, token=self._token)
        self._seen: dict[tuple[int, str], bytes] = {}  # (round, sender) -> digest of the message returned
        self._fetched: dict[tuple[int, str], tuple[int, int]] = {}  # (round, sender) -> (global round, fetches in it)
        self._read_in: dict[tuple[int, str], int] = {}  # (round, sender) -> the global round its message was last read in
        self._live: dict[str, int] = {}  # sender -> newest round it published in (within the window)
        self._last_new: dict[str, float] = {}  # sender -> when its newest message was first seen (monotonic)
        self._interval: dict[str, float] = {}  # sender -> running mean of the time between its messages
        self._routing: list[str] = []  # peer ids of the routing table, as last read
        self._peers_seen: set[str] = set()
        self._pending_stores: list[Any] = []
        self._dht = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._retry_thread: threading.Thread | None = None
        self._last_io = self._last_wait = 0.0  # the last collect: seconds reading the DHT, seconds waiting for peers
        self._next_rejoin, self._rejoin_delay = 0.0, 0.0
        self._collects = 0
        self._maddrs: list[str] = []
        self._next_announce = 0.0
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        """Join the swarm (once): start the DHT peer, or, if no initial peer answers, train alone and retry in the
        background. Until then ``collect`` finds nothing and ``publish`` keeps nothing."""
        if self._started:
            return
        self._started = True
        try:
            dht = self._create_dht()
        except BootstrapError as err:
            if not self._bootstrap_peers():
                raise
            log.error("could not join the swarm: %s. Training alone meanwhile; retrying in %gs.", err, self.retry_initial)
            self._retry_thread = threading.Thread(target=self._retry_loop, daemon=True, name="swarmlm-dht-retry")
            self._retry_thread.start()
        else:
            self._connected(dht)

    # ------------------------------------------------------------------ DHT life cycle
    def _bootstrap_peers(self) -> list[str]:
        """The initial peers, then the peers of the peer book (dialable addresses, no duplicates)."""
        out = list(self.initial_peers)
        for addr in _peer_book_addresses(self.peer_book):
            if addr not in out and not addr.endswith(f"/p2p/{self.node_id}"):
                out.append(addr)
        return out

    def _create_dht(self):
        self.counters.bootstrap_attempts += 1
        peers = self._bootstrap_peers()
        dht = dht_class()(
            initial_peers=peers or None, start=False, identity_path=str(self.identity.path),
            host_maddrs=self.host_maddrs, announce_maddrs=self.announce_maddrs or None,
            record_validators=self._validators, **self.dht_options)
        dht.storage_rules = self._validators[-1]  # the storage budget, applied to what this peer stores
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
            raise BootstrapError(_explain(err, peers)) from err
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
        self._maddrs = [m.split("/p2p/")[0] for m in maddrs][:8]
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
                log.warning("still cannot join the swarm: %s. Training alone; next try in %gs.", err, delay)
                continue
            log.info("joined the swarm after %d attempts", self.counters.bootstrap_attempts)
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
                    known = dht.run_coroutine(routing_table_size, return_future=True).result(timeout=5.0)
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
            self._write_peer_book(dht)
            try:
                dht.shutdown()
            except Exception as err:  # pragma: no cover
                log.debug("DHT shutdown: %s", err)
        forget_validators(self._token)

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

        self._pending_stores.append(dht.run_coroutine(partial(
            store_message, run=self.run, round=round, peer_id=self.node_id, payload=payload,
            expiration=get_dht_time() + self.ttl, subkey=self.identity.owner_subkey), return_future=True))
        self.counters.published += 1
        if self._maddrs and time.monotonic() >= self._next_announce:
            self._next_announce = time.monotonic() + self.max_ttl / 2
            addresses = json.dumps(self._maddrs).encode()[:MAX_ADDRESS_BYTES]
            self._pending_stores.append(dht.store(address_key(self.run, self.node_id), addresses,
                                                  get_dht_time() + self.max_ttl - 5, subkey=self.identity.owner_subkey,
                                                  return_future=True))

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
        self._forget_before(first)
        rounds = range(first, round + self.future_rounds + 1)
        peers = self._read_order(first)
        self.counters.peers_read = len(peers)
        heard: set[str] = set()
        out: list[Received] = []
        budget = [self.max_round_bytes]
        while True:
            out.extend(self._poll(dht, peers, rounds, round, deadline, heard, budget))
            if not self.wait_for_peers:
                break
            now = time.monotonic()
            waiting = [p for p, r in self._live.items() if r >= first and p not in heard and self._due(p, now)]
            if not waiting or time.monotonic() + self.poll_interval >= deadline:
                break
            time.sleep(self.poll_interval)
            self._last_wait += self.poll_interval
        self._last_io = time.monotonic() - started - self._last_wait
        self._collects += 1
        if self._collects % 20 == 1:
            self._write_peer_book(dht)
        if time.monotonic() >= self._next_refresh:  # in the background: the answer is not awaited
            self._next_refresh = time.monotonic() + self.refresh_seconds
            dht.run_coroutine(partial(refresh_routing, stale_seconds=self.refresh_seconds), return_future=True)
        return out

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"dht_io_seconds": self._last_io, "dht_wait_seconds": self._last_wait, "dht_live_peers": len(self._live),
                "dht_connected": self.connected, "peers_seen": len(self._peers_seen), "dht_routing_table": c.routing_table,
                "dht_peers_read": c.peers_read, "dht_kept_bytes": c.kept_bytes,
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
        """Hand the DHT the peers this node trusts; move its refusals into the node's drop counter; refresh
        the routing table's peers."""
        try:
            trusted = list(self.trusted())[:4096]
            fut = dht.run_coroutine(partial(read_dht_state, token=self._token, trusted=trusted,
                                            max_peers=4 * self.max_peers_per_round), return_future=True)
            counts, routing, kept = fut.result(timeout=max(0.05, min(2.0, deadline - time.monotonic())))
        except Exception as err:
            log.debug("could not read the DHT's state: %s", err)
            return
        self._routing = [p for p in routing if p != self.node_id]
        self.counters.routing_table, self.counters.kept_bytes = len(routing), kept
        if routing:
            self._rejoin_delay = 0.0
        elif self._bootstrap_peers():
            self._maybe_rejoin(dht)
        for reason, n in counts.items():
            self.drops.counts[reason] += n
            self.counters.dht_rejected += n
            log.warning("the DHT refused %d record(s) from peers: %s", n, reason)

    def _read_order(self, first: int) -> list[str]:
        """Whose keys to read: peers heard within the window (most recent first), then the routing table's
        other peers in a random order; at most ``max_peers_per_round``."""
        live = sorted((p for p, r in self._live.items() if r >= first), key=lambda p: -self._last_new.get(p, 0.0))
        others = [p for p in self._routing if p not in self._live]
        random.shuffle(others)
        return (live + others)[: self.max_peers_per_round]

    def _maybe_rejoin(self, dht) -> None:
        """Every neighbour is gone (they left, or the bootstrap peer restarted): ask the initial peers and the
        peer book's peers again, without waiting for the answer, at most once per back-off period."""
        now = time.monotonic()
        if now < self._next_rejoin:
            return
        self._rejoin_delay = min(self._rejoin_delay * 2, self.retry_max) if self._rejoin_delay else self.retry_initial
        self._next_rejoin = now + self._rejoin_delay
        log.warning("this peer knows no other peer; asking its known peers again (next try in %gs)", self._rejoin_delay)
        from hivemind.utils.multiaddr import Multiaddr

        peers: dict[str, list[str]] = {}
        for addr in self._bootstrap_peers():
            peer = Multiaddr(addr)["p2p"]
            if peer != self.node_id:
                peers.setdefault(peer, []).append(addr.split("/p2p/")[0])
        dht.run_coroutine(partial(rejoin, peers=peers), return_future=True)
        self.counters.rejoin_attempts += 1

    def _write_peer_book(self, dht) -> None:
        """Remember where the peers heard from recently listen (the addresses they announce under their own
        keys), merged with the old book; the most recently seen 256 are kept."""
        if self.peer_book is None:
            return
        peers = sorted(self._live, key=lambda p: -self._last_new.get(p, 0.0))[:64]
        keys = {address_key(self.run, p): p for p in peers}
        try:
            found = dht.run_coroutine(partial(fetch_values, keys=list(keys), timeout=2.0),
                                      return_future=True).result(timeout=4.0) if keys else {}
        except Exception as err:
            log.debug("could not read peers' addresses: %s", err)
            found = {}
        try:
            book = json.loads(self.peer_book.read_text()) if self.peer_book.is_file() else {}
            known = book.get("peers", {}) if isinstance(book, dict) else {}
        except (OSError, ValueError):
            known = {}
        now = time.time()
        for key, entries in found.items():
            peer = keys[key]
            for sub, (value, _) in entries.items():
                if sender_peer_id(sub) != peer:
                    continue
                try:
                    addrs = check_multiaddrs(json.loads(value)[:8], need_peer_id=False, what="address")
                except (ValueError, TypeError, AttributeError):
                    continue
                if addrs:
                    known[peer] = {"addrs": addrs, "seen": now}
        keep = dict(sorted(known.items(), key=lambda kv: -float(kv[1].get("seen", 0)))[:256])
        tmp = self.peer_book.with_name(self.peer_book.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"run": self.run, "peers": keep}, indent=1))
            os.replace(tmp, self.peer_book)
        except OSError as err:
            log.warning("could not write the peer book %s: %s", self.peer_book, err)

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
        for key in [k for k in self._seen if k[0] < first - 1]:
            del self._seen[key]
        for key in [k for k in self._read_in if k[0] < first - 1]:
            del self._read_in[key]
        for key in [k for k in self._fetched if k[0] < first - 1]:
            del self._fetched[key]
        for p in [p for p, r in self._live.items() if r < first]:
            del self._live[p]
            self._last_new.pop(p, None)
            self._interval.pop(p, None)

    def _poll(self, dht, peers: list[str], rounds: range, round: int, deadline: float, heard: set[str],
              budget: list[int]) -> list[Received]:
        """One read: every peer's current round first, then the other rounds (:meth:`_read`), so that lookups of
        other rounds never hold up an honest peer's current message."""
        # a past round's message is read until it has been read once after that round ended and a message of a
        # later round from the same peer has been seen: a peer that takes several steps within a round republishes
        # its message at each, and its last step of a round, begun within it, publishes after the round has ended,
        # but before its first step of a later round publishes
        wanted = [(r, p) for p in peers for r in rounds
                  if r >= round or self._read_in.get((r, p), r) <= r or self._live.get(p, r) <= r]
        position = {p: i for i, p in enumerate(peers)}
        out: list[Received] = []
        for part in ([rp for rp in wanted if rp[0] == round], [rp for rp in wanted if rp[0] != round]):
            if part:
                out += self._read(dht, part, position, round, deadline, heard, budget)
        return out

    def _read(self, dht, wanted: list[tuple[int, str]], position: dict[str, int], round: int, deadline: float,
              heard: set[str], budget: list[int]) -> list[Received]:
        """The digests of the ``wanted`` (round, peer) keys, then the messages whose digest is new (:meth:`_fetch`).
        A digest of the current or a later round is taken from the first copy found (this peer's own when it keeps
        the key: a peer's every store of its digest reaches the peers near the key, so no slower lookup is needed to
        follow it within the round; a copy that missed a republish within the round delays that message until the
        round has ended); a past round's from every peer near the key, the newest, since the read after a round has
        ended must see the round's last message."""
        # looked up in this order (16 at a time): the current round, then older rounds nearest first, then later ones
        wanted = sorted(wanted, key=lambda rp: (rp[0] > round, abs(rp[0] - round), position[rp[1]]))
        digests: dict[tuple[int, str], Any] = {}
        for latest in (False, True):
            keys = {digest_key(self.run, r, p): (r, p) for r, p in wanted if (r < round) == latest}
            if keys:
                digests.update(self._lookup(dht, keys, deadline, latest=latest))
        new: list[tuple[int, str, bytes, int]] = []
        for r, p in wanted:
            digest = digests.get((r, p))
            if digest is None:
                continue
            self._read_in[(r, p)] = round
            self._live[p] = max(r, self._live.get(p, r))
            if self._seen.get((r, p)) == digest:
                continue  # returned before
            length = digest_length(digest)
            if length is None:
                self.drops.drop("bad_message", p, f"its round {r} digest is not a digest")
                continue
            last, count = self._fetched.get((r, p), (round, 0))
            if last == round and count >= MAX_FETCHES_PER_ROUND:
                continue  # a digest that keeps changing is followed at most this often
            new.append((r, p, digest, length))
        # the round's byte budget goes to every peer's current round before anyone's later round (a peer that
        # publishes ahead cannot push an honest peer's current message out), then to older rounds, nearest first;
        # within a round, smaller messages first, so that large ones cannot take the budget of small ones. What does
        # not fit is never fetched.
        chosen = []
        for r, p, digest, length in sorted(new, key=lambda c: (c[0] > round, abs(c[0] - round), c[3], position[c[1]])):
            if length > budget[0]:
                self.drops.drop("round_cap", p, f"its round {r} message, {length} bytes: over "
                                f"{self.max_round_bytes} bytes read in round {round}")
                continue
            budget[0] -= length
            chosen.append((r, p, digest, length))
        out: list[Received] = []
        for r, p, value, digest in self._fetch(dht, chosen, round, deadline, budget):
            self._seen[(r, p)] = digest
            self._heard_new(p)
            if len(self._peers_seen) < 100_000:
                self._peers_seen.add(p)
            out.append(Received(p, r, value))
            heard.add(p)
        return out

    def _fetch(self, dht, chosen: list[tuple[int, str, bytes, int]], round: int, deadline: float,
               budget: list[int]) -> list[tuple[int, str, bytes, bytes]]:
        """The messages of ``chosen`` (round, peer, digest, length) that match their digests, with them: each first from
        wherever it is found first (this peer's own copy when it stores the key), then, if that copy is not the
        one the digest names, from every peer near the key. A message that matches neither is not returned, and
        its bytes go back to the budget; after ``MAX_FETCHES_PER_ROUND`` reads of a round that tried it, it is
        dropped as ``digest_mismatch``."""
        out: list[tuple[int, str, bytes, bytes]] = []
        for r, p, _, _ in chosen:
            last, count = self._fetched.get((r, p), (round, 0))
            self._fetched[(r, p)] = (round, count + 1 if last == round else 1)
        for latest in (False, True):
            if not chosen:
                break
            values = self._lookup(dht, {message_key(self.run, r, p): (r, p) for r, p, _, _ in chosen}, deadline,
                                  latest=latest)
            missed = []
            for r, p, digest, length in chosen:
                value = values.get((r, p))
                if value is not None and not isinstance(value, (bytes, bytearray)):
                    self.drops.drop("bad_message", p, f"payload is {type(value).__name__}")
                    budget[0] += length
                elif value is not None and message_digest(value) == digest:
                    out.append((r, p, bytes(value), digest))
                else:
                    missed.append((r, p, digest, length))
            chosen = missed
        for r, p, _, length in chosen:
            budget[0] += length
            if self._fetched[(r, p)][1] >= MAX_FETCHES_PER_ROUND:
                self.drops.drop("digest_mismatch", p, f"its round {r} message is not the one its digest names")
        return out

    def _lookup(self, dht, keys: dict[str, tuple[int, str]], deadline: float, *, latest: bool
                ) -> dict[tuple[int, str], Any]:
        """The values of ``keys`` (key -> (round, peer)) that the key's peer signed, by (round, peer); in the
        order of ``keys``, 16 lookups at a time, until ``deadline``."""
        try:
            fut = dht.run_coroutine(partial(fetch_values, keys=list(keys), latest=latest,
                                            timeout=max(0.05, deadline - time.monotonic() - 0.05)), return_future=True)
            found = fut.result(timeout=max(0.1, deadline - time.monotonic() + 1.0))
        except Exception as err:
            self.counters.get_timeouts += 1
            log.debug("DHT reads failed: %s", err)
            return {}
        out = {}
        for key, entries in found.items():
            r, peer = keys[key]
            # honest peers' validators keep nothing under a peer's key that the peer did not sign
            value = next((v for sub, (v, _) in entries.items() if sender_peer_id(sub) == peer), None)
            if value is not None:
                out[(r, peer)] = value
        return out
