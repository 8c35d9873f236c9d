"""The :class:`~swarmlm.sapo.transports.base.RolloutTransport` of the open swarm, over a hivemind DHT peer of
this node's own (see the package docstring for the key layout, and the sibling modules for each concern)."""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from swarmlm.sapo.records import DropCounter
from swarmlm.sapo.transports.base import Received, RolloutTransport
from swarmlm.sapo.transports.hivemind import require_hivemind
from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock, round_key
from swarmlm.sapo.transports.hivemind.dht_process import dht_class, read_dht_state, rejoin, routing_table_size
from swarmlm.sapo.transports.hivemind.identity import Identity, sender_peer_id
from swarmlm.sapo.transports.hivemind.validators import forget_validators, make_validators

log = logging.getLogger(__name__)


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
        #: where refusals and bad messages are counted; the volunteer process points this at its node's counter
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
        self._last_io = self._last_wait = 0.0  # the last collect: seconds reading the DHT, seconds waiting for peers
        self._next_rejoin, self._rejoin_delay = 0.0, 0.0
        try:
            dht = self._create_dht()
        except BootstrapError as err:
            if not self.initial_peers:
                raise
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
            fut = dht.run_coroutine(partial(read_dht_state, token=self._token), return_future=True)
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
        dht.run_coroutine(partial(rejoin, peer_ids=peer_ids), return_future=True)
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
                items.sort(key=lambda kv: sender_peer_id(kv[0]) not in self._live)
            for subkey, item in items:
                sender = sender_peer_id(subkey)
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
