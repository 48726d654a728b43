"""The names ``vulture pytest_ddtree --min-confidence 60`` reports as unused that are used, each
group with who uses it (tests/test_codebase.py runs vulture over the package and this file).

Why a whitelist and not a lower bar: at 60% vulture also reports what only a name-based caller
reaches (pytest's hooks, http.server's ``do_*``, a TypedDict key written as a string) or what
lives outside the package (the shipped suites/, the tests' probes); everything else it reports is
dead and goes. A name here counts as used everywhere in the package, so each entry is one a
reader can check: the caller is named. ``_.name`` is an attribute read, which vulture counts as a
use of ``name``.
"""

from __future__ import annotations


class _Used:
    """Any attribute: reading one is what vulture counts as a use of that name."""

    def __getattr__(self, name: str) -> str:
        return name


_ = _Used()

# pytest calls its hooks and fixtures by name (plugin.py; the xdist hooks from pytest-xdist).
_.pytest_addoption
_.pytest_addhooks
_.pytest_cmdline_main
_.pytest_configure
_.pytest_sessionstart
_.pytest_generate_tests
_.pytest_collection_finish
_.pytest_collection_modifyitems
_.pytest_runtestloop
_.pytest_runtest_logreport
_.pytest_report_header
_.pytest_sessionfinish
_.pytest_unconfigure
_.pytest_terminal_summary
_.pytest_xdist_make_scheduler
_.pytest_xdist_setupnodes
_.pytest_xdist_node_collection_finished
_.pytest_configure_node
_.pytest_testnodedown
_.ddtree_settings
_.ddtree_profile
_.ddtree_matrix
_.ddtree_recorder
_.ddtree_client
_.ddtree_lossless_reference
_.ddtree_lossless_source
_.ddtree_control
_.ddtree_baselines
# xdist's scheduler protocol calls it on a crashed worker (scheduling.py).
_.remove_pending_tests_from_node

# http.server / socketserver read these by name: the method dispatch (``do_`` + method), the
# request log, the response's protocol and Server header, Nagle off, the connection's end, and
# the server's threads, backlog and port reuse (refserver/server.py, refserver/transport.py).
_.do_GET
_.do_POST
_.do_PUT
_.do_DELETE
_.log_request
_.protocol_version
_.server_version
_.sys_version
_.disable_nagle_algorithm
_.close_connection
_.daemon_threads
_.request_queue_size
_.allow_reuse_address

# Python calls them by protocol: a module's lazy attributes (PEP 562, service/__init__.py) and a
# callback Protocol's signature (service/manager.py ClientFactory).
_.__getattr__
_.__call__

# A keyword of pytest's TerminalReporter.rewrite, declared by report/terminal.py's Reporter Protocol
# and passed by its TerminalProgress (vulture does not count a keyword argument as a use).
_.erase

# A record's keys (records/shapes.py, records/rate_shapes.py TypedDicts): written and read as the
# string keys of the on-disk dict (``{"control_at": ...}``, ``r.get("control_at")``), which vulture
# does not see as uses of the declared key.
_.acceptance_by_category
_.address
_.applied_evidence
_.bless_refused
_.blessed_rate
_.change_ci
_.change_ci_label
_.ci_coverage
_.config_blessed_shifts
_.config_shift
_.config_shift_se
_.control_at
_.control_launch
_.control_source
_.first_launch
_.first_pass_change
_.full_sweep_restarts
_.goodput_slos_ms
_.login_host
_.missed_rate
_.search_limit
_.new_passes
_.output_throughput
_.output_throughput_interval
_.output_throughput_spread
_.pid_of_harness
_.queued_s
_.repeat_histograms
_.restarts
_.snapshot
_.spec_num_draft_tokens
_.spoiled_repeats
_.sustainable_rate
_.systemd_unit
_.tolerance_floor
# Written into a record by ``dataclasses.asdict`` (gates/throughput/session_check.py SessionCheck).
_.compared_with
# An on-disk word read by value: a sandbox verdict ``"failed"`` (sandbox/outcome.py Verdict).
_.FAILED

# The report's Jinja template reads them (report/html/templates/report.html.j2: the timeline's gap,
# a comparison's two medians).
_.gap_s
_.this_median
_.other_median

# Called by the shipped suites (suites/*.py), which the package scan does not include.
_.session_of  # plugin.session_of: suites/test_throughput.py (also records/sessionfolder.session_of: tests)
_.judge_cell  # suites/test_throughput.py
_.golden_read_dir  # BaselineStore.golden_read_dir: suites/test_lossless.py
_.golden_bless_command  # gates/lossless.golden_bless_command: suites/test_lossless.py
_.bounded  # slo.RateSearch.bounded: suites/test_sustainable_rate.py
_.run_config  # gates/throughput/cells.run_config, the suite's cell path: suites/test_throughput.py
_.durations  # JudgedCell.durations: suites/test_throughput.py's replaying timer
_.abandon  # ServiceManager.abandon: suites/test_throughput.py, suites/test_sustainable_rate.py
_.bless_entry  # gates/throughput/rate_gate.py: suites/test_sustainable_rate.py
_.MissingBaselineWarning  # gates/suite_warnings.py: suites/test_throughput.py
_.NewMetricWarning  # gates/suite_warnings.py: suites/test_throughput.py
_.RateBaselineWarning  # gates/suite_warnings.py: suites/test_sustainable_rate.py
_.RateSearchLimitWarning  # gates/suite_warnings.py: suites/test_sustainable_rate.py
_.bless_rate  # gates/throughput/rate_gate.py: suites/test_sustainable_rate.py
_.judge_rate
_.pooled_spread  # gates/throughput/rate_gate.py: suites/test_sustainable_rate.py (read once per process)
_.rebless_note
_.unjudged
_.pass_count  # coding.CodingOutcome: suites/test_coding.py's record
_.to_record  # coding.ProblemResult, lossless.LosslessOutcome: suites/test_coding.py, suites/test_lossless.py
_.coding_max_tokens  # Settings: suites/test_coding.py

# Read by the tests only, as probes of what the package does: the tokenizer's special ids (test_refserver_units.py),
# the HTTP pool's idle connections and TCP_NODELAY (test_http.py), the process groups left behind
# (test_service.py and others), the history store's sessions (test_history.py), how many
# observations the adaptive prior was fit to (test_adaptive_plugin.py).
_.is_special
_.idle_connections
_.nodelay_of
_.live_process_groups
_.session_ids
_.n_obs

# Profile and matrix keys validated and carried, not read back by a typed reader today: their
# effect is the validation (a bad entry is a clear error at load time); the repro kit reads the
# profile's raw mapping (repro/writer.py), the slurm keys are rendered by name into ``#SBATCH``
# lines (service/slurm.py), and ``rate_search`` is read by suites/test_sustainable_rate.py through
# the matrix.
_.coding_min_pass
_.qos
_.gres
_.time_limit
_.cpus_per_task
_.constraint
_.rate_search

# gates/throughput/cells.py
_.status_reasons  # JudgedCell.status_reasons (why a cell is not valid): tests/test_throughput_spoiled.py

# service/validated_profile.py
_.declared_axes  # ServiceProfile.declared_axes: the axes its axes: key declared (tests/test_axes_profiles.py reads it)

# service/kinds.py
_.unregister  # forgets a controller kind registered from outside the package: tests/test_controller_protocol.py's own

# records/shapes.py
_.calibration_host  # CalibrationData.calibration_host: written by service/calibration.py as_record, read by describe_runs and results.json
_.prompts_digest  # WorkloadData.prompts_digest: written by measure/load.py workload_dict as a key, compared by gates/throughput/rule.py
_.also_for  # LaunchEntry.also_for: written by service/manager.py _shared through setdefault, read by records/bill.py session_bill
_.measured_best_output_throughput  # AdaptivePickData.measured_best_output_throughput: written by adaptive/sweep.py _report as a key, read by summary_lines
_.challenger_output_throughput  # AdaptivePickData.challenger_output_throughput: written by adaptive/sweep.py _report as a key, read by summary_lines
