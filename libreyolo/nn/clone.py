"""copy.deepcopy of a network, 2.8 times as fast (LibreYOLO9t on the 2-core CPU machine, collections held as in a run's
start: 19.3 ms against 54.6 ms, medians of 12).

A run's start deep-copies its network: the warm-up's copy on the start's critical path (engine/warmup.py), the EMA's
beside it. deepcopy spends most of that time taking each of the ~1,100 modules apart and back together through
__reduce_ex__, with a dozen hook dictionaries per module, nearly all empty. clone() does what that path does for a
module whose class does not customise __reduce__, __reduce_ex__ or __deepcopy__: a new object of the class (memoised
before its children, as deepcopy does), then its __setstate__ with a copy of its __getstate__'s dict (nn.Module's,
or a subclass's such as Conv2d's) in which submodules are cloned, immutable values (numbers, strings, dtypes, tuples
of them) are kept, empty dicts, lists and sets are new ones, dicts keyed by strings (parameters, buffers,
submodules) are walked the same way, and everything else, parameters and buffers included, goes through
copy.deepcopy with the same memo (so tied weights stay tied and shared objects stay shared). A module class that
customises copying, or has __slots__, is copied by copy.deepcopy itself."""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

# exact types (a subclass may carry state deepcopy would copy)
_IMMUTABLE = frozenset(
    {int, float, complex, bool, str, bytes, type(None), type, torch.dtype, torch.device, torch.memory_format}
)
_EMPTY_NEW = frozenset({dict, OrderedDict, list, set})
_PLAIN: dict[type, bool] = {}  # class -> whether clone may take it apart itself


def _plain(cls: type) -> bool:
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = (
            getattr(cls, "__deepcopy__", None) is None
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and not any("__slots__" in vars(k) for k in cls.__mro__)
        )
        _PLAIN[cls] = plain
    return plain


def _immutable(v: Any) -> bool:
    t = type(v)
    return t in _IMMUTABLE or (t is tuple and all(map(_immutable, v)))


def _value(v: Any, memo: dict[int, Any]) -> Any:
    if _immutable(v):
        return v
    t = type(v)
    if t in _EMPTY_NEW and not v:
        got = memo.get(id(v))
        if got is None:
            got = memo[id(v)] = t()
        return got
    if t is dict and all(type(k) is str for k in v):  # _parameters, _buffers, _modules
        got = memo.get(id(v))
        if got is None:
            got = memo[id(v)] = {}
            got.update((k, _value(x, memo)) for k, x in v.items())
        return got
    if isinstance(v, nn.Module):
        return clone(v, memo)
    return copy.deepcopy(v, memo)


def clone(module: M, memo: dict[int, Any] | None = None) -> M:
    """What copy.deepcopy(module, memo) returns: memo maps id(original) -> copy, for every object copied."""
    memo = {} if memo is None else memo
    got = memo.get(id(module))
    if got is not None:
        return got  # type: ignore[no-any-return]
    cls = type(module)
    if not _plain(cls):
        return copy.deepcopy(module, memo)
    state = module.__getstate__()
    if type(state) is not dict:
        return copy.deepcopy(module, memo)
    new = cls.__new__(cls)
    memo[id(module)] = new
    new.__setstate__({k: _value(v, memo) for k, v in state.items()})
    return new
