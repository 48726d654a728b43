"""Config names, the matrix file and --ddtree-config selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_ddtree.configs import DEFAULT_WINDOW, ConfigError, DDTreeConfig, name_sort_key, parse_config_name
from pytest_ddtree.measure.matrix import load_matrix
from pytest_ddtree.scheduling import config_scope
from pytest_ddtree.selection import select
from pytest_ddtree.service.profile import load_profile


@pytest.mark.parametrize("name", ["bs8_b8_k4", "bs8_b12_k6_w2048", "bs8_b8_k4_wnone", "bs16_b32_k8", "bs2_b1_k1_w1"])
def test_names_are_canonical(name: str) -> None:
    config = parse_config_name(name)
    assert config.name == name
    assert parse_config_name(config.name) == config


def test_fields_and_windows() -> None:
    assert parse_config_name("bs8_b12_k6_w2048") == DDTreeConfig(8, 12, 6, 2048)
    assert parse_config_name("bs8_b8_k4_wnone").window is None
    default = parse_config_name("bs8_b8_k4")
    assert default.window is DEFAULT_WINDOW
    assert default.resolved_window(2048) == 2048
    assert parse_config_name("bs8_b8_k4_wnone").resolved_window(2048) is None
    # the default window and an explicit one are different names, so different configs
    assert default != parse_config_name("bs8_b8_k4_w2048")


@pytest.mark.parametrize(
    "bad", ["bs8_b8_k4_k4", "k4_bs8_b8", "bs8_b8_k4_foo3", "bs08_b8_k4", "bs8_b8_k4_w", "bs8_b8_k4_wNone", "BS8_B8_K4", "bs8-b8-k4", "bs8_b0_k4", "bs1_b8_k4", ""]
)
def test_malformed_names_say_what_is_valid(bad: str) -> None:
    with pytest.raises(ConfigError, match="bs8_b8_k4|block_size|expected|canonical"):
        parse_config_name(bad)


def test_shipped_matrix(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "suites" / "configs.yaml")
    names = matrix.names()
    assert matrix.default.name == "bs8_b8_k4"
    # the campaign: bs8 x budget {4,8,12,16} x topk {4,6} x window {default, none}, plus two bs16
    assert len(names) == 4 * 2 * 2 + 2
    assert {"bs8_b4_k4", "bs8_b16_k6_wnone", "bs16_b16_k4", "bs16_b32_k8"} <= set(names)
    assert {w.name for w in matrix.cells} >= {"c1_short", "c8_short", "c32_short", "c1_4k"}


def test_selection(repo_root: Path) -> None:
    matrix = load_matrix(repo_root / "suites" / "configs.yaml")
    engine = load_profile(repo_root / "suites" / "services" / "reference.yaml")

    def selected(*requested: str, allow_unlisted: bool = False) -> list[DDTreeConfig]:
        return list(select(list(requested) or None, matrix, engine, allow_unlisted).configs)

    assert selected() == [matrix.default]
    assert [c.name for c in selected("bs8_b*_k4")] == ["bs8_b4_k4", "bs8_b8_k4", "bs8_b12_k4", "bs8_b16_k4"]
    assert [c.name for c in selected("bs8_b8_k4,bs16_b16_k4", "bs8_b8_k4")] == ["bs8_b8_k4", "bs16_b16_k4"]
    assert selected("all") == list(matrix.configs)
    # well-formed but outside the matrix: taken as it is when asked for on purpose
    assert selected("bs4_b3_k2_w512", allow_unlisted=True) == [DDTreeConfig(4, 3, 2, 512)]


@pytest.mark.parametrize("bad", ["bs9_b*", "nonsense", " , ", "bs4_b3_k2_w512"])
def test_selection_errors_list_valid_names(repo_root: Path, bad: str) -> None:
    matrix = load_matrix(repo_root / "suites" / "configs.yaml")
    with pytest.raises(ConfigError) as info:
        select([bad], matrix, load_profile(repo_root / "suites" / "services" / "reference.yaml"))
    assert "valid names: all, bs8_b4_k4" in str(info.value)


def test_matrix_errors_name_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "configs.yaml"
    path.write_text("default: bs8_b8_k4\nmatrix:\n  - {block_size: 8, budget: [4], topk: 4, windw: [none]}\n")
    with pytest.raises(ConfigError, match=r"configs.yaml: matrix\[0\]: unknown axis 'windw' in matrix entry; did you mean 'window'"):
        load_matrix(path)
    path.write_text("default: bs8_b8_k4\nmatrix: [bs8_b8_k4\n")
    with pytest.raises(ConfigError, match="YAML syntax error at line"):
        load_matrix(path)
    path.write_text("default: bs8_b8_k4\ncells:\n  - {name: x, concurrency: two, context_tokens: 5}\n")
    with pytest.raises(ConfigError, match=r"cells\[0\]: cell values must be integers"):
        load_matrix(path)


def test_one_grammar_serves_parsing_sorting_and_scheduling() -> None:
    names = ["bs16_b8_k4", "bs8_b8_k4_wnone", "bs8_b12_k6", "bs8_b8_k4_w512", "bs8_b8_k4", "not-a-config"]
    assert sorted(names, key=name_sort_key) == [
        "bs8_b8_k4", "bs8_b8_k4_w512", "bs8_b8_k4_wnone", "bs8_b12_k6", "bs16_b8_k4", "not-a-config"]
    # The scheduler finds exactly the names the parser accepts inside a test id.
    assert config_scope("suites/test_x.py::test_a[bs8_b12_k6_w2048-c4]") == "ddtree-config:bs8_b12_k6_w2048"
    assert config_scope("suites/test_x.py::test_a[c4-bs8_b8_k4]") == "ddtree-config:bs8_b8_k4"
    for not_canonical in ("bs08_b8_k4", "bs8_b8_k4_w0"):
        with pytest.raises(ConfigError):
            parse_config_name(not_canonical)
        node = f"suites/test_x.py::test_a[{not_canonical}]"
        assert config_scope(node) == node


def test_the_report_and_the_scheduler_find_the_same_config_in_a_test_id() -> None:
    from pytest_ddtree.configs import config_in_nodeid
    from pytest_ddtree.report.html.model import config_of_nodeid

    node = "suites/test_throughput.py::test_throughput[c4_l-bs8_b12_k6_w2048]"
    assert config_in_nodeid(node) == "bs8_b12_k6_w2048" == config_of_nodeid(node, ["bs8_b8_k4", "bs8_b12_k6_w2048"])
    assert config_scope(node) == "ddtree-config:bs8_b12_k6_w2048"
    assert config_of_nodeid(node, ["bs8_b8_k4"]) is None  # not a config of this session
    assert config_in_nodeid("suites/test_health.py::test_health") is None


def test_the_gpu_workloads_load_with_the_campaign_matrix(pytester: pytest.Pytester) -> None:
    """suites/configs-gpu.yaml (docs/gpu-box.md) is a matrix the harness loads: configs.yaml's
    sweep and default, cells of bench_serving's sizes, each a throughput test of its own."""
    repo = Path(__file__).resolve().parent.parent
    gpu, embedded = load_matrix(repo / "suites" / "configs-gpu.yaml"), load_matrix(repo / "suites" / "configs.yaml")
    assert gpu.names() == embedded.names() and gpu.default == embedded.default
    assert all(w.output_tokens >= 256 and w.requests >= max(16, 4 * w.concurrency) for w in gpu.cells)
    assert {w.concurrency for w in gpu.cells} == {1, 8, 32}
    result = pytester.runpytest_subprocess(
        str(repo / "suites" / "test_throughput.py"), f"--rootdir={repo}", f"--ddtree-matrix={repo / 'suites' / 'configs-gpu.yaml'}",
        "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    cells = sorted(line.split("[")[1].split("-")[0] for line in result.outlines if "test_throughput[" in line)
    assert cells == sorted(w.name for w in gpu.cells)


def test_a_workload_inline_as_bench_serving_names_it() -> None:
    from pytest_ddtree.measure.matrix import select_cells

    matrix = load_matrix(Path(__file__).resolve().parent.parent / "suites" / "configs.yaml")
    open_loop, closed = select_cells(["rate=4,max_concurrency=16,prompts=200,input=1024,output=512",
                                          "--random-input-len=4096,--random-output-len=64,concurrency=8,num_prompts=16"], matrix)
    assert open_loop.open_loop is not None and open_loop.open_loop.request_rate == 4.0
    assert open_loop.open_loop.max_concurrency == 16 and open_loop.concurrency == 16
    assert (open_loop.requests, open_loop.context_tokens, open_loop.output_tokens, open_loop.name) == (200, 1024, 512, "r4_ctx1024")
    assert (closed.concurrency, closed.context_tokens, closed.output_tokens, closed.requests, closed.name) == (8, 4096, 64, 16, "c8_ctx4096")
    assert closed.prompts == "documents"  # the matrix's cell_defaults fill what the spec leaves out
    assert [w.name for w in select_cells(["c1_short", "concurrency=2,input=128"], matrix)] == ["c1_short", "c2_ctx128"]
    with pytest.raises(ConfigError, match="unknown key 'imput'.*did you mean 'input'"):
        select_cells(["imput=128"], matrix)
    with pytest.raises(ConfigError, match="rate must be a number"):
        select_cells(["rate=fast"], matrix)
    with pytest.raises(ConfigError, match="or a cell inline"):
        select_cells(["c9_short"], matrix)
