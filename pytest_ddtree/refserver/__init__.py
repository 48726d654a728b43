"""The embedded reference engine: an SGLang-compatible HTTP server with DFlash-style
block drafting, DDTree tree verification, corpus-built models and a simulated clock.

Run it with ``python -m pytest_ddtree.refserver --port P``; see README.md beside this
file. Modules: :mod:`.tokenizer` (tokens, chat template), :mod:`.model` (target and
drafter), :mod:`.ddtree` (tree build and verify), :mod:`.engine` (scheduler, clock,
accounting), :mod:`.server` (HTTP), :mod:`.faults`, :mod:`.cli`.
"""

from pytest_ddtree.refserver.engine import VERSION

__all__ = ["VERSION"]
