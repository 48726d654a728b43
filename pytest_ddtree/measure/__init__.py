"""Measuring a service: prompts, the load generator and its streams, open-loop arrivals, SLOs, statistics.

Why a room of their own: the gates judge numbers; how those numbers are taken (bench_serving's
definitions, bounded against a hostile stream) is one job, shared by every gate and the benchmarks.
"""
