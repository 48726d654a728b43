"""Reproduction packages: ``--ddtree-package DIR``, ``ddtree-repro verify`` and ``deploy``.

The plugin calls :func:`check_package_dir_writable` at session start (a usage error when
it raises :class:`ReproError`) and :func:`write_package` at session end on the main process
(a non-zero exit status with :meth:`PackageReport.summary` when ``ok`` is False).
"""

from pytest_ddtree.repro.deploy import DeployReport, deploy_package
from pytest_ddtree.repro.patches import DiffError, PatchError, apply_unified_diff, reverse_unified_diff, unified_diff
from pytest_ddtree.repro.verify import VerifyReport, compare_env, verify_package
from pytest_ddtree.repro.writer import (
    FailedTest,
    PackagedLaunch,
    PackageReport,
    PackageRequest,
    ReproError,
    check_package_dir_writable,
    check_profile_patches,
    default_package_name,
    write_package,
)

__all__ = [
    "DeployReport",
    "DiffError",
    "FailedTest",
    "PackagedLaunch",
    "PackageReport",
    "PackageRequest",
    "PatchError",
    "ReproError",
    "VerifyReport",
    "apply_unified_diff",
    "check_package_dir_writable",
    "check_profile_patches",
    "compare_env",
    "default_package_name",
    "deploy_package",
    "reverse_unified_diff",
    "unified_diff",
    "verify_package",
    "write_package",
]
