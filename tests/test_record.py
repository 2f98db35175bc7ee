"""edge_sdk._record.frozen behaves as @dataclass(frozen=True) does, for every operation the SDK's value
classes are put to (a twin made with dataclasses is the reference), with fewer compiled methods."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from edge_sdk._record import frozen
from edge_sdk.package.manifest import TensorSpec


def _body(ns: dict) -> None:
    ns["__annotations__"] = {"a": "int", "b": "str", "c": "tuple[int, ...]", "d": "list[int]", "e": "float"}
    ns["b"] = "x"
    ns["c"] = field(default=(), compare=False)
    ns["d"] = field(default_factory=list, repr=False, hash=False)
    ns["e"] = field(default=0.0, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_derived", self.a * 2)

    ns["__post_init__"] = __post_init__


def _pair() -> tuple[type, type]:
    ns: dict = {"__module__": __name__, "__qualname__": "Rec"}
    _body(ns)
    ours = frozen(type("Rec", (), dict(ns)))
    ns2: dict = {"__module__": __name__, "__qualname__": "Rec"}
    _body(ns2)
    ref = dataclass(frozen=True)(type("Rec", (), ns2))
    return ours, ref


Ours, Ref = _pair()
globals()["Rec"] = Ours  # pickle finds the class by its qualified name


def test_same_behaviour_as_a_frozen_dataclass() -> None:
    cases = [((1,), {}), ((1, "y"), {"c": (3,)}), ((2,), {"d": [1, 2], "e": 1.5}), ((1,), {"c": (9,)}), ((1,), {"e": 7.0})]
    made = [(Ours(*a, **k), Ref(*a, **k)) for a, k in cases]
    for o, r in made:
        assert repr(o) == repr(r)
        assert o._derived == r._derived
        assert [f.name for f in dataclasses.fields(o)] == [f.name for f in dataclasses.fields(r)]
        assert dataclasses.asdict(o) == dataclasses.asdict(r)
        assert dataclasses.astuple(o) == dataclasses.astuple(r)
    for (o1, r1) in made:
        for (o2, r2) in made:
            assert (o1 == o2) == (r1 == r2)
            assert (o1 != o2) == (r1 != r2)
            if r1 == r2:
                assert hash(o1) == hash(o2)
    assert made[0][0] == made[3][0] and made[0][0] != made[4][0]  # c does not count, e does
    assert hash(made[0][0]) == hash(Ours(1, e=99.0))  # e is compared but not hashed
    assert Ours(1).__eq__(Ref(1)) is NotImplemented and Ours(1) != Ref(1)
    assert Ours(1, d=[1]) == Ours(1, d=[1]) != Ours(1, d=[2])  # a list field compares, and is not hashed


def test_frozen_after_init() -> None:
    o = Ours(1)
    for name in ("a", "b", "new"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(o, name, 5)
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(o, name)
    assert o.a == 1 and not hasattr(o, "new")


def test_replace_pickle_copy() -> None:
    o = Ours(3, "z", c=(1,), d=[4])
    r = dataclasses.replace(o, a=4)
    assert (r.a, r.b, r.c, r.d, r._derived) == (4, "z", (1,), [4], 8) and o.a == 3
    for twin in (pickle.loads(pickle.dumps(o)), copy.copy(o), copy.deepcopy(o)):
        assert twin == o and twin is not o and twin._derived == 6
        with pytest.raises(dataclasses.FrozenInstanceError):
            twin.a = 1  # type: ignore[misc]


def test_sdk_value_class_keeps_its_dataclass_behaviour() -> None:
    t = TensorSpec(name="x", dtype="float32", shape=(1, 3))
    assert t == TensorSpec(name="x", dtype="float32", shape=(1, 3)) and t != dataclasses.replace(t, name="y")
    assert len({t, dataclasses.replace(t)}) == 1
    assert repr(t).startswith("TensorSpec(name='x', dtype='float32', shape=(1, 3)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.name = "y"  # type: ignore[misc]
