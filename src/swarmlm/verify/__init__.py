"""Verification: everything that reads text a node did not write itself, or scores what its policy wrote.

This package is the trust boundary. Peers' records arrive as untrusted bytes (:mod:`swarmlm.sapo.records` decodes
them, :mod:`swarmlm.sapo.intake` orders and caps them) and reach a score only through here:

- :mod:`~swarmlm.verify.verifier`: :class:`Verifier`, the one way a node scores text, its own completions and peers'
  alike; it regenerates a peer's question from its provenance with the node's own config, and never takes an
  answer from a peer;
- :mod:`~swarmlm.verify.scoring_pool` and :mod:`~swarmlm.verify.scoring_worker`: the worker processes that score,
  under CPU, wall-clock and memory limits and an audit hook that refuses ``compile``, ``exec``, ``open`` and
  process events;
- :mod:`~swarmlm.verify.scorer_audit`: the allow-list, every reasoning-gym family's audit (a family not audited is
  refused where it is configured);
- :mod:`~swarmlm.verify.safe_scorers` and :mod:`~swarmlm.verify.safe_parsing`: our exact, bounded scorers and parsers
  for the families whose reasoning-gym scorer evaluates text or gives full marks to a wrong answer;
- :mod:`~swarmlm.verify.text_hygiene`: control tokens and invalid Unicode in what is read.

A reasoning-gym upgrade or a new family is a change here, and a security review (``docs/security/``). Task streams,
prompts and provenance, which hold no untrusted text, are :mod:`swarmlm.tasks`.

The names below are imported from their modules on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmlm.runtime.lazy import lazy_exports

_HOME = {
    "ControlTokenFilter": "text_hygiene", "invalid_unicode": "text_hygiene",
    "ScoreRequest": "verifier", "ScoreResult": "verifier", "Verifier": "verifier",
}

__getattr__ = lazy_exports(__name__, _HOME)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from swarmlm.verify.text_hygiene import ControlTokenFilter, invalid_unicode
    from swarmlm.verify.verifier import ScoreRequest, ScoreResult, Verifier

__all__ = ["ControlTokenFilter", "ScoreRequest", "ScoreResult", "Verifier", "invalid_unicode"]
