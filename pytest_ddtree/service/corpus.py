"""The bundled texts (``pytest_ddtree/data/prompts``): real code and prose, read as units.

What the harness says to a service: the throughput prompts cut them to a cell's exact length
(``measure/prompts.py``), and the proof's copy probe repeats a passage the drafter can copy
(``service/proof.py``); so the texts sit with the service, below the measure.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

#: The bundled sources.
BUNDLED = ("coding", "chat", "documents")
#: What separates two units in a documents file, and two units joined into one prompt.
JOINER = "\n\n"


def _bundled_file(name: str) -> str:
    return resources.files("pytest_ddtree").joinpath("data").joinpath("prompts").joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def bundled_units(source: str) -> tuple[str, ...]:
    """The text units of a bundled source, in a fixed order."""
    if source in ("coding", "chat"):
        units = [json.loads(line)["prompt"] for line in _bundled_file(f"{source}.jsonl").splitlines() if line.strip()]
        return tuple(u for u in units if u.strip())
    if source == "documents":
        folder = resources.files("pytest_ddtree").joinpath("data").joinpath("prompts").joinpath("documents")
        blocks: list[str] = []
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".txt"):
                text = entry.read_text(encoding="utf-8")
                blocks.extend(b.strip("\n") for b in text.split(JOINER) if b.strip())
        return tuple(blocks)
    raise ValueError(f"unknown bundled text {source!r} (valid: {', '.join(BUNDLED)})")
