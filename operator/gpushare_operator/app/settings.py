"""The operator's settings: one frozen record, filled from flags and ``GPUSHARE_<FLAG>`` variables.

Every flag has an environment variable so that the Helm chart can set all of them the same way,
and so that a flag given on the command line always wins over the environment.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gpushare_operator.core.api import defaults, flagvalues

LogFormat = Literal["json", "console"]


@dataclass(frozen=True, slots=True)
class Settings:
    namespace: str
    device_plugin_namespace: str
    device_plugin_configmap: str
    mig_parted_configmap: str
    http_port: int
    metrics_port: int
    metrics_insecure: bool
    metrics_cert_file: str
    metrics_key_file: str
    identity: str
    write_qps: float
    write_burst: int
    write_concurrency: int
    policy_status_max_delay: float
    write_backoff_cap: float
    config_propagation_delay: float
    config_key_grace_period: float
    mismatch_timeout: float
    max_unavailable: int | str
    log_format: LogFormat
    lease_duration: float
    renew_deadline: float
    retry_period: float
    webhook_port: int
    webhook_secret: str
    webhook_configuration: str
    webhook_service: str
    webhook_hosts: tuple[str, ...]
    webhook_cert_validity: float
    dra_sharing: bool = False  # TimeSlicing and MPS accepted under backend DRA (alpha)

    @property
    def webhook_enabled(self) -> bool:
        return self.webhook_port > 0

    def webhook_names(self) -> tuple[str, ...]:
        """The names the serving certificate is for: the Service's, as the API server calls
        it, then ``--webhook-hosts``."""
        service = f"{self.webhook_service}.{self.namespace}.svc"
        return tuple(dict.fromkeys((service, f"{service}.cluster.local", *self.webhook_hosts)))


def _env_name(flag: str) -> str:
    return "GPUSHARE_" + flag.upper().replace("-", "_")


def _env_default(env: Mapping[str, str], flag: str, default: str) -> str:
    return env.get(_env_name(flag), default)


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def _port_or_off(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port, or 0 for off; got {text}")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _validity(text: str) -> float:
    value = float(text)
    if value < 30:
        raise argparse.ArgumentTypeError(f"must be at least 30 seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


@dataclass(frozen=True, slots=True)
class _Flag:
    """One ``run`` flag: its default (or how to find it in the environment), help and type."""

    name: str
    default: str | float | Callable[[Mapping[str, str]], str]
    help: str
    kind: Callable[[str], object] = str


_SECONDS, _RATE = flagvalues.seconds, flagvalues.rate
_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        "namespace",
        lambda env: env.get("POD_NAMESPACE", "gpushare-system"),
        "namespace of the Lease and Events",
    ),
    _Flag(
        "device-plugin-namespace",
        defaults.DEVICE_PLUGIN_NAMESPACE,
        "namespace of the device-plugin ConfigMap",
    ),
    _Flag(
        "device-plugin-configmap", defaults.DEVICE_PLUGIN_CONFIGMAP, "device-plugin ConfigMap name"
    ),
    _Flag(
        "mig-parted-configmap",
        defaults.MIG_PARTED_CONFIGMAP,
        "name of the mig-parted ConfigMap (MIG layouts), in the device-plugin namespace",
    ),
    _Flag("http-port", "8080", "plain-HTTP port for /healthz and /readyz", _positive_int),
    _Flag(
        "metrics-port", "8443", "port for /metrics (HTTPS unless --metrics-insecure)", _positive_int
    ),
    _Flag(
        "metrics-cert-file",
        "",
        "PEM certificate for the /metrics server; empty: a self-signed one made at start",
    ),
    _Flag("metrics-key-file", "", "PEM private key of --metrics-cert-file"),
    _Flag("identity", lambda _: socket.gethostname(), "this replica's identity in the Lease"),
    _Flag("write-qps", defaults.WRITE_QPS, "sustained API writes per second", _RATE),
    _Flag("write-burst", "200", "API writes allowed in a burst", _positive_int),
    _Flag(
        "write-concurrency",
        defaults.WRITE_CONCURRENCY,
        "API writes in flight at once",
        _positive_int,
    ),
    _Flag(
        "policy-status-max-delay",
        defaults.POLICY_STATUS_MAX_DELAY,
        "seconds a policy status may wait for its nodes to settle",
        _SECONDS,
    ),
    _Flag(
        "write-backoff-cap",
        defaults.WRITE_BACKOFF_CAP,
        "seconds a failing write's retry back-off grows to at most",
        _SECONDS,
    ),
    _Flag(
        "config-propagation-delay",
        defaults.CONFIG_PROPAGATION_DELAY,
        "seconds before a new config key is put on nodes",
        _SECONDS,
    ),
    _Flag(
        "config-key-grace-period",
        defaults.CONFIG_KEY_GRACE_PERIOD,
        "seconds an unused config key is kept",
        _SECONDS,
    ),
    _Flag(
        "mismatch-timeout",
        defaults.MISMATCH_TIMEOUT,
        "seconds Applied may last before it is a Mismatch",
        _SECONDS,
    ),
    _Flag(
        "max-unavailable",
        defaults.MAX_UNAVAILABLE,
        "GPU nodes that may be between a config label change and Verified at once, over all"
        " policies: a count or a percentage of GPU nodes (rounded down, at least 1)",
        flagvalues.max_unavailable,
    ),
    _Flag("lease-duration", defaults.LEASE_DURATION, "leader Lease duration in seconds", _RATE),
    _Flag(
        "renew-deadline",
        defaults.RENEW_DEADLINE,
        "seconds the leader may go without renewing",
        _RATE,
    ),
    _Flag("retry-period", defaults.RETRY_PERIOD, "seconds between Lease attempts", _RATE),
    _Flag(
        "webhook-port",
        "9443",
        "HTTPS port of the memory-request webhook (gpushare.dev/gpu-memory), served by every"
        " replica; 0 turns it off",
        _port_or_off,
    ),
    _Flag(
        "webhook-secret",
        "gpushare-webhook-tls",
        "Secret in --namespace holding the webhook's serving certificate (made and rotated by"
        " the leader)",
    ),
    _Flag(
        "webhook-configuration",
        "gpushare-operator",
        "MutatingWebhookConfiguration whose caBundle the leader keeps current",
    ),
    _Flag(
        "webhook-service",
        "gpushare-operator-webhook",
        "Service the API server calls the webhook through (in --namespace): the serving"
        " certificate is for its DNS names",
    ),
    _Flag(
        "webhook-hosts",
        "",
        "more names or IP addresses for the serving certificate, comma-separated",
        _names,
    ),
    _Flag(
        "webhook-cert-validity",
        "7776000",
        "seconds a serving certificate is valid (it is replaced after two thirds of that)",
        _validity,
    ),
)


def add_run_arguments(parser: argparse.ArgumentParser, *, env: Mapping[str, str]) -> None:
    """Declare every ``run`` flag with its ``GPUSHARE_*`` environment default."""
    for spec in _FLAGS:
        default = spec.default(env) if callable(spec.default) else spec.default
        # As a user would type it (75, not 75.0): the environment's values are text too.
        text = default if isinstance(default, str) else f"{default:g}"
        described = f"{spec.help} (env {_env_name(spec.name)}; default {text!r})"
        parser.add_argument(
            f"--{spec.name}",
            default=_env_default(env, spec.name, text),
            type=spec.kind,
            help=described.replace("%", "%%"),  # argparse %-formats help: '10%' would break it
        )
        if spec.name == "metrics-port":  # in --help, the switch beside the port it changes
            _add_metrics_insecure(parser, env=env)
    _add_switch(
        parser,
        env=env,
        name="dra-sharing",
        help="accept TimeSlicing and MPS under backend DRA: rendered as NVIDIA's DRA driver"
        " GpuConfig on the DeviceClass, which needs the driver's alpha feature gates"
        " (TimeSlicingSettings, MPSSupport)",
    )
    parser.add_argument(
        "--log-format",
        choices=["json", "console"],
        default=_env_default(env, "log-format", "json"),
        help="log format (env GPUSHARE_LOG_FORMAT; default 'json')",
    )


def _add_metrics_insecure(parser: argparse.ArgumentParser, *, env: Mapping[str, str]) -> None:
    _add_switch(
        parser,
        env=env,
        name="metrics-insecure",
        help="serve /metrics over plain HTTP to anyone, without TokenReview and "
        "SubjectAccessReview",
    )


def _add_switch(
    parser: argparse.ArgumentParser, *, env: Mapping[str, str], name: str, help: str
) -> None:
    """A switch that the environment can turn on and a flag can still turn off, both ways."""
    try:
        on = _boolean(_env_default(env, name, "false"))
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{_env_name(name)}: {exc}")
    parser.add_argument(
        f"--{name}",
        action=argparse.BooleanOptionalAction,
        default=on,
        help=f"{help} (env {_env_name(name)}; default false)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Build and cross-check the settings; argparse already checked each value on its own."""
    settings = Settings(
        namespace=args.namespace,
        device_plugin_namespace=args.device_plugin_namespace,
        device_plugin_configmap=args.device_plugin_configmap,
        mig_parted_configmap=args.mig_parted_configmap,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        metrics_insecure=args.metrics_insecure,
        metrics_cert_file=args.metrics_cert_file,
        metrics_key_file=args.metrics_key_file,
        identity=args.identity,
        write_qps=args.write_qps,
        write_burst=args.write_burst,
        write_concurrency=args.write_concurrency,
        policy_status_max_delay=args.policy_status_max_delay,
        write_backoff_cap=args.write_backoff_cap,
        config_propagation_delay=args.config_propagation_delay,
        config_key_grace_period=args.config_key_grace_period,
        mismatch_timeout=args.mismatch_timeout,
        max_unavailable=args.max_unavailable,
        log_format=args.log_format,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        webhook_port=args.webhook_port,
        webhook_secret=args.webhook_secret,
        webhook_configuration=args.webhook_configuration,
        webhook_service=args.webhook_service,
        webhook_hosts=args.webhook_hosts,
        webhook_cert_validity=args.webhook_cert_validity,
        dra_sharing=args.dra_sharing,
    )
    if not settings.retry_period < settings.renew_deadline < settings.lease_duration:
        raise ValueError("need retry-period < renew-deadline < lease-duration")
    if settings.metrics_port == settings.http_port:
        raise ValueError("metrics-port and http-port must differ: they are two servers")
    ports = (settings.http_port, settings.metrics_port)
    if settings.webhook_enabled and settings.webhook_port in ports:
        raise ValueError("webhook-port must differ from http-port and metrics-port")
    if bool(settings.metrics_cert_file) != bool(settings.metrics_key_file):
        raise ValueError("give both metrics-cert-file and metrics-key-file, or neither")
    return settings


def parse_settings(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> Settings:
    """Parse ``run`` flags alone (tests use this to check the env/flag precedence)."""
    parser = argparse.ArgumentParser(prog="gpushare-operator run")
    add_run_arguments(parser, env=os.environ if env is None else env)
    return settings_from_args(parser.parse_args(list(argv)))
