"""Verifiable tasks (reasoning-gym), the answer format, and the verifier that scores untrusted text safely.

The names below are imported from their modules on first use (PEP 562), so that ``from swarmlm.tasks import
TaskConfig`` (as the command line's configs do) loads neither reasoning-gym nor the verifier's worker pool.
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
    "ControlTokenFilter": "text_hygiene", "invalid_unicode": "text_hygiene",
    "ScoreRequest": "verifier", "ScoreResult": "verifier", "Verifier": "verifier",
}


__getattr__ = lazy_exports(__name__, _HOME)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from swarmlm.tasks.prompts import build_prompt, extract_answer, format_answer
    from swarmlm.tasks.provenance import Provenance
    from swarmlm.tasks.reasoning_gym_tasks import (TASK_PRESETS, AllowedFamily, FamilySpec, Question, TaskConfig,
                                                   TaskSource, VerifierConfig, eval_questions)
    from swarmlm.tasks.text_hygiene import ControlTokenFilter, invalid_unicode
    from swarmlm.tasks.verifier import ScoreRequest, ScoreResult, Verifier

__all__ = ["TASK_PRESETS", "AllowedFamily", "ControlTokenFilter", "FamilySpec", "Provenance", "Question",
           "ScoreRequest", "ScoreResult", "TaskConfig", "TaskSource", "Verifier", "VerifierConfig", "build_prompt",
           "eval_questions", "extract_answer", "format_answer", "invalid_unicode"]
