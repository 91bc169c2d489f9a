"""Command-line settings: defaults, environment variables, flags, validation."""

from __future__ import annotations

import re
from collections.abc import Callable

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
    assert (settings.max_unavailable, settings.write_qps) == ("10%", 100)
    assert (settings.config_key_grace_period, settings.mismatch_timeout) == (300, 300)


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


# The operator's flags that the plugin's plan takes too, to forecast that operator.
SHARED_FLAGS = (
    "max-unavailable",
    "config-propagation-delay",
    "write-qps",
    "device-plugin-namespace",
    "device-plugin-configmap",
)


def test_the_operator_and_the_plugin_default_alike() -> None:
    from gpushare_operator.core.api.models import RolloutSpec
    from gpushare_operator.kubectl import cluster, forecast
    from gpushare_operator.kubectl.cli import build_parser
    from gpushare_operator.kubectl.plan import PlanOptions
    from gpushare_operator.kubectl.standings import RolloutPace

    operator = parse_settings([], env={})
    plugin = build_parser().parse_args(["plan"])
    for flag in SHARED_FLAGS:
        name = flag.replace("-", "_")
        assert getattr(plugin, name) == getattr(operator, name), flag
    # What the plugin assumes of the operator where it takes no flag for it.
    pace, ref = RolloutPace(), cluster.ClusterRef()
    assert (pace.propagation_delay, pace.write_qps) == (
        operator.config_propagation_delay,
        operator.write_qps,
    )
    assert PlanOptions().max_unavailable == operator.max_unavailable
    assert (ref.device_plugin_namespace, ref.device_plugin_configmap) == (
        operator.device_plugin_namespace,
        operator.device_plugin_configmap,
    )
    assert (
        operator.config_key_grace_period,
        operator.mismatch_timeout,
    ) == (forecast.KEY_GRACE_PERIOD, forecast.MISMATCH_TIMEOUT)
    # The cluster-wide budget is, by default, the share a policy's own rollout has.
    assert RolloutSpec().maxUnavailable == operator.max_unavailable


def _help_of(text: str, flag: str) -> str:
    """The help of ``--flag`` in argparse's --help output, on one line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"--{flag} "))
    paragraph = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("   ") or line.strip().startswith("-"):
            break
        paragraph.append(line)
    return " ".join(line.strip() for line in paragraph)


def _help(
    main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_both_helps_show_the_shared_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpushare_operator.app import cli
    from gpushare_operator.kubectl import cli as plugin_cli

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at hyphens: gpu- operator
    operator = _help(cli.main, ["run", "--help"], capsys)
    plugin = _help(plugin_cli.main, ["plan", "--help"], capsys)
    settings = parse_settings([], env={})
    for flag in SHARED_FLAGS:
        value = getattr(settings, flag.replace("-", "_"))
        text = re.escape(value if isinstance(value, str) else f"{value:g}")
        assert re.search(rf"default '{text}'\)", _help_of(operator, flag)), flag
        assert re.search(rf"\(default {text}\)", _help_of(plugin, flag)), flag
