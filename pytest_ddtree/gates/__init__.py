"""The gates a suite runs against a service: throughput (with its statistics), coding correctness, lossless.

Why a room of their own: each gate turns what was measured into a verdict against a stored baseline;
what they share is that job, not how they measure (``measure/``) or how they talk to the service
(``service/``).
"""
