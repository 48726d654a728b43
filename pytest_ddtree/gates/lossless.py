"""The lossless gate: greedy output under speculation must equal the non-speculative output.

Why: speculative decoding with exact verification is lossless by construction; a verify kernel
that accepts a draft token the target would not have produced (a bug, a numerics shortcut)
silently changes answers while looking faster.  Token ids are compared, not text, so a
difference that decodes to the same characters is still caught; the text is the fallback
when a service does not return ``output_ids``.

Prompts: every bundled coding prompt (``suites/coding/*.yaml``) plus the text prompts of
``suites/coding/lossless_prompts.yaml`` (``prompts: [{id, text}]``), sent raw to ``/generate``
with ``temperature: 0`` and ``max_new_tokens: 96`` (:data:`MAX_NEW_TOKENS`).

The reference is always a launch with the profile's ``lossless_args`` (speculation off), in the
instance's own slot (``ServiceManager.ensure_reference``: the instance lock and the GPU-memory
wait like any launch), measured once per process (:func:`measure_reference`):
``instance`` - measured live in every session.
``golden`` - read from ``baselines/<hardware>/golden/`` (``reference.json`` plus
    ``lossless-<prompt id>.json``), for services the harness cannot launch. Blessed by
    ``--ddtree-update-baselines``: the workers measure the reference launch and propose it, and
    the controller writes it once per hardware profile (:func:`write_golden`). The config under
    test never writes transcripts, so a lossy build cannot bless itself. A transcript records a
    hash of its prompt and the token limit, so an edited prompt is reported as stale.

The floor: on GPUs greedy output can differ between two non-speculative runs whose batches
differ (kernels are not batch-invariant). So the reference is generated twice, all prompts at
once and one at a time, and the divergences between the two are its floor. The config under
test must be exact where the service is deterministic (the reference engine, or SGLang with
``--enable-deterministic-inference``); elsewhere it must not diverge on more prompts, nor at an
earlier token, than the floor (a floor without divergences means exact).

No pytest import here; ``suites/test_lossless.py`` is the thin wrapper.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from pytest_ddtree.gates import coding_problems
from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.records.shapes import FloorData, LosslessOutcomeData

if TYPE_CHECKING:
    from pytest_ddtree.baselines import BaselineStore
    from pytest_ddtree.options import Settings
    from pytest_ddtree.records.recorder import SessionRecorder
    from pytest_ddtree.service.manager import ServiceManager
    from pytest_ddtree.service.profile import ServiceProfile

__all__ = [
    "MAX_NEW_TOKENS",
    "Divergence",
    "LosslessError",
    "LosslessOutcome",
    "Prompt",
    "Transcript",
    "Floor",
    "Reference",
    "collect",
    "compare",
    "deterministic_hint",
    "exact_reason",
    "judge",
    "load_golden_reference",
    "measure_reference",
    "golden_path",
    "load_golden",
    "load_prompts",
    "write_golden",
]

MAX_NEW_TOKENS = 96
GOLDEN_REFERENCE = "reference.json"
GOLDEN_SECTION = "lossless-golden"
"""The baseline-update section under which workers propose a measured reference for golden/."""
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
    directory = directory or coding_problems.problems_dir()
    prompts = [Prompt(f"coding:{p.id}", coding_problems.user_message(p), "coding") for p in coding_problems.load_problems(directory)]
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


def _invalid(result: Any) -> str | None:
    """What is malformed in a ``/generate`` answer (SGLang's ``GenerateReqInput`` reply:
    ``text``, ``output_ids``, ``meta_info``), or None.  The body is the service's: a wrong
    type is that prompt's failure, never an exception out of the gate."""
    if not isinstance(result, Mapping):
        return f"the body is a {type(result).__name__}, not an object"
    text = result.get("text")
    if text is not None and not isinstance(text, str):
        return f"'text' is a {type(text).__name__}, not a string"
    ids = result.get("output_ids")
    if ids is not None and (not isinstance(ids, list) or not all(type(t) is int for t in ids)):
        return "'output_ids' is not a list of token ids"
    meta = result.get("meta_info")
    if meta is not None and not isinstance(meta, Mapping):
        return f"'meta_info' is a {type(meta).__name__}, not an object"
    return None


def _transcript(prompt: Prompt, result: Mapping[str, Any], max_new_tokens: int) -> Transcript:
    why = _invalid(result)
    if why is not None:
        return Transcript(prompt.id, "", None, None, prompt.sha256, max_new_tokens, f"invalid response: {why}")
    ids = result.get("output_ids")
    output_ids = tuple(ids) if isinstance(ids, list) else None
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


# --------------------------------------------------------------------------- golden


def golden_path(golden_dir: Path, prompt_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in prompt_id)
    return golden_dir / f"lossless-{safe}.json"


def write_golden(golden_dir: Path, blessed: Mapping[str, Any]) -> list[Path]:
    """Write a proposed reference (:meth:`Reference.golden_payload`): ``reference.json`` (the
    launch it came from and its floor) and one file per prompt, each replaced atomically."""
    golden_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for pid, data in sorted(blessed["transcripts"].items()):
        path = golden_path(golden_dir, pid)
        write_atomic(path, json.dumps(data, sort_keys=True, indent=1) + "\n")
        written.append(path)
    meta = {key: blessed[key] for key in ("command", "floor", "session", "written_at")}
    path = golden_dir / GOLDEN_REFERENCE
    write_atomic(path, json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return [path, *written]


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

    def to_record(self) -> LosslessOutcomeData:
        return {
            "passed": self.passed,
            "compared": self.compared,
            "diverged": [{"prompt_id": d.prompt_id, "position": d.position, "unit": d.unit, "reference": d.reference,
                          "got": d.got, "detail": d.detail} for d in self.divergences],
            "missing": list(self.missing),
        }


# --------------------------------------------------------------------------- reference and floor


@dataclass(frozen=True)
class Floor:
    """How far a non-speculative launch disagrees with itself between two batch compositions."""

    compared: int
    diverged: int
    earliest: int | None  # earliest diverging token among them (None: no divergence)
    batch_sizes: tuple[int, int] = (1, 1)

    def describe(self) -> str:
        runs = f"the same prompts at batch {self.batch_sizes[0]} and at batch {self.batch_sizes[1]}"
        if not self.diverged:
            return f"floor: 0/{self.compared} prompts differ between {runs}"
        return f"floor: {self.diverged}/{self.compared} prompts differ between {runs}, the earliest at token {self.earliest}"

    def to_json(self) -> FloorData:
        return {"compared": self.compared, "diverged": self.diverged, "earliest": self.earliest, "batch_sizes": list(self.batch_sizes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Floor:
        sizes = data.get("batch_sizes") or (1, 1)
        earliest = data.get("earliest")
        return cls(int(data["compared"]), int(data["diverged"]), None if earliest is None else int(earliest), (int(sizes[0]), int(sizes[1])))


@dataclass(frozen=True)
class Reference:
    """The non-speculative transcripts a config is judged against, where they came from, and
    their floor."""

    transcripts: Mapping[str, Transcript]
    floor: Floor
    source: str  # named in every message: which launch, live or golden
    command: str = ""
    missing: tuple[str, ...] = ()

    def golden_payload(self, session: str) -> dict[str, Any]:
        """What a worker proposes for ``golden/`` (plain JSON: it travels through workeroutput)."""
        return {
            "transcripts": {pid: t.to_json() for pid, t in self.transcripts.items()},
            "floor": self.floor.to_json(),
            "command": self.command,
            "session": session,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def measure_reference(client: GenerateClient, prompts: Sequence[Prompt], command: str, max_new_tokens: int = MAX_NEW_TOKENS) -> Reference:
    """Generate every prompt on the reference launch twice: all at once, then one at a time.

    The one-at-a-time transcripts are the reference (no batch neighbours); their differences
    from the batched run are the floor. A failed request means no reference at all.
    """
    batched = collect(client, prompts, max_new_tokens, workers=max(1, len(prompts)))
    single = collect(client, prompts, max_new_tokens, workers=1)
    failed = [f"{t.prompt_id}: {t.error}" for t in (*batched.values(), *single.values()) if t.error]
    if failed:
        raise LosslessError("the non-speculative reference launch failed requests: " + "; ".join(failed[:5]))
    positions = [d.position for p in prompts if (d := compare(single[p.id], batched[p.id])) is not None]
    floor = Floor(len(prompts), len(positions), min(positions) if positions else None, (1, len(prompts)))
    return Reference(single, floor, f"a launch with lossless_args, measured now: {command}", command)


class ReferenceUnavailable(RuntimeError):
    """The non-speculative reference could not be launched or measured (the message says why)."""


def launches_reference(profile: ServiceProfile, settings: Settings) -> bool:
    """Whether this session launches the reference (``lossless: instance``, or a bless, which writes
    ``golden/`` from it) rather than reading the blessed golden transcripts. A bless of a service the
    harness cannot launch (``--ddtree-url``, a pool of URLs) reads them too: its gate skips with how to
    write them (:func:`golden_bless_command`) instead of erroring on a launch it cannot make. A
    measure-only session judges nothing, so launches none."""
    if settings.measure_only:
        return False
    if profile.lossless == "instance":
        return True
    return bool(settings.update_baselines) and profile.launches_itself()


#: The reference engine's shipped profile, and the copy of it that blesses golden transcripts.
ENGINE_PROFILE = "suites/services/reference.yaml"
ENGINE_GOLDEN_PROFILE = "/tmp/reference-golden.yaml"


def golden_bless_command(profile: ServiceProfile, create_command: str, server_info: Mapping[str, object]) -> str:
    """The command that writes this session's golden transcripts, as it can be run from a checkout.

    ``create_command`` is the session's own bless command for the lossless suite; it writes them where
    the profile launches its reference. A service the harness cannot launch (``--ddtree-url``) cannot
    bless its own: the reference engine's are written by a copy of its shipped profile in golden mode
    (into the same ``refserver`` folder: the engine's plain output does not depend on how it was started),
    any other service's by a profile that launches that deployment, named as a placeholder."""
    import shlex

    from pytest_ddtree.service.fingerprint import is_reference_engine

    if profile.launches_itself():
        return create_command
    words = [w for w in shlex.split(create_command) if not w.startswith(("--ddtree-url=", "--ddtree-service="))]
    at = words.index("--ddtree-update-baselines") + 1
    if is_reference_engine(server_info):
        words.insert(at, f"--ddtree-service={ENGINE_GOLDEN_PROFILE}")
        return (f"sed 's/^lossless: instance$/lossless: golden/' {ENGINE_PROFILE} > {ENGINE_GOLDEN_PROFILE} && "
                f"{shlex.join(words)}")
    words.insert(at, "--ddtree-service=PROFILE.yaml")
    return (f"{shlex.join(words)} (this service was not started by the harness, so it cannot launch its plain reference: "
            "PROFILE.yaml is a profile that launches this deployment, with lossless: golden; docs/gates/lossless.md)")


def session_reference(manager: ServiceManager, recorder: SessionRecorder, session_id: str,
                      bless_golden: Callable[[Mapping[str, object]], BaselineStore] | None = None) -> Reference:
    """The session's non-speculative reference: the profile's ``lossless_args`` launched in this
    instance's slot (``manager``), every prompt generated (:func:`measure_reference`), recorded; with
    ``bless_golden`` (golden mode with ``--ddtree-update-baselines``: the session's baseline store for a
    ``/server_info``, whose hardware profile the proposal is filed under) also proposed for ``golden/``
    (the main process writes it once per hardware profile)."""
    from pytest_ddtree.service.base import ServiceError
    from pytest_ddtree.records.shapes import LosslessReferenceData
    from pytest_ddtree.records.words import RecordKind

    try:
        service = manager.ensure_reference()
        begin = time.monotonic()
        reference = measure_reference(service.client, load_prompts(), service.launch_command or "")
        measured_s = time.monotonic() - begin
    except (ServiceError, LosslessError) as exc:
        raise ReferenceUnavailable(f"the non-speculative reference (lossless_args) is not available: {exc}") from None
    if bless_golden is not None:
        if recorder.hardware_profile is None:
            recorder.hardware_profile = bless_golden(service.server_info).hardware_profile
        recorder.propose_baseline("", GOLDEN_SECTION, reference.golden_payload(session_id))
    measured: LosslessReferenceData = {"command": reference.command, "floor": reference.floor.to_json(),
                                       "measured_s": round(measured_s, 3)}
    recorder.record(RecordKind.LOSSLESS_REFERENCE, None, measured)
    return reference


def load_golden_reference(golden_dir: Path, prompts: Sequence[Prompt], create_command: str, max_new_tokens: int = MAX_NEW_TOKENS) -> Reference:
    """The blessed reference of ``golden/``; transcripts without ``reference.json`` (written by an
    older harness from a config under test, possibly speculative) are not trusted."""
    meta_path = golden_dir / GOLDEN_REFERENCE
    if not meta_path.exists():
        problems = [f"{golden_dir}: no {GOLDEN_REFERENCE}, so these transcripts were not written from a non-speculative "
                    f"launch; re-bless with: {create_command}"]
        return Reference({}, Floor(0, 0, None), f"golden transcripts in {golden_dir}", missing=tuple(problems))
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        floor = Floor.from_json(meta["floor"])
        command = str(meta["command"])
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise LosslessError(f"corrupt {meta_path}: {type(exc).__name__}: {exc}. Re-bless with: {create_command}") from None
    found, problems = load_golden(golden_dir, prompts, create_command, max_new_tokens)
    written = meta.get("written_at", "?")
    source = f"golden transcripts in {golden_dir}, blessed {written} from a launch with lossless_args: {command}"
    return Reference(found, floor, source, command, tuple(problems))


def exact_reason(server_info: Mapping[str, object]) -> str | None:
    """Why this service must match the reference exactly (None: judge against the floor)."""
    if str(server_info.get("version", "")).startswith("refserver"):
        return "the reference engine is deterministic"
    if server_info.get("enable_deterministic_inference") is True:
        return "SGLang's deterministic inference is on (--enable-deterministic-inference)"
    return None


def deterministic_hint(server_info: Mapping[str, object]) -> str:
    """Where the build offers deterministic inference but it is off: how to get an exact check."""
    if server_info.get("enable_deterministic_inference") is False:
        return ("note: this build has --enable-deterministic-inference; a service started with it is held to "
                "an identical output instead of the floor")
    return ""


def judge(reference: Reference, got: Mapping[str, Transcript], exact: str | None, hint: str = "") -> LosslessOutcome:
    """Compare every prompt that has a reference transcript, then apply the rule: exact where
    ``exact`` says why, else no more diverging prompts and no earlier divergence than the floor."""
    divergences = [d for pid in sorted(got) if pid in reference.transcripts and (d := compare(reference.transcripts[pid], got[pid])) is not None]
    compared = sum(1 for pid in got if pid in reference.transcripts)
    floor = reference.floor
    earliest = min((d.position for d in divergences), default=None)
    requests_failed = any(d.unit == "request" for d in divergences)
    if exact is not None or not floor.diverged:
        rule = f"rule: identical ({exact or 'the reference has no divergence floor'})"
        passed = not divergences
    else:
        rule = "rule: no more diverging prompts than the floor, and none earlier than its earliest" + (f"\n{hint}" if hint else "")
        passed = not requests_failed and len(divergences) <= floor.diverged and (earliest is None or earliest >= (floor.earliest or 0))
    passed = passed and compared > 0
    lines = [
        f"lossless: {compared - len(divergences)}/{compared} prompts identical to the non-speculative reference",
        f"reference: {reference.source}",
        floor.describe(),
        rule,
    ]
    if divergences:
        head = "DIVERGED (speculation changed the greedy output):" if not passed else "diverged within the floor:"
        lines.append(head)
        lines += [d.describe() for d in divergences]
    if reference.missing:
        lines.append("without a reference: " + "; ".join(reference.missing))
    return LosslessOutcome(passed, compared, tuple(divergences), reference.missing, "\n".join(lines))
