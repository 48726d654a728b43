"""Repo-local defaults for running the suites from a checkout.

The plugin itself is installed through its pytest11 entry point (``pip install -e .``); this file
only keeps the repository importable when someone runs ``pytest suites`` straight from a checkout
without installing, which is the first thing people try.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
