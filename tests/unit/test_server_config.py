"""``zinfer serve --config FILE``: every key, flags over the file, unknown keys, bad values, the example."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from zinfer.broker import cli
from zinfer.broker.server_config import (
    KEYS,
    ConfigFileError,
    cpus_for,
    format_cpus,
    load_config,
    parse_config,
    parse_cpus,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "zinfer.toml"

EVERY_KEY = """
model_repository = "models"
runtime_dir = "/run/zinfer"
tcp = "127.0.0.1:8001"
metrics = "127.0.0.1:9002"
socket_group = "zinfer-clients"
curve_secret_key = "keys/server.key_secret"
curve_allow = "/etc/zinfer/keys/clients"
max_tensor_bytes = 1_048_576
max_batch_bytes = 3_145_728
max_region_bytes = 8_589_934_592
max_user_region_bytes = 17_179_869_184
max_unread_reply_bytes = 67_108_864
drain_timeout_s = 12
exit_timeout_s = 2.5
heartbeat_interval_s = 0.5
heartbeat_liveness = 3
log_level = "debug"
model_control_mode = "explicit"
load_models = ["add", "identity"]
memory_budget = { host = "8G", gpu0 = 1024 }
model_idle_unload_s = 600
cache_bytes = 1024
gpus = [1, 0]
grpc = "127.0.0.1:8101"
http = "127.0.0.1:8100"
frontdoor_workers = 3
frontdoor_cpus = "1,4-5"
tls_cert = "tls/server.crt"
tls_key = "/etc/zinfer/tls/server.key"
tls_client_ca = "/etc/zinfer/tls/ca.crt"
insecure_remote = true
allow_unknown_shm_callers = true
http_header_timeout_s = 2.5
http_peer_connections = 32

[rate_limit_resources]
R1 = 4
"gpu memory" = 0

[cpu_affinity]
"*" = ["0-3"]
linear = ["0-1,8", "2-3"]
"""

EXPECTED: dict[str, Any] = {
    "model_repository": Path("models"),  # relative to the file's folder: joined in the test
    "runtime_dir": Path("/run/zinfer"),
    "tcp": "127.0.0.1:8001",
    "metrics": "127.0.0.1:9002",
    "socket_group": "zinfer-clients",
    "curve_secret_key": Path("keys/server.key_secret"),
    "curve_allow": Path("/etc/zinfer/keys/clients"),
    "max_tensor_bytes": 1 << 20,
    "max_batch_bytes": 3 << 20,
    "max_region_bytes": 8 << 30,
    "max_user_region_bytes": 16 << 30,
    "max_unread_reply_bytes": 64 << 20,
    "drain_timeout_s": 12.0,
    "exit_timeout_s": 2.5,
    "heartbeat_interval_s": 0.5,
    "heartbeat_liveness": 3,
    "log_level": "DEBUG",
    "model_control_mode": "explicit",
    "load_models": ("add", "identity"),
    "memory_budget": ("host=8G", "gpu0=1024"),
    "model_idle_unload_s": 600.0,
    "cache_bytes": 1024,
    "gpus": (1, 0),
    "rate_limit_resources": {"R1": 4, "gpu memory": 0},
    "cpu_affinity": {"*": (frozenset({0, 1, 2, 3}),), "linear": (frozenset({0, 1, 8}), frozenset({2, 3}))},
    "grpc": "127.0.0.1:8101",
    "http": "127.0.0.1:8100",
    "frontdoor_workers": 3,
    "frontdoor_cpus": frozenset({1, 4, 5}),
    "tls_cert": Path("tls/server.crt"),
    "tls_key": Path("/etc/zinfer/tls/server.key"),
    "tls_client_ca": Path("/etc/zinfer/tls/ca.crt"),
    "insecure_remote": True,
    "allow_unknown_shm_callers": True,
    "http_header_timeout_s": 2.5,
    "http_peer_connections": 32,
}


def _write(tmp_path: Path, text: str, name: str = "zinfer.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_key_is_read_and_converted(tmp_path: Path) -> None:
    values = load_config(_write(tmp_path, EVERY_KEY))
    assert set(values) == set(KEYS) == set(EXPECTED)
    expected = dict(EXPECTED)
    for key in ("model_repository", "curve_secret_key", "tls_cert"):
        expected[key] = tmp_path / EXPECTED[key]
    assert values == expected


def test_an_empty_file_sets_nothing(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path, "# nothing\n")) == {}


def _options(tmp_path: Path, text: str, *flags: str) -> Any:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    args = cli.parse_args(["serve", "--config", str(_write(tmp_path, text)), *flags])
    return args, cli.server_options(args, args.model_repository or repo)


def test_the_file_fills_server_options(tmp_path: Path) -> None:
    args, opts = _options(tmp_path, EVERY_KEY)
    assert opts.model_repository == tmp_path / "models"
    assert opts.runtime_dir == Path("/run/zinfer")
    assert opts.tcp == "127.0.0.1:8001"
    assert opts.metrics == "127.0.0.1:9002"
    assert opts.socket_group == "zinfer-clients"
    assert opts.curve_secret_key == tmp_path / "keys/server.key_secret"
    assert opts.curve_allow == Path("/etc/zinfer/keys/clients")
    assert opts.max_tensor_bytes == 1 << 20
    assert opts.max_batch_bytes == 3 << 20
    assert (opts.drain_timeout_s, opts.exit_timeout_s) == (12.0, 2.5)
    assert opts.log_level == "DEBUG" and args.log_level == "DEBUG"
    assert opts.model_control_mode == "explicit"
    assert opts.load_models == ("add", "identity")
    # keys no flag overrides become ServerOptions fields of the same name (where the server has them)
    for key in ("max_region_bytes", "heartbeat_interval_s", "heartbeat_liveness", "cache_bytes", "gpus",
                "cpu_affinity"):  # fmt: skip
        assert getattr(opts, key, EXPECTED[key]) == EXPECTED[key]
    # the rate limiter takes its pools as (name, count, device); a table's entries are for every device
    assert opts.rate_limit_resources == (("R1", 4, None), ("gpu memory", 0, None))


def test_rate_limit_and_cache_flags(tmp_path: Path) -> None:
    _, opts = _options(tmp_path, "", "--cache-bytes", "4096", "--rate-limit-resource", "R:2:gpu:1",
                       "--rate-limit-resource", "S:3", "--heartbeat-interval", "0.5")  # fmt: skip
    assert opts.cache_bytes == 4096 and opts.heartbeat_interval_s == 0.5
    assert opts.rate_limit_resources == (("R", 2, "gpu:1"), ("S", 3, None))


def test_flags_override_the_file(tmp_path: Path) -> None:
    args, opts = _options(
        tmp_path,
        EVERY_KEY,
        "--model-repository", str(tmp_path / "other"),
        "--runtime-dir", str(tmp_path / "rt"),
        "--tcp", "127.0.0.1:7001",
        "--metrics", "127.0.0.1:7002",
        "--socket-group", "staff",
        "--curve-secret-key", "/k/s.key_secret",
        "--curve-allow", "/k/allowed",
        "--max-tensor-bytes", "99",
        "--max-batch-bytes", "150",
        "--drain-timeout", "1",
        "--exit-timeout", "0.5",
        "--log-level", "ERROR",
        "--model-control-mode", "on-demand",
        "--load-model", "linear",
        "--memory-budget", "host=1G",
        "--model-idle-unload", "5",
        "--grpc", "127.0.0.1:7003",
        "--http", "127.0.0.1:7004",
        "--frontdoor-workers", "2",
        "--frontdoor-cpus", "0-1",
        "--tls-cert", "/t/c.crt",
        "--tls-key", "/t/c.key",
        "--tls-client-ca", "/t/ca.crt",
        "--insecure-remote",
        "--allow-unknown-shm-callers",
        "--http-header-timeout", "4",
        "--http-peer-connections", "7",
        "--max-region-bytes", "1000",
        "--max-user-region-bytes", "0",
        "--max-unread-reply-bytes", "2000",
    )  # fmt: skip
    assert (opts.max_region_bytes, opts.max_user_region_bytes, opts.max_unread_reply_bytes) == (1000, 0, 2000)
    assert (args.grpc, args.http, args.frontdoor_workers) == ("127.0.0.1:7003", "127.0.0.1:7004", 2)
    assert args.frontdoor_cpus == frozenset({0, 1})
    assert args.allow_unknown_shm_callers is True
    assert (args.http_header_timeout, args.http_peer_connections) == (4.0, 7)
    assert (args.tls_cert, args.tls_key, args.tls_client_ca) == (Path("/t/c.crt"), Path("/t/c.key"),
                                                                 Path("/t/ca.crt"))  # fmt: skip
    assert args.insecure_remote is True
    assert opts.model_repository == tmp_path / "other"
    assert opts.runtime_dir == (tmp_path / "rt").resolve()
    assert (opts.tcp, opts.metrics, opts.socket_group) == ("127.0.0.1:7001", "127.0.0.1:7002", "staff")
    assert (opts.curve_secret_key, opts.curve_allow) == (Path("/k/s.key_secret"), Path("/k/allowed"))
    assert opts.max_tensor_bytes == 99
    assert opts.max_batch_bytes == 150
    assert (opts.drain_timeout_s, opts.exit_timeout_s) == (1.0, 0.5)
    assert (opts.log_level, opts.model_control_mode) == ("ERROR", "on-demand")
    assert opts.load_models == ("linear",)  # the flags replace the file's list; they do not add to it
    assert (opts.memory_budget.limits, opts.model_idle_unload_s) == ({"host": 1 << 30}, 5.0)


def test_every_flag_key_is_overridden_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The keys with a flag are exactly those overridden above (so a new key needs a case there)."""
    with_flags = {k for k, key in KEYS.items() if key.flag}
    assert with_flags == {
        "model_repository", "runtime_dir", "tcp", "metrics", "socket_group", "curve_secret_key",
        "curve_allow", "max_tensor_bytes", "max_batch_bytes", "drain_timeout_s", "exit_timeout_s",
        "log_level", "max_region_bytes", "max_user_region_bytes", "max_unread_reply_bytes",
        "model_control_mode", "load_models", "memory_budget", "model_idle_unload_s",
        "grpc", "http", "frontdoor_workers", "frontdoor_cpus", "tls_cert", "tls_key", "tls_client_ca",
        "insecure_remote", "allow_unknown_shm_callers", "http_header_timeout_s", "http_peer_connections",
    }  # fmt: skip
    with pytest.raises(SystemExit):
        cli.parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    for key in with_flags:
        assert KEYS[key].flag in help_text


def test_metrics_off_in_the_file_and_back_on_with_the_flag(tmp_path: Path) -> None:
    _, opts = _options(tmp_path, 'metrics = "off"\n')
    assert opts.metrics is None
    _, opts = _options(tmp_path, 'metrics = "off"\n', "--metrics", "127.0.0.1:0")
    assert opts.metrics == "127.0.0.1:0"
    _, opts = _options(tmp_path, 'metrics = "127.0.0.1:9000"\n', "--no-metrics")
    assert opts.metrics is None


def test_without_a_file_the_defaults_are_unchanged(tmp_path: Path) -> None:
    args = cli.parse_args(["serve"])
    opts = cli.server_options(args, tmp_path)
    assert opts.metrics == "127.0.0.1:8002"
    assert opts.load_models == ()
    assert (opts.drain_timeout_s, opts.exit_timeout_s, opts.log_level) == (30.0, 5.0, "INFO")
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # region limits follow the machine's
    assert (opts.max_region_bytes, opts.max_user_region_bytes) == (memory // 4, memory // 2)
    assert opts.max_unread_reply_bytes == 256 << 20


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ('model_repository = ""', "model_repository", "expected a non-empty string, got ''"),
        ("runtime_dir = 3", "runtime_dir", "expected a non-empty string, got 3"),
        ('tcp = "localhost"', "tcp", 'expected "HOST:PORT"'),
        ('tcp = "127.0.0.1:70000"', "tcp", 'expected "HOST:PORT" with a port in 0..65535'),
        ("metrics = false", "metrics", 'expected "HOST:PORT" or "off", got false'),
        ("socket_group = []", "socket_group", "got an array"),
        ("curve_secret_key = {}", "curve_secret_key", "got a table"),
        ('curve_allow = "  "', "curve_allow", "expected a non-empty string"),
        ("max_tensor_bytes = 0", "max_tensor_bytes", "expected an integer >= 1, got 0"),
        ('max_tensor_bytes = "4GiB"', "max_tensor_bytes", "expected an integer >= 1, got '4GiB'"),
        ("max_tensor_bytes = 1.5", "max_tensor_bytes", "expected an integer >= 1"),
        ("max_region_bytes = -1", "max_region_bytes", "expected an integer >= 0"),
        ('drain_timeout_s = "30s"', "drain_timeout_s", "expected a number of seconds >= 0, got '30s'"),
        ("drain_timeout_s = -1", "drain_timeout_s", "expected a number of seconds >= 0"),
        ("drain_timeout_s = nan", "drain_timeout_s", "expected a number of seconds >= 0"),
        ("exit_timeout_s = inf", "exit_timeout_s", "expected a number of seconds >= 0"),
        ("exit_timeout_s = true", "exit_timeout_s", "got true"),
        ("heartbeat_interval_s = 0", "heartbeat_interval_s", "expected a number of seconds > 0"),
        ("heartbeat_liveness = 0", "heartbeat_liveness", "expected an integer >= 1"),
        ("heartbeat_liveness = true", "heartbeat_liveness", "expected an integer >= 1, got true"),
        ('log_level = "TRACE"', "log_level", 'expected one of "DEBUG", "INFO", "WARNING", "ERROR"'),
        ('model_control_mode = "poll"', "model_control_mode", 'expected one of "none", "explicit"'),
        ('load_models = "add"', "load_models", "expected an array of model names"),
        ('memory_budget = "8G"', "memory_budget", "expected a table of memory budgets"),
        ('memory_budget = { ram = "8G" }', "memory_budget", "'ram=8G': expected host=BYTES"),
        ('memory_budget = { host = "lots" }', "memory_budget", "not a size: 'lots'"),
        ("memory_budget = { host = true }", "memory_budget", "host = true"),
        ("model_idle_unload_s = 0", "model_idle_unload_s", "expected a number of seconds > 0"),
        ('load_models = ["add", "../etc"]', "load_models", "'../etc' is not one"),
        ("load_models = [1]", "load_models", "1 is not one"),
        ("cache_bytes = -5", "cache_bytes", "expected an integer >= 0"),
        ("gpus = 0", "gpus", "expected an array of GPU indices"),
        ("gpus = [0, -1]", "gpus", "-1 is not one"),
        ("gpus = [0, 0]", "gpus", "distinct"),
        ('gpus = ["0"]', "gpus", "'0' is not one"),
        ("rate_limit_resources = 4", "rate_limit_resources", "expected a table of resource name = count"),
        ("[rate_limit_resources]\nR1 = -1", "rate_limit_resources", "R1 = -1"),
        ('[rate_limit_resources]\nR1 = "4"', "rate_limit_resources", "R1 = '4'"),
        ('[rate_limit_resources]\n"" = 1', "rate_limit_resources", "a name is empty"),
        ('cpu_affinity = ["0-3"]', "cpu_affinity", "expected a table of model name"),
        ('[cpu_affinity]\nadd = "0-3"', "cpu_affinity", "add = '0-3'"),
        ("[cpu_affinity]\nadd = []", "cpu_affinity", "add = an array"),
        ('[cpu_affinity]\nadd = ["3-1"]', "cpu_affinity", "add has '3-1'"),
        ('[cpu_affinity]\nadd = ["a"]', "cpu_affinity", "add has 'a'"),
        ("[cpu_affinity]\nadd = [3]", "cpu_affinity", "add has 3"),
        ('[cpu_affinity]\n"a/b" = ["0"]', "cpu_affinity", "'a/b' is not a model name"),
        ("frontdoor_cpus = 1", "frontdoor_cpus", 'expected a CPU list such as "1"'),
        ('frontdoor_cpus = "3-1"', "frontdoor_cpus", "got '3-1'"),
        ('frontdoor_cpus = ""', "frontdoor_cpus", "got ''"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = _write(tmp_path, text + "\n")
    with pytest.raises(ConfigFileError) as err:
        load_config(path)
    assert err.value.key == key
    assert str(err.value).startswith(f"{path}: {key}: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "key", "hint"),
    [
        ("drain_timeout = 5", "drain_timeout", "did you mean 'drain_timeout_s'?"),
        ("load_model = []", "load_model", "did you mean 'load_models'?"),
        ("[server]\nlog_level = 'INFO'", "server", ""),
        ("frobnicate = 1", "frobnicate", ""),
    ],
)
def test_unknown_keys_are_errors(tmp_path: Path, text: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigFileError, match=re.escape(f"{key}: unknown key")) as err:
        load_config(_write(tmp_path, text + "\n"))
    assert err.value.key == key
    assert hint in str(err.value)


def test_not_toml_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="not valid TOML.*line 2"):
        load_config(_write(tmp_path, 'log_level = "INFO"\nthis is not toml\n'))
    with pytest.raises(ConfigFileError, match="cannot read: No such file"):
        load_config(tmp_path / "missing.toml")


def test_main_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "heartbeat_liveness = 0\n")
    assert cli.main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"zinfer serve: error: {path}: heartbeat_liveness: expected an integer >= 1, got 0" in err
    assert cli.main(["serve", "--config", str(_write(tmp_path, "colour = 1\n"))]) == 2
    assert "colour: unknown key" in capsys.readouterr().err


def test_parse_config_takes_a_decoded_document(tmp_path: Path) -> None:
    assert parse_config({"runtime_dir": "rt"}, tmp_path) == {"runtime_dir": tmp_path / "rt"}


def test_cpu_lists() -> None:
    assert parse_cpus("0-3,8, 10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert format_cpus(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
    assert format_cpus(parse_cpus("5")) == "5"
    for bad in ("", "1-", "-1", "a", "3-1", "1,,2", "70000"):
        with pytest.raises(ValueError):
            parse_cpus(bad)
    affinity = {"linear": (frozenset({0}), frozenset({1})), "*": (frozenset({7}),)}
    assert [cpus_for(affinity, "linear", i) for i in range(3)] == [{0}, {1}, {0}]
    assert cpus_for(affinity, "add", 5) == {7}
    assert cpus_for({}, "add", 0) is None


# ---------------------------------------------------------------------------------------------- the example


def test_the_example_loads() -> None:
    values = load_config(EXAMPLE)
    assert values["runtime_dir"] == Path("/run/zinfer")
    assert values["socket_group"] == "zinfer-clients"


_COMMENTED_KEY = re.compile(r"^# ?(\"?[A-Za-z_*]+\"? = .+)$")


def test_the_example_names_every_key_and_its_commented_lines_are_valid(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    named = set(re.findall(r"^(?:# ?)?\[?([a-z_]+)\]? ?=?", text, re.M)) & set(KEYS)
    assert named == set(KEYS), f"missing from the example: {set(KEYS) - named}"
    for key in KEYS.values():
        if key.flag:
            assert key.flag in text
    uncommented = "\n".join(
        m.group(1) if (m := _COMMENTED_KEY.match(line)) else line for line in text.splitlines()
    )
    values = load_config(_write(tmp_path, uncommented))
    assert set(values) == set(KEYS)


def test_the_file_sets_the_front_door(tmp_path: Path) -> None:
    text = 'grpc = "127.0.0.1:8101"\nhttp = "127.0.0.1:8100"\nfrontdoor_workers = 3\n'
    args, opts = _options(tmp_path, text)
    config = cli.frontdoor_config(args, opts)
    assert (config.grpc, config.http, config.workers, config.enabled) == (
        "127.0.0.1:8101",
        "127.0.0.1:8100",
        3,
        True,
    )
    assert config.broker_url == f"ipc://{opts.runtime_dir / 'zinfer.sock'}"
    assert config.max_tensor_bytes == opts.max_tensor_bytes
    assert not cli.frontdoor_config(*_options(tmp_path, "")).enabled


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grpc", "0.0.0.0:8001"], "not a loopback address"),
        (["--http", "192.0.2.1:8000"], "not a loopback address"),
        (["--grpc", "127.0.0.1:8001", "--tls-cert", "/nonexistent/c.crt"], "go together"),
        (
            ["--grpc", "0.0.0.0:8001", "--tls-cert", "/nonexistent/c", "--tls-key", "/nonexistent/k"],
            "no such file",
        ),
        (["--grpc", "127.0.0.1:8001", "--tls-client-ca", "/nonexistent/ca"], "needs --tls-cert"),
    ],
)
def test_a_front_door_that_cannot_serve_safely_is_a_config_error(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    args, opts = _options(tmp_path, "", *flags)
    with pytest.raises(cli.ConfigError, match=message):
        cli.frontdoor_config(args, opts)


def test_insecure_remote_allows_a_non_loopback_address(tmp_path: Path) -> None:
    args, opts = _options(tmp_path, "", "--grpc", "0.0.0.0:8001", "--insecure-remote")
    assert cli.frontdoor_config(args, opts).grpc == "0.0.0.0:8001"


def test_the_file_sets_on_demand_budgets_and_flags_replace_them(tmp_path: Path) -> None:
    text = 'model_control_mode = "on-demand"\nmemory_budget = { host = "8G", gpu1 = "2G" }\n'
    text += "model_idle_unload_s = 60\n"
    _, opts = _options(tmp_path, text)
    assert opts.memory_budget.limits == {"host": 8 << 30, "gpu1": 2 << 30}
    assert opts.model_idle_unload_s == 60.0
    _, opts = _options(tmp_path, text, "--memory-budget", "host=1G", "--model-idle-unload", "5")
    assert opts.memory_budget.limits == {"host": 1 << 30} and opts.model_idle_unload_s == 5.0


def test_a_file_budget_is_left_out_in_another_mode(tmp_path: Path) -> None:
    _, opts = _options(tmp_path, 'memory_budget = { host = "8G" }\nmodel_idle_unload_s = 60\n')
    assert not opts.memory_budget and opts.model_idle_unload_s is None
