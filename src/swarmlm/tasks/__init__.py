"""Verifiable tasks (reasoning-gym), the answer format, and the verifier that scores untrusted text safely."""

from swarmlm.tasks.prompts import build_prompt, extract_answer, format_answer
from swarmlm.tasks.provenance import Provenance
from swarmlm.tasks.reasoning_gym_tasks import (
    TASK_PRESETS,
    AllowedFamily,
    FamilySpec,
    Question,
    TaskConfig,
    TaskSource,
    VerifierConfig,
    eval_questions,
)
from swarmlm.tasks.text_hygiene import ControlTokenFilter, invalid_unicode
from swarmlm.tasks.verifier import ScoreRequest, ScoreResult, Verifier

__all__ = ["TASK_PRESETS", "AllowedFamily", "ControlTokenFilter", "FamilySpec", "Provenance", "Question",
           "ScoreRequest", "ScoreResult", "TaskConfig", "TaskSource", "Verifier", "VerifierConfig", "build_prompt",
           "eval_questions", "extract_answer", "format_answer", "invalid_unicode"]
