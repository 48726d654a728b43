"""``python -m pytest_ddtree.repro`` runs the ddtree-repro CLI (useful before installation)."""

import sys

from pytest_ddtree.repro.cli import main

sys.exit(main())
