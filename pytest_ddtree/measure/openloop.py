"""Open-loop load: the arrival schedule requests are sent on, whatever the service does (no pytest import;
no project import: the matrix reads it, and ``loops.run_open_loop`` sends on it).

Why: a closed loop at concurrency C sends the next request only when one finishes, so a slow
service is offered less load and never builds a queue; deployments meet requests that arrive on
their own clock. An open-loop cell takes bench_serving's ``--request-rate`` (requests/s) and
``--max-concurrency``: the schedule is drawn before the first request is sent, each request is
sent at its time on a thread of its own, and a request the client could not send on time is sent
late and recorded with its lateness (``send_lag_s``), never skipped or re-timed.

Arrivals follow bench_serving. SGLang 0.5.23's ``get_request`` (sglang/benchmark/serving.py:1092)
yields the first request at once and then sleeps ``np.random.exponential(1 / request_rate)``
between requests (Poisson arrivals); it has no burstiness. ``gamma`` with ``burstiness`` is vLLM's
``benchmarks/serve.py`` spelling (gamma intervals of shape ``burstiness`` and mean ``1 / rate``:
1 is Poisson, below 1 burstier, above 1 more even); ``constant`` sends every ``1 / rate`` s.
``max_concurrency`` is bench_serving's semaphore (serving.py:1432): a request past it waits in the
client for a free slot, and its latency is timed from when it is really sent, as there.

Bounded: the whole cell has a deadline (``Arrivals.deadline_s``; by default the schedule's span
plus the per-request timeout). At the deadline every connection still open is shut, and each
request not finished by then is a failed request saying so, so a service that stops answering
costs one deadline, not one timeout per queued request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The arrival processes an open-loop cell can ask for (bench_serving's Poisson, vLLM's gamma).
ARRIVALS = ("poisson", "constant", "gamma")
#: A request sent this much later than its scheduled time counts as late (``ddtree_late_requests``).
LATE_S = 0.010


class ArrivalError(ValueError):
    """An open-loop schedule was asked for with values that cannot make one (the message says which)."""


@dataclass(frozen=True)
class Arrivals:
    """How an open-loop cell's requests arrive: ``request_rate`` requests/s on ``arrival``."""

    request_rate: float
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        rate = self.request_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 < rate < math.inf):
            raise ArrivalError(f"request_rate must be a positive finite number of requests/s, got {rate!r} "
                               "(leave it out for a closed-loop cell at its concurrency)")
        if self.arrival not in ARRIVALS:
            raise ArrivalError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if not (isinstance(self.burstiness, (int, float)) and self.burstiness > 0):
            raise ArrivalError(f"burstiness must be a positive number (1: Poisson), got {self.burstiness!r}")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ArrivalError(f"burstiness {self.burstiness} needs arrival: gamma (it is the gamma shape)")
        cap = self.max_concurrency
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ArrivalError(f"max_concurrency must be a positive integer, got {cap!r}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ArrivalError(f"deadline_s must be positive, got {self.deadline_s!r}")

    def offsets(self, n: int, seed: int) -> list[float]:
        """The send times of ``n`` requests in seconds after the first (which is sent at 0).

        Drawn from ``seed`` alone, so every repeat and every session of a cell offers the service
        the same schedule and repeats differ only by what the service did."""
        rng = random.Random(seed)
        rate = float(self.request_rate)
        out, t = [], 0.0
        for i in range(n):
            if i:
                if self.arrival == "constant":
                    t += 1.0 / rate
                elif self.arrival == "gamma":
                    t += rng.gammavariate(self.burstiness, 1.0 / (rate * self.burstiness))
                else:
                    t += rng.expovariate(rate)
            out.append(t)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The keys a measured workload carries (bench_serving's ``request_rate``, ``max_concurrency``)."""
        out: dict[str, Any] = {"request_rate": float(self.request_rate), "arrival": self.arrival,
                               "max_concurrency": self.max_concurrency}
        if self.arrival == "gamma":
            out["burstiness"] = float(self.burstiness)
        return out


def lag_figures(lags: Sequence[float]) -> dict[str, float | int | None]:
    """How far the client kept its schedule: the latest send (ms) and the requests sent more than
    ``LATE_S`` late (a client that could not keep the schedule offered the service less than the
    rate names; with ``max_concurrency`` a wait for a slot is by design)."""
    return {
        "ddtree_max_send_lag_ms": max(lags) * 1000 if lags else None,
        "ddtree_late_requests": sum(1 for lag in lags if lag > LATE_S),
    }
