"""The public API is documented, and the API the docs name exists.

1. Every public name of every module of ``edge_sdk`` (recursively, private
   ``_*.py`` modules excluded) and ``converters`` has a docstring: the names in a
   module's ``__all__`` (or, without one, its top-level names not starting with
   ``_`` that it defines itself), and the public methods and properties of public
   classes. A class may inherit its docstring from a documented base in these
   packages (a dataclass or NamedTuple's generated ``Name(field, ...)`` text does
   not count); a method needs its own, or the one of the base method it overrides.
2. Every dotted ``edge_sdk.*`` / ``converters.*`` name in README.md and docs/*.md
   (fenced and inline code, ``from edge_sdk.x import A, B``, ``import edge_sdk.x``)
   and every error in docs/reference.md's table resolves; every ``python`` code
   block in them compiles. Failures name file:line and what is missing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import types
from pathlib import Path

from conftest import ROOT

PACKAGES = ("edge_sdk", "converters")
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# --- 1. docstrings on every public name ------------------------------------------------


def _modules() -> list[types.ModuleType]:
    mods = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        mods.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if any(part.startswith("_") for part in info.name.split(".")[1:]):
                continue  # private module (or inside a private package)
            mods.append(importlib.import_module(info.name))
    return mods


def _ours(obj: object) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return mod.split(".")[0] in PACKAGES


def _public_names(mod: types.ModuleType) -> list[tuple[str, object]]:
    if hasattr(mod, "__all__"):
        return [(n, getattr(mod, n)) for n in mod.__all__]
    out = []
    for n, obj in vars(mod).items():
        if n.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if getattr(obj, "__module__", None) == mod.__name__:  # defined here, not imported
            out.append((n, obj))
    return out


def _generated_doc(cls: type) -> bool:
    """The ``Name(a: int, ...)`` text dataclasses and NamedTuples write when a class has none."""
    doc = cls.__dict__.get("__doc__")
    return bool(doc) and doc.startswith(cls.__name__ + "(") and (dataclasses.is_dataclass(cls) or hasattr(cls, "_fields"))


def _class_has_doc(cls: type) -> bool:
    for c in cls.__mro__:
        if c is not cls and not _ours(c):
            continue  # object's / Exception's / Enum's text says nothing about this class
        doc = c.__dict__.get("__doc__")
        if doc and doc.strip() and not _generated_doc(c):
            return True
    return False


def _member_doc(member: object) -> str | None:
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        return member.__doc__ or (member.fget.__doc__ if member.fget else None)
    if isinstance(member, functools.cached_property):
        return member.__doc__ or member.func.__doc__
    return getattr(member, "__doc__", None)


def _is_method_like(member: object) -> bool:
    return isinstance(member, (staticmethod, classmethod, property, functools.cached_property)) or inspect.isfunction(member)


def _undocumented_members(cls: type) -> list[str]:
    missing = []
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    fields |= set(getattr(cls, "_fields", ()))
    for name, member in vars(cls).items():
        if name.startswith("_") or name in fields or not _is_method_like(member):
            continue
        if (_member_doc(member) or "").strip():
            continue
        inherited = any((_member_doc(base.__dict__[name]) or "").strip() for base in cls.__mro__[1:] if name in base.__dict__)
        if not inherited:
            missing.append(name)
    return missing


def test_every_public_name_has_a_docstring() -> None:
    missing: list[str] = []
    seen: set[int] = set()
    n_checked = 0
    for mod in _modules():
        if not (mod.__doc__ or "").strip():
            missing.append(f"{mod.__name__} (module)")
        for _name, obj in _public_names(mod):
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not _ours(obj) or id(obj) in seen:
                continue  # constants, re-exported third-party names, already checked
            seen.add(id(obj))
            n_checked += 1
            where = f"{obj.__module__}.{obj.__qualname__}"
            if inspect.isclass(obj):
                if not _class_has_doc(obj):
                    missing.append(where)
                missing += [f"{where}.{m}" for m in _undocumented_members(obj)]
            elif not (obj.__doc__ or "").strip():
                missing.append(where)
    assert n_checked > 200, n_checked  # the walk really found the API
    assert not missing, f"{len(missing)} public names have no docstring:\n" + "\n".join(sorted(missing))


# --- 2. the API the docs name exists ---------------------------------------------------

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_INLINE = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w./-])((?:edge_sdk|converters)(?:\.[A-Za-z_]\w*)+)")
_FROM_IMPORT = re.compile(r"^\s*from\s+((?:edge_sdk|converters)(?:\.\w+)*)\s+import\s+\(?([\w\s,]+)\)?")
_IMPORT = re.compile(r"^\s*import\s+((?:edge_sdk|converters)(?:\.\w+)*)")


def _code_spans(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(line, code text) for every code line and inline code span; and
    (first line, language, text) for every fenced block."""
    spans: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, str]] = []
    lang: str | None = None
    body: list[str] = []
    start = 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if m and lang is None:
            lang, body, start = m.group(2), [], i + 1
        elif m and not m.group(2):
            blocks.append((start, lang or "", "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
            spans.append((i, line))
        else:
            spans += [(i, s) for s in _INLINE.findall(line)]
    assert lang is None, f"{path.name}: a code fence opened at line {start - 1} is never closed"
    return spans, blocks


def _resolve(dotted: str) -> str | None:
    """None if ``dotted`` names a module or an attribute chain on one; else what is missing."""
    parts = dotted.split(".")
    obj = None
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError as e:
            if e.name and not dotted.startswith(e.name):
                raise  # a dependency is missing, not the documented module
            continue
        rest = parts[k:]
        break
    else:
        return dotted
    for i, attr in enumerate(rest):
        if not hasattr(obj, attr):
            return ".".join(parts[: len(parts) - len(rest) + i + 1])
        obj = getattr(obj, attr)
    return None


def _references(path: Path) -> list[tuple[int, str]]:
    refs: list[tuple[int, str]] = []
    spans, _ = _code_spans(path)
    for line_no, text in spans:
        for m in _DOTTED.finditer(text):
            name = m.group(1)
            if name.endswith((".py", ".toml", ".md", ".json")):
                continue  # a file name, not a Python name
            refs.append((line_no, name))
        m = _FROM_IMPORT.match(text)
        if m:
            refs += [(line_no, f"{m.group(1)}.{n.strip()}") for n in m.group(2).split(",") if n.strip() and n.strip() != "as"]
        m = _IMPORT.match(text)
        if m:
            refs.append((line_no, m.group(1)))
    return refs


def test_the_api_named_in_the_docs_exists() -> None:
    broken: list[str] = []
    n_refs = 0
    for path in DOC_FILES:
        for line_no, name in _references(path):
            n_refs += 1
            missing = _resolve(name)
            if missing:
                broken.append(f"{path.relative_to(ROOT)}:{line_no}: {name} ({missing} does not exist)")
    assert n_refs > 50, n_refs  # the scan really found the references
    assert not broken, "the docs name API that does not exist:\n" + "\n".join(broken)


_CLASS_ATTR = re.compile(r"(?<![\w.])([A-Z]\w+)\.([a-z_]\w*)")


@functools.lru_cache(maxsize=1)
def _public_classes() -> dict[str, type]:
    """Class name -> class, for the public classes whose name is unique in the packages."""
    found: dict[str, set[type]] = {}
    for mod in _modules():
        for name, obj in _public_names(mod):
            if inspect.isclass(obj) and _ours(obj):
                found.setdefault(name, set()).add(obj)
    return {n: next(iter(cs)) for n, cs in found.items() if len(cs) == 1}


def _has_attr(cls: type, attr: str) -> bool:
    if hasattr(cls, attr) or (dataclasses.is_dataclass(cls) and attr in {f.name for f in dataclasses.fields(cls)}):
        return True
    for c in cls.__mro__:  # an attribute set on instances: ``self.attr = ...`` in the class body
        if _ours(c) and re.search(rf"\bself\.{attr}\s*(:[^=]*)?=", inspect.getsource(c)):
            return True
    return False


def test_the_class_members_named_in_the_docs_exist() -> None:
    """``Governor.add_action``, ``SignalStreamOptions.dtype`` ...: a public class's member named in
    the docs' code exists (as an attribute, a dataclass field, or one set on instances)."""
    classes = _public_classes()
    broken: list[str] = []
    n_refs = 0
    for path in DOC_FILES:
        spans, _ = _code_spans(path)
        for line_no, text in spans:
            for m in _CLASS_ATTR.finditer(text):
                cls = classes.get(m.group(1))
                if cls is None:
                    continue
                n_refs += 1
                if not _has_attr(cls, m.group(2)):
                    broken.append(
                        f"{path.relative_to(ROOT)}:{line_no}: {m.group(0)} ({cls.__module__}.{cls.__qualname__} has no {m.group(2)!r})"
                    )
    assert n_refs > 20, n_refs
    assert not broken, "the docs name class members that do not exist:\n" + "\n".join(broken)


def test_the_errors_in_the_reference_exist() -> None:
    ref = ROOT / "docs" / "reference.md"
    broken = []
    rows = 0
    for line_no, line in enumerate(ref.read_text().splitlines(), 1):
        m = re.match(r"\| `((?:edge_sdk|converters|tools)\.[\w.]+)` \| ([\w, ]+) \|", line)
        if not m:
            continue
        rows += 1
        mod_name, _, cls_name = m.group(1).rpartition(".")
        cls = getattr(importlib.import_module(mod_name), cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            broken.append(f"docs/reference.md:{line_no}: {m.group(1)} is not an exception class")
            continue
        bases = [b.strip() for b in m.group(2).split(",")]
        if bases != [b.__name__ for b in cls.__bases__]:
            broken.append(f"docs/reference.md:{line_no}: {m.group(1)} bases are {[b.__name__ for b in cls.__bases__]}, not {bases}")
    assert rows > 40, rows
    assert not broken, "\n".join(broken)


def test_the_python_examples_in_the_docs_compile() -> None:
    broken = []
    n_blocks = 0
    for path in DOC_FILES:
        _, blocks = _code_spans(path)
        for start, lang, text in blocks:
            if lang not in ("python", "py"):
                continue
            n_blocks += 1
            try:
                compile(text, f"{path.relative_to(ROOT)}:{start}", "exec")
            except SyntaxError as e:
                broken.append(f"{path.relative_to(ROOT)}:{start + (e.lineno or 1) - 1}: {e.msg}")
    assert n_blocks >= 5, n_blocks
    assert not broken, "python examples in the docs do not compile:\n" + "\n".join(broken)
