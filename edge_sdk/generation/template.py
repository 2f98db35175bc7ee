"""Chat templates: a model package's Jinja template turned into the prompt text, in a sandbox.

The template is compiled the way Hugging Face transformers compiles ``tokenizer.chat_template``
(``_compile_jinja_template`` in ``transformers/utils/chat_template_utils.py``; the format is described at
https://huggingface.co/docs/transformers/main/en/chat_templating): a
``jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the ``loopcontrols``
extension, a ``tojson`` filter that does not escape HTML (``ensure_ascii=False``; ``indent``, ``separators``,
``sort_keys`` as in ``json.dumps``), and the globals ``raise_exception(message)`` and ``strftime_now(format)``.
It is rendered with ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` and any extra variables. ``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask
tag) renders its body unchanged.

A template inside a package is untrusted (https://jinja.palletsprojects.com/en/stable/sandbox/), so on top of
jinja2's sandbox:

* an unsafe attribute (``_``-prefixed, ``__globals__``, a mutating method such as ``list.append``) raises at
  once instead of becoming a silent empty Undefined;
* there is no loader: ``{% include %}``, ``{% import %}``, ``{% from %}`` and ``{% extends %}`` are refused on
  construction;
* output is produced with ``Template.generate`` and counted: past ``max_output_chars`` rendering stops;
* ``+``, ``*``, ``**``, ``%``, ``~``, ``str.format``, the ``str`` methods ``ljust``/``rjust``/``center``/``zfill``/
  ``expandtabs``/``replace``/``join`` and the ``center``/``indent``/``format``/``replace``/``tojson`` filters
  refuse results larger than ``max_output_chars`` before building them;
* each render has an operation budget (calls plus ``range`` items, ``max_operations``), so
  nested loops or exponential macro recursion that print nothing still stop;
* recursion too deep is a TemplateError, not a crash.

Every failure is an :class:`edge_sdk.errors.TemplateError` naming the cause; bad messages are a PromptError.
"""

from __future__ import annotations

import json
import math
import re
import string
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .._deps import require_jinja2
from ..errors import OptionsError, PromptError, TemplateError
from .text import validate_prompt

if TYPE_CHECKING:
    import jinja2

__all__ = ["CHATML", "ChatTemplate", "ROLES"]

#: The roles a message may have.
ROLES = frozenset({"system", "user", "assistant", "tool"})

#: A plain ChatML template (``<|im_start|>role\\ncontent<|im_end|>\\n``), the one transformers used as its
#: default chat template; for packages without a template when the caller asks for ChatML explicitly.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "range", "raise_exception", "strftime_now"})
_MAX_POW_BITS = 1 << 16  # bits of an int a template may build with ** or *
_MAX_JSON_INDENT = 1000


class _Refused(Exception):
    """A sandbox limit of ours was hit; becomes a TemplateError."""


class _Raised(Exception):
    """``raise_exception(message)`` was called by the template."""


class _Budget:
    """Per-render limits: characters of output and operations (calls, range items)."""

    def __init__(self, max_chars: int, max_ops: int) -> None:
        self.max_chars = max_chars
        self.ops_left = max_ops
        self.max_ops = max_ops

    def spend(self, n: int) -> None:
        self.ops_left -= n
        if self.ops_left < 0:
            raise _Refused(f"the template ran more than {self.max_ops} operations (calls and loop items) in one render")


_BUDGET: ContextVar[_Budget | None] = ContextVar("edge_sdk_template_budget", default=None)


def _budget() -> _Budget:
    b = _BUDGET.get()
    if b is None:  # compile-time constant folding: no render running, use a throwaway bound
        return _Budget(1_000_000, 1_000_000)
    return b


def _check_len(n: int, what: str) -> None:
    cap = _budget().max_chars
    if n > cap:
        raise _Refused(f"{what} would be {n} characters, more than the output limit {cap}")


def _check_format_string(fmt: str) -> None:
    """Refuse ``str.format`` specs whose width/precision exceed the output limit (``'{:>999999999}'``)."""
    cap = _budget().max_chars
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format will raise its own error
    for _, _, spec, _ in fields:
        if spec and "{" in spec:
            raise _Refused("nested replacement fields in a format spec are not allowed in a chat template")
        for num in re.findall(r"\d+", spec or ""):
            if int(num) > cap:
                raise _Refused(f"format width {num} exceeds the output limit {cap}")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent_format(fmt: str) -> None:
    cap = _budget().max_chars
    for m in _PERCENT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise _Refused("'*' widths in %-formatting are not allowed in a chat template")
            if g is not None and int(g) > cap:
                raise _Refused(f"format width {g} exceeds the output limit {cap}")


def _check_str_call(obj: Any, args: tuple[Any, ...]) -> None:
    """Size pre-checks for the ``str`` methods that can build a string much larger than their inputs."""
    owner = getattr(obj, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(obj, "__name__", "")
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _check_len(args[0], f"str.{name} width")
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        _check_len(len(owner) + owner.count("\t") * max(size, 0), "str.expandtabs output")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        n = owner.count(args[0]) if args[0] else len(owner) + 1
        if len(args) >= 3 and isinstance(args[2], int) and args[2] >= 0:
            n = min(n, args[2])
        _check_len(len(owner) + n * (len(args[1]) - len(args[0])), "str.replace output")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        items = args[0]
        _check_len(sum(len(x) for x in items if isinstance(x, str)) + len(owner) * max(len(items) - 1, 0), "str.join output")


def _raise_exception(message: object) -> None:
    raise _Raised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(str(fmt))


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    if isinstance(indent, int) and indent > _MAX_JSON_INDENT or isinstance(indent, str) and len(indent) > _MAX_JSON_INDENT:
        raise _Refused(f"tojson indent larger than {_MAX_JSON_INDENT}")
    out = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    _check_len(len(out), "tojson output")
    return out


def _require_jinja2() -> Any:
    return require_jinja2("Chat templates")


@lru_cache(maxsize=1)
def _jinja_parts() -> tuple[type[jinja2.sandbox.ImmutableSandboxedEnvironment], type[jinja2.ext.Extension], dict[str, Any]]:
    """The hardened environment class, the ``{% generation %}`` extension and the size-checked filters
    (built on first use: jinja2 is an optional dependency)."""
    _require_jinja2()
    from jinja2 import filters as jfilters
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator, Frame
    from jinja2.exceptions import SecurityError
    from jinja2.ext import Extension
    from jinja2.parser import Parser
    from jinja2.runtime import Context
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generator(CodeGenerator):
        def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
            # ``a ~ b`` goes through the environment so its size can be checked (jinja2 writes ``str_join``).
            self.write("environment.edge_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _GenerationTag(Extension):
        """transformers' ``{% generation %}`` block (marks assistant text for masks): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser: Parser) -> nodes.Node | list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class _Env(ImmutableSandboxedEnvironment):
        code_generator_class = _Generator
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def getattr(self, obj: Any, attribute: str) -> Any:
            if isinstance(attribute, str) and attribute.startswith("_"):  # refused even where it does not exist
                raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")
            return super().getattr(obj, attribute)

        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

        def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _budget().spend(1)
            _check_str_call(__obj, args)
            return super().call(__context, __obj, *args, **kwargs)

        def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
            if operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    _check_len(len(left) + len(right), "a '+' result")
            elif operator == "*":
                seq, n = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _check_len(len(seq) * max(n, 0), "a '*' result")
                elif isinstance(left, int) and isinstance(right, int):
                    if left.bit_length() + right.bit_length() > _MAX_POW_BITS:
                        raise _Refused(f"an integer product of more than {_MAX_POW_BITS} bits")
            elif operator == "**":
                if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                    if right * math.log2(abs(left)) > _MAX_POW_BITS:
                        raise _Refused(f"an integer power of more than {_MAX_POW_BITS} bits")
            elif operator == "%" and isinstance(left, str):
                _check_percent_format(left)
            return super().call_binop(context, operator, left, right)

        def edge_concat(self, values: Sequence[Any]) -> str:
            parts = [str(v) for v in values]
            _check_len(sum(len(p) for p in parts), "a '~' result")
            return "".join(parts)

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__
            inner = wrapped

            def checked(*args: Any, **kwargs: Any) -> str:
                _check_format_string(fmt)
                return inner(*args, **kwargs)

            return checked

    def _center(value: Any, width: int = 80) -> str:
        _check_len(int(width), "center width")
        return jfilters.do_center(value, width)

    def _indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
        w = width if isinstance(width, str) else " " * min(int(width), _budget().max_chars + 1)
        _check_len(len(str(s)) * (len(w) + 1), "indent output")
        return jfilters.do_indent(s, width, first, blank)

    def _replace(s: str, old: str, new: str, count: int | None = None) -> str:
        text, o, n = str(s), str(old), str(new)
        hits = text.count(o) if o else len(text) + 1
        if count is not None and count >= 0:
            hits = min(hits, count)
        _check_len(len(text) + hits * (len(n) - len(o)), "replace output")
        return text.replace(o, n, -1 if count is None else count)  # jinja2's do_replace without autoescape

    def _format(value: str, *args: Any, **kwargs: Any) -> str:
        _check_percent_format(str(value))
        return jfilters.do_format(value, *args, **kwargs)

    return _Env, _GenerationTag, {"center": _center, "indent": _indent, "format": _format, "replace": _replace, "tojson": _tojson}


def _find_forbidden(ast: Any) -> str | None:
    from jinja2 import nodes

    for cls, what in (
        (nodes.Include, "{% include %}"),
        (nodes.Import, "{% import %}"),
        (nodes.FromImport, "{% from ... import %}"),
        (nodes.Extends, "{% extends %}"),
    ):
        found = next(iter(ast.find_all(cls)), None)
        if found is not None:
            return f"{what} at line {found.lineno}"
    return None


class ChatTemplate:
    """A compiled chat template (see the module docstring for the sandbox).

    ``source`` is the Jinja text (``tokenizer_config.json``'s ``chat_template``, GGUF's
    ``tokenizer.chat_template``); ``bos_token``/``eos_token`` are given to it as variables, as transformers does.
    ``max_output_chars`` bounds the rendered text (and any string built on the way); ``max_operations`` bounds the
    calls plus ``range`` items of one render (a real chat template uses a few per message).
    A syntax error, a forbidden tag or a sandbox violation during compile is a TemplateError here.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        max_output_chars: int = 1_000_000,
        max_operations: int = 200_000,
    ) -> None:
        if not isinstance(source, str):
            raise TemplateError(f"chat template: expected str source, got {type(source).__name__}")
        for name, tok in (("bos_token", bos_token), ("eos_token", eos_token)):
            if tok is not None and not isinstance(tok, str):
                raise OptionsError(f"{name}: expected str or None, got {type(tok).__name__}")
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise OptionsError(f"max_output_chars: expected an int >= 1, got {max_output_chars!r}")
        if isinstance(max_operations, bool) or not isinstance(max_operations, int) or max_operations < 1:
            raise OptionsError(f"max_operations: expected an int >= 1, got {max_operations!r}")
        jinja2 = _require_jinja2()
        from jinja2 import ext as jext

        env_cls, generation_tag, filters = _jinja_parts()
        env = env_cls(trim_blocks=True, lstrip_blocks=True, extensions=[jext.loopcontrols, generation_tag])
        env.filters.update(filters)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.max_output_chars = max_output_chars
        self.max_operations = max_operations
        token = _BUDGET.set(_Budget(max_output_chars, max_operations))
        try:
            ast = env.parse(source)
            forbidden = _find_forbidden(ast)
            if forbidden is not None:
                raise TemplateError(f"chat template uses {forbidden}: templates in a package may not load other templates")
            self._template = env.from_string(ast)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from e
        except (jinja2.TemplateError, _Refused, _Raised) as e:
            raise TemplateError(f"chat template cannot be compiled: {type(e).__name__}: {e}") from e
        except RecursionError as e:
            raise TemplateError("chat template nests too deeply to compile") from e
        finally:
            _BUDGET.reset(token)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages`` (a list of ``{"role": ..., "content": str}``; roles in :data:`ROLES`).

        ``add_generation_prompt`` makes the template open an assistant turn; ``tools`` is a list of JSON schemas
        for templates that support tool use; ``extra`` are further template variables (e.g. ``documents``,
        ``enable_thinking``) and may override ``bos_token``/``eos_token``.
        """
        msgs = _validate_messages(messages)
        if tools is not None:
            if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
                raise PromptError(f"tools: expected None or a list of mappings, got {type(tools).__name__}")
            for i, t in enumerate(tools):
                if not isinstance(t, Mapping):
                    raise PromptError(f"tools[{i}]: expected a mapping (a JSON schema), got {type(t).__name__}")
        bad = sorted(_RESERVED.intersection(extra))
        if bad:
            raise OptionsError(f"render: {', '.join(bad)} cannot be passed as extra template variables")
        budget = _Budget(self.max_output_chars, self.max_operations)

        def bounded_range(*args: int) -> range:
            r = range(*args)
            budget.spend(len(r))
            return r

        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "documents": None,
            **extra,
            "messages": msgs,
            "tools": None if tools is None else [dict(t) for t in tools],
            "add_generation_prompt": bool(add_generation_prompt),
            "range": bounded_range,
        }
        token = _BUDGET.set(budget)
        try:
            return self._render(variables, budget)
        finally:
            _BUDGET.reset(token)

    def _render(self, variables: dict[str, Any], budget: _Budget) -> str:
        jinja2 = _require_jinja2()
        from jinja2.exceptions import SecurityError

        chunks: list[str] = []
        total = 0
        gen: Iterator[str] = self._template.generate(**variables)
        try:
            for chunk in gen:
                total += len(chunk)
                if total > budget.max_chars:
                    raise _Refused(f"output passed the limit of {budget.max_chars} characters")
                chunks.append(chunk)
        except _Raised as e:
            raise TemplateError(f"chat template raised an error: {e}") from e
        except SecurityError as e:
            raise TemplateError(f"chat template tried to leave its sandbox: {e}") from e
        except _Refused as e:
            raise TemplateError(f"chat template stopped: {e}") from e
        except RecursionError as e:
            raise TemplateError("chat template recursed too deeply (a macro calling itself without end?)") from e
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, MemoryError) as e:
            raise TemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from e
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()
        return "".join(chunks)


def _validate_messages(messages: object) -> list[dict[str, Any]]:
    if not isinstance(messages, (list, tuple)):
        raise PromptError(f"messages: expected a list of {{'role', 'content'}} mappings, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise PromptError(f"messages[{i}]: expected a mapping with 'role' and 'content', got {type(m).__name__}")
        if "role" not in m:
            raise PromptError(f"messages[{i}]: has no 'role' (expected one of {sorted(ROLES)})")
        role = m["role"]
        if not isinstance(role, str) or role not in ROLES:
            raise PromptError(f"messages[{i}]: role {role!r} is not one of {sorted(ROLES)}")
        if "content" not in m:
            raise PromptError(f"messages[{i}]: has no 'content'")
        validate_prompt(m["content"], what=f"messages[{i}].content")
        out.append(dict(m))
    return out
