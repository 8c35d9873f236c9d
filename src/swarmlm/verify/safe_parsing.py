"""Hand-written, bounded parsers for answer text: nothing here ever evaluates Python or calls sympy.

Some reasoning-gym scorers pass the model's answer (or a dataset field) to ``eval`` or ``sympy.parse_expr``.
The safe scorers (:mod:`swarmlm.verify.safe_scorers`) use these parsers instead:

* :func:`parse_arithmetic` reads ``+ - * / ( )`` over decimal numbers by recursive descent and computes
  exactly with :class:`fractions.Fraction`, following sympy's rules for division by zero (``x/0`` is complex
  infinity, ``0/0`` is NaN) so that scores agree with reasoning-gym's on every answer a model writes.
* :func:`parse_python_literal` reads Python literals made of lists, tuples, integers, floats and strings
  (what ``eval`` would return for such text) and nothing else.

Every parser bounds its input length, nesting depth and item count, and the arithmetic bounds the size of
its numbers, so its time and memory are bounded by a small multiple of the input length. Anything outside
the grammar or the bounds raises :class:`ParseError`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Union


class ParseError(ValueError):
    """The text is not in the grammar, or exceeds a bound."""


# ----------------------------------------------------------------------------- arithmetic
class _Special:
    """sympy's non-finite results of exact arithmetic: complex infinity (``zoo``) and ``nan``."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


ZOO = _Special("zoo")  # sympy: 1/0
NAN = _Special("nan")  # sympy: 0/0, zoo - zoo, 0 * zoo, ...

Value = Union[Fraction, _Special]

ARITH_MAX_CHARS = 512
ARITH_MAX_DEPTH = 32
ARITH_MAX_BITS = 1024  # numerator and denominator of every intermediate result (2^1024 ~ 1.8e308)

_DIGITS = frozenset("0123456789")
_SPACE = frozenset(" \t")


def _bounded(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > ARITH_MAX_BITS or value.denominator.bit_length() > ARITH_MAX_BITS:
        raise ParseError("number too large")
    return value


def _add(a: Value, b: Value, sign: int) -> Value:
    if a is NAN or b is NAN:
        return NAN
    if a is ZOO and b is ZOO:
        return NAN
    if a is ZOO or b is ZOO:
        return ZOO
    return _bounded(a + b if sign > 0 else a - b)


def _mul(a: Value, b: Value) -> Value:
    if a is NAN or b is NAN:
        return NAN
    if a is ZOO or b is ZOO:
        other = b if a is ZOO else a
        return NAN if other == 0 else ZOO  # zoo * 0 = nan, zoo * x = zoo (x finite non-zero or zoo)
    return _bounded(a * b)


def _div(a: Value, b: Value) -> Value:
    if a is NAN or b is NAN:
        return NAN
    if b is ZOO:
        return NAN if a is ZOO else Fraction(0)
    if b == 0:
        return NAN if a == 0 else ZOO  # 0/0 = nan, x/0 = zoo (also zoo/0)
    if a is ZOO:
        return ZOO
    return _bounded(a / b)


def _neg(a: Value) -> Value:
    return a if isinstance(a, _Special) else -a


class _Cursor:
    """A position in a bounded text; subclasses say what whitespace they skip."""

    max_chars = 0

    def __init__(self, text: str):
        if len(text) > self.max_chars:
            raise ParseError(f"longer than {self.max_chars} characters")
        self.text = text
        self.pos = 0
        self.depth = 0

    def _skip(self) -> None:
        raise NotImplementedError

    def _peek(self) -> str:
        """The next character after whitespace, "" at the end."""
        self._skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _expect_end(self) -> None:
        if self._peek() != "":
            raise ParseError(f"unexpected {self.text[self.pos]!r} at {self.pos}")


class _ArithmeticParser(_Cursor):
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := ('+'|'-') factor | number | '(' expr ')' ; number := digits ['.' [digits]] | '.' digits.

    Spaces and tabs separate tokens anywhere; a newline only inside parentheses (as in Python)."""

    max_chars = ARITH_MAX_CHARS

    def __init__(self, text: str):
        super().__init__(text)
        self.parens = 0

    def parse(self) -> Value:
        value = self._expr()
        self._expect_end()
        return value

    def _skip(self) -> None:
        text = self.text
        while self.pos < len(text) and (text[self.pos] in _SPACE or (self.parens and text[self.pos] in "\r\n")):
            self.pos += 1

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > ARITH_MAX_DEPTH:
            raise ParseError("nested too deeply")

    def _expr(self) -> Value:
        value = self._term()
        while (op := self._peek()) in ("+", "-"):
            self.pos += 1
            value = _add(value, self._term(), 1 if op == "+" else -1)
        return value

    def _term(self) -> Value:
        value = self._factor()
        while (op := self._peek()) in ("*", "/"):
            self.pos += 1
            if self._peek() in ("*", "/"):  # ** and // are Python operators outside this grammar
                raise ParseError(f"operator {op}{self.text[self.pos]} is not supported")
            rhs = self._factor()
            value = _mul(value, rhs) if op == "*" else _div(value, rhs)
        return value

    def _factor(self) -> Value:
        self._enter()
        try:
            c = self._peek()
            if c in ("+", "-"):
                self.pos += 1
                inner = self._factor()
                return _neg(inner) if c == "-" else inner
            if c == "(":
                self.pos += 1
                self.parens += 1
                value = self._expr()
                if self._peek() != ")":
                    raise ParseError("missing ')'")
                self.parens -= 1
                self.pos += 1
                return value
            return self._number()
        finally:
            self.depth -= 1

    def _number(self) -> Fraction:
        text, start = self.text, self.pos
        end = start
        while end < len(text) and text[end] in _DIGITS:
            end += 1
        whole = end - start
        frac = 0
        if end < len(text) and text[end] == ".":
            end += 1
            while end < len(text) and text[end] in _DIGITS:
                end += 1
                frac += 1
        if whole == 0 and frac == 0:
            raise ParseError(f"expected a number at {start}")
        if end < len(text) and (text[end].isalnum() or text[end] in "_."):
            raise ParseError(f"malformed number at {start}")  # 1e5, 0x10, 1_000, 2x, 1.2.3
        token = text[start:end]
        if frac == 0 and "." not in token and len(token) > 1 and token[0] == "0" and token.strip("0"):
            raise ParseError("leading zeros in a decimal integer")  # as Python and sympy: 007 is an error
        self.pos = end
        return Fraction(token.rstrip(".") or "0")


def parse_arithmetic(text: str) -> Value:
    """The exact value of an arithmetic expression over decimal numbers with ``+ - * / ( )``.

    Returns a :class:`~fractions.Fraction`, or :data:`ZOO` / :data:`NAN` where sympy would (division by zero).
    Raises :class:`ParseError` for anything else: names, calls, ``**``, ``//``, exponents, juxtaposition
    (``2(3)``), over :data:`ARITH_MAX_CHARS` characters, nesting deeper than :data:`ARITH_MAX_DEPTH`, or a number
    wider than :data:`ARITH_MAX_BITS` bits.
    """
    if not isinstance(text, str):
        raise ParseError("not a string")
    return _ArithmeticParser(text.strip()).parse()


def arithmetic_to_float(value: Value) -> float:
    """``float()`` of a parsed value, as sympy does it: complex infinity cannot be converted (TypeError)."""
    if value is ZOO:
        raise TypeError("complex infinity has no float value")
    if value is NAN:
        return float("nan")
    return float(value)


def arithmetic_to_int(value: Value) -> int:
    """``int()`` of a parsed value, truncating towards zero as sympy does; non-finite values raise TypeError."""
    if isinstance(value, _Special):
        raise TypeError(f"cannot convert {value} to int")
    return int(value)


# ----------------------------------------------------------------------------- Python literals
LITERAL_MAX_CHARS = 65_536
LITERAL_MAX_DEPTH = 8
LITERAL_MAX_ITEMS = 20_000
_INT_MAX_DIGITS = 4300  # CPython's own limit on int() from a decimal string
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "\n": ""}
_NUMBER_CHARS = frozenset("0123456789.eE+-_")


class _LiteralParser(_Cursor):
    """value := list | tuple | string | number | ('+'|'-') number ;
    list := '[' [value (',' value)* [',']] ']' ; tuple := '(' ')' | '(' value ',' [value (',' value)* [',']] ')' ;
    a parenthesised single value is that value; at the top level, ``a, b`` is a tuple (as for ``eval``)."""

    max_chars = LITERAL_MAX_CHARS

    def __init__(self, text: str):
        super().__init__(text)
        self.items = 0
        self.brackets = 0

    def parse(self) -> Any:
        first = self._value()
        if self._peek() == ",":
            items = [first]
            while self._peek() == ",":
                self.pos += 1
                if self._peek() == "":
                    break
                items.append(self._value())
            first = tuple(items)
        self._expect_end()
        return first

    def _skip(self) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in " \t\f" or (c in "\r\n" and self.brackets):
                self.pos += 1
            elif c == "\\" and text.startswith("\\\n", self.pos):  # explicit line joining
                self.pos += 2
            else:
                break

    def _count(self) -> None:
        self.items += 1
        if self.items > LITERAL_MAX_ITEMS:
            raise ParseError(f"more than {LITERAL_MAX_ITEMS} items")

    def _value(self) -> Any:
        self._count()
        c = self._peek()
        if c in ("[", "("):
            return self._sequence(c)
        if c in ("'", '"'):
            return self._string(c)
        if c in ("+", "-"):
            negate = False
            while (c := self._peek()) in ("+", "-"):  # a run of signs, read without recursion
                negate ^= c == "-"
                self.pos += 1
            operand = self._value()
            if not isinstance(operand, (int, float)):
                raise ParseError("unary sign on a non-number")
            return -operand if negate else +operand
        return self._number()

    def _sequence(self, opener: str) -> Any:
        closer = "]" if opener == "[" else ")"
        self.depth += 1
        if self.depth > LITERAL_MAX_DEPTH:
            raise ParseError("nested too deeply")
        self.pos += 1
        self.brackets += 1
        items: list[Any] = []
        trailing_comma = False
        while True:
            c = self._peek()
            if c == closer:
                break
            if c == "":
                raise ParseError(f"missing {closer!r}")
            items.append(self._value())
            c = self._peek()
            if c == ",":
                self.pos += 1
                trailing_comma = True
                continue
            trailing_comma = False
            if c != closer:
                raise ParseError(f"expected ',' or {closer!r} at {self.pos}")
        self.pos += 1
        self.brackets -= 1
        self.depth -= 1
        if opener == "[":
            return items
        if len(items) == 1 and not trailing_comma:
            return items[0]  # (x) is x
        return tuple(items)

    def _string(self, quote: str) -> str:
        text = self.text
        if text.startswith(quote * 3, self.pos):
            raise ParseError("triple-quoted strings are not supported")
        i = self.pos + 1
        out: list[str] = []
        while True:
            if i >= len(text) or text[i] == "\n":
                raise ParseError("unterminated string")
            c = text[i]
            if c == quote:
                break
            if c == "\\":
                nxt = text[i + 1] if i + 1 < len(text) else ""
                if nxt not in _ESCAPES:
                    raise ParseError(f"unsupported escape \\{nxt}")
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            out.append(c)
            i += 1
        self.pos = i + 1
        return "".join(out)

    def _number(self) -> int | float:
        text, start = self.text, self.pos
        end = start
        while end < len(text) and (text[end] in _NUMBER_CHARS and (text[end] not in "+-" or text[end - 1] in "eE")):
            end += 1
        token = text[start:end]
        if not token or (end < len(text) and (text[end].isalnum() or text[end] == "_")):
            raise ParseError(f"expected a literal at {start}")
        if "_" in token:
            raise ParseError("digit separators are not supported")
        self.pos = end
        if token.isdigit():
            if len(token) > _INT_MAX_DIGITS:
                raise ParseError("integer too long")
            if len(token) > 1 and token[0] == "0" and token.strip("0"):
                raise ParseError("leading zeros in a decimal integer")  # as Python: 007 is a syntax error
            return int(token)
        mantissa, _, exponent = token.lower().partition("e")
        if not mantissa or mantissa == "." or mantissa.count(".") > 1 or not set(mantissa) <= set("0123456789."):
            raise ParseError(f"malformed number {token[:20]!r}")
        if "e" in token.lower() and not exponent.lstrip("+-").isdigit():
            raise ParseError(f"malformed exponent {token[:20]!r}")
        return float(token)


def parse_python_literal(text: str) -> Any:
    """What ``eval(text)`` returns when ``text`` is a literal of lists, tuples, ints, floats and strings.

    Raises :class:`ParseError` for anything else (names, calls, operators other than a sign, dicts, sets,
    bytes, f-strings, ``True``/``None``), or beyond :data:`LITERAL_MAX_CHARS` characters,
    :data:`LITERAL_MAX_DEPTH` levels of nesting or :data:`LITERAL_MAX_ITEMS` items.
    """
    if not isinstance(text, str):
        raise ParseError("not a string")
    return _LiteralParser(text.strip(" \t\f\r\n")).parse()
