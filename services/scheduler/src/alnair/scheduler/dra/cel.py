"""The subset of CEL device selectors the Alnair allocator evaluates; the rest is refused.

DeviceClasses and claim requests select devices with CEL over `device`. Alnair's DeviceClasses
use only conjunctions of comparisons, and so do the selectors users write against them in
practice ("this model", "at least this compute capability", "this much memory"):

    term ('&&' term)*
    term := 'device.driver' OP literal
          | 'device.attributes["<domain>"].<name>' OP literal   (also ["<name>"] indexing)
          | <attribute or capacity> '.isGreaterThan(' literal ')'   (also isLessThan)
          | <attribute or capacity> '.compareTo(' literal ')' OP integer
          | 'device.allowMultipleAllocations' OP bool
          | '(' term ')' | 'true'
    OP := == != < <= > >=;  literal := "string" | integer | true | false | quantity("..")
          | semver("..")

(`device.capacity["gpu.alnair.io"].memory.compareTo(quantity("40Gi")) >= 0` is CEL's way to
say "at least 40 GiB"; quantities and versions have no < operator in CEL.)

Anything else (||, functions, macros, lists) raises `UnsupportedSelector` naming the expression,
which the scheduler reports on the pod instead of guessing. A comparison with an attribute the
device lacks is false (CEL would raise "no such key"; upstream counts that as not matching).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from alnair.common.errors import InvalidValueError
from alnair.common.resources import parse_quantity

Value = str | int | bool | Decimal | tuple[int, ...]


class UnsupportedSelector(InvalidValueError):
    """A CEL expression outside the subset this allocator evaluates."""

    def __init__(self, expression: str, why: str) -> None:
        super().__init__(
            "CEL selector", expression, f"not supported by the Alnair allocator: {why}"
        )


@dataclass(frozen=True)
class DeviceView:
    """What a selector sees of a device: qualified attribute and capacity names."""

    driver: str
    attributes: Mapping[str, Value]
    capacity: Mapping[str, Decimal]
    allow_multiple: bool


Predicate = Callable[[DeviceView], bool]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<num>-?\d+)
      | (?P<op>==|!=|<=|>=|<|>|&&|\|\||[()\[\].!,])
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _tokens(expression: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = expression.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise UnsupportedSelector(expression, f"unexpected text at {text[pos : pos + 12]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def semver_tuple(value: str) -> tuple[int, ...]:
    parts = value.split("-", 1)[0].split(".")
    if not all(p.isdigit() for p in parts):
        raise InvalidValueError("semver", value, "not a semantic version")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


class _Parser:
    def __init__(self, expression: str, driver_domain: str) -> None:
        self.expression = expression
        self.toks = _tokens(expression)
        self.i = 0
        self.domain = driver_domain

    def fail(self, why: str) -> UnsupportedSelector:
        return UnsupportedSelector(self.expression, why)

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise self.fail("ends too early")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise self.fail(f"expected {want!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Predicate:
        pred = self.conjunction()
        if self.i != len(self.toks):
            raise self.fail(f"{self.toks[self.i][1]!r} (only && of comparisons)")
        return pred

    def conjunction(self) -> Predicate:
        terms = [self.term()]
        while self.peek() == "&&":
            self.take()
            terms.append(self.term())
        if self.peek() == "||":
            raise self.fail("|| (only && of comparisons)")
        return lambda d: all(t(d) for t in terms)

    def term(self) -> Predicate:
        if self.peek() == "(":
            self.take("(")
            inner = self.conjunction()
            self.take(")")
            return inner
        if self.peek() == "true":
            self.take()
            return lambda d: True
        getter = self.operand()
        if self.peek() == ".":
            return self.method(getter)
        op = self.take()[1]
        if op not in _OPS:
            raise self.fail(f"operator {op!r}")
        literal = self.literal()
        compare = _OPS[op]

        def pred(d: DeviceView) -> bool:
            value = getter(d)
            if value is None:
                return False
            try:
                return bool(compare(value, literal))
            except TypeError:
                return False  # comparing a string with a number: no match, as a CEL error is

        return pred

    def method(self, getter: Callable[[DeviceView], Value | None]) -> Predicate:
        """Quantities and versions compare through methods in CEL: isGreaterThan(x),
        isLessThan(x), compareTo(x) OP integer."""
        self.take(".")
        name = self.take()[1]
        self.take("(")
        arg = self.literal()
        self.take(")")
        if name == "isGreaterThan":
            compare, against = operator.gt, arg
        elif name == "isLessThan":
            compare, against = operator.lt, arg
        elif name == "compareTo":
            op = self.take()[1]
            if op not in _OPS:
                raise self.fail(f"operator {op!r}")
            bound = self.literal()
            cmp_op = _OPS[op]

            def by_compare(d: DeviceView) -> bool:
                value = getter(d)
                if value is None or type(value) is not type(arg):
                    return False
                sign = (value > arg) - (value < arg)  # type: ignore[operator]
                return bool(cmp_op(sign, bound))

            return by_compare
        else:
            raise self.fail(f"method {name}()")

        def pred(d: DeviceView) -> bool:
            value = getter(d)
            if value is None or type(value) is not type(against):
                return False
            return bool(compare(value, against))

        return pred

    def _key(self) -> str:
        if self.peek() == "[":
            self.take("[")
            kind, text = self.take()
            if kind != "str":
                raise self.fail("a map key must be a string")
            self.take("]")
            return text[1:-1]
        self.take(".")
        kind, text = self.take()
        if kind != "ident":
            raise self.fail(f"field {text!r}")
        return text

    def operand(self) -> Callable[[DeviceView], Value | None]:
        _, text = self.take()
        if text != "device":
            raise self.fail(f"{text!r} (only fields of `device`)")
        self.take(".")
        _, field = self.take()
        if field == "driver":
            return lambda d: d.driver
        if field == "allowMultipleAllocations":
            return lambda d: d.allow_multiple
        if field not in ("attributes", "capacity"):
            raise self.fail(f"device.{field}")
        domain = self._key()
        name = self._key()
        qualified = name if domain == self.domain else f"{domain}/{name}"
        if field == "attributes":
            return lambda d: d.attributes.get(qualified)
        return lambda d: d.capacity.get(qualified)

    def literal(self) -> Value:
        kind, text = self.take()
        if kind == "str":
            return bytes(text[1:-1], "utf-8").decode("unicode_escape")
        if kind == "num":
            return int(text)
        if text in ("true", "false"):
            return text == "true"
        if text in ("quantity", "semver"):
            self.take("(")
            k, arg = self.take()
            if k != "str":
                raise self.fail(f"{text}() takes a string")
            self.take(")")
            raw = arg[1:-1]
            try:
                return parse_quantity(raw) if text == "quantity" else semver_tuple(raw)
            except InvalidValueError as exc:
                raise self.fail(str(exc)) from exc
        raise self.fail(f"literal {text!r}")


def compile_selector(expression: str, driver: str) -> Predicate:
    """A predicate over devices of `driver` (whose domain unqualified names belong to)."""
    return _Parser(expression, driver).parse()
