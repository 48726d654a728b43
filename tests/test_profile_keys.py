"""The profile's keys, declared once (pytest_ddtree/service/profile_keys.py): grouped or flat they
read the same, the errors name the key as written with its line, and the docs' table is the
declaration's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_ddtree.service import kinds
from pytest_ddtree.service.fleet import HOST_OVERRIDES
from pytest_ddtree.service.installed import DIALECTS_FILE
from pytest_ddtree.service.profile import ProfileError, ServiceProfile, load_profile, parse_profile
from pytest_ddtree.service.profile_keys import GROUPS, KEYS, flatten, keys_table
from pytest_ddtree.service.slurm import SLURM_KEYS

SERVICES = Path(__file__).resolve().parent.parent / "suites" / "services"
BY_NAME = {key.name: key for key in KEYS}
REGENERATE = "python -m pytest_ddtree.service.profile_keys docs/profiles.md"


def _refuse(key: str, problem: str) -> ProfileError:
    return ProfileError(f"{key}: {problem}")


def flat(raw: dict[str, Any]) -> dict[str, Any]:
    return flatten(raw, _refuse)[0]


def grouped(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every key that has a group written inside it."""
    out: dict[str, Any] = {}
    for name, value in flat(raw).items():
        key = BY_NAME.get(name)
        if key is None or key.group is None:
            out[name] = value
        else:
            out.setdefault(key.group, {})[key.inner or key.name] = value
    return out


def _write(tmp_path: Path, raw: dict[str, Any], extra: str = "") -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False) + extra)
    return path


def _reference() -> dict[str, Any]:
    raw = yaml.safe_load((SERVICES / "reference.yaml").read_text())
    assert isinstance(raw, dict)
    return raw


def test_the_docs_table_is_the_declarations(repo_root: Path) -> None:
    page = (repo_root / "docs" / "profiles.md").read_text()
    assert keys_table() in page, f"docs/profiles.md's table of profile keys is not the declaration's: run {REGENERATE}"
    # every group and key is in it, once
    table = keys_table()
    for key in KEYS:
        assert len(re.findall(rf"^\| `{key.inner or key.name}` \|(?: `{key.name}` \|)?", table, re.M)) >= 1, key.name
    assert all(f"**`{group.name}:`**" in table for group in GROUPS)


@pytest.mark.parametrize("name", sorted(p.name for p in SERVICES.glob("*.yaml") if p.name != DIALECTS_FILE))
def test_every_shipped_profile_reads_the_same_flat_and_grouped(name: str) -> None:
    path = SERVICES / name
    raw = yaml.safe_load(path.read_text())
    as_written = load_profile(path)

    def read(document: dict[str, Any]) -> ServiceProfile:
        return dataclasses.replace(parse_profile(document, source=path), text=as_written.text)

    assert read(flat(raw)) == as_written
    assert read(grouped(raw)) == as_written
    standing_alone = {key.name for key in KEYS if key.group is None} | set(kinds.key_types())
    assert set(grouped(raw)) - standing_alone <= {group.name for group in GROUPS}


def test_a_shipped_profile_is_written_grouped() -> None:
    raw = yaml.safe_load((SERVICES / "sglang-cpu-ngram.yaml").read_text())
    assert {"launch", "config", "proof", "deadlines"} <= set(raw) and "command" not in raw


def test_a_key_given_both_ways_is_an_error_naming_both_and_the_line(tmp_path: Path) -> None:
    raw = {**_reference(), "control": {"launches": 3}}
    with pytest.raises(ProfileError, match=r"profile.yaml:\d+: control.launches: given twice: as control.launches and "
                                           r"as control_launches; keep one of them"):
        load_profile(_write(tmp_path, raw))


def test_an_unknown_key_names_the_closest_one_and_its_line(tmp_path: Path) -> None:
    raw = grouped(_reference())
    raw["deadlines"]["ready_timeout_s"] = raw["deadlines"].pop("ready_s")  # its flat name
    path = _write(tmp_path, raw)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "ready_timeout_s" in text)
    with pytest.raises(ProfileError, match=rf"profile.yaml:{line}: deadlines.ready_timeout_s: unknown key in deadlines; "
                                           r"it is deadlines.ready_s"):
        load_profile(path)
    raw["deadlines"] = {"redy_s": 60}
    with pytest.raises(ProfileError, match=r"deadlines.redy_s: unknown key in deadlines; did you mean 'ready_s'.*\? "
                                           r"deadlines holds: ready_s, request_s"):
        load_profile(_write(tmp_path, raw))
    raw["deadlines"] = {"command": "x"}  # a key of another group
    with pytest.raises(ProfileError, match=r"deadlines.command: unknown key in deadlines; it is launch.command or "
                                           r"calibration.command"):
        load_profile(_write(tmp_path, raw))


def test_a_grouped_name_written_flat_says_where_it_belongs(tmp_path: Path) -> None:
    raw = {**_reference(), "launches": 2}
    with pytest.raises(ProfileError, match=r"profile.yaml:\d+: launches: unknown key; it is control.launches in the "
                                           r"grouped form"):
        load_profile(_write(tmp_path, raw))
    raw = {**_reference(), "deadlines": 5}
    with pytest.raises(ProfileError, match=r"deadlines: is a group of keys: write them under it"):
        load_profile(_write(tmp_path, raw))


def test_errors_name_the_key_as_written(tmp_path: Path) -> None:
    """A grouped key's problem is reported under its grouped name, at its line, as a flat one is under its own."""
    raw = grouped(_reference())
    raw["control"]["launches"] = 0
    path = _write(tmp_path, raw)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "launches: 0" in text)
    with pytest.raises(ProfileError, match=rf"profile.yaml:{line}: control.launches: must be a whole number from 1 to 16"):
        load_profile(path)
    raw = grouped(_reference())
    raw["config"]["args"]["budget"] = "--speculative-num-draft-tokens"
    with pytest.raises(ProfileError, match=r"profile.yaml:\d+: config.args.budget: must be a flag template containing"):
        load_profile(_write(tmp_path, raw))
    flat_raw = {**_reference(), "control_launches": 0}
    with pytest.raises(ProfileError, match=r"profile.yaml:\d+: control_launches: must be a whole number"):
        load_profile(_write(tmp_path, flat_raw))
    # control: as the flat key still takes a config name or none
    assert parse_profile({**_reference(), "control": "none"}).control == "none"


def _yaml_blocks(page: str) -> list[Any]:
    out = []
    for block in re.findall(r"```yaml\n(.*?)```", page, re.S):
        try:
            out.append(yaml.safe_load(block))
        except yaml.YAMLError:
            continue  # an abridged fragment
    return out


def test_the_docs_example_profile_is_grouped_and_loads(repo_root: Path, tmp_path: Path) -> None:
    example = _yaml_blocks((repo_root / "docs" / "profiles.md").read_text())[0]
    assert {"launch", "config", "proof", "control", "deadlines"} <= set(example)
    profile = parse_profile(example)
    assert profile.ready_timeout_s == 3600 and profile.control_launches == 3 and profile.fixed["topk"].follows == "budget"


def test_the_docs_profile_examples_name_only_declared_keys(repo_root: Path) -> None:
    """The profiles the pages show (flat, grouped or mixed) use keys the validator knows, down to a
    slurm job's options and a host pool entry's overrides: an example cannot keep a key that was
    renamed or dropped."""
    groups = {group.name for group in GROUPS}
    inner = {(key.group, key.inner or key.name) for key in KEYS if key.group}
    seen = 0
    slurm_documented: set[str] = set()
    for page in sorted((repo_root / "docs").rglob("*.md")):
        for block in _yaml_blocks(page.read_text()):
            if not isinstance(block, dict) or "name" not in block or not {"controller", "command", "launch", "url"} & set(block):
                continue
            seen += 1
            for name, value in block.items():
                if name in groups and isinstance(value, dict):
                    assert all((name, k) in inner for k in value), (page.name, name, sorted(value))
                else:
                    assert name in BY_NAME or name in kinds.key_types(), (page.name, name)
            assert set(block.get("slurm") or {}) <= set(SLURM_KEYS), (page.name, sorted(block["slurm"]))
            slurm_documented |= set(block.get("slurm") or {})
            for entry in (e for e in block.get("pool") or [] if isinstance(block.get("pool"), list) and isinstance(e, dict)):
                assert set(entry) <= {"host", *HOST_OVERRIDES}, (page.name, sorted(entry))
    assert seen >= 6
    assert slurm_documented == set(SLURM_KEYS), "docs/fleet/slurm.md's example shows every job option"
