"""``ddtree-repro``: verify or deploy a reproduction package on any machine.

Why a separate console script: the machine that rebuilds the deployment may not run the
gate suites at all; it needs the checks and the deploy step, nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from pytest_ddtree.repro import layout
from pytest_ddtree.repro.deploy import deploy_package
from pytest_ddtree.repro.envsnap import snapshot_env
from pytest_ddtree.repro.patchset import MAX_PY_BYTES, PatchError, read_regular
from pytest_ddtree.repro.verify import compare_env, verify_package

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

_EPILOG = """\
exit codes:
  0  ok (verify: every check passed; environment differences are only reported)
  1  verify: a check failed; deploy: refused (version mismatch, a file neither pristine
     nor patched, a corrupted package) or a copy failed
  2  usage error (bad arguments, PKG is not a directory)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddtree-repro",
        description="Verify or deploy a pytest-ddtree reproduction package (written by --ddtree-package).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{verify,deploy}")
    v = sub.add_parser(
        "verify",
        help="check the package and compare this machine with the recorded one",
        description="Check the manifest, .py files, diffs, layout and scripts of PKG; with --site-packages also "
        "check that install; then report how this machine's driver, CUDA, GPUs and packages differ from the "
        "recorded ones (differences do not fail).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    v.add_argument("package", metavar="PKG", type=Path)
    v.add_argument("--site-packages", type=Path, metavar="PATH", help="the install the patches are for")
    v.add_argument("--no-env", action="store_true", help="skip the environment comparison")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    d = sub.add_parser(
        "deploy",
        help="copy the patched files into an install (what deploy_patches.sh does)",
        description="Refuse unless the install's version equals the recorded one and every target is pristine or "
        "already patched; back up originals; copy; check hashes. Safe to run twice.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("package", metavar="PKG", type=Path)
    d.add_argument("--site-packages", type=Path, metavar="PATH", required=True)
    d.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")
    d.add_argument("--backup-dir", type=Path, metavar="DIR", help="default: PATH/.ddtree-backup")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (see --help)."""
    args = _parser().parse_args(argv)
    pkg: Path = args.package
    if not pkg.is_dir():
        print(f"ddtree-repro: error: {pkg} is not a directory (give the package folder)", file=sys.stderr)
        return EXIT_USAGE
    if args.site_packages is not None and not args.site_packages.is_dir():
        print(f"ddtree-repro: error: --site-packages {args.site_packages} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "verify":
        report = verify_package(pkg, args.site_packages)
        if not args.no_env:
            try:
                recorded = json.loads(read_regular(pkg, layout.ENV_JSON, MAX_PY_BYTES))
                report.differences = compare_env(recorded, snapshot_env())
            except (OSError, ValueError, PatchError, RecursionError, AttributeError) as exc:
                report.notes.append(f"environment comparison skipped: {exc}")
        if args.json:
            print(json.dumps({"ok": report.ok, "path": str(report.path), "problems": report.problems,
                              "differences": report.differences, "notes": report.notes}, indent=2, sort_keys=True))
        else:
            print(report.format())
        return EXIT_OK if report.ok else EXIT_FAILED
    rep = deploy_package(pkg, args.site_packages, dry_run=args.dry_run, backup_dir=args.backup_dir)
    print(rep.format(), file=sys.stdout if rep.ok else sys.stderr)
    return EXIT_OK if rep.ok else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
