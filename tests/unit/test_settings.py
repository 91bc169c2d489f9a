"""Command-line settings: defaults, environment variables, flags, validation."""

from __future__ import annotations

import pytest

from gpushare_operator.app.settings import parse_settings


def test_defaults_follow_the_design() -> None:
    settings = parse_settings([], env={})
    assert settings.namespace == "gpushare-system"
    assert settings.device_plugin_namespace == "gpu-operator"
    assert settings.device_plugin_configmap == "gpushare-device-plugin-configs"
    assert settings.http_port == 8080
    assert settings.config_propagation_delay == 75
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (15, 10, 2)
    assert settings.log_format == "json"


def test_pod_namespace_then_env_then_flag() -> None:
    assert parse_settings([], env={"POD_NAMESPACE": "ops"}).namespace == "ops"
    env = {"POD_NAMESPACE": "ops", "GPUSHARE_NAMESPACE": "gs"}
    assert parse_settings([], env=env).namespace == "gs"
    assert parse_settings(["--namespace", "cli"], env=env).namespace == "cli"


def test_every_flag_reads_its_environment_variable() -> None:
    env = {
        "GPUSHARE_WRITE_QPS": "5.5",
        "GPUSHARE_WRITE_BURST": "7",
        "GPUSHARE_CONFIG_PROPAGATION_DELAY": "1",
        "GPUSHARE_LOG_FORMAT": "console",
        "GPUSHARE_IDENTITY": "replica-a",
        "GPUSHARE_HTTP_PORT": "9999",
    }
    settings = parse_settings([], env=env)
    assert settings.write_qps == 5.5
    assert settings.write_burst == 7
    assert settings.config_propagation_delay == 1
    assert settings.log_format == "console"
    assert settings.identity == "replica-a"
    assert settings.http_port == 9999


@pytest.mark.parametrize(
    "argv",
    [
        ["--write-qps", "-1"],
        ["--write-qps", "0"],
        ["--retry-period", "0"],
        ["--write-burst", "0"],
        ["--log-format", "xml"],
        ["--http-port", "nope"],
    ],
)
def test_bad_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(argv, env={})


def test_lease_timings_must_nest() -> None:
    with pytest.raises(ValueError, match="retry-period < renew-deadline < lease-duration"):
        parse_settings(["--renew-deadline", "20"], env={})


@pytest.mark.parametrize("value", ["0", "-1", "101%", "ten%", "0.5", "05%"])
def test_the_operator_and_the_plugin_refuse_the_same_budgets(value: str) -> None:
    from gpushare_operator.kubectl.cli import build_parser

    with pytest.raises(SystemExit):
        parse_settings(["--max-unavailable", value], env={})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "--max-unavailable", value])


def test_the_operator_and_the_plugin_read_a_budget_alike() -> None:
    from gpushare_operator.kubectl.cli import build_parser

    for value, read in (("3", 3), ("25%", "25%"), ("100%", "100%")):
        assert parse_settings(["--max-unavailable", value], env={}).max_unavailable == read
        assert (
            build_parser().parse_args(["plan", "--max-unavailable", value]).max_unavailable == read
        )
    env = {"GPUSHARE_MAX_UNAVAILABLE": "7"}
    assert parse_settings([], env=env).max_unavailable == 7


def test_run_help_prints_with_a_percentage_default(capsys: pytest.CaptureFixture[str]) -> None:
    from gpushare_operator.app import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--help"])
    assert exited.value.code == 0
    assert "default '10%')" in capsys.readouterr().out
