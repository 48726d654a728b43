"""Names shared by the writer, the verifier, the deploy logic and the kit scripts.

Why one module: the bash scripts in kit/ read the same files the Python code writes, so a
renamed file must be renamed in one place (and the kit's scripts, which tests check).
"""

from __future__ import annotations

from pathlib import Path

FORMAT_VERSION = 1

MANIFEST = "MANIFEST.sha256"
PACKAGE_JSON = "package.json"
REPRODUCE = "REPRODUCE.md"
DEPLOY_SH = "deploy_patches.sh"
SETUP_SH = "setup_env.sh"
SCRIPTS = (DEPLOY_SH, SETUP_SH)

ENV_JSON = "env/environment.json"
ENV_TXT = "env/environment.txt"
ENV_FREEZE = "env/pip-freeze.txt"
ENV_REQUIREMENTS = "env/requirements.txt"
ENV_EXPECTED = "env/expected.txt"
ENV_TOPO = "env/nvidia-smi-topo.txt"

PATCHES_JSON = "patches/patches.json"
PATCHES_DIST = "patches/DISTRIBUTION"
PATCHES_TSV = "patches/deploy.tsv"
PATCHES_RECORD = "patches/RECORD"
PATCHES_FULL = "patches/full"
PATCHES_DIFFS = "patches/diffs"

REQUIRED = (
    REPRODUCE, MANIFEST, PACKAGE_JSON, DEPLOY_SH, SETUP_SH, ENV_JSON, ENV_TXT, ENV_EXPECTED,
    PATCHES_JSON, PATCHES_DIST, PATCHES_TSV,
)


def kit_dir() -> Path:
    """The static kit (scripts, REPRODUCE template) shipped as package data."""
    return Path(__file__).resolve().parent / "kit"
