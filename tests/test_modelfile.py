"""Tests for edge_sdk.package.modelfile: the dependency-free model-file inspector.

Real models are built with ``onnx.helper`` and checked two ways: against
expected values written out by hand, and against a reference computed from the
protobuf-parsed ``ModelProto`` (the same bytes through the real protobuf
parser).  Hostile inputs (truncations, random bytes, mutations, nesting bombs,
huge lengths) are checked differentially too: whenever protobuf rejects the
bytes the scanner must raise ModelFormatError, and whenever the scanner accepts
them it must report exactly what protobuf sees.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import subprocess
import sys
import textwrap
import time
import zipfile

import numpy as np
import onnx
import pytest
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from edge_sdk.errors import ModelFormatError
from edge_sdk.package import modelfile as mf
from edge_sdk.package.modelfile import (
    ExternalRef,
    OnnxInfo,
    TensorSig,
    inspect_tflite,
    scan_onnx,
    sniff_format,
)

# Messages of ModelFormatError raised where the scanner is deliberately stricter
# than protobuf (which would accept the bytes).
STRICT = re.compile(
    r"wire type [34] \(protobuf group\)|not valid UTF-8|deeper than max_depth"
    r"|repeats domain|repeats key|no 'location'|non-negative decimal"
)


# --- protobuf encoding helpers (to hand-craft hostile bytes) -------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def vf(field: int, value: int) -> bytes:
    """A varint field."""
    return varint(field << 3) + varint(value)


# --- model builders ---------------------------------------------------------------------


def _opsets(*extra):
    return [helper.make_opsetid("", 17), *extra]


def matmul_add_model() -> onnx.ModelProto:
    """Y = X @ W + B, plus an int64 input with an unnamed dynamic axis, an
    IR-3-style graph input that is also an initializer, and a com.microsoft node."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "W")
    b = numpy_helper.from_array(np.ones(3, dtype=np.float32), "B")
    scale = numpy_helper.from_array(np.ones(1, dtype=np.float16), "scale")
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [None, 7])
    scale_in = helper.make_tensor_value_info("scale", TensorProto.FLOAT16, [1])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3])
    z = helper.make_tensor_value_info("Z", TensorProto.INT64, None)  # unknown rank
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["XW"], name="mm"),
        helper.make_node("Add", ["XW", "B"], ["Y"], name="add"),
        helper.make_node("Identity", ["ids"], ["Z"], name="id"),
        helper.make_node("FusedThing", ["scale"], ["unused"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(nodes, "mm_add", [x, ids, scale_in], [y, z], [w, b, scale])
    model = helper.make_model(
        graph,
        opset_imports=_opsets(helper.make_opsetid("com.microsoft", 1)),
        producer_name="edge-sdk-tests",
    )
    model.ir_version = 8
    return model


def if_model() -> onnx.ModelProto:
    """An If whose branches hold Constant tensors (the then-branch nests a Loop-free
    second If, so a tensor sits two subgraphs deep)."""

    def const(name: str, value: float, out: str):
        t = numpy_helper.from_array(np.full((2, 2), value, dtype=np.float32), name)
        return helper.make_node("Constant", [], [out], value=t)

    out_vi = helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 2])
    inner_then = helper.make_graph([const("deep_then", 3.0, "r")], "inner_then", [], [out_vi])
    inner_else = helper.make_graph([const("deep_else", 4.0, "r")], "inner_else", [], [out_vi])
    then_g = helper.make_graph(
        [helper.make_node("If", ["cond"], ["r"], then_branch=inner_then, else_branch=inner_else)],
        "then",
        [],
        [out_vi],
    )
    else_g = helper.make_graph([const("else_c", 2.0, "r")], "else", [], [out_vi])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    res = helper.make_tensor_value_info("res", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["res"], then_branch=then_g, else_branch=else_g)],
        "if_graph",
        [cond],
        [res],
    )
    return helper.make_model(graph, opset_imports=_opsets())


def save_external(model: onnx.ModelProto, tmp_path, location: str, name="model.onnx") -> bytes:
    path = tmp_path / name
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
        convert_attribute=True,  # also the Constant tensors inside If branches
    )
    return path.read_bytes()


def everywhere_model() -> onnx.ModelProto:
    """External tensors in every place a TensorProto can sit (set by hand, so the
    bytes need not exist): sparse initializer, attribute t/tensors/sparse_tensor(s),
    a graph inside ``graphs``, a function body and default attribute, training info."""

    def ext(name: str, location: str, offset=None, length=None, dtype=np.float32):
        t = numpy_helper.from_array(np.zeros(2, dtype=dtype), name)
        set_external_data(t, location, offset, length)
        t.data_location = TensorProto.EXTERNAL
        t.ClearField("raw_data")
        return t

    def sparse(name: str, location: str):
        return helper.make_sparse_tensor(ext(name, location), ext(name + "_idx", location, dtype=np.int64), [4])

    sub = helper.make_graph(
        [helper.make_node("Constant", [], ["s"], value=ext("in_graphs", "g.bin", 0, 8))], "sub", [], []
    )
    weird = helper.make_node("Weird", [], ["w"], domain="custom")
    weird.attribute.extend(
        [
            helper.make_attribute("t", ext("attr_t", "a.bin", 16, 8)),
            helper.make_attribute("ts", [ext("attr_ts0", "a.bin"), ext("attr_ts1", "b.bin")]),
            helper.make_attribute("sp", sparse("attr_sp", "sp.bin")),
            helper.make_attribute("sps", [sparse("attr_sps", "sps.bin")]),
            helper.make_attribute("gs", [sub]),
        ]
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [weird, helper.make_node("MyFunc", ["x"], ["y"], domain="local")],
        "everywhere",
        [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[ext("init", "w.bin", 0, 8)],
        sparse_initializer=[sparse("sparse_init", "si.bin")],
    )
    fn_node = helper.make_node("Constant", [], ["c"], value=ext("fn_const", "fn.bin"))
    fn = helper.make_function(
        "local", "MyFunc", ["x"], ["y"], [fn_node, helper.make_node("Add", ["x", "c"], ["y"])],
        opset_imports=_opsets(),
    )
    fn.attribute_proto.append(helper.make_attribute("alpha", ext("fn_default", "fn.bin", 8)))
    model = helper.make_model(
        graph, opset_imports=_opsets(helper.make_opsetid("local", 1), helper.make_opsetid("custom", 2)),
        functions=[fn],
    )
    training = model.training_info.add()
    training.initialization.CopyFrom(
        helper.make_graph([helper.make_node("TrainOnly", [], ["t"])], "init", [], [],
                          initializer=[ext("train_init", "train.bin")])
    )
    return model


# --- reference: the same facts from protobuf's own parse ---------------------------------


class _StrictCase(Exception):
    """protobuf accepts the bytes but they hold something the scanner rejects on purpose."""


def _txt(value):
    """upb hands back proto2 strings that are not UTF-8 as bytes; the scanner rejects them."""
    if isinstance(value, bytes):
        raise _StrictCase(f"not UTF-8: {value!r}")
    return value


def _ref_tensor(t, refs):
    entries = {_txt(e.key): _txt(e.value) for e in t.external_data}
    if t.data_location == TensorProto.EXTERNAL and "location" not in entries:
        raise _StrictCase("EXTERNAL without location")
    if t.data_location == TensorProto.EXTERNAL or "location" in entries:
        for k in ("offset", "length"):
            if k in entries and not re.fullmatch(r"[0-9]+", entries[k]):
                raise _StrictCase(f"{k}={entries[k]!r}")  # int() may take it; the scanner does not
        num = lambda k: int(entries[k]) if k in entries else None  # noqa: E731
        refs.append(ExternalRef(_txt(t.name), entries["location"], num("offset"), num("length")))


def _ref_sparse(st, refs):
    _ref_tensor(st.values, refs)
    _ref_tensor(st.indices, refs)


def _ref_node(n, refs, ops):
    op_type, domain = _txt(n.op_type), _txt(n.domain)
    ops.add(op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}")
    for a in n.attribute:
        _ref_attr(a, refs, ops)


def _ref_attr(a, refs, ops):
    # in field-number order, which is file order for protobuf-serialized bytes
    if a.HasField("t"):
        _ref_tensor(a.t, refs)
    if a.HasField("g"):
        _ref_graph(a.g, refs, ops)
    for t in a.tensors:
        _ref_tensor(t, refs)
    for g in a.graphs:
        _ref_graph(g, refs, ops)
    if a.HasField("sparse_tensor"):
        _ref_sparse(a.sparse_tensor, refs)
    for st in a.sparse_tensors:
        _ref_sparse(st, refs)


def _ref_graph(g, refs, ops):
    for n in g.node:
        _ref_node(n, refs, ops)
    for t in g.initializer:
        _ref_tensor(t, refs)
    for st in g.sparse_initializer:
        _ref_sparse(st, refs)


def _ref_sig(vi) -> TensorSig:
    if vi.type.WhichOneof("value") != "tensor_type":
        return TensorSig(_txt(vi.name), 0, None, None)
    tt = vi.type.tensor_type
    dims = None
    if tt.HasField("shape"):
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else _txt(d.dim_param) if d.HasField("dim_param") else None
            for d in tt.shape.dim
        )
    return TensorSig(_txt(vi.name), tt.elem_type, mf.ONNX_DTYPE_NAMES.get(tt.elem_type), dims)


def reference(data: bytes):
    """("reject", None) when protobuf cannot parse the bytes, ("nograph", None)
    when it parses but has no graph, else ("ok", OnnxInfo)."""
    try:
        m = onnx.ModelProto.FromString(data)
    except DecodeError:
        return "reject", None
    if not m.HasField("graph"):
        return "nograph", None
    try:
        return "ok", _reference_info(m)
    except _StrictCase:
        return "strict", None


def _reference_info(m: onnx.ModelProto) -> OnnxInfo:
    refs: list[ExternalRef] = []
    ops: set[str] = set()
    g = m.graph
    _ref_graph(g, refs, ops)
    for t in m.training_info:
        _ref_graph(t.initialization, refs, set())
        _ref_graph(t.algorithm, refs, set())
    for fn in m.functions:
        for n in fn.node:
            _ref_node(n, refs, ops)
        for a in fn.attribute_proto:
            _ref_attr(a, refs, ops)
    init_names = {_txt(t.name) for t in g.initializer} | {_txt(st.values.name) for st in g.sparse_initializer}
    return OnnxInfo(
        ir_version=m.ir_version,
        opsets={("ai.onnx" if _txt(o.domain) in ("", "ai.onnx") else o.domain): o.version for o in m.opset_import},
        producer_name=_txt(m.producer_name),
        graph_name=_txt(g.name),
        inputs=tuple(_ref_sig(vi) for vi in g.input if vi.name not in init_names),
        outputs=tuple(_ref_sig(vi) for vi in g.output),
        external_data=tuple(refs),
        op_types=frozenset(ops),
        node_count=len(g.node),
    )


def _unordered(info: OnnxInfo) -> OnnxInfo:
    """Mutated bytes may carry fields out of field-number order; compare refs as a multiset."""
    return OnnxInfo(**{**info.__dict__, "external_data": tuple(sorted(info.external_data, key=repr))})


def check_against_protobuf(data: bytes, *, ordered: bool = True) -> str:
    """Scan ``data`` and hold the outcome against protobuf's.  Returns which case happened."""
    verdict, expected = reference(data)
    try:
        got = scan_onnx(data)
    except ModelFormatError as exc:
        if verdict in ("ok", "strict"):
            assert STRICT.search(str(exc)), f"protobuf accepts, scanner says: {exc}"
            return "strict"
        return verdict
    except Exception as exc:  # pragma: no cover - the point of the test
        pytest.fail(f"{type(exc).__name__} instead of ModelFormatError: {exc}")
    assert verdict == "ok", f"scanner accepted bytes protobuf calls {verdict!r}"
    if ordered:
        assert got == expected
    else:
        assert _unordered(got) == _unordered(expected)
    return "ok"


# --- signatures, opsets, op types ---------------------------------------------------------


def test_matmul_add_signature_opsets_and_ops():
    data = matmul_add_model().SerializeToString()
    info = scan_onnx(data)
    assert info.ir_version == 8
    assert info.producer_name == "edge-sdk-tests"
    assert info.graph_name == "mm_add"
    assert info.opsets == {"ai.onnx": 17, "com.microsoft": 1}
    # "scale" is listed as a graph input but is an initializer: not an input
    assert info.inputs == (
        TensorSig("X", 1, "float32", ("batch", 4)),
        TensorSig("ids", 7, "int64", (None, 7)),
    )
    assert info.outputs == (
        TensorSig("Y", 1, "float32", ("batch", 3)),
        TensorSig("Z", 7, "int64", None),
    )
    assert info.op_types == {"MatMul", "Add", "Identity", "com.microsoft.FusedThing"}
    assert info.node_count == 4
    assert info.external_data == ()
    assert check_against_protobuf(data) == "ok"


def test_accepts_bytes_bytearray_and_memoryview_alike():
    data = matmul_add_model().SerializeToString()
    info = scan_onnx(data)
    assert scan_onnx(bytearray(data)) == info
    assert scan_onnx(memoryview(data)) == info
    padded = b"\x00" * 5 + data
    assert scan_onnx(memoryview(padded)[5:]) == info
    with pytest.raises(TypeError):
        scan_onnx("not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        scan_onnx(memoryview(data)[::2])


def test_dtype_names_follow_numpy():
    for elem, name in mf.ONNX_DTYPE_NAMES.items():
        if elem == TensorProto.STRING:
            assert name == "string"  # numpy would say "object"
            continue
        assert name == np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name


def test_non_tensor_input_has_no_dtype():
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, [2])
    graph = helper.make_graph(
        [helper.make_node("SequenceLength", ["seq"], ["n"])],
        "g",
        [seq],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    info = scan_onnx(helper.make_model(graph, opset_imports=_opsets()).SerializeToString())
    assert info.inputs == (TensorSig("seq", 0, None, None),)
    assert info.outputs == (TensorSig("n", 7, "int64", ()),)  # scalar: rank 0


def test_if_model_ops_count_and_depth():
    data = if_model().SerializeToString()
    info = scan_onnx(data)
    assert info.op_types == {"If", "Constant"}
    assert info.node_count == 1  # the top-level If only
    assert info.inputs == (TensorSig("cond", 9, "bool", ()),)
    assert check_against_protobuf(data) == "ok"
    # deepest message: Model0 graph1 node2 attr3 graph4 node5 attr6 graph7 (inner branch)
    # output8 type9 tensor_type10 shape11 dim12
    assert scan_onnx(data, max_depth=12) == info
    with pytest.raises(ModelFormatError, match=r"g\.output\.type\.tensor_type\.shape\.dim at byte \d+ is nested deeper than max_depth=11"):
        scan_onnx(data, max_depth=11)


def test_max_depth_argument_is_validated():
    data = if_model().SerializeToString()
    for bad in (0, -1, mf.MAX_DEPTH_LIMIT + 1):
        with pytest.raises(ValueError):
            scan_onnx(data, max_depth=bad)
    with pytest.raises(TypeError):
        scan_onnx(data, max_depth=True)


def test_schema_matches_onnx_descriptors():
    """_SCHEMA lists exactly the message-typed and packable numeric fields of onnx.proto."""
    from google.protobuf.descriptor import FieldDescriptor as FD

    numeric = {
        FD.TYPE_INT64: "varints", FD.TYPE_INT32: "varints", FD.TYPE_UINT64: "varints",
        FD.TYPE_UINT32: "varints", FD.TYPE_BOOL: "varints", FD.TYPE_ENUM: "varints",
        FD.TYPE_SINT32: "varints", FD.TYPE_SINT64: "varints",
        FD.TYPE_FLOAT: "fixed32s", FD.TYPE_FIXED32: "fixed32s", FD.TYPE_SFIXED32: "fixed32s",
        FD.TYPE_DOUBLE: "fixed64s", FD.TYPE_FIXED64: "fixed64s", FD.TYPE_SFIXED64: "fixed64s",
    }
    seen: dict[str, dict[int, tuple[str, str]]] = {}
    todo = [onnx.ModelProto.DESCRIPTOR]
    while todo:
        desc = todo.pop()
        name = desc.full_name.removeprefix("onnx.")
        if name in seen:
            continue
        fields = {}
        for f in desc.fields:
            if f.message_type is not None:
                fields[f.number] = (f.name, f.message_type.full_name.removeprefix("onnx."))
                todo.append(f.message_type)
            elif f.is_repeated and f.type in numeric:
                fields[f.number] = (f.name, numeric[f.type])
        seen[name] = fields
    assert seen == mf._SCHEMA


# --- external data ------------------------------------------------------------------------


def test_external_data_saved_by_onnx_incl_subgraphs(tmp_path):
    model = matmul_add_model()
    data = save_external(model, tmp_path, "weights.bin")
    info = scan_onnx(data)
    assert {r.tensor_name for r in info.external_data} == {"W", "B", "scale"}
    assert {r.location for r in info.external_data} == {"weights.bin"}
    size = (tmp_path / "weights.bin").stat().st_size
    for ref in info.external_data:
        assert ref.offset is not None and ref.length is not None
        assert ref.offset + ref.length <= size
    assert check_against_protobuf(data) == "ok"

    data = save_external(if_model(), tmp_path, "if.bin", name="if.onnx")
    info = scan_onnx(data)
    # the Constant tensors sit one and two subgraphs deep
    assert sorted(r.tensor_name for r in info.external_data) == ["deep_else", "deep_then", "else_c"]
    assert check_against_protobuf(data) == "ok"


def test_external_location_outside_is_reported_verbatim(tmp_path):
    """onnx.save_model refuses a location containing '..', so save the model
    normally and then point its references one directory up, as a hostile
    package would."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    with pytest.raises(Exception, match=r"contains '\.\.'"):
        save_external(matmul_add_model(), pkg, "../outside.bin")
    model = onnx.ModelProto.FromString(save_external(matmul_add_model(), pkg, "outside.bin"))
    (pkg / "outside.bin").rename(tmp_path / "outside.bin")
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = "../outside.bin"
    data = model.SerializeToString()
    info = scan_onnx(data)
    assert check_against_protobuf(data) == "ok"
    assert {r.location for r in info.external_data} == {"../outside.bin"}
    assert len(info.external_data) == 3


def test_external_data_found_everywhere():
    model = everywhere_model()
    data = model.SerializeToString()
    info = scan_onnx(data)
    assert check_against_protobuf(data) == "ok"  # same refs, same order as protobuf
    by_name = {r.tensor_name: r for r in info.external_data}
    assert set(by_name) == {
        "attr_t", "attr_ts0", "attr_ts1", "attr_sp", "attr_sp_idx", "attr_sps", "attr_sps_idx",
        "in_graphs", "init", "sparse_init", "sparse_init_idx",  # graph + attributes + graphs
        "fn_const", "fn_default",  # function body and default attribute
        "train_init",  # training_info graph
    }
    assert by_name["attr_t"] == ExternalRef("attr_t", "a.bin", 16, 8)
    assert by_name["fn_default"] == ExternalRef("fn_default", "fn.bin", 8, None)
    assert by_name["in_graphs"] == ExternalRef("in_graphs", "g.bin", 0, 8)
    # sparse initializer is not a graph input; the function call and custom op show their domain
    assert info.inputs == (TensorSig("x", 1, "float32", (2,)),)
    assert info.op_types == {"custom.Weird", "Constant", "local.MyFunc", "Add"}
    assert "TrainOnly" not in info.op_types
    assert info.opsets == {"ai.onnx": 17, "local": 1, "custom": 2}


def test_graph_split_in_two_chunks_is_merged_like_protobuf():
    """protobuf merges a repeated singular field: an external tensor hidden in a
    first ``graph`` chunk must still be reported."""
    model = everywhere_model()
    g1 = onnx.GraphProto()
    g1.initializer.extend(model.graph.initializer)
    g2 = onnx.GraphProto()
    g2.CopyFrom(model.graph)
    del g2.initializer[:]
    data = ld(7, g1.SerializeToString()) + ld(7, g2.SerializeToString()) + b"".join(
        ld(8, o.SerializeToString()) for o in model.opset_import
    )
    info = scan_onnx(data)
    assert "init" in {r.tensor_name for r in info.external_data}
    assert check_against_protobuf(data, ordered=False) == "ok"


# --- hostile inputs -----------------------------------------------------------------------


def _tensor(*fields: bytes) -> bytes:
    return b"".join(fields)


def _graph_with_tensor(tensor: bytes) -> bytes:
    return ld(7, ld(5, tensor))


def _nest_bomb(levels: int) -> bytes:
    """graph{node{attribute{g: graph{node{...}}}}} ``levels`` subgraphs deep."""
    inner = b""
    for _ in range(levels):
        inner = ld(1, ld(5, ld(6, inner)))  # node.attribute.g
    return ld(7, inner)


def _type_bomb(levels: int) -> bytes:
    """TypeProto.sequence_type.elem_type... -- nested types the scanner only checks."""
    t = b""
    for _ in range(levels):
        t = ld(4, ld(1, t))
    return ld(7, ld(11, ld(1, b"x") + ld(2, t)))


def _unknown_bomb(levels: int) -> bytes:
    """An unknown field (99) nesting itself: skipped by length, never entered."""
    inner = b""
    for _ in range(levels):
        inner = ld(99, inner)
    return ld(7, ld(2, b"g") + inner)


HOSTILE = [
    # (id, bytes, regex the ModelFormatError message must match)
    # nothing at all
    ("empty", b"", r"empty file"),
    # a valid ModelProto holding only ir_version: protobuf parses it, but there is no graph
    ("only-ir-version", vf(1, 8), r"no graph \(ModelProto field 7\) in 2 bytes"),
    # ir_version tag with its value cut off
    ("truncated-value", b"\x08", r"truncated varint \(value of field 1 in ModelProto\) at byte 1"),
    # a value whose continuation bits run to end of file
    ("truncated-multibyte", b"\x08\x80\x80", r"truncated varint .* at byte 1: .* ends at byte 3"),
    # the tag varint itself is cut
    ("truncated-tag", b"\x80", r"truncated varint \(field tag in ModelProto\) at byte 0"),
    # an 11-byte varint (protobuf allows 10)
    ("varint-11-bytes", b"\x08" + b"\xff" * 10 + b"\x01", r"at byte 1 is longer than 10 bytes"),
    # a tag above 2**32 (field number overflow)
    ("tag-over-32-bits", b"\xff\xff\xff\xff\x7f", r"tag at byte 0 .* does not fit in a 5-byte varint32"),
    # a small tag zero-padded to 6 bytes; protobuf rejects it as well
    ("tag-6-bytes", b"\x88\x80\x80\x80\x80\x00\x01:\x00", r"tag at byte 0 .* 5-byte varint32"),
    # tag 0
    ("field-zero", b"\x00", r"invalid field number 0 at byte 0 in ModelProto"),
    # field 0 with wire type 2, after a valid field
    ("field-zero-ld", vf(1, 3) + b"\x02\x00", r"invalid field number 0 at byte 2"),
    # start-group: protobuf would skip an unknown group, ONNX never writes one
    ("group-start", b"\x0b", r"field 1 at byte 0 .* wire type 3 \(protobuf group\)"),
    # stray end-group
    ("group-end", b"\x0c", r"wire type 4 \(protobuf group\)"),
    # reserved wire type 6
    ("wire-6", b"\x0e", r"invalid wire type 6"),
    # reserved wire type 7 on the graph field
    ("wire-7", b"\x3f", r"field 7 at byte 0 in ModelProto has invalid wire type 7"),
    # graph declares 5 bytes, 3 follow
    ("ld-past-end", b":\x05abc", r"field 7 at byte 0 in ModelProto declares 5 bytes but only 3 remain before byte 5"),
    # graph declares 2**62 bytes: rejected by arithmetic, nothing allocated
    ("huge-length", b":" + varint(2**62), r"declares 4611686018427387904 bytes but only 0 remain"),
    # graph declares 2**64-1 bytes (largest 10-byte varint)
    ("max-varint-length", b":" + b"\xff" * 9 + b"\x01", r"declares 18446744073709551615 bytes"),
    # fixed64 field with 2 of its 8 bytes
    ("fixed64-cut", b"\x09\x00\x00", r"fixed64 field 1 at byte 0 .* needs 8 bytes but only 2 remain"),
    # fixed32 field with 1 of its 4 bytes
    ("fixed32-cut", vf(1, 1) + b"\x0d\x00", r"fixed32 field 1 at byte 2 .* needs 4 bytes but only 1 remain"),
    # a node claims more bytes than its graph holds, although the file has them
    ("nested-overrun", ld(7, b"\x0a\x05") + b"abcde", r"field 1 at byte 2 in ModelProto.graph declares 5 bytes but only 0 remain before byte 4"),
    # If-in-If-in-If... 10 000 subgraphs deep (30 000 message levels)
    ("subgraph-bomb", _nest_bomb(10_000), r"ModelProto.graph.node.attribute.g.*nested deeper than max_depth=64"),
    # TypeProto sequence-of-sequence-of... 10 000 deep, in a part that is only checked
    ("type-bomb", _type_bomb(10_000), r"sequence_type.*deeper than max_depth=64"),
    # producer_name is not UTF-8 (protobuf's proto2 parser would pass it through)
    ("bad-utf8-producer", ld(2, b"\xff\xfe") + ld(7, b""), r"producer_name at bytes 2..4 is not valid UTF-8"),
    # op_type ends in half a UTF-8 sequence
    ("bad-utf8-op-type", ld(7, ld(1, ld(4, b"A\xc3"))), r"op_type at bytes 6..8 is not valid UTF-8"),
    # packed initializer dims whose last varint is cut (protobuf checks packed lists)
    ("packed-dims-cut", _graph_with_tensor(ld(1, b"\x02\x80")), r"truncated varint in packed .*initializer.dims ending at byte 8"),
    # packed float_data of 6 bytes, not whole floats
    ("packed-floats-odd", _graph_with_tensor(ld(4, b"\x00" * 6)), r"float_data at byte 6 is 6 bytes, not a multiple of 4"),
    # data_location=EXTERNAL but no location: the runtime would fail, say so now
    ("ext-no-location", _graph_with_tensor(ld(8, b"w") + vf(14, 1)), r"tensor 'w' .* data_location=EXTERNAL but no 'location'"),
    # external offset that is not a plain non-negative decimal
    ("ext-bad-offset", _graph_with_tensor(ld(8, b"w") + vf(14, 1) + ld(13, ld(1, b"location") + ld(2, b"x.bin")) + ld(13, ld(1, b"offset") + ld(2, b"-5"))),
     r"'offset' must be a non-negative decimal integer, got '-5'"),
    # two locations for one tensor: which one would the runtime use?
    ("ext-dup-location", _graph_with_tensor(vf(14, 1) + ld(13, ld(1, b"location") + ld(2, b"a")) + ld(13, ld(1, b"location") + ld(2, b"../b"))),
     r"repeats key 'location'"),
    # default domain imported twice ("" and "ai.onnx") with different versions
    ("dup-opset", ld(7, b"") + ld(8, vf(2, 17)) + ld(8, ld(1, b"ai.onnx") + vf(2, 9)), r"repeats domain 'ai.onnx' \(versions 17 and 9\)"),
]


@pytest.mark.parametrize("data, message", [pytest.param(d, m, id=i) for i, d, m in HOSTILE])
def test_hostile_table(data, message):
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match=message):
        scan_onnx(data)
    assert time.perf_counter() - t0 < 1.0
    assert sniff_format(data) == "unknown"
    check_against_protobuf(data)  # protobuf rejects it too, or it is one of the STRICT cases


@pytest.mark.parametrize("bomb", [_nest_bomb, _type_bomb])
def test_bombs_at_the_highest_max_depth_do_not_exhaust_the_stack(bomb):
    with pytest.raises(ModelFormatError, match=rf"deeper than max_depth={mf.MAX_DEPTH_LIMIT}"):
        scan_onnx(bomb(10_000), max_depth=mf.MAX_DEPTH_LIMIT)


def test_unknown_field_bomb_is_skipped_not_entered():
    data = _unknown_bomb(50_000)
    info = scan_onnx(data)
    assert info.graph_name == "g"
    assert check_against_protobuf(data) == "ok"


def _top_level_boundaries(model: onnx.ModelProto) -> tuple[list[int], int]:
    """Byte offsets where a top-level field of the serialized model ends, and where the graph ends.

    protobuf writes known fields in field-number order, so serializing growing
    copies of the model yields those offsets."""
    partial = onnx.ModelProto()
    ends, graph_end = [], None
    for field, value in sorted(model.ListFields(), key=lambda fv: fv[0].number):
        items = value if field.is_repeated else [value]
        for item in items:
            target = getattr(partial, field.name)
            if field.is_repeated:
                target.add().CopyFrom(item) if field.message_type else target.append(item)
            elif field.message_type:
                target.CopyFrom(item)
            else:
                setattr(partial, field.name, item)
            ends.append(partial.ByteSize())
            if field.name == "graph":
                graph_end = partial.ByteSize()
    return ends, graph_end


@pytest.mark.parametrize("build", [matmul_add_model, if_model, everywhere_model])
def test_truncated_at_every_cut(build):
    model = build()
    data = model.SerializeToString()
    ends, graph_end = _top_level_boundaries(model)
    assert ends[-1] == len(data)
    accepted = []
    for cut in range(len(data)):
        outcome = check_against_protobuf(data[:cut])
        assert outcome in ("reject", "nograph", "ok"), outcome
        if outcome == "ok":
            accepted.append(cut)
    # A cut yields a model exactly when it falls on a top-level field boundary
    # after the graph (e.g. between opset_import entries); every other cut raises.
    assert accepted == [e for e in ends[:-1] if e >= graph_end]
    assert accepted, "the models end with opset_import, so some cuts must parse"


def test_random_bytes_never_escape():
    rng = random.Random(20240611)
    t0 = time.perf_counter()
    outcomes: dict[tuple[str, str], int] = {}
    # (label, prefix): plain random bytes, and random bytes wrapped as a graph's
    # payload so the walk reaches GraphProto/NodeProto/... handling
    prefixes = [("raw", b""), ("graph", b":"), ("ir+graph", vf(1, 8) + b":"), ("producer", ld(2, b"p"))]
    for trial in range(4000):
        label, prefix = prefixes[trial % len(prefixes)]
        body = rng.randbytes(rng.randint(0, 300))
        if prefix.endswith(b":"):
            prefix += varint(len(body))
        data = prefix + body
        outcome = check_against_protobuf(data, ordered=False)
        outcomes[label, outcome] = outcomes.get((label, outcome), 0) + 1
        assert sniff_format(data) in ("unknown", "onnx", "pickle", "zip", "tflite", "ort")
    assert time.perf_counter() - t0 < 30
    # Plain random bytes never form a model: every one raised ModelFormatError.
    assert {o for (label, o) in outcomes if label in ("raw", "producer")} <= {"reject", "nograph"}, outcomes
    # A random graph payload occasionally *is* a well-formed GraphProto made of
    # unknown fields; then protobuf accepts it too and the results matched above.
    assert sum(n for (label, o), n in outcomes.items() if o == "reject") > 3000, outcomes


def test_mutated_models_agree_with_protobuf(tmp_path):
    rng = random.Random(7)
    seeds = [
        matmul_add_model().SerializeToString(),
        save_external(if_model(), tmp_path, "if.bin"),
        everywhere_model().SerializeToString(),
    ]
    outcomes: dict[str, int] = {}
    for trial in range(3000):
        data = bytearray(seeds[trial % len(seeds)])
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            op = rng.randrange(4)
            if op == 0:
                data[i] = rng.randrange(256)
            elif op == 1:
                data[i] ^= 1 << rng.randrange(8)
            elif op == 2:
                del data[i]
            else:
                data.insert(i, rng.randrange(256))
        outcome = check_against_protobuf(bytes(data), ordered=False)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # both kinds occur, so the comparison is exercised in both directions
    assert outcomes.get("ok", 0) > 100 and outcomes.get("reject", 0) > 100, outcomes


# --- speed ----------------------------------------------------------------------------------


def _big_model(n_weights=11, n_small=2000) -> bytes:
    """~15.6 MB: 11 1-MiB weight initializers plus 2000 Add nodes, each with its own 2 KiB constant."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    prev = "X"
    for i in range(n_weights):
        inits.append(numpy_helper.from_array(rng.standard_normal((512, 512), dtype=np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"]))
        prev = f"h{i}"
    for i in range(n_small):
        inits.append(numpy_helper.from_array(np.full((512,), i, dtype=np.float32), f"b{i}"))
        nodes.append(helper.make_node("Add", [prev, f"b{i}"], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 512])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["n", 512])],
        inits,
    )
    return helper.make_model(graph, opset_imports=_opsets()).SerializeToString()


def test_15mb_model_scans_fast():
    data = _big_model()
    assert 14e6 < len(data) < 17e6
    best = min(_timed(scan_onnx, data) for _ in range(5))
    info = scan_onnx(data)
    assert info.node_count == 2011
    assert check_against_protobuf(data) == "ok"
    print(f"\nscan_onnx of {len(data) / 1e6:.1f} MB, {info.node_count} nodes: {best * 1e3:.2f} ms")
    assert best < 0.100


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


# --- no runtime dependencies -----------------------------------------------------------------


def test_module_imports_only_the_standard_library():
    code = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        import edge_sdk.package.modelfile
        new = {m.split('.')[0] for m in set(sys.modules) - before}
        bad = new & {'onnx', 'google', 'numpy', 'onnxruntime', 'flatbuffers', 'ai_edge_litert'}
        assert not bad, bad
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


# --- TFLite -----------------------------------------------------------------------------------


def tflite_model(weights: int = 64) -> bytes:
    """A real one-op TFLite model (y = x + w) built with the LiteRT schema."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    def tensor(name, buffer):
        t = s.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, weights // 4], s.TensorType.FLOAT32, buffer
        return t

    opcode = s.OperatorCodeT()
    opcode.builtinCode = opcode.deprecatedBuiltinCode = s.BuiltinOperator.ADD
    opcode.version = 1
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    op.builtinOptionsType, op.builtinOptions = s.BuiltinOptions.AddOptions, s.AddOptionsT()
    sg = s.SubGraphT()
    sg.name, sg.tensors, sg.inputs, sg.outputs, sg.operators = (
        "main", [tensor("x", 1), tensor("w", 2), tensor("y", 3)], [0], [2], [op])
    bufs = [s.BufferT() for _ in range(4)]
    bufs[2].data = np.arange(weights // 4, dtype=np.float32).view(np.uint8)
    m = s.ModelT()
    m.version, m.description, m.operatorCodes, m.subgraphs, m.buffers = 3, "test", [opcode], [sg], bufs
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def test_tflite_model_is_real_and_inspected():
    data = tflite_model()
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover
        Interpreter = None
    if Interpreter is not None:
        interp = Interpreter(model_content=data)
        interp.allocate_tensors()
        inp = interp.get_input_details()[0]
        interp.set_tensor(inp["index"], np.ones((1, 16), np.float32))
        interp.invoke()
        out = interp.get_tensor(interp.get_output_details()[0]["index"])
        assert np.allclose(out, np.arange(16) + 1)
    assert sniff_format(data) == "tflite"
    assert inspect_tflite(data) == mf.TFLiteInfo(version=3, size=len(data))
    assert inspect_tflite(memoryview(data)) == inspect_tflite(data)


def test_tflite_truncated_anywhere_raises():
    data = tflite_model()
    for cut in range(len(data)):
        with pytest.raises(ModelFormatError):
            inspect_tflite(data[:cut])


TFLITE_BAD = [
    # (id, bytes, regex the ModelFormatError message must match)
    # 7 bytes: not even the root offset and identifier
    ("too-short", b"\x08\x00\x00\x00TFL", r"shorter than the 8-byte header"),
    # another flatbuffer schema's identifier
    ("wrong-identifier", b"\x08\x00\x00\x00TFL2" + b"\x00" * 8, r"is b'TFL2', expected b'TFL3'"),
    # root offset points past the end of an 8-byte file
    ("root-outside", b"\xf0\x00\x00\x00TFL3", r"root table .* at byte 240 needs 4 bytes but the file has 8"),
    # root table at an odd offset
    ("root-unaligned", b"\x09\x00\x00\x00TFL3" + b"\x00" * 8, r"root table \(Model\) at byte 9 is not 4-byte aligned"),
    # root table at 8 whose soffset puts the vtable 0x1000 bytes before the file
    ("vtable-outside", b"\x08\x00\x00\x00TFL3" + (0x1000).to_bytes(4, "little"), r"vtable of root table .* at byte -4088"),
    # vtable (at 12) claims a 64-byte table starting at 16 in a 20-byte file
    ("table-past-end", b"\x10\x00\x00\x00TFL3" + b"\x00" * 4 + b"\x04\x00\x40\x00" + b"\x04\x00\x00\x00",
     r"root table \(Model\) at byte 16 needs 64 bytes but the file has 20"),
    # an ONNX model named .tflite
    ("onnx-bytes", matmul_add_model().SerializeToString(), r"file identifier at bytes 4..8"),
]


@pytest.mark.parametrize("data, message", [pytest.param(d, m, id=i) for i, d, m in TFLITE_BAD])
def test_tflite_bad_table(data, message):
    with pytest.raises(ModelFormatError, match=message):
        inspect_tflite(data)


def test_tflite_element_count_is_bounded():
    import struct

    count = mf._TFL_MAX_ELEMENTS + 1
    data = (
        struct.pack("<I", 24) + b"TFL3"  # root table at 24
        + struct.pack("<7H", 14, 8, 0, 0, 0, 0, 4) + b"\0\0"  # vtable at 8: only field 4 (buffers), at +4
        + struct.pack("<iI", 24 - 8, 4)  # table at 24: soffset to vtable; buffers vector at 28 + 4
        + struct.pack("<I", count) + b"\0" * (4 * count)  # vector at 32, all present
    )
    with pytest.raises(ModelFormatError, match=r"Model.buffers at byte 32 declares 262145 elements"):
        inspect_tflite(data)


def test_tflite_random_bytes_with_header_never_escape():
    rng = random.Random(3)
    good = tflite_model()
    for trial in range(3000):
        if trial % 2:
            data = rng.randbytes(4) + b"TFL3" + rng.randbytes(rng.randint(0, 200))
        else:
            data = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data)
        try:
            inspect_tflite(data)
        except ModelFormatError:
            pass


# --- sniffing -----------------------------------------------------------------------------------


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, payload in members.items():
            zf.writestr(name, payload)
    return buf.getvalue()


SNIFF = [
    # (id, builder of the bytes, expected format)
    # plain model built with onnx.helper
    ("onnx", lambda: matmul_add_model().SerializeToString(), "onnx"),
    # model with subgraphs
    ("onnx-if", lambda: if_model().SerializeToString(), "onnx"),
    # real TFLite flatbuffer
    ("tflite", tflite_model, "tflite"),
    # a truncated TFLite file still says what it claims to be; inspect_tflite rejects it
    ("tflite-truncated", lambda: tflite_model()[:40], "tflite"),
    # ORT flatbuffer identifier (a real .ort file is tested below)
    ("ort-header", lambda: b"\x10\x00\x00\x00ORTM" + b"\x00" * 16, "ort"),
    # pickles, protocols 2..5
    ("pickle-2", lambda: pickle.dumps({"a": 1}, protocol=2), "pickle"),
    ("pickle-3", lambda: pickle.dumps([1, 2], protocol=3), "pickle"),
    ("pickle-4", lambda: pickle.dumps("x", protocol=4), "pickle"),
    ("pickle-5", lambda: pickle.dumps(b"y", protocol=5), "pickle"),
    # PROTO opcode with a protocol that does not exist
    ("pickle-bad-protocol", lambda: b"\x80\x09", "unknown"),
    # an ordinary zip archive
    ("zip", lambda: _zip({"model.onnx": b"x", "README": b"y"}), "zip"),
    # PyTorch's zip checkpoint layout: archive/data.pkl
    ("torch-zip", lambda: _zip({"archive/data.pkl": pickle.dumps(1, protocol=2), "archive/version": b"3"}), "pickle"),
    # central directory chopped off: the local header still names data.pkl
    ("torch-zip-damaged", lambda: _zip({"m/data.pkl": b"\x80\x02N."})[:40], "pickle"),
    # no bytes
    ("empty", lambda: b"", "unknown"),
    # text
    ("text", lambda: b"hello world, definitely not a model\n", "unknown"),
    # well-formed protobuf, but no graph: a guess is not enough
    ("proto-without-graph", lambda: vf(1, 8) + ld(2, b"x"), "unknown"),
    # an ONNX model missing its last 40 bytes
    ("truncated-onnx", lambda: matmul_add_model().SerializeToString()[:-40], "unknown"),
]


@pytest.mark.parametrize("make, expected", [pytest.param(m, e, id=i) for i, m, e in SNIFF])
def test_sniff_table(make, expected):
    data = make()
    assert sniff_format(data) == expected
    assert sniff_format(memoryview(data)) == expected


def test_sniff_real_ort_format_model(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    src = tmp_path / "m.onnx"
    m = if_model()
    m.ir_version = 10  # onnx 1.23 writes IR 14 by default; ORT 1.23 (Python 3.10) reads up to 11
    onnx.save_model(m, str(src))
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "m.ort")
    opts.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    data = (tmp_path / "m.ort").read_bytes()
    assert sniff_format(data) == "ort"


def test_sniff_external_data_model_is_onnx(tmp_path):
    assert sniff_format(save_external(if_model(), tmp_path, "w.bin")) == "onnx"
