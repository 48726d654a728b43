"""``python -m pytest_ddtree.repro`` runs the ddtree-repro CLI (useful before installation)."""

import sys

from .cli import main

sys.exit(main())
