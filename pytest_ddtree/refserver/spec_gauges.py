"""The engine's ``sglang:spec_*`` series as SGLang 0.5.23 publishes them (no pytest).

Why a module of its own: the harness reads these series as evidence (proof.py: a worker's
``spec_num_draft_tokens`` read while a request decodes), so their cadence must be SGLang's, not
whatever is convenient. Followed (the 0.5.23 wheel):

* six gauges exist from start-up at 0 (``sglang/srt/observability/metrics_collector.py:125-131``,
  declared at :511-546): ``spec_accept_length``, ``spec_accept_rate``, ``spec_cap_length``,
  ``spec_block_accept_length`` (both 0 outside DSpark), ``spec_num_steps``, ``spec_num_draft_tokens``;
* they are written only at the "Decode batch" log, every ``decode_log_interval`` decode batches
  (``scheduler_components/metrics_reporter.py:955-1020``): the accept length and rate of the
  interval's verifies (accepted tokens over forwards; correct drafts over forwards x
  (num_draft_tokens - 1)), the worker's num_steps and num_draft_tokens (``_active_spec_config_snapshot``,
  :518-541: upstream DFLASH's worker reports steps 1 and its block size, EAGLE's its steps and its
  tree's node count); prefill and idle reports republish what they hold, and ``/flush_cache`` does
  not reset them;
* the counter ``spec_verify_calls_total`` moves when a request finishes, by its ``spec_verify_ct``
  (``metrics_collector.py:2101-2112``, ``observe_one_finished_request``): a request in flight is
  not in it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecGauges:
    """The values SGLang's gauges hold (0 until the first decode-log interval) and the verify counter."""

    accept_length: float = 0.0
    accept_rate: float = 0.0
    num_steps: int = 0
    num_draft_tokens: int = 0
    verify_calls_total: int = 0

    def publish(self, accepted_tokens: int, forwards: int, num_steps: int, num_draft_tokens: int) -> None:
        """The decode-log interval's figures: ``accepted_tokens`` over ``forwards`` verifies (each
        verify's accepted drafts plus its bonus token), under the worker's steps and node count."""
        self.accept_length = accepted_tokens / forwards if forwards else 0.0
        proposed = forwards * max(num_draft_tokens - 1, 0)
        self.accept_rate = (accepted_tokens - forwards) / proposed if proposed else 0.0
        self.num_steps = num_steps
        self.num_draft_tokens = num_draft_tokens

    def series(self) -> list[tuple[str, str, str, float]]:
        """(name, type, help, value) of each series, in SGLang's order."""
        return [
            ("sglang:spec_accept_length", "gauge",
             "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).", self.accept_length),
            ("sglang:spec_accept_rate", "gauge",
             "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).", self.accept_rate),
            ("sglang:spec_cap_length", "gauge",
             "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when no cap is scheduled).", 0.0),
            ("sglang:spec_block_accept_length", "gauge",
             "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact only in DSpark cap-accept mode).", 0.0),
            ("sglang:spec_num_steps", "gauge", "Currently active speculative_num_steps.", float(self.num_steps)),
            ("sglang:spec_num_draft_tokens", "gauge",
             "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).", float(self.num_draft_tokens)),
            ("sglang:spec_verify_calls_total", "counter", "Number of speculative decoding verification calls.",
             float(self.verify_calls_total)),
        ]
