#!/usr/bin/env bash
# deploy_patches.sh - copy this package's patched files into an installed distribution.
#
# Usage: ./deploy_patches.sh [--dry-run] [--backup-dir DIR] SITE_PACKAGES
#
# Reads patches/DISTRIBUTION (name, version) and patches/deploy.tsv
# (target<TAB>pristine_sha256<TAB>patched_sha256; "-" = file is new).
# Refuses (exit 1), before changing anything, when the install's version differs from the
# recorded one or when a target file is neither the pristine nor the patched version.
# Backs up each original to BACKUP_DIR/<target> (default SITE_PACKAGES/.ddtree-backup),
# copies the full file, then checks its sha256. Running it twice is safe: files that are
# already patched are left alone.
# Exit codes: 0 deployed (or nothing to do), 1 refused or a check failed, 2 usage error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dry_run=0
backup_dir=""
site=""

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1; shift ;;
        --backup-dir) [ $# -ge 2 ] || { echo "error: --backup-dir needs a directory" >&2; exit 2; }
                      backup_dir="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [ -z "$site" ] || { echo "error: only one SITE_PACKAGES directory" >&2; exit 2; }
           site="$1"; shift ;;
    esac
done
if [ -z "$site" ]; then
    echo "error: give the site-packages directory of the install to patch (see --help)" >&2
    exit 2
fi
if [ ! -d "$site" ]; then
    echo "error: $site is not a directory" >&2
    exit 2
fi
site="$(cd "$site" && pwd)"
[ -n "$backup_dir" ] || backup_dir="$site/.ddtree-backup"

if command -v sha256sum >/dev/null 2>&1; then
    hash_file() { sha256sum -- "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
    hash_file() { shasum -a 256 -- "$1" | cut -d' ' -f1; }
else
    echo "error: neither sha256sum nor shasum is installed" >&2
    exit 1
fi

refuse() { echo "REFUSED: $*" >&2; exit 1; }
# The package as it was written, before any of it is read: regular files only (a FIFO would block
# the reader, a link lead out of the package), every file's sha256, nothing added (the Python
# deploy checks the same).
odd="$(find "$here" ! -type f ! -type d -print -quit)"
[ -z "$odd" ] || refuse "${odd#"$here"/}: not a regular file (a link, FIFO or device: a package holds regular files only)"
if command -v sha256sum >/dev/null 2>&1; then
    (cd "$here" && sha256sum -c --strict --quiet MANIFEST.sha256 >/dev/null 2>&1) || refuse "MANIFEST.sha256 does not match the package (run: ddtree-repro verify $here)"
else
    (cd "$here" && shasum -a 256 -c MANIFEST.sha256 >/dev/null 2>&1) || refuse "MANIFEST.sha256 does not match the package (run: ddtree-repro verify $here)"
fi
unlisted="$(cd "$here" && find . -type f ! -path ./MANIFEST.sha256 | sed 's|^\./||' | LC_ALL=C sort \
    | LC_ALL=C comm -23 - <(cut -c67- MANIFEST.sha256 | LC_ALL=C sort))"
[ -z "$unlisted" ] || refuse "${unlisted%%$'\n'*}: present but not listed in MANIFEST.sha256 (added after packaging?)"

dist_name=""
dist_version=""
while IFS='=' read -r key value; do
    case "$key" in
        name) dist_name="$value" ;;
        version) dist_version="$value" ;;
    esac
done < "$here/patches/DISTRIBUTION"

norm() { printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/-/g'; }

if [ -n "$dist_name" ]; then
    want="$(norm "$dist_name")"
    found_version=""
    found_count=0
    for meta in "$site"/*.dist-info/METADATA; do
        [ -f "$meta" ] || continue
        name="$(sed -n 's/^Name:[[:space:]]*//p' "$meta" | head -n 1 | tr -d '\r')"
        if [ "$(norm "$name")" = "$want" ]; then
            found_version="$(sed -n 's/^Version:[[:space:]]*//p' "$meta" | head -n 1 | tr -d '\r')"
            found_count=$((found_count + 1))
        fi
    done
    [ "$found_count" -gt 0 ] || refuse "$dist_name is not installed in $site (no *.dist-info/METADATA with Name: $dist_name)"
    [ "$found_count" -eq 1 ] || refuse "$found_count dist-info directories of $dist_name in $site; remove the stale one"
    if [ "$found_version" != "$dist_version" ]; then
        refuse "$dist_name $found_version is installed in $site but the patches are for $dist_name $dist_version; install $dist_name==$dist_version first"
    fi
    echo "ok: $dist_name $found_version in $site"
else
    echo "warning: the package records no distribution; skipping the version check" >&2
fi

# Pass 1: check every target before touching anything.
# The top-level folders of the installed distribution (its RECORD): the only place a new file may go.
record=""
for meta in "$site"/*.dist-info/METADATA; do
    [ -f "$meta" ] || continue
    [ -n "$dist_name" ] && [ "$(norm "$(sed -n 's/^Name:[[:space:]]*//p' "$meta" | head -n 1 | tr -d '\r')")" = "$(norm "$dist_name")" ] && record="$(dirname "$meta")/RECORD"
done
# The target rules of patchset.check_target_path and check_new_file_target, in bash.
check_target() {
    local target="$1" pristine="$2" part top
    case "$target" in ''|/*|*\\*) refuse "'$target' must be a relative POSIX path inside site-packages" ;; esac
    IFS='/' read -r -a parts <<< "$target"
    for part in "${parts[@]}"; do
        case "$part" in ''|.|..) refuse "'$target' must be normalized (no '.', '..' or empty components)" ;; esac
    done
    case "$target" in .*) refuse "'$target' is under a hidden folder of site-packages (the deploy's backups live in .ddtree-backup/)" ;; esac
    if [ "$pristine" = "-" ]; then
        top="${target%%/*}"
        if [ "$top" = "$target" ] || [ -z "$record" ] || \
           ! awk -F, -v t="$top/" 'index($1, t) == 1 { found = 1 } END { exit !found }' "$record"; then
            refuse "'$target' is a new file outside the patched distribution's own folders; a package may add files only inside them"
        fi
    fi
}
todo=()
while IFS=$'\t' read -r target pristine patched; do
    case "$target" in ''|'#'*) continue ;; esac
    check_target "$target" "$pristine"
    full="$here/patches/full/$target"
    [ -L "$full" ] && refuse "patches/full/$target is a symbolic link (a package holds regular files only)"
    [ -f "$full" ] || refuse "package is incomplete: patches/full/$target is missing"
    [ "$(hash_file "$full")" = "$patched" ] || refuse "patches/full/$target does not match its recorded sha256 (package corrupted?)"
    dest="$site/$target"
    if [ -f "$dest" ]; then
        current="$(hash_file "$dest")"
        if [ "$current" = "$patched" ]; then
            echo "already patched: $target"
            continue
        fi
        if [ "$pristine" = "-" ]; then
            refuse "$target exists in $site but the package says it is a new file; it differs from the patched copy"
        fi
        [ "$current" = "$pristine" ] || refuse "$target in $site is neither the pristine nor the patched version (sha256 $current)"
    else
        [ "$pristine" = "-" ] || refuse "$target is missing from $site; the recorded layout expects it"
        [ -d "$(dirname "$dest")" ] || refuse "directory $(dirname "$dest") is missing from $site"
    fi
    todo+=("$target")
done < "$here/patches/deploy.tsv"

if [ "${#todo[@]}" -eq 0 ]; then
    echo "nothing to do: every file is already patched"
    exit 0
fi

# Pass 2: back up and copy.
for target in "${todo[@]}"; do
    dest="$site/$target"
    if [ "$dry_run" -eq 1 ]; then
        echo "would patch: $target"
        continue
    fi
    if [ -f "$dest" ] && [ ! -e "$backup_dir/$target" ]; then
        mkdir -p "$(dirname "$backup_dir/$target")"
        cp -p -- "$dest" "$backup_dir/$target"
    fi
    cp -- "$here/patches/full/$target" "$dest.ddtree-tmp"
    mv -f -- "$dest.ddtree-tmp" "$dest"
    want_hash="$(awk -F'\t' -v t="$target" '$1 == t { print $3 }' "$here/patches/deploy.tsv")"
    [ "$(hash_file "$dest")" = "$want_hash" ] || { echo "FAILED: $dest does not have the expected sha256 after copying" >&2; exit 1; }
    echo "patched: $target"
done
if [ "$dry_run" -eq 1 ]; then
    echo "dry run: nothing changed"
else
    echo "done: ${#todo[@]} file(s) patched; originals in $backup_dir"
fi
