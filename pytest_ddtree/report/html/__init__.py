"""The session's ``report.html``: one self-contained page (data, styles, chart runtime inline).

Why one file with everything inline: it is opened from disk, attached to a CI run or copied off
a GPU box that has no network, so it may not fetch anything. It is rendered from the same
payload as ``results.json`` (plus a live status while the session runs) by a Jinja2 template;
the charts are Plotly figures drawn by the vendored plotly.js basic bundle (see charts.py);
every figure is in a table too, so a page without charts would still say it all.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ddtree.metrics import OUTPUT_THROUGHPUT, PER_REQUEST_OUTPUT_THROUGHPUT
from pytest_ddtree.report import text as report
from pytest_ddtree.report.html import charts, model
from pytest_ddtree.atomicfile import write_atomic
from pytest_ddtree.records.shapes import RawRecord, screen
from pytest_ddtree.records.recorder import RESULTS_JSON, read_records
from pytest_ddtree.records.words import RecordKind

REPORT_HTML = "report.html"
#: How often a page of a running session reloads itself.
REFRESH_S = 10
#: How often the session's process touches its running page (``live.Heartbeat``), and how old the
#: page's modification time may be before the page says the session stopped and reloads no more: a
#: killed session (kill -9, a lost node) leaves a page that would otherwise say "running" for ever.
HEARTBEAT_S = REFRESH_S
STALE_S = 6 * REFRESH_S


@dataclass
class LiveStatus:
    """Where a session stands; ``state`` is "running" or "finished"."""

    state: str = "finished"
    done: int = 0
    total: int = 0
    started_at: float | None = None
    eta: float | None = None
    current: list[str] = field(default_factory=list)
    planned: list[str] = field(default_factory=list)
    updated_at: float = field(default_factory=time.time)
    #: the process that writes (and keeps touching) the running page, and its host
    writer: str = field(default_factory=lambda: f"pid {os.getpid()} on {socket.gethostname()}")

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state, "done": self.done, "total": self.total, "current": self.current, "writer": self.writer,
            "started_at_text": model.fmt_time(self.started_at), "eta_text": model.fmt_time(self.eta) if self.eta else "",
            "updated_at_text": model.fmt_time(self.updated_at),
        }


def template(name: str = "report.html.j2") -> Any:
    """One of the package's Jinja2 templates (autoescaped; an undefined name is an error)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pytest_ddtree.report.html", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(name)


def environment_rows(payload: Mapping[str, Any]) -> list[tuple[str, str]]:
    env = payload.get("environment")
    if not isinstance(env, Mapping):
        return []
    rows = []
    for key, value in env.items():
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value) or "-"
        elif isinstance(value, Mapping):
            value = "; ".join(f"{k}: {v}" for k, v in value.items()) or "-"
        rows.append((str(key), "not recorded" if value in (None, "") else str(value)))
    return rows


def collect_environment(service: str | None = None, configs: Sequence[str] = (), results: Path | None = None) -> dict[str, Any]:
    """The facts a reader needs to trust the numbers: machine, GPUs, package; with a session's
    ``service`` (its profile, as :func:`live.start_report` names it), also its configs and results folder."""
    import pytest_ddtree
    from pytest_ddtree.repro.envsnap import nvml_snapshot

    nvml = nvml_snapshot()
    gpus = [f"{g.get('name')} ({(g.get('memory_total_bytes') or 0) / 2**30:.0f} GiB)" for g in nvml.get("gpus") or []]
    env: dict[str, Any] = {
        "package": f"pytest-ddtree {pytest_ddtree.__version__} at {Path(pytest_ddtree.__file__).parent}",
        "python": f"{platform.python_version()} ({sys.executable})",
        "host": f"{platform.node()} ({platform.system()} {platform.release()}, {os.cpu_count()} CPUs)",
        "GPUs": gpus or (nvml.get("error") or "none"),
        "NVIDIA driver": nvml.get("driver_version"),
        "CUDA driver": nvml.get("cuda_driver_version"),
    }
    if service is not None:
        env["service profile"] = service
        env["configs"] = list(configs)
    if results is not None:
        env["results"] = str(results)
    return env


def _engine_facts(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Hardware profile and launch commands, from the records (they name the engine build)."""
    facts: dict[str, Any] = {}
    profiles = sorted({str(c.get("hardware_profile")) for c in payload.get("throughput") or []
                       if isinstance(c, Mapping) and c.get("hardware_profile")})
    if profiles:
        facts["hardware profile (baselines folder)"] = profiles
    launches = [model.launch_entry(r) for r in model.records(payload, RecordKind.LAUNCH)]
    versions = sorted({str(v) for launch in launches if (v := launch.get("engine_version"))})
    facts["engine version (/server_info)"] = versions or "not recorded"
    commands = [launch.get("command") for launch in launches]
    if commands and commands[0]:
        facts["engine command (first launch)"] = commands[0]
    return facts


def build_html(
    payload: Mapping[str, Any],
    *,
    live: LiveStatus | None = None,
    other: Mapping[str, Any] | None = None,
    other_label: str = "",
    source: str = "",
) -> str:
    """The page for ``payload`` (results.json's shape); ``other`` adds the comparison section."""
    live = live or LiveStatus(state="finished")
    if live.started_at is None:  # a rebuilt page: the session began with its first record
        times = [float(r["time"]) for r in payload.get("records") or [] if isinstance(r, Mapping) and model.is_number(r.get("time"))]
        live.started_at = min(times) if times else None
    cells = model.cells(payload)
    gate_rows = model.gates(payload, planned=live.planned)
    if not live.total:
        live.total = len(gate_rows)
    recommendations = [str(r) for r in payload.get("recommendations") or []]
    environment = dict(payload.get("environment") or {}) if isinstance(payload.get("environment"), Mapping) else {}
    environment.update(_engine_facts(payload))
    lossless = model.records(payload, RecordKind.LOSSLESS)
    return str(template().render(
        live=live.view(),
        refresh_s=REFRESH_S,
        stale_s=STALE_S,
        overall=model.overall(gate_rows, measure_only=payload.get("measure_only") is True, running=live.state == "running"),
        measure_only=payload.get("measure_only") is True,
        source=source,
        gate_names=model.GATES,
        gates=gate_rows,
        recommendations=recommendations,
        control=payload.get("control") if isinstance(payload.get("control"), Mapping) else None,
        **_charts(payload, cells),
        depth_cells=[c for c in cells if c.acceptance_by_depth and not c.predicted],
        # the recommendation's own sentence, not one worked out again from other cells: the page says one thing
        drafter_bound=[r for r in recommendations if r.startswith(report.DRAFTER_BOUND_LINE)],
        cells=cells,
        columns=model.CELL_COLUMNS,
        coding=model.coding_grid(payload),
        divergences=model.divergences(payload),
        lossless_measured=bool(lossless),
        timeline=model.timeline(payload),
        bill=payload.get("bill") if isinstance(payload.get("bill"), Mapping) else None,
        comparison=model.compare_sessions(payload, other) if other is not None else None, other_label=other_label,
        environment=environment_rows({"environment": environment}),
        fmt=model.fmt, fmt_pct=model.fmt_pct, fmt_time=model.fmt_time, ctx=report._ctx, is_number=model.is_number,
    ))



def _charts(payload: Mapping[str, Any], cells: list[model.CellRow]) -> dict[str, Any]:
    """The page's charts, as the template's variables: each figure once in one JSON blob the page's
    script draws from, and the panels that place them. Without the plotly runtime the page still
    says which charts there would be (and why there are none), so the panels come back either way."""
    runtime = charts.plotly_runtime()
    figures: dict[str, Any] = {}
    output_panels = charts.sweep_panels(cells, OUTPUT_THROUGHPUT, "output tok/s")
    request_panels = charts.sweep_panels(cells, PER_REQUEST_OUTPUT_THROUGHPUT, "tok/s per request (median)")
    pareto_panels = charts.pareto_panels(cells)
    for p in output_panels + request_panels + pareto_panels:
        figures[p["id"]] = p["figure"]
    acceptance = charts.acceptance_figure(cells)
    if acceptance:
        figures["acceptance"] = acceptance
    depth_panels = charts.depth_panels(cells)
    for p in depth_panels:
        figures[p["id"]] = p["figure"]
    speedup = charts.speedup_figure(cells, payload.get("control") if isinstance(payload.get("control"), Mapping) else None)
    if speedup:
        figures["acceptance-speedup"] = speedup
    repeat_charts = []
    for config in dict.fromkeys(c.config for c in cells):
        fig = charts.repeats_figure(config, cells)
        if fig:
            figure_id = f"repeats-{config}"
            figures[figure_id] = fig
            repeat_charts.append({"id": figure_id, "caption": f"{config}: output tok/s repeats / baseline median"})
    return {
        "charts_available": runtime is not None,
        "runtime_file": charts.RUNTIME_FILE,
        "plotly_js": (runtime or "").replace("</script", "<\\/script"),
        "figures_json": charts.figure_json(figures if runtime else {}),
        "output_panels": output_panels,
        "request_panels": request_panels,
        "pareto_panels": pareto_panels,
        "speedup": speedup,
        "acceptance": acceptance,
        "repeat_charts": repeat_charts,
        "depth_panels": depth_panels,
    }


def load_payload(results_dir: Path) -> dict[str, Any]:
    """results.json when the session finished; else the payload rebuilt from its records."""
    path = results_dir / RESULTS_JSON
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a results object")
        for key in ("records", "throughput_repeats"):  # records from a file: each checked (records.screen)
            if isinstance(data.get(key), list):
                data[key] = screen(r for r in data[key] if isinstance(r, dict))
        return data
    records = read_records(results_dir)
    if not records:
        raise FileNotFoundError(f"{results_dir}: neither {RESULTS_JSON} nor records-*.jsonl (is it a results folder?)")
    return payload_from_records(records)


def payload_from_records(records: Sequence[RawRecord], failed_tests: Sequence[Mapping[str, str]] = (),
                         environment: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """results.json's shape from raw records (what the page of a running session shows)."""
    payload = report.session_summary(records).json
    payload["failed_tests"] = [dict(f) for f in failed_tests]
    if environment is not None:
        payload["environment"] = dict(environment)
    return payload


def write_report(path: Path, payload: Mapping[str, Any], live: LiveStatus | None = None) -> Path:
    """Render and replace ``path`` atomically: a reader (a reloading browser) never sees half a page."""
    write_atomic(path, build_html(payload, live=live))
    return path
