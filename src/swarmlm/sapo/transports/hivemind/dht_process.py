"""hivemind's DHT process, as a node runs it: it dies with its node, it takes commands of any size, and the
coroutines the node runs inside it (``DHT.run_coroutine``) to read its state or rejoin the swarm."""

from __future__ import annotations

import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

from swarmlm.sapo.transports.hivemind.keys import digest_key, message_digest, message_key
from swarmlm.sapo.transports.hivemind.validators import set_trusted, take_refusals

_DHT_CLASS: list[type] = []
_RUNNING: set = set()  # the coroutines running in this DHT process (see _OwnedDHT._run_coroutine)


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


def _log_coroutine_error() -> None:
    from hivemind.utils import get_logger

    get_logger("hivemind.dht.dht").exception("Caught an exception when running a coroutine:")


def dht_class():
    """hivemind's DHT process, which also exits (with its p2p daemon) when the node process dies, and
    which can receive commands of any size (see :class:`_BlockingReceiver`).

    Given ``storage_rules`` before it starts, it keeps what peers ask it to store within their storage budget,
    while the validators (which hivemind also runs on what it reads) check only the records' form.

    hivemind runs the DHT in a daemonic child process, but a SIGKILLed parent never reaps it: the
    orphan would keep the node's peer id alive, and the restarted node would find its identity taken. The
    coroutines the node runs in it are held until they end, and one that the shutdown interrupts ends quietly
    (``_run_coroutine``).
    """
    if _DHT_CLASS:
        return _DHT_CLASS[0]
    from hivemind import DHT

    class _OwnedDHT(DHT):
        async def _run_coroutine(self, coro, future) -> None:
            """hivemind's, with two changes. The task is held while it runs: hivemind keeps no reference to it, so
            a coroutine waiting on a future that nothing else holds (a ping whose connection the p2p layer
            dropped) was garbage-collected mid-flight, and logged as an error with a traceback. And a coroutine
            destroyed while pending (the DHT is shutting down under it) ends quietly: nobody waits for it. Any
            other exception is logged and handed to the caller, as before."""
            import asyncio

            task = asyncio.current_task()
            _RUNNING.add(task)
            try:
                future.set_result(await coro(self, self._node))
            except (GeneratorExit, asyncio.CancelledError):
                raise
            except BaseException as err:
                _log_coroutine_error()
                future.set_exception(err)
            finally:
                _RUNNING.discard(task)

        #: the node's swarm rules (:class:`.record_validators.SwarmRecordValidator`); when set, this DHT peer keeps
        #: records within their rules' storage budget (:class:`.record_validators.BudgetedStorage`)
        storage_rules = None

        def run(self) -> None:
            self._inner_pipe = _BlockingReceiver(self._inner_pipe)
            if self.storage_rules is not None:  # in this process only, which holds this one DHT peer
                from hivemind.dht import protocol

                from swarmlm.sapo.transports.hivemind.record_validators import BudgetedStorage

                protocol.DHTLocalStorage = partial(BudgetedStorage, self.storage_rules)
            parent = os.getppid()

            def watch() -> None:
                while True:
                    time.sleep(1.0)
                    if os.getppid() != parent:
                        _kill_children_and_exit()

            threading.Thread(target=watch, daemon=True, name="swarmlm-parent-watch").start()
            super().run()

    _DHT_CLASS.append(_OwnedDHT)
    return _OwnedDHT


async def read_dht_state(_dht, dht_node, token: str, trusted: list[str], max_peers: int
                         ) -> tuple[dict[str, int], list[str], int]:
    """Once per collect: hand the validators the peers this node trusts, and read back their refusals since the
    last call, the peer ids of the routing table (at most ``max_peers``) and the bytes the storage budget keeps."""
    set_trusted(token, trusted)
    refusals, kept = take_refusals(token)
    peers = [str(p.to_base58()) for p in list(dht_node.protocol.routing_table.uid_to_peer_id.values())[:max_peers]]
    return refusals, peers, kept


async def store_message(_dht, dht_node, run: str, round: int, peer_id: str, payload: bytes, expiration: float,
                        subkey: bytes, digest: bytes | None = None) -> bool:
    """Store ``peer_id``'s message of ``round``, then, once its stores have ended, its digest (:mod:`.keys`;
    ``digest`` overrides it, for tests of a lying peer): a reader who finds the digest finds the message too,
    wherever it was kept. The digest is stored whatever the message's store returned: hivemind reports the answer
    of the last peer asked, which may be one whose storage budget was full while others kept it. Returns whether
    both stores reported success."""
    stored = await dht_node.store(message_key(run, round, peer_id), payload, expiration, subkey=subkey)
    digest = message_digest(payload) if digest is None else digest
    stored_digest = await dht_node.store(digest_key(run, round, peer_id), digest, expiration, subkey=subkey)
    return bool(stored) and bool(stored_digest)


async def fetch_values(_dht, dht_node, keys: list[str], timeout: float, concurrency: int = 16, latest: bool = True
                       ) -> dict[str, dict[bytes, tuple[bytes, float]]]:
    """The dictionaries stored under ``keys`` (``{subkey: (value, expiration)}``), looked up one key per
    request so that a reply carries one peer's message and never approaches hivemind's reply limit. Keys
    not found within ``timeout`` seconds are left out. ``latest`` asks every peer near the key for the newest
    value (each that holds it sends it whole); otherwise the first value found is taken, this peer's own copy
    when it stores the key."""
    import asyncio

    limit = asyncio.Semaphore(concurrency)
    found: dict[str, dict[bytes, tuple[bytes, float]]] = {}

    async def one(key: str) -> None:
        async with limit:
            result = await dht_node.get(key, latest=latest)
        if result is None or not isinstance(result.value, dict):
            return
        found[key] = {sub: (item.value, float(item.expiration_time)) for sub, item in result.value.items()}

    tasks = [asyncio.create_task(one(k)) for k in keys]
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=max(0.01, timeout))
        for task in pending:
            task.cancel()
        for task in done:
            task.exception()  # a failed lookup is a key not found (retrieved, so that asyncio does not warn)
    return found


async def refresh_routing(_dht, dht_node, stale_seconds: float, timeout: float = 30.0) -> int:
    """Kademlia's bucket refresh: look up a random id in every bucket not updated for ``stale_seconds``, and this
    peer's own id, so that the routing table learns of peers it has not met yet (hivemind's own
    ``refresh_timeout`` passes a bare id where a list is expected, in 1.1.12). It ends within ``timeout`` seconds,
    whatever the peers do. Returns the table's size."""
    import asyncio
    import random

    from hivemind.dht.routing import DHTID
    from hivemind.utils import get_dht_time

    table = dht_node.protocol.routing_table
    threshold = get_dht_time() - stale_seconds
    queries = [DHTID(random.randint(b.lower, b.upper - 1)) for b in table.buckets if b.last_updated < threshold][:8]
    try:
        await asyncio.wait_for(dht_node.find_nearest_nodes(queries + [dht_node.node_id]), timeout)
    except asyncio.TimeoutError:
        pass  # what it learnt so far stays in the table
    return len(table.uid_to_peer_id)


async def routing_table_size(_dht, dht_node) -> int:
    """How many other peers this DHT peer knows."""
    return len(dht_node.protocol.routing_table.uid_to_peer_id)


async def rejoin(_dht, dht_node, peers: dict[str, list[str]], timeout: float = 10.0) -> int:
    """For a peer that lost every neighbour: dial its known peers again at the given addresses (``peer id ->
    multiaddrs``: its initial peers and its peer book's), ping them and, if one answers, look up this peer's
    neighbourhood anew. Each of the two steps ends within ``timeout`` seconds (a peer that accepts a connection
    and never answers cannot hold it). Returns how many peers answered."""
    import asyncio

    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    async def ping(peer: str, addrs: list[str]):
        peer_id = PeerID.from_base58(peer)
        try:  # the daemon may have forgotten them; hivemind has no public call for this (it uses it itself)
            await dht_node.protocol.p2p._client.connect(peer_id, [Multiaddr(a) for a in addrs])
        except Exception:
            pass
        return await dht_node.protocol.call_ping(peer_id)

    answers = await asyncio.gather(*(asyncio.wait_for(ping(p, a), timeout) for p, a in peers.items()),
                                   return_exceptions=True)
    answered = sum(1 for a in answers if a is not None and not isinstance(a, BaseException))
    if answered:
        try:
            await asyncio.wait_for(dht_node.find_nearest_nodes([dht_node.node_id]), timeout)
        except asyncio.TimeoutError:
            pass
    return answered
