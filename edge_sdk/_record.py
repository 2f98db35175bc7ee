"""``@frozen``: ``@dataclass(frozen=True)`` for the value classes read on every load, made cheap to define.

Python's ``dataclasses`` (3.10-3.12) writes each method it adds as source text and compiles it with its own
``exec``: six per frozen class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``,
``__delattr__``), about 0.9 ms a class on an AMD EPYC Zen 3, 36 ms for the 43 dataclasses a first ``load`` and
``predict_image`` import (``python tools/bench/bench_cold.py``; docs/benchmarks.md). ``@frozen`` lets ``dataclass``
write ``__init__`` alone (one ``exec``) and gives the class the other five as closures over its field names,
with the same behaviour:

* ``==`` compares instances of the same class field by field (``compare=True`` fields, in order), else
  ``NotImplemented``; ``hash`` hashes those fields; ``repr`` is ``Name(field=value!r, ...)``
  (``repr=True`` fields);
* assigning or deleting a field after ``__init__`` raises :class:`dataclasses.FrozenInstanceError`, as
  does setting or deleting any other attribute (``object.__setattr__`` still works in ``__post_init__``).

``dataclasses.fields``, ``replace``, ``asdict``, pickling and copying work as on any dataclass (it is one,
with ``__dataclass_params__.frozen`` False). mypy reads it as a frozen dataclass (``dataclass_transform``).
A class that defines one of these methods in its body keeps its own.

The price is paid per instance: the generated ``__init__`` sets each field through the ``__setattr__``
above (1.1 against 0.6 us for a 3-field class), so a class built per call or per frame (``ImageTransform``,
``BBox``, ``Detections``) stays a plain ``@dataclass(frozen=True)``.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kw: Any) -> Callable[[Any], Any]:
        return lambda f: f


__all__ = ["frozen"]

_T = TypeVar("_T", bound=type)
_FrozenInstanceError = dataclasses.FrozenInstanceError
_setattr = object.__setattr__


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function instance -> tuple of those attributes (a tuple for one name too, as dataclasses compares)."""
    if len(names) >= 2:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda self: (one(self),)
    return lambda self: ()


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: _T) -> _T:
    """``@dataclass(frozen=True)`` with one ``exec`` instead of six (see the module)."""
    own = set(cls.__dict__)
    dataclasses.dataclass(eq=False, repr=False)(cls)  # adds __init__ to cls itself (no slots)
    fields = dataclasses.fields(cls)
    names = frozenset(f.name for f in fields)
    cmp_key = _getter(tuple(f.name for f in fields if f.compare))
    hash_key = _getter(tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)))
    shown = tuple(f.name for f in fields if f.repr)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return cmp_key(self) == cmp_key(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hash_key(self))

    def __repr__(self: Any) -> str:
        return f"{self.__class__.__qualname__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")"

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if name in names and name not in self.__dict__:  # the generated __init__ setting a field, once
            _setattr(self, name, value)
            return
        raise _FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self: Any, name: str) -> None:
        raise _FrozenInstanceError(f"cannot delete field {name!r}")

    for fn in (__eq__, __hash__, __repr__, __setattr__, __delattr__):
        if fn.__name__ not in own:
            fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
            setattr(cls, fn.__name__, fn)
    return cls
