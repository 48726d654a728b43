"""Service profile validation and rendering."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pytest_ddtree.configs import parse_config_name
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.selection import select
from pytest_ddtree.service.profile import ProfileError, SelectionError, ServiceProfile, load_profile, parse_profile, render_value

SHIPPED = ["reference.yaml", "sglang-upstream-dflash.yaml", "sglang-ddtree-pr27509.yaml", "sglang-subsir-tree-verify.yaml",
           "sglang-subsir-tree-verify-flags.yaml", "sglang-dflash-tree-pr31069.yaml"]


def shipped(repo_root: Path, name: str) -> ServiceProfile:
    return load_profile(repo_root / "suites" / "services" / name)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_and_warn_about_flags(repo_root: Path, name: str) -> None:
    path = repo_root / "suites" / "services" / name
    profile = load_profile(path)
    assert profile.default_window == 2048
    assert profile.applied, "every shipped profile checks that the config applied"
    for field_name in profile.settable_fields():  # every set field is read back or says why not
        assert field_name in profile.applied.values() or field_name in profile.unverifiable, field_name
    if name != "reference.yaml":
        text = path.read_text()
        assert "CHECK THE FLAG MAPPING" in text and profile.ready_timeout_s == 3600
        assert "sglang/srt/" in text and profile.sources, "a shipped profile cites the source files it follows"


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "reference.yaml"])
def test_shipped_real_build_profiles_cite_a_source_for_every_flag_variable_and_key(repo_root: Path, name: str) -> None:
    """Each flag, environment variable and applied key says where in the build's source it was read
    (repository, commit, path:line) or that it is unverified."""
    profile = shipped(repo_root, name)
    flags = {render_value(t, 1).split()[0] for t in profile.config_args.values()}
    variables = {v for mapping in profile.config_env.values() for v in mapping} | set(profile.env)
    for item in sorted(flags | variables | set(profile.applied)):
        assert item in profile.sources, f"{name}: no source for {item}"
        where = profile.sources[item]
        assert "unverified" in where or re.search(r"[\w./-]+\.(py|md)(:\d+)?", where), f"{name}: {item}: {where}"
    assert "start-up log" in profile.sources, f"{name}: say which start-up line tells this build apart"


def test_upstream_dflash_sets_the_block_size_only(repo_root: Path) -> None:
    profile = shipped(repo_root, "sglang-upstream-dflash.yaml")
    assert profile.render_config_args(parse_config_name("bs8_b7_k1")) == [
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/Kimi-K2.6-DFlash",
        "--speculative-dflash-block-size", "8", "--speculative-draft-window-size", "2048"]
    assert profile.expected_applied(parse_config_name("bs16_b15_k1_wnone")) == {
        "speculative_num_draft_tokens": 16, "speculative_eagle_topk": 1, "speculative_draft_window_size": None}
    profile.check_selection([parse_config_name("bs8_b7_k1"), parse_config_name("bs16_b15_k1_wnone")])
    with pytest.raises(SelectionError) as info:
        profile.check_selection([parse_config_name("bs8_b8_k4")])
    message = str(info.value)
    assert "bs8_b8_k4 asks topk=4, but this build cannot set topk: it is always 1" in message
    assert "bs8_b8_k4 asks budget=8, but this build cannot set budget: it is = block_size - 1 (7 here; DFLASH verifies a chain" in message


def test_ddtree_pr27509_takes_its_own_flags_and_topk_follows_the_budget(repo_root: Path) -> None:
    profile = shipped(repo_root, "sglang-ddtree-pr27509.yaml")
    command = profile.render_command(parse_config_name("bs8_b16_k16"), 30000)
    assert "--speculative-algorithm DDTREE" in command
    assert "--speculative-ddtree-block-size 8 --speculative-ddtree-budget 16" in command
    assert "topk" not in command
    with pytest.raises(SelectionError, match="cannot set topk"):
        profile.check_selection([parse_config_name("bs8_b8_k4"), parse_config_name("bs8_b8_k6")])


def test_subsir_fork_sets_budget_and_topk_through_the_environment(repo_root: Path) -> None:
    profile = shipped(repo_root, "sglang-subsir-tree-verify.yaml")
    config = parse_config_name("bs8_b12_k6_wnone")
    assert profile.render_env(config) == {
        "SGLANG_DFLASH_TREE_VERIFY": "1", "SGLANG_DFLASH_BLOCK_VERIFY": "1",
        "SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS": "13", "SGLANG_DFLASH_TREE_VERIFY_TOPK": "6"}
    assert profile.render_config_args(config)[-2:] == ["--speculative-num-draft-tokens", "8"]  # no window: not an axis
    assert set(profile.unverifiable) == {"budget", "topk"}
    how = profile.how_fields_reach_the_service()
    assert "unverifiable: set by SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS" in how["budget"]
    # k4 and k6 differ only in an environment variable: two launches, both allowed
    profile.check_selection([parse_config_name("bs8_b8_k4"), parse_config_name("bs8_b8_k6")])


def test_a_profile_that_cannot_set_topk_refuses_two_configs_differing_in_topk(repo_root: Path) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    del raw["config_args"]["topk"], raw["applied"]["speculative_eagle_topk"]
    profile = parse_profile(raw)  # topk unmapped: derived by the build
    k4, k6, k4_w = parse_config_name("bs8_b8_k4"), parse_config_name("bs8_b8_k6"), parse_config_name("bs8_b8_k4_w2048")
    profile.check_selection([k4, k4_w])  # the same config under two names is not a conflict
    with pytest.raises(SelectionError) as info:
        profile.check_selection([k4, k6])
    assert "bs8_b8_k4, bs8_b8_k6 would run the same launch" in str(info.value)
    assert "cannot set topk (topk: not settable: derived by the build)" in str(info.value)


def test_value_templates_take_an_offset() -> None:
    assert render_value("--n {value}", 8) == "--n 8"
    assert render_value("{value+1}", 8) == "9" and render_value("x{value-1}y", 8) == "x7y"


def _write(tmp_path: Path, repo_root: Path, **changes: object) -> Path:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"comand": "x"}, r"profile.yaml:\d+: comand: unknown key; did you mean 'command'"),
        ({"controller": "docker"}, r"profile.yaml:\d+: controller: must be one of process, systemd, external"),
        ({"command": "python -m server {config_args}"}, r"profile.yaml:\d+: command: must contain \{port\}"),
        ({"command": "python -m server --port {port}"}, r"command: must contain \{config_args\}"),
        ({"command": "python -m server --port {prot} {config_args}"}, r"command: unknown placeholder"),
        ({"config_args": {"budget": "--budget"}}, r"config_args.budget: must be a flag template"),
        ({"config_args": {"tree": "--t {value}"}}, r"config_args.tree: unknown config field"),
        ({"config_args": {"budget": "--b {valu}"}}, r"config_args.budget: must be a flag template"),
        ({"config_env": {"budget": {"X": "{value}"}}}, r"config_env.budget: this field is already set by config_args"),
        ({"config_env": {"topk": "X"}}, r"config_env.topk: must map environment variables"),
        ({"fixed": {"topk": 1}}, r"fixed.topk: the profile also sets this field"),
        ({"fixed": {"tree": 1}}, r"fixed.tree: unknown config field"),
        ({"applied": {"speculative_num_draft_tokens": "budget"}}, r"config_args.block_size: the profile sets block_size but never checks it"),
        ({"unverifiable": {"topk": "no key"}}, r"unverifiable.topk: this field is read back by applied"),
        ({"unverifiable": {"topk": ""}}, r"unverifiable.topk: must give the reason"),
        ({"applied": {"speculative_eagle_topk": "top_k"}}, r"applied.speculative_eagle_topk: must name a config field"),
        ({"url": None}, r"profile.yaml: url: missing required key"),
        ({"port": "any"}, r"port: must be an integer or 'auto'"),
        ({"ready_timeout_s": -1}, r"ready_timeout_s: must be positive"),
        ({"request_timeout_s": 0}, r"request_timeout_s: must be positive \(seconds\), got 0"),
        ({"cell_timeout_s": float("inf")}, r"cell_timeout_s: must be positive \(seconds\), got inf"),
        ({"info_timeout_s": "30"}, r"info_timeout_s: expected int or float, got str"),
        ({"env": {"A B": "1"}}, r"env.A B: not an environment variable name"),
        ({"env": {"X=1;touch /tmp/p;Y": "1"}}, r"env.X=1;touch /tmp/p;Y: not an environment variable name"),
        ({"config_args": {"block_size": "--b {value}", "budget": "--n {value}", "window": "--w {value}"},
          "config_env": {"topk": {"1TOPK": "{value}"}}}, r"config_env.topk.1TOPK: not an environment variable name"),
        ({"pool": 0}, r"pool: must be at least 1"),
        ({"lossless_args": None}, r"lossless_args: lossless: instance needs"),
        ({"command": "python -m server --speculative-algorithm DFLASH --port {port} {config_args}"},
         r"lossless_args: the plain launch \(the command without config_args, plus lossless_args\) would speculate"),
        ({"speculative_args": "--speculative-algorithm {algo}"}, r"speculative_args: takes no placeholders"),
        ({"speculative_args": "--speculative-draft-model-path '/models/x"}, r"speculative_args: must be shell words"),
        ({"controller": "systemd"}, r"unit: the systemd controller needs the unit name"),
        ({"pool": ["http://127.0.0.1:30000"], "relaunch_flagged": True, "control_launches": None, "control_max_launches": None,
          "bless_control_launches": None}, r"relaunch_flagged: an external service or a pool of URLs cannot be relaunched"),
        ({"control_launches": 0}, r"control_launches: must be a whole number from 1 to 16"),
        ({"control_launches": True}, r"control_launches: expected int, got bool"),
        ({"pool": ["http://127.0.0.1:30000"], "control_launches": 4}, r"control_launches: an external service or a pool of URLs cannot be relaunched"),
    ],
)
def test_profile_errors_name_file_key_and_problem(tmp_path: Path, repo_root: Path, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        load_profile(_write(tmp_path, repo_root, **changes))


def test_yaml_syntax_error_reports_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\ncontroller: process\ncommand: [unclosed\n")
    with pytest.raises(ProfileError, match=r"broken.yaml: YAML syntax error at line \d+"):
        load_profile(path)


def test_environment_variables_fill_a_profile_when_it_is_read(tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_TEST_MODEL", "/models/tiny")
    monkeypatch.setenv("DDTREE_TEST_EMPTY", "")
    monkeypatch.delenv("DDTREE_TEST_UNSET", raising=False)
    command = ("{python} -m pytest_ddtree.refserver --model ${DDTREE_TEST_MODEL} --a ${DDTREE_TEST_UNSET:-fallback} "
               "--b x${DDTREE_TEST_EMPTY:-fb} --c x${DDTREE_TEST_EMPTY-fb} --d ${DDTREE_TEST_UNSET-} --e ${{SHELL_VAR}} $$ "
               "--port {port} {config_args}")
    profile = load_profile(_write(tmp_path, repo_root, command=command, python="${DDTREE_TEST_MODEL}/bin/python",
                                  env={"A": "${DDTREE_TEST_MODEL}", "S": "$${HOME}"}))
    assert profile.command == ("{python} -m pytest_ddtree.refserver --model /models/tiny --a fallback --b xfb --c x --d  "
                               "--e ${{SHELL_VAR}} $$ --port {port} {config_args}")  # a shell's ${X} in a template: untouched
    assert profile.env == {"A": "/models/tiny", "S": "${HOME}"} and profile.python == "/models/tiny/bin/python"
    # {python} is the profile's python: where it names one (the service's venv, not the harness's)
    assert profile.render_command(None, 1).startswith("/models/tiny/bin/python -m pytest_ddtree.refserver")
    assert "${DDTREE_TEST_MODEL}" in profile.text  # the file as written, for the package
    with pytest.raises(ProfileError, match=r"profile.yaml:\d+: env.B: \$\{DDTREE_TEST_UNSET\} is not set in the environment: "
                                           r"set it, or give a default"):
        load_profile(_write(tmp_path, repo_root, env={"B": "${DDTREE_TEST_UNSET}"}))


def test_control_none_accepts_the_launch_keys_of_a_copied_profile(tmp_path: Path, repo_root: Path) -> None:
    """A user copies reference.yaml (it sets all three control launch keys) and writes control: none:
    the keys are unused then, so the profile loads, with no warning, also where a control could not be
    relaunched (a pool of URLs); their range is still checked."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profile = load_profile(_write(tmp_path, repo_root, control="none"))
        assert profile.control == "none" and profile.control_launches == 2  # as reference.yaml sets it, unused
        pooled = load_profile(_write(tmp_path, repo_root, control="none", pool=["http://127.0.0.1:30000"],
                                     relaunch_flagged=False, control_launches=4))
        assert pooled.control == "none"
    with pytest.raises(ProfileError, match=r"control_launches: must be a whole number from 1 to 16"):
        load_profile(_write(tmp_path, repo_root, control="none", control_launches=0))
    with pytest.raises(ProfileError, match=r"control_launches: an external service or a pool of URLs cannot be relaunched"):
        load_profile(_write(tmp_path, repo_root, pool=["http://127.0.0.1:30000"], relaunch_flagged=False, control_launches=4))


def test_an_empty_lossless_args_launches_the_command_as_written(tmp_path: Path, repo_root: Path) -> None:
    profile = load_profile(_write(tmp_path, repo_root, lossless_args="", lossless=None))
    assert profile.lossless == "instance" and profile.lossless_args == ""
    plain = profile.render_command(None, 1, profile.lossless_args)
    assert plain.endswith("--enable-metrics") and "--speculative" not in plain, plain  # the command, no config_args


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parent.parent / "suites" / "services").glob("sglang-*.yaml")))
def test_every_shipped_sglang_profile_has_a_plain_launch_and_speculates_only_in_its_configs(repo_root: Path, name: str) -> None:
    """The control, the lossless reference and the golden bless are the command without config_args
    (SGLang serves plainly only where no --speculative-algorithm is given); every config's launch
    names the algorithm (and the drafter, where the build has one)."""
    profile = shipped(repo_root, name)
    assert profile.lossless_args == "", name
    plain = profile.render_command(None, 30000, profile.lossless_args)
    assert "--speculative" not in plain and "{" not in plain, plain
    configs = select(["all"], load_matrix(repo_root / "suites" / "configs.yaml"), profile).configs
    assert configs, name
    for config in configs:
        launch = profile.render_command(config, 30000)
        assert launch.startswith(plain.split(" --host")[0]) and "--speculative-algorithm " in launch, launch
        if profile.draft_model_path:
            assert f"--speculative-draft-model-path {profile.draft_model_path}" in launch, launch


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_tree_profile_says_whether_its_budget_flag_counts_the_root(repo_root: Path, name: str) -> None:
    """bN means N non-root nodes on every build: a flag that counts the root is launched as N + 1."""
    profile = shipped(repo_root, name)
    counts_root = yaml.safe_load((repo_root / "suites" / "services" / name).read_text()).get("budget_counts_root")
    if "budget" not in profile.settable_fields():
        assert counts_root is None
        return
    assert counts_root is not None, f"{name} sets the budget but does not say budget_counts_root"
    rendered = profile.render_command(parse_config_name("bs8_b4_k4"), 30000) + " " + " ".join(
        f"{k}={v}" for k, v in profile.render_env(parse_config_name("bs8_b4_k4")).items())
    nodes = "5" if counts_root else "4"
    assert re.search(rf"(--speculative-num-draft-tokens|--speculative-ddtree-budget|_NUM_TOKENS=) ?{nodes}\b", rendered), rendered


@pytest.mark.parametrize("edit, message", [
    ({"budget_counts_root": True}, "must use {value+1}"),
    ({"budget_counts_root": True, "config_args": {"block_size": "--speculative-dflash-block-size {value}",
                                                  "budget": "--speculative-num-draft-tokens {value+1}",
                                                  "topk": "--speculative-eagle-topk {value}",
                                                  "window": "--speculative-draft-window-size {value}"}},
     "read it back as budget + 1"),
    ({"fork_flags": {"--speculative-ddtree-budget": "PR 27509"}}, "is not passed by the command"),
    ({"fork_flags": {"--speculative-eagle-topk": " "}}, "must say which fork or PR"),
    ({"fork_flags": {"speculative-eagle-topk": "x"}}, "spelled --like-this"),
])
def test_budget_counts_root_and_fork_flags_are_checked(repo_root: Path, edit: dict[str, object], message: str) -> None:
    raw = yaml.safe_load((repo_root / "suites" / "services" / "reference.yaml").read_text())
    raw.update(edit)
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_profile(raw)


def test_a_profile_path_that_does_not_exist_lists_the_shipped_profiles(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as info:
        load_profile(tmp_path / "sglang-upstrem-dflash.yaml")
    assert "No such file" in str(info.value) and "the shipped profiles are in" in str(info.value)
    assert "sglang-upstream-dflash.yaml" in str(info.value) and "reference.yaml" in str(info.value)
    assert "dialects.yaml" not in str(info.value)  # beside the profiles, the engine's dialects: not a profile


def test_max_repeat_spread_decides_when_a_cells_repeats_agree(tmp_path: Path, repo_root: Path) -> None:
    """A host shared with other work (a CI box running the real-SGLang lane) spreads its tok/s far
    past 12%: the profile says how much it tolerates, and only that decides whether repeats agree."""
    from pytest_ddtree.gates.throughput.cells import CellSetup, driving_for
    from pytest_ddtree.gates.throughput.verdicts import judge_bless
    from pytest_ddtree.gates.throughput.measurement import repeat_policy
    from pytest_ddtree.records.words import Status

    assert load_profile(_write(tmp_path, repo_root)).max_repeat_spread == 0.12
    profile = load_profile(_write(tmp_path, repo_root, max_repeat_spread=1.0))
    assert profile.max_repeat_spread == 1.0
    for bad in (0, -0.1, 11):
        with pytest.raises(ProfileError, match=r"max_repeat_spread: must be a fraction above 0 \(0.12 is 12%\)"):
            load_profile(_write(tmp_path, repo_root, max_repeat_spread=bad))

    driving = driving_for(CellSetup(profile, repeats=3))
    noisy = [156.6, 153.4, 47.4, 98.5, 131.1, 137.3, 89.7, 160.0, 56.9]  # c1_short on real EAGLE3, a loaded 2-core box
    assert repeat_policy(3).status(noisy) == Status.INCONCLUSIVE
    assert repeat_policy(3, max_spread=driving.max_repeat_spread).status(noisy) == Status.VALID
    # a bless asks for a tight interval: +-5% by default, what the profile says otherwise
    assert load_profile(_write(tmp_path, repo_root)).bless_max_half_width == 0.05
    with pytest.raises(ProfileError, match=r"bless_max_half_width: must be a fraction above 0 \(0.05 is \+-5%\)"):
        load_profile(_write(tmp_path, repo_root, bless_max_half_width=0))
    loose = load_profile(_write(tmp_path, repo_root, max_repeat_spread=1.0, bless_max_half_width=0.5))
    driving = driving_for(CellSetup(loose, repeats=3))
    refused = judge_bless(Status.VALID, [], noisy)
    assert not refused.blessed and "95% t-interval +-" in str(refused.refusal) and "+-5% a bless needs" in str(refused.refusal)
    assert judge_bless(Status.VALID, [], noisy, driving.bless_max_half_width).blessed
    assert repeat_policy(3, True, driving.max_repeat_spread, driving.bless_max_half_width).target_half_width == 0.5
