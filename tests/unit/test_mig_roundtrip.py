"""Every layout shape gpushare renders reads back the same through a parser that follows
mig-parted's own rules (the simulator's, ``gpushare_testing.migparted``: written from NVIDIA's
``api/spec/v1`` and ``pkg/types``, not from the renderer)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.mig import migconfigs
from gpushare_operator.core.mig.migconfigs import MigLayout
from gpushare_testing.migparted import parse_mig_parted_config

PROFILES = sorted(
    {
        name
        for product in miggeometry.products()
        for name in getattr(miggeometry.model(product), "profiles", ())
    }
)
layouts = st.dictionaries(st.sampled_from(PROFILES), st.integers(1, 7), min_size=1, max_size=5)
policies = st.from_regex(r"[a-z][a-z0-9-]{0,40}[a-z0-9]", fullmatch=True)


@given(st.lists(st.tuples(policies, layouts), min_size=1, max_size=4))
def test_rendered_layouts_read_back_the_same_through_mig_parted_rules(
    wanted: list[tuple[str, dict[str, int]]],
) -> None:
    named = {}
    for policy, devices in wanted:
        layout = MigLayout.from_mapping(devices)
        named[migconfigs.layout_name(policy_name=policy, layout=layout)] = layout
    spec = parse_mig_parted_config(migconfigs.render_text(named))
    assert spec.version == "v1"
    assert set(spec.configs) == {migconfigs.ALL_DISABLED, *named}
    [disabled] = spec.configs[migconfigs.ALL_DISABLED]
    assert (disabled.devices, disabled.mig_enabled, dict(disabled.mig_devices)) == (
        "all",
        False,
        {},
    )
    for name, layout in named.items():
        [entry] = spec.configs[name]
        assert entry.devices == "all" and entry.mig_enabled
        assert dict(entry.mig_devices) == layout.as_dict()
