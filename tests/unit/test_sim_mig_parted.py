"""The simulator's mig-parted parser refuses what mig-parted refuses (api/spec/v1, pkg/types)."""

from __future__ import annotations

import pytest

from gpushare_testing.migparted import (
    MigConfigEntry,
    MigPartedError,
    parse_mig_parted_config,
    parse_mig_profile,
)

GOOD = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  mixed:
    - device-filter: ["0x233010DE"]
      devices: [0, 1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 1, "2g.20gb": 1, "1c.1g.10gb": 1, "1g.20gb": 0}
"""


def test_a_valid_file_parses_into_entries_per_config() -> None:
    spec = parse_mig_parted_config(GOOD)
    assert set(spec.configs) == {"all-disabled", "all-1g.10gb", "mixed"}
    assert spec.configs["all-disabled"] == (MigConfigEntry("all", False, {}),)
    assert spec.configs["all-1g.10gb"][0].mig_devices == {"1g.10gb": 7}
    mixed = spec.configs["mixed"][0]
    # 1c.1g.10gb is 1g.10gb (MigProfile.String); zero counts are dropped.
    assert mixed.mig_devices == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}
    assert mixed.matches(1, "0x233010de") and not mixed.matches(2, "0x233010DE")
    assert not mixed.matches(0, "0x20B010DE")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "unknown version"),
        ("[]", "not a mapping"),
        ("mig-configs: {}", "missing 'version'"),
        ("version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}", "version"),
        ("version: v1\nother: 1", "unexpected field: other"),
        ("version: v1\nmig-configs: {}", "at least one entry in 'mig-configs'"),
        ("version: v1\nmig-configs: {a: []}", "at least one entry in 'a'"),
        ("version: v1\nmig-configs: {a: [{mig-enabled: false}]}", "missing required field"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "missing required field"),
        ("version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}", "invalid"),
        ("version: v1\nmig-configs: {a: [{devices: [a], mig-enabled: false}]}", "devices"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: 1}]}", "boolean"),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}", "mig-devices"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false,"
            " mig-devices: {1g.10gb: 1}}]}",
            "included when 'mig-enabled' is false",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true,"
            " mig-devices: {1g.10gb: 0}}]}",
            "all counts",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true,"
            " mig-devices: {1g.10gb: 1.0}}]}",
            "not an integer",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true,"
            " mig-devices: {5g.10gb: 1}}]}",
            "unknown Compute Instance slice size: 5",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, extra: 1,"
            " mig-devices: {1g.10gb: 1}}]}",
            "unexpected field: extra",
        ),
    ],
)
def test_what_mig_parted_refuses_is_refused(text: str, error: str) -> None:
    with pytest.raises(MigPartedError, match=error):
        parse_mig_parted_config(text)


def test_mig_enabled_with_an_empty_device_map_is_valid_as_in_go() -> None:
    text = "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-devices: {}}]}"
    assert parse_mig_parted_config(text).configs["a"][0].mig_devices == {}


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("1g.10gb", "1g.10gb"),
        ("1c.3g.40gb", "1c.3g.40gb"),
        ("3c.3g.40gb", "3g.40gb"),
        ("1g.10gb+me", "1g.10gb+me"),
        ("7g.80gb", "7g.80gb"),
    ],
)
def test_profile_names_print_as_mig_parted_prints_them(name: str, canonical: str) -> None:
    assert str(parse_mig_profile(name)) == canonical


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1g",
        "1g.10",
        "g.10gb",
        "1g. 10gb",
        "5g.10gb",
        "1c.5g.10gb",
        "1g.10gb+",
        "1g.10gb+xx",
        "1g.10gb+me,me",
        "1g.10gb+1a",
        "1x.1g.10gb",
        "1g.10gb.2",
    ],
)
def test_bad_profile_names_are_refused(name: str) -> None:
    with pytest.raises(MigPartedError):
        parse_mig_profile(name)
