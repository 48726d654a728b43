#!/usr/bin/env python3
"""Run SGLang 0.5.23's own benchmark client (``python -m sglang.benchmark.serving``, formerly
``sglang.bench_serving``) without torch: the smallest shim that makes it importable.

Why a shim: ``pip install --no-deps sglang==0.5.23`` brings the client's code, but importing it
runs ``sglang/__init__.py``, which imports torch and FlashInfer (its own comment says so), and
``sglang/benchmark/serving.py`` imports ``sglang.srt.disaggregation.utils`` (torch again) for one
constant. Nothing the client runs needs either. This script, run with a Python where
``pip install --no-deps sglang==0.5.23`` and :data:`PACKAGES` are installed, registers four
stand-ins before importing the client, then runs its own ``cli_main()`` with the given flags:

1. the ``sglang`` package without executing its ``__init__`` (submodules load from the install);
2. the ``sglang.srt.utils`` package likewise (its ``__init__`` imports ``utils.common``: torch;
   the client only needs ``sglang.srt.utils.network``, loaded from the install);
3. ``sglang.srt.disaggregation.utils`` with its one constant the client uses,
   ``FAKE_BOOTSTRAP_HOST = "2.2.2.2"`` (copied from 0.5.23);
4. ``datasets`` (Hugging Face's, pyarrow and pandas behind it) when it is not installed: only the
   mmmu and longbench data sets call ``load_dataset``; the stand-in refuses with a message.

``benchmarks/bench_client.py`` builds that environment (a throwaway venv) and runs this script;
with ``BENCH_CPU_FILE`` set, the process CPU seconds spent inside the client's ``benchmark()``
(warm-up and measured requests, not the imports and the data set) are written there.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from typing import Any

#: What the client imports besides the standard library (0.5.23): aiohttp, msgspec, numpy,
#: orjson, requests, tqdm, transformers (tokenizers), pillow + pybase64 (the image data set module
#: is imported at start), psutil + pyzmq (sglang/srt/utils/network.py). No torch, no GPU package.
PACKAGES = ("transformers==5.19.0", "tokenizers==0.23.2", "aiohttp", "msgspec", "numpy", "orjson", "requests",
            "tqdm", "pillow", "pybase64", "psutil", "pyzmq")
SGLANG = "sglang==0.5.23"


def _package(name: str, path: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module


def install_stand_ins() -> None:
    spec = importlib.util.find_spec("sglang")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"sglang is not installed here: pip install --no-deps {SGLANG} {' '.join(PACKAGES)}")
    root = list(spec.submodule_search_locations)[0]
    _package("sglang", root)
    _package("sglang.srt.utils", os.path.join(root, "srt", "utils"))
    disagg = types.ModuleType("sglang.srt.disaggregation.utils")
    disagg.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]
    sys.modules[disagg.__name__] = disagg
    if importlib.util.find_spec("datasets") is None:
        datasets = types.ModuleType("datasets")

        def load_dataset(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("this data set needs Hugging Face `datasets` (pip install datasets)")

        datasets.load_dataset = load_dataset  # type: ignore[attr-defined]
        sys.modules["datasets"] = datasets


def main() -> None:
    install_stand_ins()
    from sglang.benchmark import serving  # noqa: PLC0415 (after the stand-ins)

    cpu_file = os.environ.get("BENCH_CPU_FILE")
    if cpu_file:
        original = serving.benchmark

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return await original(*args, **kwargs)
            finally:
                with open(cpu_file, "w") as fh:
                    fh.write(f"{time.process_time() - t0:.6f}\n")

        serving.benchmark = timed
    serving.cli_main()


if __name__ == "__main__":
    main()
