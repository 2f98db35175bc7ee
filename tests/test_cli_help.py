"""Both commands explain themselves: ``--version``, a help text for every option and argument,
and ``edge-convert --help`` without importing ONNX or ONNX Runtime."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from conftest import ROOT

from edge_sdk._version import __version__


def undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """``"<command path> <option or argument>"`` for every action without a help text, subcommands included."""
    out: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    out.append(f"{path} {name} (subcommand)")
                out += undocumented(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction) and not (action.help and action.help.strip()):
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def edge_convert_parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``converters.cli.main`` builds, taken at its ``parse_args`` call (main has no build_parser)."""
    import converters.cli

    seen: list[argparse.ArgumentParser] = []

    class Built(Exception):
        pass

    def capture(self: argparse.ArgumentParser, *a: object, **k: object) -> None:
        seen.append(self)
        raise Built

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Built):
        converters.cli.main(["verify", "x"])
    return seen[0]


def test_walker_finds_an_option_without_help() -> None:
    ap = argparse.ArgumentParser(prog="t")
    ap.add_argument("--ok", help="documented")
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("run", help="a command")
    p.add_argument("thing")
    sub.add_parser("bare")
    assert undocumented(ap, "t") == ["t run thing", "t bare (subcommand)"]


def test_every_edge_sdk_option_has_help() -> None:
    from edge_sdk.cli import build_parser

    parser = build_parser()
    assert undocumented(parser, "edge-sdk") == []
    # the walk reached the nested parsers (models install, bench, serve), not only the top
    walked = {a.dest for a in parser._actions}
    assert "cmd" in walked and "version" in walked


def test_every_edge_convert_option_has_help(monkeypatch: pytest.MonkeyPatch) -> None:
    assert undocumented(edge_convert_parser(monkeypatch), "edge-convert") == []


def test_edge_convert_parser_is_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = edge_convert_parser(monkeypatch)
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"package", "verify", "quantize", "validate", "inspect", "llm"} <= set(subs.choices)
    missing = undocumented(parser, "edge-convert")
    assert "edge-convert --version" not in missing  # the top-level --version added here is documented


@pytest.mark.parametrize(("module", "prog"), [("edge_sdk.cli", "edge-sdk"), ("converters.cli", "edge-convert")])
def test_version(module: str, prog: str) -> None:
    p = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"{prog} {__version__}"


def test_edge_convert_help_imports_no_runtime() -> None:
    """``edge-convert --help`` must not pay for ``import onnx`` / ``import onnxruntime`` (seconds on a small board)."""
    code = (
        "import sys, converters.cli as c\n"
        "try:\n"
        "    c.main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('LOADED', sorted(m for m in ('onnx', 'onnxruntime', 'onnx_ir') if m in sys.modules))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "usage: edge-convert" in p.stdout and "--version" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "LOADED []"
    # and a subcommand's help too
    code = code.replace("['--help']", "['quantize', '--help']")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "LOADED []", p.stdout + p.stderr


# --------------------------------------------------------------------------- errors name what they are about


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_sdk.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_missing_package_and_input_are_named(tmp_path) -> None:
    missing = tmp_path / "no-such-package"
    p = run_cli("inspect", str(missing))
    assert p.returncode == 1 and f"'{missing}' does not exist" in p.stderr and "ManifestError" in p.stderr
    from edge_sdk.assets import demo_package_path

    image = tmp_path / "no-such-image.png"
    p = run_cli("predict", str(demo_package_path()), str(image))
    assert p.returncode == 1 and f"input file '{image}' does not exist" in p.stderr
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image at all")
    p = run_cli("predict", str(demo_package_path()), str(bad))
    assert p.returncode == 1 and "ImageError" in p.stderr and f"image file '{bad}'" in p.stderr


def test_monitor_url_errors_name_the_url() -> None:
    import http.server
    import socket
    import threading

    p = run_cli("monitor", "--url", "127.0.0.1:9100/metrics", "--count", "1")
    assert p.returncode == 1 and "OptionsError" in p.stderr and "'127.0.0.1:9100/metrics'" in p.stderr and "http://" in p.stderr

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"
    p = run_cli("monitor", "--url", closed, "--count", "1")
    assert p.returncode == 1 and f"ConnectionError: --url {closed}: cannot connect" in p.stderr

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_error(404, "no metrics here")

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/wrong"
        p = run_cli("monitor", "--url", url, "--count", "1")
        assert p.returncode == 1 and f"--url {url}: HTTP 404" in p.stderr
    finally:
        server.shutdown()
        server.server_close()
