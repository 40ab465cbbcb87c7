"""Helm's `--set` syntax, as `helm install --set` reads it (Helm v4.2.3, pkg/strvals/parser.go;
the values layering in pkg/cli/values/options.go), written for `gpu-operator sim up --helm --set`
and `gpu-operator images --set`.

What a user writes: `name=value` pairs separated by commas; dots between map keys (`a.b.c=v`);
`[N]` list indices (`a[0].b[1]=v`, 0..65536; a list is padded with nulls up to N); `{x,y}` lists;
a backslash takes the next character as it is (`a\\.b=1\\,2` sets the key `a.b` to `1,2`). A value
is typed as Helm types it: true/false and null (any case), decimal integers that do not start
with 0 (and 0 itself) within 64 bits; anything else is a string (`yes`, `0x10`, `1.5`, `07`).

Helm applies each `--set` onto the values of the `-f` files beneath it, so `env[0].name=x` changes
the first element of a list a file gave and keeps its other keys and elements; the chart's own
defaults are not beneath (a list set by index replaces the chart's default list, as in Helm).

Stricter than Helm on purpose: an empty key (`=3`, `a.=1`) and a key or index without a value
(`a.`, `a[0]`) are refused here, where Helm silently sets nothing (or an empty list); and a name
with more than 30 list indices (`a[0][0]...`, counted over the whole name), which Helm takes
(strvals limits each index to 65536 and the dots in a name to 30, not the indices), is refused
here, as its nesting would exhaust the parser's recursion. Whatever is refused is one line that
names the argument (cut to its first 60 characters and its length when longer than 100).
"""

from __future__ import annotations

import copy
import re
from typing import Any

MAX_INDEX = 65536  # strvals.MaxIndex
MAX_NESTING = 30  # strvals.MaxNestedNameLevel: dots in one name
MAX_LIST_NESTING = 30  # ours (Helm has none): list indices in one name
SHOWN = 100  # an argument longer than this is cut in messages
_INT = re.compile(r"[+-]?[0-9]+")


class SetSyntaxError(ValueError):
    """One `--set` argument Helm would not take (or would silently drop); the message names it and the fix."""


def scalar(text: str) -> Any:
    """A value as Helm types it (strvals typedVal)."""
    folded = text.casefold()  # Go's EqualFold: "falſe" is false too
    if folded in ("true", "false"):
        return folded == "true"
    if folded == "null":
        return None
    if text == "0":
        return 0
    if text[:1] not in ("", "0") and _INT.fullmatch(text) and -(2**63) <= int(text) < 2**63:
        return int(text)
    return text


class _Problem(Exception):
    """What is wrong and how to write it instead; apply() adds the argument."""


def _describe(value: Any) -> str:
    return "null" if value is None else f"the {type(value).__name__} {value!r}"


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def more(self) -> bool:
        return self.pos < len(self.text)

    def until(self, stops: str) -> tuple[str, str]:
        """The text up to the first character of `stops` (consumed) and that character, "" at the
        end; a backslash takes the next character as it is."""
        out: list[str] = []
        while self.more():
            char = self.text[self.pos]
            self.pos += 1
            if char in stops:
                return "".join(out), char
            if char == "\\":
                if not self.more():
                    break
                char = self.text[self.pos]
                self.pos += 1
            out.append(char)
        return "".join(out), ""

    def skip(self, char: str) -> bool:
        if self.text[self.pos : self.pos + 1] == char:
            self.pos += 1
            return True
        return False


def _value(reader: _Reader) -> Any:
    """After `=`: a `{x,y}` list or one scalar up to the next comma."""
    if not reader.skip("{"):
        return scalar(reader.until(",")[0])
    items: list[Any] = []
    while True:
        text, stop = reader.until(",}")
        if not stop:
            raise _Problem("a list has no closing '}': write it as {a,b}")
        items.append(scalar(text))
        if stop == "}":
            reader.skip(",")
            return items


def _index(reader: _Reader, name: str) -> int:
    text, stop = reader.until("]")
    if not stop:
        raise _Problem(f"{name}[ has no closing ']': write {name}[0]=VALUE")
    if not _INT.fullmatch(text):
        raise _Problem(f"the list index {text!r} of {name} is not a number: write {name}[0]=VALUE")
    if not 0 <= int(text) <= MAX_INDEX:
        raise _Problem(
            f"the list index {text} of {name} is outside 0..{MAX_INDEX} (Helm's limit): "
            f"give an index in that range, or the whole list as {name}={{a,b}}"
        )
    return int(text)


def _put(items: list[Any], index: int, value: Any) -> None:
    items.extend([None] * (index + 1 - len(items)))
    items[index] = value


def _key(reader: _Reader, data: dict[str, Any], where: str, nesting: int, lists: int = 0) -> None:
    key, stop = reader.until("=[,.")
    name = f"{where}.{key}" if where else key
    if not key:
        raise _Problem(f"an empty key name{f' after {where}' if where else ''}: name every key, e.g. a.b=1")
    if stop in ("", ","):
        raise _Problem(f"{name} has no value: write {name}=VALUE (pairs are separated by commas)")
    if stop == "=":
        data[key] = _value(reader)
    elif stop == ".":
        if nesting + 1 > MAX_NESTING:
            raise _Problem(f"{name} nests deeper than {MAX_NESTING} keys (Helm's limit): use a --values file")
        inner = data.get(key, {})
        if not isinstance(inner, dict):
            raise _Problem(
                f"{name} is {_describe(inner)} in the values beneath, not a map, so Helm cannot "
                f"set a key inside it: set {name} whole in a --values file"
            )
        _key(reader, inner, name, nesting + 1, lists)
        data[key] = inner
    else:  # "["
        _count_list(name, lists + 1)
        index = _index(reader, name)
        items = data.get(key, [])
        if not isinstance(items, list):
            raise _Problem(
                f"{name} is {_describe(items)} in the values beneath, not a list, so Helm cannot "
                f"set {name}[{index}]: set {name} whole, e.g. {name}={{a,b}}"
            )
        data[key] = _item(reader, items, index, name, nesting, lists + 1)


def _count_list(name: str, lists: int) -> None:
    if lists > MAX_LIST_NESTING:
        raise _Problem(
            f"{name} has more than {MAX_LIST_NESTING} list indices (this parser's limit; Helm's strvals has "
            "none for indices): set the value in a --values file"
        )


def _item(reader: _Reader, items: list[Any], index: int, where: str, nesting: int, lists: int) -> list[Any]:
    """What follows `where[index]`: `=value`, another `[N]`, or `.key...`."""
    name = f"{where}[{index}]"
    rest, stop = reader.until("[.=")
    if rest:
        raise _Problem(f"{rest!r} after {name}: write {name}=VALUE, {name}.KEY=VALUE or {name}[N]=VALUE")
    if not stop:
        raise _Problem(f"{name} has no value: write {name}=VALUE")
    current = items[index] if index < len(items) else None
    if stop == "=":
        _put(items, index, _value(reader))
    elif stop == "[":
        _count_list(name, lists + 1)
        inner_index = _index(reader, name)
        if current is not None and not isinstance(current, list):
            raise _Problem(
                f"{name} is {_describe(current)} in the values beneath, not a list, so Helm cannot "
                f"set {name}[{inner_index}]: set {name} whole in a --values file"
            )
        _put(items, index, _item(reader, current or [], inner_index, name, nesting, lists + 1))
    else:  # "." (an element that is not a map is replaced by one, as Helm does)
        inner = current if isinstance(current, dict) else {}
        _key(reader, inner, name, nesting, lists)
        _put(items, index, inner)
    return items


def apply(argument: str, beneath: dict[str, Any]) -> dict[str, Any]:
    """One `--set` argument applied onto `beneath` (the values of the files under it, unchanged):
    a new mapping. SetSyntaxError names the argument, what is wrong and how to write it."""
    if not argument:
        raise SetSyntaxError("--set '': empty: use KEY=VALUE, e.g. --set driver.enabled=false")
    values = copy.deepcopy(beneath)
    reader = _Reader(argument)
    try:
        while reader.more():
            _key(reader, values, "", 0)
    except _Problem as problem:
        raise SetSyntaxError(f"--set {_shown(argument)}: {_cut(str(problem), 300)}") from None
    return values


def _shown(argument: str) -> str:
    """The argument, quoted, as a message names it: cut to its start and its length when long."""
    return (
        repr(argument)
        if len(argument) <= SHOWN
        else f"{_cut(argument, SHOWN)!r} ({len(argument)} characters)"
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit * 3 // 5] + "..."
