"""A small pool of scoring worker processes, each job under a CPU, a wall-clock and a memory limit.

:class:`ScoringPool` starts its workers once (``python -m swarmlm.verify.scoring_worker``, so it works the same
in a plain process, a ``multiprocessing`` child, a daemon process or a ``torchrun`` rank) and reuses them.
:meth:`ScoringPool.run` takes a whole batch of jobs (e.g. a round's groups), hands one job at a time to each
idle worker and returns one result per job, in order. A job that overruns its limits costs only that job:

* CPU: the worker's ``ITIMER_PROF`` terminates it after ``cpu_seconds`` of CPU (``generate_cpu_seconds`` for a
  job that regenerates an item) -> ``scorer_timeout``;
* wall clock: the pool kills a worker whose job has run ``wall_seconds`` -> ``scorer_timeout``;
* memory: ``RLIMIT_AS`` -> ``scorer_memory``; any other death of a worker -> ``scorer_error``.

The dead worker is replaced at once and the batch goes on. Workers run in their own session (a terminal's
Ctrl+C does not reach them), die with their parent (``PR_SET_PDEATHSIG``), exit when their stdin closes, and
are killed by :meth:`ScoringPool.close`, which also runs at interpreter exit.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "NUMEXPR_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def _package_root() -> str:
    import swarmlm

    return str(Path(swarmlm.__file__).resolve().parent.parent)


class _Worker:
    def __init__(self, settings: bytes):
        env = dict(os.environ, **_WORKER_ENV)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swarmlm.verify.scoring_worker", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env, start_new_session=True,
            close_fds=True)
        self.buffer = bytearray()
        self.ready = False
        self.fatal = ""
        self.job: int | None = None  # index of the job it is running
        self.job_started = 0.0
        self.spawned = time.monotonic()
        self.proc.stdin.write(settings)
        self.proc.stdin.flush()
        os.set_blocking(self.proc.stdout.fileno(), False)

    @property
    def fd(self) -> int:
        return self.proc.stdout.fileno()

    def send(self, line: bytes) -> bool:
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def read_lines(self) -> tuple[list[bytes], bool]:
        """Complete lines available now, and whether the worker's stdout reached EOF."""
        eof = False
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
        lines = []
        while (cut := self.buffer.find(b"\n")) >= 0:
            lines.append(bytes(self.buffer[:cut]))
            del self.buffer[:cut + 1]
        return lines, eof

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:  # pragma: no cover - exited meanwhile
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def _shutdown(workers: list[_Worker], owner: int) -> None:
    if os.getpid() != owner:  # a forked copy of the node must not kill the node's workers
        return
    for worker in workers:
        worker.kill()


def _overrun_reason(returncode: int | None) -> tuple[str, str]:
    if returncode in (-signal.SIGPROF, -signal.SIGXCPU):
        return "scorer_timeout", "CPU limit"
    if returncode == -signal.SIGKILL:
        return "scorer_error", "worker killed"
    return "scorer_error", f"worker exited ({returncode})"


class ScoringPool:
    """Worker processes that run scoring and regeneration jobs for the given families and configs."""

    def __init__(self, families: dict[str, dict[str, Any]], *, workers: int = 2, cpu_seconds: float = 1.0,
                 generate_cpu_seconds: float = 5.0, wall_seconds: float = 10.0, memory_mb: int = 512,
                 start_timeout: float = 180.0):
        self.size = max(1, workers)
        self.wall_seconds = wall_seconds
        self.start_timeout = start_timeout
        self._settings = (json.dumps({"families": families, "memory_mb": memory_mb, "cpu_seconds": cpu_seconds,
                                      "generate_cpu_seconds": generate_cpu_seconds}) + "\n").encode("utf-8")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._failed_starts = 0
        self.restarts = 0  # workers replaced after an overrun or a crash
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, os.getpid())
        for _ in range(self.size):
            self._workers.append(_Worker(self._settings))

    # ------------------------------------------------------------------ lifecycle
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every worker has started (raises RuntimeError if they cannot)."""
        with self._lock:
            deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
            while not all(w.ready for w in self._workers):
                if time.monotonic() > deadline:
                    raise RuntimeError("scoring workers did not start in time")
                self._poll([], {}, max(0.0, min(0.5, deadline - time.monotonic())))

    def close(self) -> None:
        """Kill every worker. Idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "ScoringPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        if self._closed:
            return
        index = self._workers.index(worker)
        self._workers[index] = _Worker(self._settings)
        self.restarts += 1

    # ------------------------------------------------------------------ the batch loop
    def run(self, jobs: list[dict[str, Any]], deadline: float | None = None) -> list[dict[str, Any]]:
        """Run ``jobs`` (JSON objects, see :mod:`swarmlm.verify.scoring_worker`) and return their results in
        order. A job that overruns or kills its worker returns ``{"ok": False, "reason": ..., "detail": ...}``.
        With a ``deadline`` (``time.monotonic()`` seconds), the batch ends then: jobs not yet started return
        ``verify_budget`` and jobs still running are stopped (their workers replaced) as ``scorer_timeout``."""
        if self._closed:
            raise RuntimeError("the scoring pool is closed")
        with self._lock:
            try:
                return self._run(jobs, deadline)
            except BaseException:
                for worker in list(self._workers):  # e.g. Ctrl+C: a reply still due would not find its job
                    if worker.job is not None:
                        worker.job = None
                        self._replace(worker)
                raise

    def _run(self, jobs: list[dict[str, Any]], deadline: float | None) -> list[dict[str, Any]]:
        results: dict[int, dict[str, Any]] = {}
        pending = deque(range(len(jobs)))
        while len(results) < len(jobs):
            if deadline is not None and time.monotonic() >= deadline:
                self._stop_batch(pending, results)
                break
            for worker in self._workers:
                if worker.ready and worker.job is None and pending:
                    index = pending.popleft()
                    try:
                        line = json.dumps(dict(jobs[index], id=index), ensure_ascii=True).encode("ascii") + b"\n"
                    except (TypeError, ValueError) as err:  # e.g. metadata that is not JSON
                        results[index] = {"ok": False, "reason": "scorer_error", "detail": f"job is not JSON: {err}"[:120]}
                        continue
                    worker.job, worker.job_started = index, time.monotonic()
                    if not worker.send(line):
                        results[index] = {"ok": False, "reason": "scorer_error", "detail": "worker gone"}
                        worker.job = None
                        self._replace(worker)
            now = time.monotonic()
            busy = [w.job_started + self.wall_seconds - now for w in self._workers if w.job is not None]
            starting = [w.spawned + self.start_timeout - now for w in self._workers if not w.ready]
            left = [deadline - now] if deadline is not None else []
            timeout = max(0.0, min(busy + starting + left + [1.0]))
            self._poll(jobs, results, timeout)
        return [results[i] for i in range(len(jobs))]

    def _stop_batch(self, pending: deque, results: dict[int, dict[str, Any]]) -> None:
        """The batch's deadline passed: what has not started is not started, what runs is stopped."""
        while pending:
            results[pending.popleft()] = {"ok": False, "reason": "verify_budget", "detail": "the round's verification time is spent"}
        for worker in list(self._workers):
            if worker.job is not None:
                results[worker.job] = {"ok": False, "reason": "scorer_timeout", "detail": "stopped at the round's deadline"}
                worker.job = None
                self._replace(worker)

    def _poll(self, jobs: list[dict[str, Any]], results: dict[int, dict[str, Any]], timeout: float) -> None:
        selector = selectors.DefaultSelector()
        try:
            for worker in self._workers:
                selector.register(worker.fd, selectors.EVENT_READ, worker)
            events = selector.select(timeout)
        finally:
            selector.close()
        for key, _ in events:
            worker: _Worker = key.data
            lines, eof = worker.read_lines()
            for line in lines:
                self._on_message(worker, line, results)
            if eof and worker in self._workers:  # (a worker that said it exits is replaced already)
                self._on_exit(worker, results)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now - worker.job_started > self.wall_seconds:
                results[worker.job] = {"ok": False, "reason": "scorer_timeout", "detail": f"over {self.wall_seconds:g} s"}
                log.warning("scoring job over its wall-clock limit: worker %d replaced", worker.proc.pid)
                worker.job = None
                self._replace(worker)
            elif not worker.ready and now - worker.spawned > self.start_timeout:
                self._start_failed(worker, "did not start in time")

    def _on_message(self, worker: _Worker, line: bytes, results: dict[int, dict[str, Any]]) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            log.warning("scoring worker %d sent a malformed line", worker.proc.pid)
            return
        if not worker.ready:
            if message.get("ready") is True:
                worker.ready = True
                self._failed_starts = 0
            elif "fatal" in message:
                worker.fatal = str(message["fatal"])
            return
        if worker.job is not None and message.get("id") == worker.job:
            results[worker.job] = message
            worker.job = None
            if message.get("reason") == "scorer_memory":  # the worker exits after saying so: replace it now
                self._replace(worker)

    def _on_exit(self, worker: _Worker, results: dict[int, dict[str, Any]]) -> None:
        if not worker.ready:
            self._start_failed(worker, worker.fatal or f"exited ({worker.proc.wait()})")
            return
        returncode = worker.proc.wait()
        if worker.job is not None:
            reason, detail = _overrun_reason(returncode)
            results[worker.job] = {"ok": False, "reason": reason, "detail": detail}
            log.warning("scoring worker %d ended during a job (%s): replaced", worker.proc.pid, detail)
            worker.job = None
        self._replace(worker)

    def _start_failed(self, worker: _Worker, why: str) -> None:
        self._failed_starts += 1
        worker.kill()
        if self._failed_starts >= 3 * self.size:
            self.close()
            raise RuntimeError(f"scoring workers cannot start: {why}")
        self._workers[self._workers.index(worker)] = _Worker(self._settings)
