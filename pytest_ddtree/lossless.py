"""The lossless gate: greedy output under speculation must equal the non-speculative output.

Why: speculative decoding with exact verification is lossless by construction; a verify kernel
that accepts a draft token the target would not have produced (a bug, a numerics shortcut)
silently changes answers while looking faster.  Token ids are compared, not text, so a
difference that decodes to the same characters is still caught; the text is the fallback
when a service does not return ``output_ids``.

Prompts: every bundled coding prompt (``suites/coding/*.yaml``) plus the text prompts of
``suites/coding/lossless_prompts.yaml`` (``prompts: [{id, text}]``), sent raw to ``/generate``
with ``temperature: 0`` and ``max_new_tokens: 96`` (:data:`MAX_NEW_TOKENS`).

References (the profile's ``lossless`` key):
``instance`` - a second instance started with the profile's ``lossless_args`` (for the
    reference engine ``--speculative-algorithm NONE``); its outputs do not depend on the
    config, so they are fetched once per process and cached.
``golden`` - transcripts in ``baselines/<hardware>/golden/lossless-<prompt id>.json``, written
    by ``--ddtree-update-baselines`` from the config under test (bless them with a trusted,
    ideally non-speculative, config).  A transcript records a hash of its prompt and the token
    limit, so an edited prompt is reported as a stale transcript, not as a divergence.

No pytest import here; ``suites/test_lossless.py`` is the thin wrapper.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from pytest_ddtree import coding
from pytest_ddtree.atomicfile import write_atomic

__all__ = [
    "MAX_NEW_TOKENS",
    "Divergence",
    "LosslessError",
    "LosslessOutcome",
    "Prompt",
    "Transcript",
    "collect",
    "compare",
    "compare_all",
    "golden_path",
    "load_golden",
    "load_prompts",
    "write_golden",
]

MAX_NEW_TOKENS = 96
PROMPTS_FILE = "lossless_prompts.yaml"


class LosslessError(RuntimeError):
    """Prompts or golden transcripts cannot be used; the message says what to do."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    source: str  # "coding" | "text"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Transcript:
    prompt_id: str
    text: str
    output_ids: tuple[int, ...] | None
    finish_reason: Any = None
    prompt_sha256: str = ""
    max_new_tokens: int = MAX_NEW_TOKENS
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["output_ids"] = list(self.output_ids) if self.output_ids is not None else None
        return data


class GenerateClient(Protocol):
    def generate(self, text: str | None = ..., input_ids: Sequence[int] | None = ..., sampling_params: Mapping[str, Any] | None = ..., timeout: float | None = ..., **extra: Any) -> dict[str, Any]: ...


# --------------------------------------------------------------------------- prompts


def load_prompts(directory: Path | None = None) -> list[Prompt]:
    """Coding prompts (as the coding gate sends them) then the extra text prompts."""
    directory = directory or coding.problems_dir()
    prompts = [Prompt(f"coding:{p.id}", coding.user_message(p), "coding") for p in coding.load_problems(directory)]
    path = directory / PROMPTS_FILE
    if path.exists():
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise LosslessError(f"{path}: invalid YAML: {exc}") from None
        items = raw.get("prompts") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            raise LosslessError(f"{path}: expected a top-level key 'prompts' holding a list of {{id, text}}")
        seen = {p.id for p in prompts}
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("text"), str) or not item["text"]:
                raise LosslessError(f"{path}: prompts[{i}] needs string keys 'id' and 'text'")
            pid = f"text:{item['id']}"
            if pid in seen:
                raise LosslessError(f"{path}: prompts[{i}]: duplicate id {item['id']!r}")
            seen.add(pid)
            prompts.append(Prompt(pid, item["text"], "text"))
    return prompts


# --------------------------------------------------------------------------- collecting


def _transcript(prompt: Prompt, result: Mapping[str, Any], max_new_tokens: int) -> Transcript:
    ids = result.get("output_ids")
    output_ids = tuple(int(t) for t in ids) if isinstance(ids, list) else None
    meta = result.get("meta_info") or {}
    return Transcript(prompt.id, str(result.get("text") or ""), output_ids, meta.get("finish_reason"), prompt.sha256, max_new_tokens)


def generate_one(client: GenerateClient, prompt: Prompt, max_new_tokens: int = MAX_NEW_TOKENS, timeout: float | None = 300.0) -> Transcript:
    """One greedy generation; a failed request becomes a transcript with ``error`` set."""
    try:
        result = client.generate(text=prompt.text, sampling_params={"max_new_tokens": max_new_tokens, "temperature": 0.0}, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported as the prompt's failure
        return Transcript(prompt.id, "", None, None, prompt.sha256, max_new_tokens, f"{type(exc).__name__}: {exc}")
    return _transcript(prompt, result, max_new_tokens)


def collect(client: GenerateClient, prompts: Sequence[Prompt], max_new_tokens: int = MAX_NEW_TOKENS, workers: int = 8) -> dict[str, Transcript]:
    """Greedy transcripts of all prompts, requested with bounded concurrency."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda p: generate_one(client, p, max_new_tokens), prompts))
    return {t.prompt_id: t for t in results}


_ref_lock = threading.Lock()
_ref_cache: dict[tuple[str, str, int], Transcript] = {}


def collect_cached(key: str, client: GenerateClient, prompts: Sequence[Prompt], max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, Transcript]:
    """:func:`collect` memoized per (key, prompt, limit): the non-speculative reference does
    not depend on the config under test, so a sweep asks it once.  Errors are not cached."""
    with _ref_lock:
        have = {p.id: _ref_cache[(key, p.sha256, max_new_tokens)] for p in prompts if (key, p.sha256, max_new_tokens) in _ref_cache}
    missing = [p for p in prompts if p.id not in have]
    fresh = collect(client, missing, max_new_tokens) if missing else {}
    with _ref_lock:
        for p in missing:
            t = fresh[p.id]
            if not t.error:
                _ref_cache[(key, p.sha256, max_new_tokens)] = t
    return {**have, **fresh}


# --------------------------------------------------------------------------- golden


def golden_path(golden_dir: Path, prompt_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in prompt_id)
    return golden_dir / f"lossless-{safe}.json"


def write_golden(golden_dir: Path, transcripts: Mapping[str, Transcript]) -> list[Path]:
    """One JSON file per prompt, written atomically (readers never see half a file)."""
    golden_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for pid, t in sorted(transcripts.items()):
        if t.error:
            continue
        path = golden_path(golden_dir, pid)
        write_atomic(path, json.dumps(t.to_json(), sort_keys=True, indent=1) + "\n")
        written.append(path)
    return written


def load_golden(golden_dir: Path, prompts: Sequence[Prompt], create_command: str, max_new_tokens: int = MAX_NEW_TOKENS) -> tuple[dict[str, Transcript], list[str]]:
    """Golden transcripts by prompt id, and the prompts without a usable one (missing or
    stale), each with the reason.  A corrupt file raises :class:`LosslessError`."""
    found: dict[str, Transcript] = {}
    problems: list[str] = []
    for p in prompts:
        path = golden_path(golden_dir, p.id)
        if not path.exists():
            problems.append(f"{p.id}: no golden transcript {path}")
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ids = data.get("output_ids")
            t = Transcript(
                str(data["prompt_id"]), str(data.get("text") or ""),
                tuple(int(x) for x in ids) if isinstance(ids, list) else None,
                data.get("finish_reason"), str(data.get("prompt_sha256", "")), int(data.get("max_new_tokens", MAX_NEW_TOKENS)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LosslessError(f"corrupt golden transcript {path}: {type(exc).__name__}: {exc}. Delete it and re-create with: {create_command}") from None
        if t.prompt_sha256 != p.sha256 or t.max_new_tokens != max_new_tokens:
            problems.append(f"{p.id}: golden transcript {path} is stale (prompt or token limit changed); re-create with: {create_command}")
            continue
        found[p.id] = t
    return found, problems


# --------------------------------------------------------------------------- comparing


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    position: int  # token index (or character index when compared by text)
    unit: str  # "token" | "char" | "request"
    reference: str  # the reference continuation from the divergence on
    got: str
    detail: str = ""

    def describe(self) -> str:
        if self.unit == "request":
            return f"{self.prompt_id}: {self.detail}"
        return (
            f"{self.prompt_id}: first divergence at {self.unit} {self.position}{(' (' + self.detail + ')') if self.detail else ''}\n"
            f"    reference: {self.reference!r}\n"
            f"    got:       {self.got!r}"
        )


def _first_diff(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _char_offset(ids: Sequence[int], text: str, index: int) -> int:
    """Approximate character offset of token ``index`` (proportional; exact needs a tokenizer)."""
    if not ids:
        return 0
    return min(len(text), round(len(text) * index / len(ids)))


def compare(reference: Transcript, got: Transcript, context: int = 60) -> Divergence | None:
    """None when equal; else where they diverge, with both continuations."""
    if reference.error or got.error:
        which = "reference" if reference.error else "config under test"
        return Divergence(got.prompt_id, 0, "request", "", "", f"the {which} request failed: {reference.error or got.error}")
    if reference.output_ids is not None and got.output_ids is not None:
        pos = _first_diff(reference.output_ids, got.output_ids)
        if pos is None:
            return None
        # the text continuations from the first differing character near the divergence
        cpos = _first_diff(reference.text, got.text)
        start = cpos if cpos is not None else _char_offset(reference.output_ids, reference.text, pos)
        ref_id = reference.output_ids[pos] if pos < len(reference.output_ids) else "end"
        got_id = got.output_ids[pos] if pos < len(got.output_ids) else "end"
        detail = f"reference token {ref_id}, got {got_id}; lengths {len(reference.output_ids)} vs {len(got.output_ids)}"
        return Divergence(got.prompt_id, pos, "token", reference.text[start:start + context], got.text[start:start + context], detail)
    cpos = _first_diff(reference.text, got.text)
    if cpos is None:
        return None
    return Divergence(got.prompt_id, cpos, "char", reference.text[cpos:cpos + context], got.text[cpos:cpos + context], "compared as text: no output_ids")


@dataclass(frozen=True)
class LosslessOutcome:
    passed: bool
    compared: int
    divergences: tuple[Divergence, ...]
    missing: tuple[str, ...] = ()
    message: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "compared": self.compared,
            "diverged": [asdict(d) for d in self.divergences],
            "missing": list(self.missing),
        }


def compare_all(reference: Mapping[str, Transcript], got: Mapping[str, Transcript], missing: Sequence[str] = ()) -> LosslessOutcome:
    """Compare every prompt that has a reference; ``missing`` lists prompts without one."""
    divergences = []
    compared = 0
    for pid in sorted(got):
        if pid not in reference:
            continue
        compared += 1
        d = compare(reference[pid], got[pid])
        if d is not None:
            divergences.append(d)
    lines = [f"lossless: {compared - len(divergences)}/{compared} prompts identical to the non-speculative reference"]
    if divergences:
        lines.append("DIVERGED (speculation changed the greedy output):")
        lines += [d.describe() for d in divergences]
    if missing:
        lines.append("without a reference: " + "; ".join(missing))
    return LosslessOutcome(not divergences and compared > 0, compared, tuple(divergences), tuple(missing), "\n".join(lines))
