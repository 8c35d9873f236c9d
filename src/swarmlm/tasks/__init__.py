"""Verifiable tasks: reasoning-gym question streams and held-out sets, their provenance, and the answer format.

Trusted input only: what a node asks its own policy. Scoring text, the node's or a peer's, is
:mod:`swarmlm.verify`'s (the trust boundary); the only thing this package takes from it is the allow-list of
audited families (:mod:`swarmlm.verify.scorer_audit`), so that a task mix with an unaudited family is refused when
it is configured.

The names below are imported from their modules on first use (PEP 562), so that ``from swarmlm.tasks import
TaskConfig`` (as the command line's configs do) does not load reasoning-gym.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmlm.runtime.lazy import lazy_exports

_HOME = {
    "build_prompt": "prompts", "extract_answer": "prompts", "format_answer": "prompts",
    "Provenance": "provenance",
    "TASK_PRESETS": "reasoning_gym_tasks", "AllowedFamily": "reasoning_gym_tasks", "FamilySpec": "reasoning_gym_tasks",
    "Question": "reasoning_gym_tasks", "TaskConfig": "reasoning_gym_tasks", "TaskSource": "reasoning_gym_tasks",
    "VerifierConfig": "reasoning_gym_tasks", "eval_questions": "reasoning_gym_tasks",
}


__getattr__ = lazy_exports(__name__, _HOME)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from swarmlm.tasks.prompts import build_prompt, extract_answer, format_answer
    from swarmlm.tasks.provenance import Provenance
    from swarmlm.tasks.reasoning_gym_tasks import (TASK_PRESETS, AllowedFamily, FamilySpec, Question, TaskConfig,
                                                   TaskSource, VerifierConfig, eval_questions)

__all__ = ["TASK_PRESETS", "AllowedFamily", "FamilySpec", "Provenance", "Question", "TaskConfig", "TaskSource",
           "VerifierConfig", "build_prompt", "eval_questions", "extract_answer", "format_answer"]
