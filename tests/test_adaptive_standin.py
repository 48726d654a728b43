"""The adaptive sweep against a service outside the advisor's model family.

``tests/fakes/standin_server.py --cost-shape odd``: topk-6 acceptance peaks at budget 12 and then
falls, and every running request adds a fixed cost to each step. The advisor's model has neither;
the picks must still be near the best because they are measured. A file of its own so that
``--dist loadfile`` can run it beside the reference-engine sweep.
"""

from __future__ import annotations


import pytest

from pytest_ddtree.measure.matrix import load_matrix
from tests.fakes.standin_server import odd_tok_s  # the stand-in's own surface: the truth
from tests.suite_helpers import run_suite
from tests.adaptive_helpers import check_sweep, sweep_matrix
from tests.service_helpers import standin_profile

# the picks are judged on measured tok/s: take turns with other test runs on this machine
pytestmark = pytest.mark.usefixtures("measurement_turn")


@pytest.mark.slow  # over 20 s on a 2-core box
def test_a_cost_shape_outside_the_model_still_gets_picks_within_five_percent(pytester: pytest.Pytester) -> None:
    """A stand-in whose topk-6 acceptance peaks then falls and whose step has a fixed cost per
    request (tests/fakes/standin_server.py --cost-shape odd): with 8 restarts, the picks of at
    least 80% of the cells are within 5% of the best config of the stand-in's own surface."""
    concurrencies = (1, 2, 4, 8, 16)
    cells = [{"name": f"c{n}", "concurrency": n, "context_tokens": 64, "output_tokens": 32,
              "requests": n, "warmup_requests": max(1, n // 2), "prompts": "coding"} for n in concurrencies]
    matrix = sweep_matrix(pytester.path, cells)
    profile = standin_profile(pytester.path, "--cost-shape odd")
    result = run_suite(pytester, profile, f"--ddtree-matrix={matrix}", "--ddtree-max-restarts", "8",
                       suite="test_throughput.py", config="all", timeout=400)
    assert result.ret == 0, result.stdout.str()[-3000:]
    payload = check_sweep(result, pytester.path / "results", limit=8, cells=len(cells))
    configs = {c.name: c for c in load_matrix(matrix).configs}

    def truth(name: str, n: int) -> float:
        shape = configs[name].tree_shape()
        assert shape is not None
        return odd_tok_s(*shape, n, 32)

    picks = {rec["cell"]: rec["config"] for rec in payload["adaptive_sweep"]["recommendations"]}
    within = [truth(picks[f"c{n}"], n) >= 0.95 * max(truth(name, n) for name in configs) for n in concurrencies]
    print(f"odd cost shape, N=8: picks within 5% of the best in {sum(within)}/{len(within)} cells: {picks}")
    measured = {(r["config"], r["cell"]): r["output_throughput"] for r in payload["throughput"]}
    print("measured / stand-in surface:", {k: round(v / truth(k[0], int(k[1][1:])), 3) for k, v in sorted(measured.items())})
    assert sum(within) >= 0.8 * len(within), picks
