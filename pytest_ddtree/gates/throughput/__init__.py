"""The throughput gate (no pytest): one module per job, and a caller imports the module that is a concept's
home (``from pytest_ddtree.gates.throughput import rule``, or ``from pytest_ddtree.gates.throughput.rule import
judge_config``); this package re-exports nothing, so each name has one address.

- ``verdicts``: what a judgement says (the gated metrics, a metric's and a cell's verdict) and whether a
  measurement can be judged or blessed at all;
- ``rule``: the rule, a config's cells against their baselines (its docstring states it, steps 1-7);
- ``session_check``: a config against the other configs of its session (step 6);
- ``baseline``: the baseline entry a bless writes and a session reads back, and the noise pooled over
  the blessed entries of a hardware profile;
- ``measurement``: a config's cells measured with interleaved repeats, the flagged ones confirmed;
  the sustainable-rate search;
- ``rate_gate``: the sustainable rate's gate, a blessed rate re-probed as one open-loop cell;
- ``cells``: a config's cells from their baseline to their records and each cell's outcome (the one
  orchestration the suite, the relaunch and the control run);
- ``control``: the session's control judged (each config's speedup over it, the uniform shift);
- ``launches``: the launches a process adds beside its configs' own: the control's and the relaunch of
  a flagged config.
"""
