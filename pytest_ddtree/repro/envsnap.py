"""Environment snapshot: what a second machine needs to know to rebuild this one.

Why: the first question on a machine that does not reproduce the numbers is "what was
different" (driver, CUDA, GPU count, a package version).  The snapshot records the
collect_env-style facts once, as JSON for tools (``ddtree-repro verify`` compares it with
the machine it runs on) and as text for people.  Every probe is optional: no GPU, no NVML,
no ``nvidia-smi``, no pip all give a recorded "absent" and never an exception, because a
snapshot failure must not cost the user the rest of the package.

Deliberately left out, for determinism: anything that changes between two calls in the
same session (GPU memory *used*, temperatures, uptime, load).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

__all__ = ["snapshot_env", "snapshot_env_on", "render_env_text", "filter_env_vars", "is_secret_name", "pip_freeze", "NO_GPU"]

NO_GPU = "no NVIDIA GPU"

# Names whose values matter to an SGLang/CUDA deployment.
_ENV_PREFIXES = (
    "CUDA_", "NCCL_", "NVIDIA_", "SGLANG_", "TORCH_", "PYTORCH_", "TRITON_", "FLASHINFER_", "HF_",
    "HUGGINGFACE_", "TRANSFORMERS_", "OMP_", "MKL_", "NVTE_", "CUBLAS_", "CUDNN_", "DDTREE_", "VLLM_",
    "SLURM_", "SLURMD_",  # a Slurm job's allocation (node, GPUs bound by gres, CPUs), where it ran
)
_ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
              "LANG", "LC_ALL", "TZ")
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT|PAT$", re.I)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def is_secret_name(name: str) -> bool:
    """True for names that look like they hold a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...)."""
    return bool(_SECRET.search(name))


def filter_env_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """Keep deployment-relevant variables and drop anything secret-looking, sorted by name."""
    return {
        k: environ[k]
        for k in sorted(environ)
        if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not is_secret_name(k)
    }


def _run(cmd: list[str], timeout: float = 30.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    # nvidia-smi underlines table headers with ANSI escapes even when not on a terminal
    return _ANSI.sub("", proc.stdout) if proc.returncode == 0 else None


_INTERPRETER_FACTS = (
    "import json, platform, sys, importlib.metadata as md\n"
    "seen = {}\n"
    "for d in md.distributions():\n"
    "    n = d.metadata['Name']\n"
    "    if n and n.lower() not in seen: seen[n.lower()] = n + '==' + d.version\n"
    "print(json.dumps({'version': platform.python_version(), 'implementation': platform.python_implementation(),"
    " 'executable': sys.executable, 'prefix': sys.prefix, 'distributions': sorted(seen.values(), key=str.lower)}))\n"
)


def interpreter_facts(python: str) -> dict[str, Any]:
    """Version, implementation, executable, prefix and ``name==version`` of every distribution of
    another interpreter (the service's), asked by running it. Raises OSError when it cannot run."""
    try:
        proc = subprocess.run([python, "-c", _INTERPRETER_FACTS], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise OSError(f"cannot run the service's interpreter {python}: {exc}") from None
    if proc.returncode != 0:
        raise OSError(f"the service's interpreter {python} failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    facts: dict[str, Any] = json.loads(proc.stdout)
    return facts


def pip_freeze(python: str | None = None) -> tuple[str, list[str]]:
    """(source, lines) of ``python -m pip freeze`` of ``python`` (default: this interpreter);
    importlib.metadata when pip is unavailable.

    The fallback lists ``name==version`` for every distribution on sys.path, which loses
    editable/URL details but keeps the versions that matter for pinning.
    """
    try:
        proc = subprocess.run(
            [python or sys.executable, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PIP_NO_INPUT": "1", "PYTHONWARNINGS": "ignore"},
        )
        if proc.returncode == 0 and proc.stdout.strip():
            lines = sorted({ln.strip() for ln in proc.stdout.splitlines() if ln.strip()}, key=str.lower)
            return "pip freeze", lines
    except (OSError, subprocess.SubprocessError):
        pass
    if python is not None and python != sys.executable:
        return "importlib.metadata", list(interpreter_facts(python)["distributions"])
    import importlib.metadata as md

    seen: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "importlib.metadata", sorted(seen.values(), key=str.lower)


def _os_release() -> str | None:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def nvml_snapshot() -> dict[str, Any]:
    """Driver, CUDA driver version and per-GPU name/memory via nvidia-ml-py; never raises.

    Returns ``{"available": False, "error": ...}`` with error starting with NO_GPU when
    NVML is missing or finds no device, so the text file says so plainly.
    """
    try:
        import pynvml
    except Exception as exc:  # noqa: BLE001 - any import failure means "no NVML here"
        return {"available": False, "error": f"{NO_GPU} (nvidia-ml-py not importable: {exc})", "gpus": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "error": f"{NO_GPU} (NVML init failed: {_s(exc)})", "gpus": []}
    try:
        out: dict[str, Any] = {"available": True, "error": None}
        out["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            out["cuda_driver_version"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001
            out["cuda_driver_version"] = None
        gpus: list[dict[str, Any]] = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h))}
            try:
                g["memory_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:  # noqa: BLE001
                g["memory_total_bytes"] = None
            for key, fn in (("uuid", "nvmlDeviceGetUUID"), ("pci_bus_id", None)):
                try:
                    if fn:
                        g[key] = _s(getattr(pynvml, fn)(h))
                    else:
                        g[key] = _s(pynvml.nvmlDeviceGetPciInfo(h).busId)
                except Exception:  # noqa: BLE001
                    g[key] = None
            gpus.append(g)
        out["gpus"] = gpus
        if not gpus:
            out["available"] = False
            out["error"] = f"{NO_GPU} (NVML found 0 devices)"
        return out
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "error": f"{NO_GPU} (NVML query failed: {_s(exc)})", "gpus": []}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _nvcc_version() -> str | None:
    text = _run(["nvcc", "--version"])
    if not text:
        return None
    m = re.search(r"release ([\d.]+)", text)
    return m.group(1) if m else text.strip().splitlines()[-1]


def snapshot_env(environ: Mapping[str, str] | None = None, include_pip: bool = True, python: str | None = None) -> dict[str, Any]:
    """Collect the snapshot as a JSON-ready dict (keys sorted when dumped).

    ``python``: the service's interpreter (the profile's ``python:``); its version and packages
    are what the snapshot records. A service interpreter that cannot run is recorded as an error
    and this interpreter's facts are used, so a package is still written (with the warning).
    """
    env = dict(os.environ if environ is None else environ)
    uname = platform.uname()
    snap: dict[str, Any] = {
        "os": {
            "system": uname.system,
            "release": _os_release(),
            "kernel": uname.release,
            "kernel_version": uname.version,
            "machine": uname.machine,
            "hostname": uname.node,
        },
        "cpu": {"model": _cpu_model(), "count": os.cpu_count(), "memory_total_bytes": _mem_total_bytes()},
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "prefix": sys.prefix,
        },
        "nvml": nvml_snapshot(),
        "cuda_toolkit": _nvcc_version(),
        "nvidia_smi_topo": _run(["nvidia-smi", "topo", "-m"]),
        "env_vars": filter_env_vars(env),
    }
    if python is not None and python != sys.executable:
        try:
            facts = interpreter_facts(python)
            snap["python"] = {k: facts[k] for k in ("version", "implementation", "executable", "prefix")}
        except (OSError, ValueError, KeyError) as exc:
            snap["python"]["service_interpreter_error"] = str(exc)
            python = None
    snap["python"]["role"] = "the service's interpreter" if python is not None else "the harness's interpreter"
    if include_pip:
        source, lines = pip_freeze(python)
        snap["packages"] = {"source": source, "freeze": lines}
    return snap


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, int) else "unknown"


def render_env_text(snap: Mapping[str, Any]) -> str:
    """Human-readable rendering of :func:`snapshot_env` output (what people read first)."""
    o, c, py, nv = snap["os"], snap["cpu"], snap["python"], snap["nvml"]
    lines = [
        f"OS:            {o.get('release') or o.get('system')} ({o.get('machine')})",
        f"Kernel:        {o.get('kernel')} {o.get('kernel_version')}",
        f"Host:          {o.get('hostname')}",
        f"CPU:           {c.get('model')} x{c.get('count')}, RAM {_gib(c.get('memory_total_bytes'))}",
        f"Python:        {py.get('version')} ({py.get('implementation')}) {py.get('executable')}"
        + (f" - {py['role']}" if py.get("role") else ""),
    ]
    if py.get("service_interpreter_error"):
        lines.append(f"               (the service's interpreter could not be asked: {py['service_interpreter_error']})")
    if nv.get("available"):
        gpus = nv.get("gpus", [])
        lines += [
            f"NVIDIA driver: {nv.get('driver_version')}",
            f"CUDA driver:   {nv.get('cuda_driver_version')}",
            f"GPUs:          {len(gpus)}",
        ]
        lines += [f"  GPU {g['index']}: {g['name']}, {_gib(g.get('memory_total_bytes'))}, {g.get('pci_bus_id')}" for g in gpus]
    else:
        lines.append(f"GPUs:          {nv.get('error') or NO_GPU}")
    lines.append(f"CUDA toolkit:  {snap.get('cuda_toolkit') or 'nvcc not found'}")
    topo = snap.get("nvidia_smi_topo")
    lines.append("Interconnect:  " + ("see nvidia-smi-topo.txt" if topo else "nvidia-smi not found"))
    pk = snap.get("packages")
    if pk:
        lines.append(f"Packages:      {len(pk['freeze'])} (from {pk['source']}; see pip-freeze.txt)")
    lines.append("Environment variables (secret-looking names dropped):")
    lines += [f"  {k}={v}" for k, v in snap.get("env_vars", {}).items()] or ["  (none)"]
    return "\n".join(lines) + "\n"


class _Runner(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, input_text: str | None = None, timeout_s: float | None = None) -> Any: ...


def snapshot_env_on(host: _Runner, python: str = "python3", timeout_s: float = 180.0) -> dict[str, Any]:
    """:func:`snapshot_env` taken on ``host`` (ssh.py's SSHHost) with the service's interpreter.

    Why remote: in a fleet sweep the machine that ran the service is the host, not the one
    running pytest; its driver, GPUs and packages are what a reproduction needs. This module is
    stdlib-only on purpose, so its own source is piped to ``python -`` there: nothing needs to be
    installed on the host. Raises RuntimeError with the host's output when the snapshot fails.
    """
    source = Path(__file__).read_text(encoding="utf-8")
    program = source + "\nimport json as _json\nprint(_json.dumps(snapshot_env()))\n"
    result = host.run([python, "-"], input_text=program, timeout_s=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"environment snapshot on {host.name} with {python} failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-500:]}")
    snap: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    snap["host"] = host.name
    return snap
