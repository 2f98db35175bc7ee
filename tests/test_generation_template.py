"""edge_sdk.generation.template: a real model's chat template, ChatML, the sandbox, limits, message checks."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("jinja2")

from edge_sdk.errors import OptionsError, PromptError, TemplateError  # noqa: E402
from edge_sdk.generation.template import CHATML, ChatTemplate  # noqa: E402

# SmolLM2-135M-Instruct's chat template, copied verbatim from the GGUF key ``tokenizer.chat_template`` of
# SmolLM2-135M-Instruct.Q4_1.gguf (HuggingFaceTB/SmolLM2-135M-Instruct; read with gguf.GGUFReader).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

USER = [{"role": "user", "content": "What is 2+2? Réponds en français 🙂"}]


def test_smollm2_template_renders_chatml() -> None:
    t = ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    user_turn = "<|im_start|>user\nWhat is 2+2? Réponds en français 🙂<|im_end|>\n"
    assert t.render(USER) == SMOL_SYSTEM + user_turn + "<|im_start|>assistant\n"
    assert t.render(USER, add_generation_prompt=False) == SMOL_SYSTEM + user_turn
    with_system = [{"role": "system", "content": "Be brief."}, *USER, {"role": "assistant", "content": "4"}, USER[0]]
    assert t.render(with_system) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        + user_turn
        + "<|im_start|>assistant\n4<|im_end|>\n"
        + user_turn
        + "<|im_start|>assistant\n"
    )


def test_chatml_constant() -> None:
    t = ChatTemplate(CHATML)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "tool", "content": "T"}]
    assert (
        t.render(msgs)
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.render((), add_generation_prompt=False) == ""


def test_transformers_globals_filters_and_variables() -> None:
    src = (
        "{{ bos_token }}|{{ eos_token }}|{{ tools | tojson }}|{{ {'k': 'é<>'} | tojson }}|{{ [1, 2] | tojson(indent=2) }}|"
        "{{ strftime_now('%Y') | length }}|{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}"
        "{% endfor %}|{{ documents }}|{{ custom }}|{% generation %}{{ 'gen' }}{% endgeneration %}"
    )
    t = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    out = t.render(USER * 3, tools=[{"name": "f"}], custom="x")
    assert out == '<s>|</s>|[{"name": "f"}]|{"k": "é<>"}|[\n  1,\n  2\n]|4|user|None|x|gen'
    # the size-checked filters and methods still do their ordinary work
    same = (
        "{{ 'a-b' | replace('-', '+') }} {{ 'ab'.replace('a', 'x') }} {{ 'x' | center(5) }}|{{ '7'.zfill(3) }} {{ ', '.join(['a', 'b']) }}"
    )
    assert ChatTemplate(same).render([]) == "a+b xb   x  |007 a, b"
    # trim_blocks / lstrip_blocks as transformers sets them
    blocks = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert blocks.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb\n"
    # extra may override the tokens but not the reserved names
    assert ChatTemplate("{{ bos_token }}", bos_token="<s>").render([], bos_token="<b>") == "<b>"
    with pytest.raises(OptionsError, match="range"):
        t.render(USER, range=list)


@pytest.mark.parametrize(
    "src",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ self.__init__ }}",
        "{{ messages._private }}",
        "{{ messages['__class__'] }}",
        "{{ lipsum.__globals__['os'] }}",
        "{% set x = [].append(1) %}",
        "{% set d = {} %}{{ d.update({'a': 1}) }}",
        "{{ messages[0].pop('role') }}",
        "{{ '{0.__class__}'.format(1) }}",
    ],
)
def test_sandbox_escapes_are_template_errors(src: str) -> None:
    with pytest.raises(TemplateError, match="sandbox|unsafe"):
        ChatTemplate(src).render(USER)


def test_raise_exception_message() -> None:
    src = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Conversation roles must start with system') }}{% endif %}"
    with pytest.raises(TemplateError, match="Conversation roles must start with system"):
        ChatTemplate(src).render(USER)


def test_syntax_error_at_construction() -> None:
    with pytest.raises(TemplateError, match="syntax error at line 2"):
        ChatTemplate("ok\n{% for %}")
    with pytest.raises(TemplateError, match="syntax"):
        ChatTemplate("{% unknowntag %}")
    with pytest.raises(TemplateError, match="expected str"):
        ChatTemplate(b"{{ x }}")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "src", ["{% include 'other.jinja' %}", "{% import 'm.jinja' as m %}", "{% from 'm' import f %}", "{% extends 'base' %}"]
)
def test_no_loading_other_templates(src: str) -> None:
    with pytest.raises(TemplateError, match="may not load other templates"):
        ChatTemplate(src)


@pytest.mark.parametrize(
    "src, why",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}xy{% endfor %}{% endfor %}", "limit|operations"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "operations"),
        ("{{ 'a' * 1000000000 }}", "'\\*' result"),
        ("{{ [0] * 1000000000 }}", "'\\*' result"),
        ("{{ 2 ** 100000000 }}", "integer power"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~' result"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'\\+' result"),
        ("{{ 'x' | center(1000000000) }}", "center"),
        ("{{ '{:>1000000000}'.format(1) }}", "format width"),
        ("{{ '%01000000000d' % 1 }}", "format width"),
        ("{{ '%01000000000d' | format(1) }}", "format width"),
        ("{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}", "operations"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('a', 'aa') %}{% endfor %}", "replace"),
        ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s.replace('a', 'aaa') %}{% endfor %}", "replace"),
        ("{{ 'x'.ljust(1000000000) }}", "ljust"),
        ("{{ 'x'.zfill(1000000000) }}", "zfill"),
        ("{{ '\t\t'.expandtabs(1000000000) }}", "expandtabs"),
        ("{{ ('x' * 100000).join(['a'] * 100) }}", "join"),
    ],
)
def test_resource_limits(src: str, why: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match=why):
        ChatTemplate(src).render(USER)
    assert time.perf_counter() - t0 < 5


def test_output_cap_streams_and_is_configurable() -> None:
    src = "{% for m in messages %}{{ m.content }}{% endfor %}"
    msgs = [{"role": "user", "content": "x" * 1000}] * 20
    assert len(ChatTemplate(src).render(msgs)) == 20_000
    with pytest.raises(TemplateError, match="limit of 5000 characters"):
        ChatTemplate(src, max_output_chars=5000).render(msgs)
    with pytest.raises(OptionsError, match="max_output_chars"):
        ChatTemplate(src, max_output_chars=0)


def test_recursive_macro_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="recursed too deeply"):
        ChatTemplate("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", max_operations=10**9).render(USER)


def test_other_render_failures_are_template_errors() -> None:
    with pytest.raises(TemplateError, match="UndefinedError"):
        ChatTemplate("{{ nothing.here }}").render(USER)
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}").render(USER)
    assert ChatTemplate("{{ nothing }}{% if nothing is defined %}x{% endif %}ok").render(USER) == "ok"  # as transformers


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hello", r"messages: expected a list"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\]: expected a mapping"),
        ([{"content": "a"}], r"messages\[0\]: has no 'role'"),
        ([{"role": "robot", "content": "a"}], r"messages\[0\]: role 'robot'"),
        ([{"role": "user"}], r"messages\[0\]: has no 'content'"),
        ([{"role": "user", "content": None}], r"messages\[0\]\.content: expected str"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": "bad\x00"}], r"messages\[1\]\.content: control character U\+0000"),
        ([{"role": "user", "content": b"x"}], r"messages\[0\]\.content: .*decode bytes first"),
    ],
)
def test_bad_messages_are_prompt_errors(messages: object, match: str) -> None:
    with pytest.raises(PromptError, match=match):
        ChatTemplate(CHATML).render(messages)  # type: ignore[arg-type]


def test_bad_tools_and_messages_unchanged() -> None:
    with pytest.raises(PromptError, match=r"tools\[0\]"):
        ChatTemplate(CHATML).render(USER, tools=["f"])  # type: ignore[list-item]
    msgs = [{"role": "user", "content": "a", "extra": [1]}]
    ChatTemplate("{{ messages[0].extra }}").render(msgs)
    assert msgs == [{"role": "user", "content": "a", "extra": [1]}]


def test_missing_jinja2_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_sdk.errors import MissingDependencyError

    monkeypatch.setitem(__import__("sys").modules, "jinja2", None)  # `import jinja2` now fails
    with pytest.raises(MissingDependencyError, match=r"edge-sdk\[generate\]"):
        ChatTemplate(CHATML)
