"""Properties of the code base itself: no dead code in the package.

Dead code is where a fix lands and nothing changes; vulture finds what nothing calls (at 80%
confidence it reports only what is certainly unused: imports, variables, unreachable code).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_vulture_finds_no_dead_code(repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vulture", "pytest_ddtree", "--min-confidence", "80"],
        cwd=repo_root, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
