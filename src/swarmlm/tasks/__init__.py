"""Verifiable tasks (reasoning-gym) and the answer format."""

from swarmlm.tasks.prompts import build_prompt, extract_answer, format_answer
from swarmlm.tasks.reasoning_gym_tasks import TASK_PRESETS, FamilySpec, Question, TaskConfig, TaskSource, eval_questions

__all__ = ["TASK_PRESETS", "FamilySpec", "Question", "TaskConfig", "TaskSource", "build_prompt", "eval_questions", "extract_answer", "format_answer"]
