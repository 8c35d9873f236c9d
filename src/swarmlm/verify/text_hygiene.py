"""Text from peers, made safe to tokenize and train on: control tokens and invalid Unicode.

* :class:`ControlTokenFilter` removes a tokenizer's special and added tokens (EOS, padding, chat markers such
  as ``<|im_start|>``) **until none remain**: removing ``<|endoftext|>`` from ``<|endo<|endoftext|>ftext|>``
  must not leave a new ``<|endoftext|>`` behind. It removes them in one left-to-right pass with a stack
  (each kept character is pushed; whenever the kept text ends with a token, the token is popped), so the kept
  text never contains one, whatever the nesting, in time linear in the text. :meth:`ControlTokenFilter.check`
  then encodes the result and confirms that no special or added token id appears (a tokenizer whose
  normaliser maps other text onto a token is caught there); :meth:`ControlTokenFilter.find` only reports
  the first token present, for a caller that drops such records instead.
* :func:`invalid_unicode` finds a string that is not valid Unicode (a lone surrogate such as ``"\\ud800"`` is
  valid JSON but cannot be encoded, and a tokenizer raises on it) anywhere in a JSON value, keys included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def control_strings(tokenizer: "PreTrainedTokenizerBase") -> list[str]:
    """Every special token and every added token of ``tokenizer``, as text (longest first)."""
    found: set[str] = set(getattr(tokenizer, "all_special_tokens", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found.update(getattr(token, "content", str(token)) for token in decoder.values())
    found.update((getattr(tokenizer, "get_added_vocab", lambda: {})() or {}).keys())
    return sorted((s for s in found if s), key=lambda s: (-len(s), s))


def control_ids(tokenizer: "PreTrainedTokenizerBase") -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update((getattr(tokenizer, "added_tokens_decoder", None) or {}).keys())
    return {int(i) for i in ids if i is not None}


def strip_tokens(text: str, tokens: Iterable[str]) -> str:
    """``text`` with every occurrence of ``tokens`` removed, repeatedly, until none remains."""
    tokens = [t for t in tokens if t]
    if not tokens or not text:
        return text
    by_last: dict[str, list[str]] = {}
    for token in sorted(set(tokens), key=len, reverse=True):
        by_last.setdefault(token[-1], []).append(token)
    kept: list[str] = []
    for char in text:
        kept.append(char)
        candidates = by_last.get(char)
        if candidates is None:
            continue
        for token in candidates:
            n = len(token)
            if len(kept) >= n and kept[-1] == token[-1] and "".join(kept[-n:]) == token:
                del kept[-n:]
                break
    return "".join(kept)


def find_token(text: str, tokens: Iterable[str]) -> str | None:
    """The first of ``tokens`` that occurs in ``text``, or None."""
    for token in tokens:
        if token and token in text:
            return token
    return None


class ControlTokenFilter:
    """A tokenizer's control tokens, and the operations a node applies to peer text before tokenizing it."""

    def __init__(self, tokenizer: "PreTrainedTokenizerBase"):
        self.tokenizer = tokenizer
        self.tokens = control_strings(tokenizer)
        self.ids = control_ids(tokenizer)

    def strip(self, text: str) -> str:
        """``text`` with every control token removed until none remains."""
        return strip_tokens(text, self.tokens)

    def find(self, text: str) -> str | None:
        """The first control token present in ``text`` (for a caller that drops the record instead)."""
        return find_token(text, self.tokens)

    def check(self, text: str) -> bool:
        """True when encoding ``text`` yields no control-token id (run after :meth:`strip`)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return not any(i in self.ids for i in ids)

    def clean(self, text: str) -> str | None:
        """The stripped text, or None when its encoding still holds a control token (drop the record)."""
        stripped = self.strip(text)
        return stripped if self.check(stripped) else None


def is_valid_unicode(text: str) -> bool:
    """Whether ``text`` is a sequence of Unicode scalar values (no surrogate code points)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_unicode(value: Any, path: str = "", max_depth: int = 64) -> str | None:
    """The path of the first string (or dict key) in a JSON value that is not valid Unicode, else None.
    Paths look like ``metadata.rows[2]``; ``""`` is the value itself."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if not is_valid_unicode(item):
                return where or "<value>"
        elif depth >= max_depth:
            return where or "<value>"  # deeper than any record may be: treat as invalid
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not is_valid_unicode(key):
                    return (f"{where}.<key>" if where else "<key>")
                stack.append((child, child_path if is_valid_unicode(child_path) else "<key>", depth + 1))
        elif isinstance(item, (list, tuple)):
            for i, child in enumerate(item):
                stack.append((child, f"{where}[{i}]", depth + 1))
    return None
