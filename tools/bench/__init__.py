"""The benchmarks: ``python tools/bench/NAME.py ...`` from the repository root.

They may import ``tools.fixtures``; nothing in tests/ or samples/ imports them
(tests/test_layout.py checks it). A test that exercises a benchmark end to end runs it as a
script in a subprocess, the way a user does.
"""
