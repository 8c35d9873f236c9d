"""One scoring worker process: scores answers and regenerates items under resource limits.

Started by :class:`swarmlm.verify.scoring_pool.ScoringPool` as ``python -m swarmlm.verify.scoring_worker PARENT_PID``.
It speaks line-delimited JSON on stdin/stdout (never pickle, so a worker cannot make its parent run code):

* first line in: ``{"families": {name: config}, "memory_mb": int, "cpu_seconds": float,
  "generate_cpu_seconds": float}``;
  first line out: ``{"ready": true}`` once every family's dataset is built and its scorer warmed up
  (or ``{"fatal": "..."}``);
* then one job per line, one result per line (see :func:`handle`).

Limits, set once the worker is warm:

* memory: ``RLIMIT_AS`` = the address space after start-up + ``memory_mb``; a ``MemoryError`` is reported
  as ``scorer_memory`` and the worker exits (its parent starts another);
* CPU: before each job ``ITIMER_PROF`` is armed with ``cpu_seconds`` (``generate_cpu_seconds`` for a job that
  regenerates an item); at expiry ``SIGPROF``'s default action terminates the process, even inside a long C
  call, and the parent reports ``scorer_timeout``;
* no new processes or threads (``RLIMIT_NPROC`` = 0), no file writes (``RLIMIT_FSIZE`` = 0);
* while a scorer runs, an audit hook (PEP 578) refuses ``compile``/``exec``/``eval`` of anything, ``open``, process,
  socket and ``ctypes`` events: a second wall behind the audit, in case a scorer thought safe evaluates text;
* the worker dies with its parent (``PR_SET_PDEATHSIG``), and exits when its stdin closes.

Everything the libraries print goes to /dev/null: stdout carries the protocol only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Callable

_BLOCKED_EVENTS = ("compile", "exec", "open", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.kill", "os.killpg", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                   "os.chmod", "os.chown", "os.truncate", "os.symlink", "os.link", "os.startfile", "os.putenv",
                   "os.unsetenv", "subprocess.Popen", "socket.", "ctypes.", "shutil.", "pty.", "webbrowser.",
                   "urllib.Request", "code.__new__", "function.__new__", "marshal.loads", "pickle.find_class",
                   "import")


class BlockedOperation(RuntimeError):
    """Raised by the audit hook when a scorer attempts something a scorer never needs."""


_guard = {"on": False}


def _audit_hook(event: str, args: tuple) -> None:
    if _guard["on"] and event.startswith(_BLOCKED_EVENTS):
        raise BlockedOperation(f"blocked {event} while scoring")


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); exit if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux: stdin EOF still ends the worker
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _address_space_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


class Worker:
    def __init__(self, families: dict[str, dict[str, Any]], cpu_seconds: float, generate_cpu_seconds: float | None = None):
        import reasoning_gym

        from swarmlm.tasks.provenance import DATASET_SIZE, TRAIN_SEED
        from swarmlm.verify.safe_scorers import scorer_for

        self.train_seed = TRAIN_SEED
        self.families = families
        self.cpu_seconds = cpu_seconds
        self.generate_cpu_seconds = generate_cpu_seconds or cpu_seconds
        self.scorers: dict[str, Callable] = {name: scorer_for(name) for name in families}
        # every training question comes from these datasets (one seed per family, see provenance.py), built once
        # here so that a regeneration only generates its item; scorers read the same datasets' configs
        self.scoring_datasets = {name: reasoning_gym.create_dataset(name, seed=TRAIN_SEED, size=DATASET_SIZE, **config)
                                 for name, config in families.items()}

    def warm_up(self) -> None:
        """Run every scorer once on a few answers before the audit hook is installed, so that first-call work
        (caches, imports inside library functions) is done. Items are not generated here: a family's generator
        may be slow for some configs, and generation runs under the per-job limits."""
        entry = {"question": "", "answer": "0", "metadata": {}}
        for name, dataset in self.scoring_datasets.items():
            for answer in ("0", None, "", "[[0]]", "1/2", "(P ∧ Q)"):
                try:
                    self.scorers[name](dataset, answer, entry)
                except Exception:
                    pass

    # ------------------------------------------------------------------ jobs
    def _score(self, family: str, entry: dict[str, Any], answers: list[Any]) -> tuple[list[float], int]:
        dataset, scorer = self.scoring_datasets[family], self.scorers[family]
        scores, errors = [], 0
        for answer in answers:
            if answer is not None and not isinstance(answer, str):
                answer = None
            _guard["on"] = True
            try:
                value = float(scorer(dataset, answer, entry))
            except MemoryError:
                raise
            except Exception:  # an answer the scorer chokes on earns nothing
                value, errors = 0.0, errors + 1
            finally:
                _guard["on"] = False
            scores.append(value if value == value and abs(value) != float("inf") else 0.0)
        return scores, errors

    def handle(self, job: dict[str, Any]) -> dict[str, Any]:
        """``{"op": "score", "family", "entry", "answers"}`` -> ``{"scores", "errors"}``;
        ``{"op": "generate", "family", "seed", "index", ["question", "answers"]}`` -> ``{"item"[, "forged"][, "scores",
        "errors"]}``: the receiver's own item, and when a question is given, whether it differs (``forged``)
        and, if it does not, the answers' scores against the regenerated item."""
        family = job.get("family")
        if family not in self.families:
            return {"ok": False, "reason": "foreign_family", "detail": str(family)[:32]}
        if job.get("op") == "score":
            entry = job.get("entry")
            if not isinstance(entry, dict):
                return {"ok": False, "reason": "scorer_error", "detail": "entry is not an object"}
            scores, errors = self._score(family, entry, list(job.get("answers") or []))
            return {"ok": True, "scores": scores, "errors": errors}
        if job.get("op") == "generate":
            if job.get("seed") != self.train_seed:  # the verifier refuses these first (bad_provenance)
                return {"ok": False, "reason": "bad_provenance", "detail": "not the training seed"}
            raw = self.scoring_datasets[family][int(job["index"])]
            item = {"question": raw["question"], "answer": raw.get("answer"), "metadata": raw.get("metadata") or {}}
            item = json.loads(json.dumps(item))  # what a peer would see: JSON types only
            out: dict[str, Any] = {"ok": True, "item": item}
            if job.get("question") is not None:
                out["forged"] = job["question"] != item["question"]
            if not out.get("forged") and job.get("answers") is not None:
                out["scores"], out["errors"] = self._score(family, item, list(job["answers"]))
            return out
        return {"ok": False, "reason": "scorer_error", "detail": "unknown op"}


def _set_limits(memory_mb: int) -> None:
    import resource

    limit = _address_space_bytes() + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    parent_pid = int(sys.argv[1])
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers end
    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # CPU deadline: terminate
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # reasoning-gym prints (bf's generator, tower_of_hanoi's scorer): never on the protocol
    sys.stdout = open(os.devnull, "w")
    requests = sys.stdin.buffer

    def reply(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message, ensure_ascii=True) + "\n")
        protocol.flush()

    try:
        settings = json.loads(requests.readline())
        worker = Worker(settings["families"], float(settings["cpu_seconds"]),
                        float(settings.get("generate_cpu_seconds") or settings["cpu_seconds"]))
        worker.warm_up()
        _set_limits(int(settings["memory_mb"]))
        sys.addaudithook(_audit_hook)
    except BaseException as err:  # noqa: BLE001 - tell the parent why, then stop
        reply({"fatal": f"{type(err).__name__}: {err}"[:2000]})
        raise SystemExit(1)
    os.dup2(devnull, 2)  # from here on, hostile input cannot make the worker write to the node's log
    reply({"ready": True})
    while True:
        line = requests.readline()
        if not line:
            return  # the parent closed our stdin
        try:
            job = json.loads(line)
            job_id = job.get("id")
        except (ValueError, AttributeError):
            reply({"id": None, "ok": False, "reason": "scorer_error", "detail": "malformed job"})
            continue
        generating = isinstance(job, dict) and job.get("op") == "generate"
        signal.setitimer(signal.ITIMER_PROF, worker.generate_cpu_seconds if generating else worker.cpu_seconds)
        try:
            result = worker.handle(job)
        except MemoryError:
            signal.setitimer(signal.ITIMER_PROF, 0)
            reply({"id": job_id, "ok": False, "reason": "scorer_memory", "detail": "memory limit"})
            os._exit(3)  # the heap may be in a poor state: let the parent start a fresh worker
        except RecursionError:
            result = {"ok": False, "reason": "scorer_error", "detail": "RecursionError"}
        except Exception as err:  # noqa: BLE001 - e.g. a generator that raises on this index
            result = {"ok": False, "reason": "scorer_error", "detail": f"{type(err).__name__}: {err}"[:200]}
        signal.setitimer(signal.ITIMER_PROF, 0)
        result["id"] = job_id
        reply(result)


if __name__ == "__main__":
    main()
