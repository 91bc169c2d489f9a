"""The mig-parted config gpushare owns: rendering, names, reading back, and mig-parted's rules."""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.hardware.migprofiles import (
    MigProfile,
    ProfileError,
    parse_profile,
    profile_error,
)
from gpushare_operator.core.labelling.labels import is_valid_label_value
from gpushare_operator.core.mig.migconfigs import (
    ALL_DISABLED,
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    MigConfigError,
    MigLayout,
    layout_name,
    parse_text,
    render_spec,
    render_text,
    validate_spec,
)

NAME_SHAPE = re.compile(r"(?:(?P<policy>.+)-)?mig-(?P<hash>[0-9a-f]{6})")

MIXED = MigLayout.from_mapping({"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 1})
UNIFORM = MigLayout.from_mapping({"1g.10gb": 7})

# The entry each name hashes: what render_text writes under the name, as its own document.
MIXED_ENTRY = """\
- devices: all
  mig-enabled: true
  mig-devices:
    3g.40gb: 1
    2g.20gb: 1
    1g.10gb: 2
"""
UNIFORM_ENTRY = """\
- devices: all
  mig-enabled: true
  mig-devices:
    1g.10gb: 7
"""


def _hash(entry: str) -> str:
    return hashlib.sha256(entry.encode()).hexdigest()[:6]


MIXED_NAME = f"inference-mig-{_hash(MIXED_ENTRY)}"
UNIFORM_NAME = f"batch-mig-{_hash(UNIFORM_ENTRY)}"

FILE_TEXT = f"""\
version: v1
mig-configs:
  all-disabled:
  - devices: all
    mig-enabled: false
  {UNIFORM_NAME}:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.10gb: 7
  {MIXED_NAME}:
  - devices: all
    mig-enabled: true
    mig-devices:
      3g.40gb: 1
      2g.20gb: 1
      1g.10gb: 2
"""


def policy_names() -> st.SearchStrategy[str]:
    label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
    return st.lists(label, min_size=1, max_size=5).map(".".join).filter(lambda n: len(n) <= 253)


def profiles() -> st.SearchStrategy[str]:
    """Every shape of profile name: short and compute-instance forms, each attribute."""
    slices = st.sampled_from([1, 2, 3, 4, 6, 7, 8])
    suffix = st.sampled_from(["", "+me", "+me.all", "+gfx", "-me"])

    def spell(gpu: int, compute: int, memory: int, tail: str) -> str:
        base = f"{gpu}g.{memory}gb" if compute >= gpu else f"{compute}c.{gpu}g.{memory}gb"
        return base + tail

    return st.builds(spell, slices, slices, st.integers(1, 192), suffix)


def layouts() -> st.SearchStrategy[MigLayout]:
    counts = st.dictionaries(profiles(), st.integers(1, 7), min_size=1, max_size=6)
    return counts.map(MigLayout.from_mapping)


# --- the file -----------------------------------------------------------------------------------


def test_constants_name_the_configmap_and_its_key() -> None:
    assert CONFIGMAP_NAME == "gpushare-mig-parted-config"
    assert CONFIGMAP_KEY == "config.yaml"
    assert ALL_DISABLED == "all-disabled"


def test_rendered_file_golden_bytes() -> None:
    assert layout_name(policy_name="inference", layout=MIXED) == MIXED_NAME
    assert layout_name(policy_name="batch", layout=UNIFORM) == UNIFORM_NAME
    text = render_text({MIXED_NAME: MIXED, UNIFORM_NAME: UNIFORM})
    assert text == FILE_TEXT


def test_the_input_order_does_not_change_the_text() -> None:
    reordered = {
        UNIFORM_NAME: UNIFORM,
        MIXED_NAME: MigLayout((("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1))),
    }
    assert render_text(reordered) == FILE_TEXT


def test_an_empty_file_still_has_all_disabled() -> None:
    assert render_text({}) == (
        "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n"
    )
    assert parse_text(render_text({})) == {ALL_DISABLED: None}


def test_the_text_is_the_dict_as_yaml() -> None:
    spec = render_spec({MIXED_NAME: MIXED})
    assert yaml.safe_load(render_text({MIXED_NAME: MIXED})) == spec
    assert spec["mig-configs"][MIXED_NAME] == [
        {
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
        }
    ]


def test_parse_reads_back_what_was_rendered() -> None:
    assert parse_text(FILE_TEXT) == {ALL_DISABLED: None, UNIFORM_NAME: UNIFORM, MIXED_NAME: MIXED}


@given(st.lists(st.tuples(policy_names(), layouts()), max_size=4))
def test_every_layout_shape_round_trips(named: list[tuple[str, MigLayout]]) -> None:
    wanted = {layout_name(policy_name=policy, layout=layout): layout for policy, layout in named}
    text = render_text(wanted)
    assert parse_text(text) == {ALL_DISABLED: None, **wanted}
    assert render_text(wanted) == text


# --- names --------------------------------------------------------------------------------------


def test_layouts_keep_one_canonical_order() -> None:
    assert MIXED.devices == (("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2))
    assert MIXED.profiles == ("3g.40gb", "2g.20gb", "1g.10gb")
    assert MigLayout.from_mapping({"3g.40gb": 1, "1g.10gb": 2, "2g.20gb": 1}) == MIXED
    odd = MigLayout.from_mapping({"1g.10gb": 1, "1c.2g.20gb": 1, "2g.20gb": 1, "1g.10gb+me": 1})
    assert odd.profiles == ("2g.20gb", "1c.2g.20gb", "1g.10gb", "1g.10gb+me")
    assert MIXED.as_dict() == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}


def test_the_policy_name_does_not_change_the_hash() -> None:
    first = NAME_SHAPE.fullmatch(layout_name(policy_name="a", layout=MIXED))
    second = NAME_SHAPE.fullmatch(layout_name(policy_name="b", layout=MIXED))
    assert first is not None and second is not None
    assert first["hash"] == second["hash"]
    other = NAME_SHAPE.fullmatch(layout_name(policy_name="a", layout=UNIFORM))
    assert other is not None and other["hash"] != first["hash"]


def test_every_count_changes_the_name() -> None:
    more = MigLayout.from_mapping({"1g.10gb": 3, "3g.40gb": 1, "2g.20gb": 1})
    assert layout_name(policy_name="p", layout=more) != layout_name(policy_name="p", layout=MIXED)


def test_longest_policy_name_is_cut_to_fit_a_label_value() -> None:
    name = layout_name(policy_name="p" * 253, layout=UNIFORM)
    assert len(name) == 63
    assert name == "p" * 52 + f"-mig-{_hash(UNIFORM_ENTRY)}"
    cut = layout_name(policy_name="a" * 51 + ".-" + "b" * 100, layout=UNIFORM)
    assert cut == "a" * 51 + f"-mig-{_hash(UNIFORM_ENTRY)}"
    assert layout_name(policy_name="---", layout=UNIFORM) == f"mig-{_hash(UNIFORM_ENTRY)}"


@given(policy_names(), layouts())
def test_names_are_valid_label_values(policy: str, layout: MigLayout) -> None:
    name = layout_name(policy_name=policy, layout=layout)
    assert len(name) <= 63
    assert is_valid_label_value(name)
    assert name != ALL_DISABLED
    found = NAME_SHAPE.fullmatch(name)
    assert found is not None
    assert policy.startswith(found["policy"] or "")


# --- profile names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("1g.10gb", MigProfile(compute=1, gpu=1, memory_gb=10)),
        ("7g.80gb", MigProfile(compute=7, gpu=7, memory_gb=80)),
        ("1c.2g.20gb", MigProfile(compute=1, gpu=2, memory_gb=20)),
        ("1g.10gb+me", MigProfile(compute=1, gpu=1, memory_gb=10, attribute="me")),
        ("1g.12gb+me.all", MigProfile(compute=1, gpu=1, memory_gb=12, attribute="me.all")),
        ("2g.24gb+gfx", MigProfile(compute=2, gpu=2, memory_gb=24, attribute="gfx")),
        ("1g.12gb-me", MigProfile(compute=1, gpu=1, memory_gb=12, without="me")),
    ],
)
def test_profiles_parse_as_nvidia_spells_them(name: str, profile: MigProfile) -> None:
    assert parse_profile(name) == profile
    assert profile.name == name
    assert profile_error(name) is None


def test_only_whole_instances_are_whole() -> None:
    assert parse_profile("3g.40gb").whole_instance
    assert not parse_profile("1c.3g.40gb").whole_instance


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must be a non-empty string"),
        ("1g", "must look like <g>g.<memory>gb"),
        ("1g.10GB", "must look like"),
        ("1g.10gb ", "must look like"),
        ("+1g.10gb", "must look like"),
        ("01g.10gb", "must look like"),
        ("1g.10gb+me,gfx", "must look like"),
        ("1g.10gb+", "must look like"),
        ("1g.10gb+me-me", "must look like"),
        ("1g.10gb+foo", "NVIDIA GPUs have no profile with +foo"),
        ("1g.10gb-gfx", "no profile with -gfx"),
        ("5g.50gb", "a GPU instance has 1, 2, 3, 4, 6, 7, 8 slices, not 5"),
        ("0g.10gb", "not 0"),
        ("5c.7g.80gb", "a compute instance has 1, 2, 3, 4, 6, 7, 8 slices, not 5"),
        ("3c.2g.20gb", "a compute instance of 3 slices does not fit in a GPU instance of 2"),
        ("1g.0gb", "memory must be at least 1gb"),
        ("2c.2g.20gb", "is written '2g.20gb'"),
    ],
)
def test_profile_names_mig_parted_would_refuse_or_that_have_another_spelling(
    name: str, message: str
) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        parse_profile(name)
    assert profile_error(name) is not None
    with pytest.raises(MigConfigError, match=re.escape(message)):
        MigLayout.from_mapping({name: 1})


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ({}, "layout must name at least one profile"),
        ({"1g.10gb": 0}, "the count of '1g.10gb' must be an integer of at least 1, not 0"),
        ({"1g.10gb": -1}, "not -1"),
        ({"1g.10gb": True}, "not True"),
        ({"1g.10gb": "2"}, "not '2'"),
        ({"1g.10gb": 2.0}, "not 2.0"),
    ],
)
def test_layouts_refuse_what_mig_parted_or_gpushare_would_not_write(
    devices: dict[str, Any], message: str
) -> None:
    with pytest.raises(MigConfigError, match=re.escape(message)):
        MigLayout.from_mapping(devices)


def test_a_profile_named_twice_is_refused() -> None:
    with pytest.raises(MigConfigError, match=re.escape("'1g.10gb' is named more than once")):
        MigLayout((("1g.10gb", 1), ("1g.10gb", 2)))
    with pytest.raises(MigConfigError, match=re.escape("is not a (profile, count) pair")):
        MigLayout((("1g.10gb",),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layouts", "message"),
    [
        ({ALL_DISABLED: UNIFORM}, "'all-disabled' is always rendered and names no layout"),
        (
            {"": UNIFORM},
            "name '' must be a non-empty label value (it is the nvidia.com/mig.config label): "
            "it is empty",
        ),
        ({"a" * 60 + "-mig-" + _hash(UNIFORM_ENTRY): UNIFORM}, "at most 63 characters"),
        ({"bad/name-mig-" + _hash(UNIFORM_ENTRY): UNIFORM}, "must be a non-empty label value"),
        ({"all-1g.10gb": UNIFORM}, f"the name must end in mig-{_hash(UNIFORM_ENTRY)}"),
        ({MIXED_NAME: UNIFORM}, "the hash of its layout"),
    ],
)
def test_rendering_refuses_names_that_are_not_ours(
    layouts: dict[str, MigLayout], message: str
) -> None:
    with pytest.raises(MigConfigError, match=re.escape(message)):
        render_text(layouts)


DELETE = object()


def _with(path: str, value: Any) -> dict[str, Any]:
    """The golden file's spec with one field, addressed like ``a.b.0.c``, set (or deleted)."""
    spec = copy.deepcopy(yaml.safe_load(FILE_TEXT))
    *parents, last = path.split("|")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return spec


MIX = f"mig-configs|{MIXED_NAME}"
OFF = "mig-configs|all-disabled"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "config must be an object"),
        (_with("version", "v2"), "version must be 'v1', not 'v2'"),
        (_with("version", DELETE), "version must be 'v1', not None"),
        (_with("flags", {}), "config: unexpected field(s) 'flags'"),
        (_with("mig-configs", {}), "mig-configs must be an object with at least one entry"),
        (_with("mig-configs", []), "at least one entry"),
        (_with(OFF, DELETE), "mig-configs must contain 'all-disabled'"),
        (_with(OFF, []), "must be a list of exactly one entry"),
        (_with(OFF, "all"), "must be a list of exactly one entry"),
        (_with(MIX, yaml.safe_load(MIXED_ENTRY) * 2), "exactly one entry"),
        (_with(f"{OFF}|0", "off"), "must be an object with devices and mig-enabled"),
        (
            _with(f"{OFF}|0", yaml.safe_load(UNIFORM_ENTRY)[0]),
            "'all-disabled' and only it disables",
        ),
        (_with(f"{MIX}|0|mig-enabled", False), "MIG devices included when 'mig-enabled' is false"),
        (_with(f"{OFF}|0|mig-devices", {}), "MIG devices included when 'mig-enabled' is false"),
        (_with(f"{OFF}|0|mig-enabled", "false"), "mig-enabled must be true or false"),
        (_with(f"{OFF}|0|mig-enabled", DELETE), "mig-enabled must be true or false, not None"),
        (_with(f"{MIX}|0|mig-devices", DELETE), "'mig-devices' is required"),
        (_with(f"{MIX}|0|mig-devices", ["1g.10gb"]), "'mig-devices' is required"),
        (_with(f"{MIX}|0|mig-devices", {}), "mig-devices must name at least one profile"),
        (_with(f"{MIX}|0|mig-devices|1g.10gb", 0), "must be an integer of at least 1, not 0"),
        (_with(f"{MIX}|0|mig-devices|1g.5gb+me", 1), "the name must end in mig-"),
        (_with(f"{MIX}|0|mig-devices|4g", 1), "MIG profile '4g' must look like"),
        (_with(f"{MIX}|0|devices", [0, 1]), "devices must be 'all', not [0, 1]"),
        (_with(f"{MIX}|0|devices", DELETE), "devices must be 'all', not None"),
        (_with(f"{MIX}|0|device-filter", ["0x233010DE"]), "unexpected field(s) 'device-filter'"),
    ],
)
def test_validation_rejects(spec: Any, message: str) -> None:
    with pytest.raises(MigConfigError, match=re.escape(message)):
        validate_spec(spec)
    if isinstance(spec, dict):
        assert parse_text(yaml.safe_dump(spec)) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "version: v1\n",
        "version: v1\nmig-configs: [\n",
        "- just\n- a list\n",
        # NVIDIA's own shape: a device filter, indices, a name that is not hashed.
        "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n"
        "  all-1g.10gb:\n  - device-filter: ['0x233010DE']\n    devices: all\n"
        "    mig-enabled: true\n    mig-devices:\n      1g.10gb: 7\n",
    ],
)
def test_text_we_would_not_render_reads_as_unknown(text: str) -> None:
    assert parse_text(text) is None


def test_a_name_whose_layout_was_edited_in_place_reads_as_unknown() -> None:
    edited = FILE_TEXT.replace("1g.10gb: 7", "1g.10gb: 6")
    assert parse_text(edited) is None
