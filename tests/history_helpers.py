"""A synthetic history: sessions of known builds with known changes, for the history tests and
the history page's screenshot (benchmarks/history_screenshot.py)."""

from __future__ import annotations

import math
import random
from pathlib import Path

from pytest_ddtree.report.history import Build, CellEntry, HistoryStore, SessionEntry

SESSIONS = 60
STEP_AT = 40
STEP = -0.04
CREEP_PER_SESSION = -0.001  # 1% per 10 sessions
NOISE = 0.01  # of each repeat (log sd)
REPEATS = 3
#: config -> what happens to its output tok/s over the sessions
CONFIGS = {"bs8_b8_k4": "step", "bs8_b16_k4": "creep", "bs4_b8_k2": "flat"}
CELLS = {"c1_short": 900.0, "c8_4k": 2400.0}


def level(kind: str, session: int) -> float:
    if kind == "step":
        return 1.0 + (STEP if session >= STEP_AT else 0.0)
    if kind == "creep":
        return 1.0 + CREEP_PER_SESSION * session
    return 1.0


def synthetic_session(index: int, seed: int = 7, results_root: Path | None = None) -> tuple[SessionEntry, list[CellEntry]]:
    """Session ``index`` (0-based) of the synthetic history; the cell c8_4k changes, c1_short stays level."""
    rng = random.Random(seed * 1000 + index)
    cells = []
    for config, kind in CONFIGS.items():
        for cell, base in CELLS.items():
            factor = level(kind, index) if cell == "c8_4k" else 1.0
            samples = [base * factor * math.exp(rng.gauss(0.0, NOISE)) for _ in range(REPEATS)]
            accept = [4.2 * math.exp(rng.gauss(0.0, NOISE / 3)) for _ in range(REPEATS)]
            cells.append(CellEntry(config=config, cell=cell, hardware_profile="refserver", host="ci-1", status="pass",
                                   measurement_status="valid",
                                   samples={"output_throughput": samples, "ddtree_tokens_per_verify": accept},
                                   verdicts={"output_throughput": {"status": "pass", "change": 0.0, "message": ""}}))
    sid = f"20261001T{index:04d}00Z-s{index:02d}"
    results_dir = results_root / sid if results_root is not None else None
    report = None
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / "report.html").write_text(f"<html><body>session {sid}</body></html>")
        report = str(results_dir / "report.html")
    build = Build(engine_version="0.5.3", engine_build=f"commit {index:04x}{'ab' * 18}", project_commit=f"{index:02x}{'c0ffee' * 6}")
    return SessionEntry(session_id=sid, started_at=1.76e9 + index * 86400.0, host="ci-1", build=build,
                        results_dir=str(results_dir) if results_dir else None, report_path=report, exit_status=0), cells


def write_synthetic_history(url: str, sessions: int = SESSIONS, results_root: Path | None = None) -> None:
    with HistoryStore(url) as store:
        for index in range(sessions):
            store.append(*synthetic_session(index, results_root=results_root))


def write_build_history(url: str, sessions: int = 16, step_at: int = 11, step: float = -0.05, day: float = 0.01,
                        seed: int = 3) -> None:
    """A history where a whole build changes: from session ``step_at`` on every series, the control's
    included, moves by ``step`` (a slower engine build), each session with its own day shift."""
    from pytest_ddtree.gates.throughput.baseline import CONTROL
    from pytest_ddtree.report.history import ROLE_CONTROL

    rng = random.Random(seed)
    with HistoryStore(url) as store:
        for index in range(sessions):
            factor = math.exp(rng.gauss(0.0, day)) * (1.0 + (step if index >= step_at else 0.0))
            cells = []
            for config, base in (("bs8_b8_k4", 1.0), ("bs8_b16_k4", 1.1), ("bs4_b8_k2", 0.9), (CONTROL, 0.5)):
                for cell, speed in CELLS.items():
                    samples = [base * speed * factor * math.exp(rng.gauss(0.0, NOISE)) for _ in range(REPEATS)]
                    control = config == CONTROL
                    cells.append(CellEntry(config=config, cell=cell, hardware_profile="refserver", host="ci-1", status="pass",
                                           samples={"output_throughput": samples}, role=ROLE_CONTROL if control else "config",
                                           launches=2 if control else None))
            engine = "0.5.24" if index >= step_at else "0.5.23"
            build = Build(engine_version=engine, engine_build=f"commit {'beef' if index >= step_at else 'cafe'}{index:02x}",
                          project_commit=f"{index:040x}")
            store.append(SessionEntry(f"20261101T{index:04d}00Z-b{index:02d}", 1.77e9 + index * 86400.0, host="ci-1",
                                      build=build, exit_status=0), cells)


def write_calibrated_history(url: str, *, calibrated: bool, sessions: int = 33, step_at: int = 30, step: float = -0.03,
                             day: float = 0.02, probe_noise: float = 0.003, seed: int = 1) -> list[str]:
    """A history whose build gets ``step`` slower from session ``step_at`` on (every series, the
    control's too), each session with a day shift of ``day`` that the machine's calibration probe
    sees (two runs, ``probe_noise`` each); ``calibrated=False`` writes the same history (same seed,
    the probe's draws apart) without the probe. Returns the session ids, oldest first."""
    from pytest_ddtree.gates.throughput.baseline import CONTROL
    from pytest_ddtree.report.history import ROLE_CONTROL

    rng, probe_rng = random.Random(seed), random.Random(seed + 1)
    ids = []
    with HistoryStore(url) as store:
        for index in range(sessions):
            shift = rng.gauss(0.0, day)
            factor = math.exp(shift) * (1.0 + (step if index >= step_at else 0.0))
            cells = []
            for config, base in (("bs8_b8_k4", 1.0), ("bs8_b16_k4", 1.1), ("bs4_b8_k2", 0.9), (CONTROL, 0.5)):
                launch = math.exp(rng.gauss(0.0, 0.005))
                for cell, speed in CELLS.items():
                    samples = [base * speed * factor * launch * math.exp(rng.gauss(0.0, NOISE)) for _ in range(REPEATS)]
                    control = config == CONTROL
                    cells.append(CellEntry(config=config, cell=cell, hardware_profile="gpu-box", host="gpu-1", status="pass",
                                           samples={"output_throughput": samples}, role=ROLE_CONTROL if control else "config",
                                           launches=2 if control else None))
            probe = {"cpu_sha256_mib_per_s": [1300.0 * math.exp(shift + probe_rng.gauss(0.0, probe_noise)) for _ in range(2)],
                     "gemm_tflops": [700.0 * math.exp(shift + probe_rng.gauss(0.0, probe_noise)) for _ in range(2)]}
            new = index >= step_at
            build = Build(engine_version="0.5.24" if new else "0.5.23",
                          engine_build=f"commit {'beef' if new else 'cafe'}{index:02x}", project_commit=f"{index:040x}")
            sid = f"20261201T{index:04d}00Z-c{index:02d}"
            ids.append(sid)
            store.append(SessionEntry(sid, 1.78e9 + index * 86400.0, host="gpu-1", build=build, exit_status=0,
                                      calibration=probe if calibrated else {},
                                      calibration_command="python -m pytest_ddtree.measure.calibration" if calibrated else None),
                         cells)
    return ids
