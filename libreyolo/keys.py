"""Typed key parsers and the Key record: what TrainConfig's fields and a family's own keys are made of.

A parser takes what a user wrote (a string from the command line, or a Python value) and returns the typed
value, or raises ValueError saying what the key accepts; the caller names the key in the error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

TRUE = {"true", "1", "yes", "on", "y", "t"}
FALSE = {"false", "0", "no", "off", "n", "f"}


def boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in TRUE | FALSE:
        return v.strip().lower() in TRUE
    raise ValueError("a boolean (true/false)")


def integer(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("an integer")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError("an integer") from None
    if f != int(f):
        raise ValueError("an integer")
    return int(f)


def number(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError("a number") from None


def text(v: Any) -> str:
    if v is None:
        raise ValueError("a string")
    return str(v)


def opt_text(v: Any) -> str | None:
    return None if v is None or (isinstance(v, str) and v.lower() in ("", "none", "null")) else str(v)


def choice(*options: str, aliases: dict[str, str] | None = None) -> Callable[[Any], str]:
    aliases = aliases or {}

    def parse(v: Any) -> str:
        s = str(v).strip()
        s = aliases.get(s.lower(), s)
        for o in options:
            if s.lower() == o.lower():
                return o
        raise ValueError("one of " + ", ".join(options + tuple(aliases)))

    return parse


def bool_or(*options: str, true_means: str | None = None) -> Callable[[Any], bool | str]:
    """A flag that is also one of a few named modes (cache=ram, cuda_graph=full)."""

    def parse(v: Any) -> bool | str:
        if isinstance(v, str) and v.strip().lower() in options:
            return v.strip().lower()
        try:
            b = boolean(v)
        except ValueError:
            raise ValueError("true, false or one of " + ", ".join(options)) from None
        return true_means if (b and true_means) else b

    return parse


def device(v: Any) -> str:
    """Normalise 'cpu', 0, '0,1', [0, 1], 'cuda:0', 'mps', 'auto' to a string; resolution happens later."""
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")
        return ",".join(str(integer(x)) for x in v)
    if isinstance(v, bool):
        raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")
    s = str(v).strip().strip("[]()").replace(" ", "").lower()
    if s in ("cpu", "auto", "mps", "cuda"):
        return s
    if s.startswith("cuda:") and s[5:].isdigit():
        return s[5:]
    parts = s.split(",")
    if parts and all(p.isdigit() for p in parts):
        return ",".join(parts)
    raise ValueError("cpu, auto, mps, a GPU index (0), a list (0,1) or cuda:N")


def batch(v: Any) -> int:
    b = integer(v)
    if b == 0 or b < -1:
        raise ValueError("a positive integer, or -1 for autobatch")
    return b


def positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def p(v: Any) -> Any:
        x = parse(v)
        if x <= 0:
            raise ValueError("a positive number")
        return x

    return p


def nonneg(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def p(v: Any) -> Any:
        x = parse(v)
        if x < 0:
            raise ValueError("a number >= 0")
        return x

    return p


def fraction(v: Any) -> float:
    """A number in 0..1 (a confidence or an IoU threshold)."""
    x = number(v)
    if not 0 <= x <= 1:
        raise ValueError("a number from 0 to 1")
    return x


def positive_or_auto(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A positive number, or "auto" (decided once the run's length is known)."""

    def p(v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        try:
            return positive(parse)(v)
        except ValueError:
            raise ValueError("a positive integer or auto") from None

    return p


def imgsz(v: Any) -> int:
    s = integer(v)
    if s < 32 or s % 32:
        raise ValueError("a multiple of 32, at least 32")
    return s


def workers(v: Any) -> int | None:
    if v is None or (isinstance(v, str) and v.lower() in ("auto", "none", "")):
        return None
    w = integer(v)
    if w < 0:
        raise ValueError("an integer >= 0, or auto")
    return w


def resume(v: Any) -> bool | str:
    if isinstance(v, str) and v.strip().lower() not in TRUE | FALSE:
        return v
    return boolean(v)


def freeze(v: Any) -> int | str:
    """freeze=: 0 (or false: nothing), a count N of the network's first top-level modules, or backbone."""
    if isinstance(v, str) and v.strip().lower() == "backbone":
        return "backbone"
    if v is False or (isinstance(v, str) and v.strip().lower() in FALSE):
        return 0
    n = -1 if isinstance(v, bool) else integer(v) if _is_integer(v) else -1
    if n < 0:
        raise ValueError("backbone or a number of modules (0: none)")
    return n


def _is_integer(v: Any) -> bool:
    try:
        integer(v)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Key:
    """One training key: TrainConfig's own fields are declared with `opt`, a family's own keys (its loss
    gains, say) with this record in `Family.keys`; both reach --help, the docs and the console form."""

    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str
    group: str = "loss"


def option(default: Any, parse: Callable[[Any], Any], help: str, group: str = "loss") -> Any:
    """A field of a family's typed keys (a dataclass of its own options: its loss gains, say): its default, the
    parser that types what a user writes, the one-line help (--help, the docs, the console form)."""
    return field(default=default, metadata={"parse": parse, "help": help, "group": group})


def key_list(cls: type) -> tuple[Key, ...]:
    """The Key records of a typed keys dataclass, in declaration order."""
    return tuple(
        Key(f.name, f.default, f.metadata["parse"], f.metadata["help"], f.metadata["group"]) for f in fields(cls)
    )
