"""The verifier a node scores with: safe scorers, in bounded worker processes, against items it regenerates.

    verifier = Verifier(config.tasks)                 # starts the worker pool (once per node)
    own = ScoreRequest(q.family, answers, entry=q.entry)                       # the node's own question
    verifier.score_completions(questions, texts)      # the same for completion texts of own questions
    peer = ScoreRequest(rec.family, answers, provenance=prov, question=rec.question)  # a peer's question
    results = verifier.score_many([own, peer, ...])   # one call per round: every group in one batch
    for r in results:
        if r.ok: ... r.scores ...                     # one score per answer; r.item is the regenerated question
        else: drops.drop(r.drop, sender, r.detail)
    verifier.close()

What it guarantees:

* **Never executes text.** Only families that passed the audit (:mod:`swarmlm.verify.scorer_audit`) are scored,
  each with reasoning-gym's scorer where it is safe and with ours (:mod:`swarmlm.verify.safe_scorers`) where it
  is not. A family outside the node's mix and its ``allow_families`` is dropped as ``foreign_family``.
* **Bounded.** Every job (a group's answers, or a regeneration and its scoring) runs in a worker process under
  ``VerifierConfig``'s CPU, wall-clock and memory limits: an overrun is dropped as ``scorer_timeout`` /
  ``scorer_memory`` (``scorer_error`` when the worker dies otherwise) and the batch goes on.
* **No peer decides what is correct.** A peer's question is regenerated from its provenance with the
  receiver's own config (``foreign_config`` otherwise; ``bad_provenance`` for seeds or indices outside the
  training streams) and scored against the receiver's own answer and metadata. A record whose question text
  differs from the regenerated one is dropped as ``forged_task``.

Results carry one score per answer. An answer on which a scorer raises scores 0 (``errors`` counts them).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import reasoning_gym

from swarmlm.config import ConfigError
from swarmlm.tasks.prompts import extract_answer
from swarmlm.tasks.provenance import Provenance, check_provenance, config_digest
from swarmlm.tasks.reasoning_gym_tasks import Question, TaskConfig, TaskSource
from swarmlm.verify.safe_scorers import scorer_for
from swarmlm.verify.scorer_audit import allowed_families, audit_of
from swarmlm.verify.scoring_pool import ScoringPool


DROP_REASONS = ("foreign_family", "foreign_config", "bad_provenance", "forged_task", "scorer_timeout",
                "scorer_memory", "scorer_error", "verify_budget")


def score_in_process(source: TaskSource, family: str, answer: str | None, entry: dict[str, Any]) -> float:
    """Reward for ``answer`` to a question of ``source`` (its ``entry``) with the safe scorer of ``family``, in this
    process, with no time or memory limit: for trusted answers only (tests, benchmarks, a reward function of
    TRL's); a node scores through :class:`Verifier`. Raises ValueError for a family ``source`` does not score."""
    return float(scorer_for(family)(source.dataset(family), answer, entry))


@dataclass
class ScoreRequest:
    """Answers to score for one question: either the node's own (``entry``) or a peer's (``provenance`` and the
    ``question`` text the record carried, compared with the regenerated one)."""

    family: str
    answers: list[str | None]
    entry: dict[str, Any] | None = None
    provenance: Provenance | None = None
    question: str | None = None


@dataclass
class ScoreResult:
    """One score per answer, or a drop reason (one of :data:`DROP_REASONS`) and a short detail."""

    scores: list[float] | None = None
    drop: str = ""
    detail: str = ""
    errors: int = 0  # answers on which the scorer raised (they score 0)
    item: Question | None = None  # provenance requests: the receiver's own regenerated question

    @property
    def ok(self) -> bool:
        return self.scores is not None

    def scores_or_zeros(self, n: int) -> list[float]:
        """The scores, a non-finite one as 0; ``n`` zeros for a request that was not scored."""
        if self.scores is None:
            return [0.0] * n
        return [s if math.isfinite(s) else 0.0 for s in self.scores]


@dataclass
class RegenerateResult:
    item: Question | None = None
    drop: str = ""
    detail: str = ""


@dataclass
class _Plan:
    """How one request is served: already decided (``result``), or by pool job ``job``."""

    result: ScoreResult | None = None
    job: int = -1
    answers: int = 0
    provenance: Provenance | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _question(family: str, item: dict[str, Any], provenance: Provenance) -> Question:
    return Question(family=family, question=item["question"], answer=item.get("answer"),
                    metadata=dict(item.get("metadata") or {}), provenance=provenance)


class Verifier:
    """Scores answers for the families of ``config`` (its mix and ``allow_families``) under ``config.verifier``."""

    def __init__(self, config: TaskConfig):
        self.config = config
        self.families = config.scored_families()
        for name in self.families:
            if audit_of(name).verdict == "refused":  # TaskConfig validation refuses these already
                raise ConfigError(f"family '{name}' is refused by the scorer audit; allowed: {', '.join(allowed_families())}")
            try:  # a bad dataset config is a config error here, not a worker that cannot start
                reasoning_gym.create_dataset(name, seed=0, size=1, **self.families[name])
            except Exception as err:
                raise ConfigError(f"tasks: the config of family '{name}' is invalid: {type(err).__name__}: {err}") from err
        self.digests = {name: config_digest(name, cfg) for name, cfg in self.families.items()}
        limits = config.verifier
        self._items: OrderedDict[Provenance, dict[str, Any]] = OrderedDict()
        self._item_cap = limits.item_cache
        self._lock = threading.Lock()  # one batch at a time (the pool serialises too)
        self.pool = ScoringPool(self.families, workers=limits.workers, cpu_seconds=limits.cpu_seconds,
                                generate_cpu_seconds=limits.generate_cpu_seconds,
                                wall_seconds=limits.wall_seconds, memory_mb=limits.memory_mb,
                                start_timeout=limits.start_timeout)

    # ------------------------------------------------------------------ lifecycle
    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the workers have started (the first batch waits for this anyway)."""
        self.pool.wait_ready(timeout)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def can_score(self, family: str) -> bool:
        return family in self.families

    # ------------------------------------------------------------------ item cache
    def _cached(self, provenance: Provenance) -> dict[str, Any] | None:
        item = self._items.get(provenance)
        if item is not None:
            self._items.move_to_end(provenance)
        return item

    def _remember(self, provenance: Provenance, item: dict[str, Any]) -> None:
        if self._item_cap <= 0:
            return
        self._items[provenance] = item
        self._items.move_to_end(provenance)
        while len(self._items) > self._item_cap:
            self._items.popitem(last=False)

    # ------------------------------------------------------------------ scoring
    def score_many(self, requests: list[ScoreRequest], deadline: float | None = None) -> list[ScoreResult]:
        """Score every request in one batch of pool jobs; one result per request, in order. With a ``deadline``
        (``time.monotonic()`` seconds) requests not scored by then are dropped (``verify_budget``,
        ``scorer_timeout``), in the order given: put the requests that matter most first."""
        with self._lock:
            return self._score_many(requests, deadline)

    def score_completions(self, questions: list[Question], completions: list[list[str]]) -> list[ScoreResult]:
        """Score completion texts of questions from this node's own task stream: each text's ``<answer>`` span (see
        :func:`~swarmlm.tasks.prompts.extract_answer`) against its question's entry; one result per question."""
        return self.score_many([ScoreRequest(q.family, [extract_answer(t) for t in texts], entry=q.entry)
                                for q, texts in zip(questions, completions)])

    def completion_scores(self, questions: list[Question], completions: list[list[str]]) -> list[list[float]]:
        """:meth:`score_completions` as plain scores: a question the verifier refused or timed out scores 0 for
        every completion (for callers that count no drops, such as the benchmarks)."""
        return [r.scores_or_zeros(len(texts)) for r, texts in zip(self.score_completions(questions, completions), completions)]

    def _score_many(self, requests: list[ScoreRequest], deadline: float | None) -> list[ScoreResult]:
        plans: list[_Plan] = []
        jobs: list[dict[str, Any]] = []

        def add_job(job: dict[str, Any], **extra: Any) -> _Plan:
            jobs.append(job)
            return _Plan(job=len(jobs) - 1, answers=len(job["answers"]), **extra)

        for req in requests:
            answers = [a if isinstance(a, str) or a is None else None for a in req.answers]
            if req.provenance is None:
                if req.family not in self.families:
                    plans.append(_Plan(ScoreResult(drop="foreign_family", detail=str(req.family)[:32])))
                elif not isinstance(req.entry, dict):
                    plans.append(_Plan(ScoreResult(drop="scorer_error", detail="no entry")))
                else:
                    plans.append(add_job({"op": "score", "family": req.family, "entry": req.entry, "answers": answers}))
                continue
            prov = req.provenance
            reason, detail = ("foreign_family", str(req.family)[:32]) if prov.family != req.family else check_provenance(prov, self.digests)
            if reason:
                plans.append(_Plan(ScoreResult(drop=reason, detail=detail)))
                continue
            item = self._cached(prov)
            if item is not None:
                if req.question is not None and req.question != item["question"]:
                    plans.append(_Plan(ScoreResult(drop="forged_task", detail=f"{prov.family}[{prov.index}]")))
                else:
                    plans.append(add_job({"op": "score", "family": prov.family, "entry": item, "answers": answers},
                                         provenance=prov, extra={"item": item}))
                continue
            plans.append(add_job({"op": "generate", "family": prov.family, "seed": prov.seed, "index": prov.index,
                                  "question": req.question, "answers": answers}, provenance=prov))

        outputs = self.pool.run(jobs, deadline) if jobs else []
        results = []
        for plan in plans:
            if plan.result is not None:
                results.append(plan.result)
                continue
            results.append(self._result(outputs[plan.job], plan))
        return results

    def _result(self, out: dict[str, Any], plan: _Plan) -> ScoreResult:
        if not out.get("ok"):
            reason = out.get("reason")
            return ScoreResult(drop=reason if reason in DROP_REASONS else "scorer_error", detail=str(out.get("detail", ""))[:120])
        prov = plan.provenance
        item_json = out.get("item", plan.extra.get("item"))
        item = None
        if prov is not None:
            if not isinstance(item_json, dict) or not isinstance(item_json.get("question"), str):
                return ScoreResult(drop="scorer_error", detail="malformed item")
            if "item" in out:
                self._remember(prov, item_json)
            item = _question(prov.family, item_json, prov)
            if out.get("forged"):
                return ScoreResult(drop="forged_task", detail=f"{prov.family}[{prov.index}]", item=item)
        scores = out.get("scores")
        if (not isinstance(scores, list) or len(scores) != plan.answers
                or not all(isinstance(s, (int, float)) for s in scores)):
            return ScoreResult(drop="scorer_error", detail="malformed scores", item=item)
        return ScoreResult(scores=[float(s) for s in scores], errors=int(out.get("errors", 0)), item=item)

    # ------------------------------------------------------------------ regeneration
    def regenerate(self, provenances: list[Provenance]) -> list[RegenerateResult]:
        """The receiver's own question, answer and metadata for each provenance (or the reason it refuses)."""
        with self._lock:
            return self._regenerate(provenances)

    def _regenerate(self, provenances: list[Provenance]) -> list[RegenerateResult]:
        results: list[RegenerateResult | None] = []
        jobs, owners = [], []
        for prov in provenances:
            reason, detail = check_provenance(prov, self.digests)
            if reason:
                results.append(RegenerateResult(drop=reason, detail=detail))
                continue
            item = self._cached(prov)
            if item is not None:
                results.append(RegenerateResult(item=_question(prov.family, item, prov)))
                continue
            results.append(None)
            owners.append((len(results) - 1, prov))
            jobs.append({"op": "generate", "family": prov.family, "seed": prov.seed, "index": prov.index})
        for (slot, prov), out in zip(owners, self.pool.run(jobs) if jobs else []):
            if out.get("ok") and isinstance(out.get("item"), dict) and isinstance(out["item"].get("question"), str):
                self._remember(prov, out["item"])
                results[slot] = RegenerateResult(item=_question(prov.family, out["item"], prov))
            else:
                reason = out.get("reason")
                results[slot] = RegenerateResult(drop=reason if reason in DROP_REASONS else "scorer_error",
                                                 detail=str(out.get("detail", ""))[:120])
        return results  # type: ignore[return-value]
