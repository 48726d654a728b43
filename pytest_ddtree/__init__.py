"""pytest-ddtree: regression gates for DFlash/DDTree speculative-decoding configurations.

The package is a pytest plugin (``pytest_ddtree.plugin``) plus pytest-free building blocks
(configs, profiles, client, load generator, sandbox, baselines, reproduction package) that
can be reused from scripts.
"""

__version__ = "0.1.0"
