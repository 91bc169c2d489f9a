"""The whole set of labels one server-side apply gives a node: its config, and its slot promise.

A node decision (``core.phases.nodephases``) says which config labels the node should carry; this
module adds the slot labels (``core.slots.slotclasses``) under one rule: they speak for the config
in
force, so they are written only once the node is Verified, go in the same apply that changes
or removes its config (never true of the old config and the new one at once), and go as soon
as the node stops confirming its config (Degraded, Mismatch, Unsupported).  A node held back
by its rollout keeps them: its config, and what its slots enforce, have not changed.

Server-side apply removes every label of ours that an apply leaves out, so an apply that
changes only the slot labels restates the config labels the node carries.
"""

from __future__ import annotations

from gpushare_operator.core import migphases
from gpushare_operator.core.api.models import NodePhase
from gpushare_operator.core.decisions import Labels, NodeDecision
from gpushare_operator.core.dra import driver as dra
from gpushare_operator.core.records.nodes import (
    CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    POLICY_LABEL,
    NodeRecord,
)
from gpushare_operator.core.slots import slotclasses

# Phases in which the node does not confirm its config: what its slots enforce is not known.
_UNCONFIRMED = frozenset({NodePhase.DEGRADED, NodePhase.MISMATCH, NodePhase.UNSUPPORTED})


def wanted(record: NodeRecord, decision: NodeDecision) -> Labels | None:
    """The labels of the next apply, every key of ours named (None: removed); None when the
    decision leaves the node's labels as they are."""
    if decision.labels is not None:
        if not slotclasses.carries_any(record.labels):
            return decision.labels
        return {**decision.labels, **slotclasses.NO_SLOT_LABELS}
    slots = _slot_labels(record, decision)
    if slots is None or record.policy_label is None:
        return None  # a node we never labelled carries no slot labels of ours either
    if all(record.labels.get(key) == value for key, value in slots.items()):
        return None
    return {**_carried(record), **slots}


def _slot_labels(record: NodeRecord, decision: NodeDecision) -> Labels | None:
    policy = decision.policy
    if decision.phase is NodePhase.VERIFIED and policy is not None:
        return slotclasses.labels(slotclasses.promise(record, policy))
    if decision.phase in _UNCONFIRMED and slotclasses.carries_any(record.labels):
        return dict(slotclasses.NO_SLOT_LABELS)
    return None


def _carried(record: NodeRecord) -> Labels:
    """The config labels of ours the node carries now, restated so that the apply keeps them
    (a MIG layout label only when it is ours: another manager's is never taken over)."""
    carried: Labels = {CONFIG_LABEL: record.config_label, POLICY_LABEL: record.policy_label}
    if migphases.carries_ours(record):
        carried[MIG_CONFIG_LABEL] = record.mig_config_label
    carried.update(dra.carried(record))
    return carried
