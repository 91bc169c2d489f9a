"""kubectl gpushare: plan policy changes before applying them, and see what gpushare does.

Installed with the package as the console script ``kubectl-gpushare``: with it on PATH,
``kubectl gpushare ...`` runs it.  It reads the cluster as kubectl does (--kubeconfig, else
$KUBECONFIG, else ~/.kube/config; --context) and works everything out with the operator's own
code.  Exit status: 0 done (for plan: a clean plan), 2 a plan that would overcommit a node,
leave one Unsupported, or take from a pod the slot that holds its GPU memory request, 1 any
error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from gpushare_operator import __version__
from gpushare_operator.core.api import defaults, flagvalues
from gpushare_operator.kube import connection, objectpaths, reading
from gpushare_operator.kubectl import cluster, explain, manifests, output, planview, status
from gpushare_operator.kubectl.permissions import MissingPermission
from gpushare_operator.kubectl.plan import EXIT_ERROR, PlanError, PlanOptions, make_plan
from gpushare_operator.kubectl.standings import DEFAULT_VERIFY_SECONDS, POOL_LABELS, RolloutPace

PROG = "kubectl gpushare"
EPILOG = """\
examples:
  kubectl gpushare plan -f policies.yaml          what applying the file would change
  kubectl gpushare plan --delete batch -o json    what deleting a policy would release
  kubectl gpushare status                         every policy and slot class, counted now
  kubectl gpushare status --policy inference      and the nodes of one
  kubectl gpushare explain node gpu-a-0           why a node is configured as it is

exit status: 0 done (plan: clean; evictions under podPolicy Evict are no overcommit), 2 the
plan would overcommit a node, leave one Unsupported, need to drain one that cannot be drained
or take from a pod the slot class that holds its GPU memory request (gpushare.dev/gpu-memory),
1 an error (an object the API server refused, an unreadable file, no cluster)."""


def _connection_options(*, suppress: bool) -> argparse.ArgumentParser:
    """--kubeconfig, --context and -o, taken before or after the command."""
    parent = argparse.ArgumentParser(add_help=False)
    default: Callable[[Any], Any] = (lambda _: argparse.SUPPRESS) if suppress else (lambda v: v)
    group = parent.add_argument_group("cluster and output")
    group.add_argument(
        "--kubeconfig",
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    group.add_argument("--context", default=default(None), help="kubeconfig context to use")
    group.add_argument(
        "-o",
        "--output",
        choices=output.FORMATS,
        default=default("text"),
        help="text (default; plain when not on a terminal), json or yaml",
    )
    group.add_argument(
        "--device-plugin-namespace",
        default=default(defaults.DEVICE_PLUGIN_NAMESPACE),
        help="namespace of the operator's device-plugin ConfigMap"
        f" (default {defaults.DEVICE_PLUGIN_NAMESPACE})",
    )
    group.add_argument(
        "--device-plugin-configmap",
        default=default(defaults.DEVICE_PLUGIN_CONFIGMAP),
        help=f"its name (default {defaults.DEVICE_PLUGIN_CONFIGMAP})",
    )
    group.add_argument(
        "--mig-parted-configmap",
        default=default(defaults.MIG_PARTED_CONFIGMAP),
        help="name of the operator's mig-parted ConfigMap (MIG layouts), in the same namespace"
        f" (default {defaults.MIG_PARTED_CONFIGMAP})",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="say on stderr when each step of the command ended",
    )
    return parent


def _add_plan(commands: Any, common: argparse.ArgumentParser) -> None:
    plan = commands.add_parser(
        "plan",
        parents=[common],
        help="what applying or deleting policies would do (dry run; nothing is changed)",
        description="Validate each policy with a server-side dry run, then print what the"
        " operator would do: per policy and pool the nodes gained, lost and changed, slot"
        " capacity before -> after, pods that would no longer fit (under podPolicy Evict: the"
        " pods it would evict, and the PodDisruptionBudgets that refuse them now), pods whose"
        " GPU memory request their node's slot would no longer hold, the config keys written,"
        " and the rollout batches with an estimated duration.",
    )
    plan.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="FILE",
        help="YAML or JSON with GPUSharingPolicies, new or edited: a file, a directory of them,"
        " or '-' for stdin; repeatable",
    )
    plan.add_argument(
        "--delete", action="append", default=[], metavar="NAME", help="plan deleting a policy"
    )
    plan.add_argument(
        "--max-unavailable",
        type=flagvalues.max_unavailable,
        default=defaults.MAX_UNAVAILABLE,
        help="the operator's --max-unavailable: GPU nodes changing at once over all policies"
        " (default %(default)s)",
    )
    plan.add_argument(
        "--config-propagation-delay",
        type=flagvalues.seconds,
        default=defaults.CONFIG_PROPAGATION_DELAY,
        metavar="SECONDS",
        help="the operator's --config-propagation-delay: the wait before a new config key is"
        " used (default %(default)g)",
    )
    plan.add_argument(
        "--write-qps",
        type=flagvalues.rate,
        default=defaults.WRITE_QPS,
        help="the operator's --write-qps (default %(default)g)",
    )
    plan.add_argument(
        "--verify-seconds",
        type=flagvalues.seconds,
        default=DEFAULT_VERIFY_SECONDS,
        metavar="SECONDS",
        help="from a node's label change until it is Verified: the device plugin's restart and"
        f" GPU Feature Discovery's relabelling (default {DEFAULT_VERIFY_SECONDS:g})",
    )
    plan.add_argument(
        "--pool-label",
        action="append",
        default=[],
        metavar="KEY",
        help="node label that names a node's pool; repeatable (default: the first of "
        + ", ".join(POOL_LABELS)
        + "; else the GPU product)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_connection_options(suppress=False)],
    )
    common = _connection_options(suppress=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_plan(commands, common)
    show = commands.add_parser(
        "status",
        parents=[common],
        help="every policy's standing and each slot class's free slots; --policy NAME for its"
        " nodes",
    )
    show.add_argument("--policy", metavar="NAME", help="also list the nodes this policy selects")
    why = commands.add_parser(
        "explain",
        parents=[common],
        help="explain node NAME: why a node is configured as it is, and what its slots promise",
    )
    why.add_argument("kind", choices=["node"], help="what to explain (node)")
    why.add_argument("name", help="the node's name")
    commands.add_parser("version", help="print the plugin's version")
    return parser


def _cluster_ref(args: argparse.Namespace) -> cluster.ClusterRef:
    return cluster.ClusterRef(
        kubeconfig=args.kubeconfig,
        context=args.context,
        device_plugin_namespace=args.device_plugin_namespace,
        device_plugin_configmap=args.device_plugin_configmap,
        mig_parted_configmap=args.mig_parted_configmap,
    )


async def _run(args: argparse.Namespace, trace: output.Trace) -> tuple[Mapping[str, Any], str, int]:
    """The report, its text, and the exit status."""
    style = output.Style.for_stream(sys.stdout)
    if args.command == "plan":
        options = PlanOptions(
            files=args.filename,
            deletions=args.delete,
            cluster_ref=_cluster_ref(args),
            max_unavailable=args.max_unavailable,
            pace=RolloutPace(
                propagation_delay=args.config_propagation_delay,
                write_qps=args.write_qps,
                verify_seconds=args.verify_seconds,
            ),
            pool_labels=tuple(args.pool_label) or POOL_LABELS,
            trace=trace,
        )
        report = await make_plan(options)
        return report, planview.render(report, style), int(report["exitCode"])
    if args.command == "status":
        report = await status.make_status(_cluster_ref(args), policy=args.policy)
        return report, status.render(report, style), 0
    report = await explain.explain_node(_cluster_ref(args), args.name)
    return report, explain.render(report, style), 0


def _failure(exc: BaseException) -> str | None:
    """What to tell the user about an error we expect; None for a bug (let it raise)."""
    if isinstance(exc, objectpaths.BadName):
        return f"error: {exc}; nothing was sent to the API server"
    if isinstance(exc, reading.ApiError):
        body = exc.body if isinstance(exc.body, Mapping) else {}
        reason = body.get("reason") or exc.reason
        return f"Error from server ({reason}): {body.get('message') or exc.body}"
    if isinstance(exc, (aiohttp.ClientError, TimeoutError)):
        return f"error: cannot reach the API server: {exc or type(exc).__name__}"
    known = (
        PlanError,
        manifests.ManifestError,
        connection.KubeconfigError,
        status.UnknownPolicy,
        explain.UnknownNode,
        MissingPermission,
        OSError,
    )
    if isinstance(exc, known):
        return f"error: {exc}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "version":
        print(__version__)
        return 0
    # The client library logs what it then raises (a missing kubeconfig): say it once.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.ERROR)
    trace = output.Trace(enabled=args.verbose)
    try:
        report, text, code = asyncio.run(_run(args, trace))
    except Exception as exc:
        message = _failure(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return EXIT_ERROR
    output.emit(report, fmt=args.output, text=text)
    trace.mark("printed")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
