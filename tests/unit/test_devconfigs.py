"""Device-plugin config rendering, content-addressed keys and validation."""

from __future__ import annotations

import copy
import dataclasses
import enum
import hashlib
import re
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpushare_operator.core.deviceplugin.devconfigs import (
    DEFAULT_KEY,
    ConfigError,
    SharingConfig,
    advertised_resource,
    advertised_resources,
    config_key,
    mig_resource_names,
    parse_config_text,
    render_config,
    render_config_text,
    render_default_text,
    sharing_strategy_label,
    validate_config,
)
from gpushare_operator.core.labelling.labels import is_valid_label_value

CONFIGMAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
KEY_SHAPE = re.compile(
    r"(?:(?P<policy>.+)-)?(?P<kind>ts|mps)(?P<replicas>\d+)-(?P<hash>[0-9a-f]{6})"
)

TS = SharingConfig(strategy="TimeSlicing", replicas=4, fail_requests_greater_than_one=True)
MPS = SharingConfig(strategy="MPS", replicas=8, rename_by_default=True)

TS_TEXT = """\
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""

MPS_TEXT = """\
version: v1
flags:
  migStrategy: none
sharing:
  mps:
    renameByDefault: true
    failRequestsGreaterThanOne: false
    resources:
    - name: nvidia.com/gpu
      replicas: 8
"""


class Strategy(enum.StrEnum):
    """Stands in for the models' SharingStrategy enum."""

    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


def policy_names() -> st.SearchStrategy[str]:
    """DNS-subdomain object names up to the 253-character maximum."""
    label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
    return st.lists(label, min_size=1, max_size=5).map(".".join).filter(lambda n: len(n) <= 253)


def sharing_configs() -> st.SearchStrategy[SharingConfig]:
    label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?", fullmatch=True)
    short_names = st.lists(label, min_size=1, max_size=2).map(".".join)
    return st.builds(
        SharingConfig,
        strategy=st.sampled_from(["TimeSlicing", "MPS"]),
        replicas=st.integers(2, 48),
        resource_name=st.just("nvidia.com/gpu") | short_names.map("nvidia.com/{}".format),
        rename_by_default=st.booleans(),
        fail_requests_greater_than_one=st.booleans(),
    ).filter(_renders)


def _renders(config: SharingConfig) -> bool:
    try:
        render_config(config)
    except ConfigError:
        return False
    return True


# --- rendering ----------------------------------------------------------------------------------


def test_time_slicing_golden_text() -> None:
    assert render_config_text(TS) == TS_TEXT


def test_mps_golden_text() -> None:
    assert render_config_text(MPS) == MPS_TEXT


def test_default_text_shares_nothing() -> None:
    assert render_default_text() == "version: v1\nflags:\n  migStrategy: none\n"
    assert "sharing" not in yaml.safe_load(render_default_text())
    assert DEFAULT_KEY == "default"


def test_text_is_the_dict_as_yaml() -> None:
    assert yaml.safe_load(render_config_text(TS)) == render_config(TS)
    assert render_config(TS)["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]


def test_a_str_enum_strategy_renders_like_the_string() -> None:
    as_enum = dataclasses.replace(TS, strategy=Strategy.TIME_SLICING)
    assert render_config_text(as_enum) == TS_TEXT
    assert config_key(policy_name="p", config=as_enum) == config_key(policy_name="p", config=TS)
    assert sharing_strategy_label(dataclasses.replace(MPS, strategy=Strategy.MPS)) == "mps"


def test_rendering_is_fresh_each_time() -> None:
    first = render_config(TS)
    first["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 99
    first["flags"]["migStrategy"] = "mixed"
    assert render_config_text(TS) == TS_TEXT


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (SharingConfig(strategy="Hybrid", replicas=4), "strategy 'Hybrid' is not supported"),
        (SharingConfig(strategy="MPS", replicas=1), "replicas must be an integer of at least 2"),
        (
            SharingConfig(strategy="TimeSlicing", replicas=4, resource_name="example.com/gpu"),
            "must be named nvidia.com/<name>",
        ),
        (
            SharingConfig(strategy="TimeSlicing", replicas=4, resource_name="nvidia.com/GPU"),
            "lowercase DNS subdomain",
        ),
    ],
)
def test_rendering_refuses_configs_the_plugin_would_not_apply(
    config: SharingConfig, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        render_config_text(config)
    with pytest.raises(ConfigError):
        config_key(policy_name="p", config=config)


# --- keys ---------------------------------------------------------------------------------------


def test_key_format() -> None:
    text_hash = hashlib.sha256(TS_TEXT.encode()).hexdigest()[:6]
    assert config_key(policy_name="inference", config=TS) == f"inference-ts4-{text_hash}"
    mps_hash = hashlib.sha256(MPS_TEXT.encode()).hexdigest()[:6]
    assert config_key(policy_name="batch", config=MPS) == f"batch-mps8-{mps_hash}"


def test_key_is_deterministic() -> None:
    again = SharingConfig(strategy="TimeSlicing", replicas=4, fail_requests_greater_than_one=True)
    assert config_key(policy_name="inference", config=again) == config_key(
        policy_name="inference", config=TS
    )


@pytest.mark.parametrize(
    "change",
    [
        {"strategy": "MPS"},
        {"replicas": 5},
        {"resource_name": "nvidia.com/mig-1g.10gb"},
        {"rename_by_default": True},
        {"fail_requests_greater_than_one": False},
    ],
)
def test_every_field_changes_the_text_and_the_hash(change: dict[str, Any]) -> None:
    changed = dataclasses.replace(TS, **change)
    assert render_config_text(changed) != TS_TEXT
    before = KEY_SHAPE.fullmatch(config_key(policy_name="p", config=TS))
    after = KEY_SHAPE.fullmatch(config_key(policy_name="p", config=changed))
    assert before is not None
    assert after is not None
    assert before["hash"] != after["hash"]


def test_the_policy_name_does_not_change_the_hash() -> None:
    # Content addressing: the same content under another policy is the same text.
    first = KEY_SHAPE.fullmatch(config_key(policy_name="a", config=TS))
    second = KEY_SHAPE.fullmatch(config_key(policy_name="b", config=TS))
    assert first is not None
    assert second is not None
    assert first["hash"] == second["hash"]
    assert first["policy"] == "a"
    assert second["policy"] == "b"


def test_longest_policy_name_is_cut_to_fit_a_label_value() -> None:
    name = "p" * 253
    key = config_key(policy_name=name, config=SharingConfig(strategy="MPS", replicas=48))
    assert len(key) == 63
    assert is_valid_label_value(key)
    assert CONFIGMAP_KEY.fullmatch(key)
    assert key.startswith("p" * 50 + "-mps48-")


def test_cut_policy_names_end_on_a_letter_or_digit() -> None:
    # "-ts4-xxxxxx" takes 11 characters, leaving 52: the cut lands right after ".-".
    name = "a" * 50 + ".-" + "b" * 100
    key = config_key(policy_name=name, config=TS)
    found = KEY_SHAPE.fullmatch(key)
    assert found is not None
    assert found["policy"] == "a" * 50
    assert is_valid_label_value(key)


def test_names_with_nothing_usable_leave_only_the_content_part() -> None:
    key = config_key(policy_name="---", config=TS)
    assert re.fullmatch(r"ts4-[0-9a-f]{6}", key)
    assert is_valid_label_value(key)


@given(policy_names(), sharing_configs())
def test_keys_are_valid_everywhere_they_are_used(name: str, config: SharingConfig) -> None:
    key = config_key(policy_name=name, config=config)
    assert len(key) <= 63
    assert is_valid_label_value(key)
    assert CONFIGMAP_KEY.fullmatch(key)
    assert key != DEFAULT_KEY
    found = KEY_SHAPE.fullmatch(key)
    assert found is not None
    assert name.startswith(found["policy"])
    assert found["kind"] == ("ts" if config.strategy == "TimeSlicing" else "mps")
    assert int(found["replicas"]) == config.replicas
    digest = hashlib.sha256(render_config_text(config).encode()).hexdigest()
    assert found["hash"] == digest[:6]


@given(policy_names(), st.integers(2, 10**6))
def test_keys_fit_with_any_replica_count(name: str, replicas: int) -> None:
    config = SharingConfig(strategy="TimeSlicing", replicas=replicas)
    key = config_key(policy_name=name, config=config)
    assert len(key) <= 63
    assert is_valid_label_value(key)


@given(sharing_configs())
def test_everything_rendered_passes_validation(config: SharingConfig) -> None:
    validate_config(yaml.safe_load(render_config_text(config)))


# --- validation ---------------------------------------------------------------------------------


DELETE = object()
RESOURCE = "sharing.timeSlicing.resources.0"


def _with(path: str, value: Any) -> dict[str, Any]:
    """The time-slicing config with one field, addressed like ``a.b.0.c``, set (or deleted)."""
    config = copy.deepcopy(render_config(TS))
    *parents, last = path.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return config


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_with("version", "v2"), "version must be 'v1', not 'v2'"),
        (_with("version", DELETE), "version must be 'v1', not None"),
        (_with("resources", {"gpus": []}), "unknown field(s) 'resources'"),
        (_with("flags", DELETE), "flags must be an object"),
        (_with("flags.migStrategy", "all"), "migStrategy must be one of none, single, mixed"),
        (_with("flags.failOnInitError", True), "flags: unknown field(s) 'failOnInitError'"),
        (_with("sharing", []), "sharing must be an object"),
        (_with("sharing.mps", {"resources": []}), "exactly one of timeSlicing or mps"),
        (_with("sharing.timeSlicing", DELETE), "not neither"),
        (_with("sharing.timeSlicing", None), "not neither"),
        (_with("sharing.timeSlicing", "yes"), "sharing.timeSlicing must be an object"),
        (_with("sharing.timeSlicing.strategy", "packed"), "unknown field(s) 'strategy'"),
        (_with("sharing.timeSlicing.renameByDefault", "false"), "renameByDefault must be true"),
        (_with("sharing.timeSlicing.failRequestsGreaterThanOne", 1), "must be true or false"),
        (_with("sharing.timeSlicing.resources", []), "resources must be a non-empty list"),
        (_with("sharing.timeSlicing.resources", DELETE), "resources must be a non-empty list"),
        (_with("sharing.timeSlicing.resources", "nvidia.com/gpu"), "must be a non-empty list"),
        (_with(RESOURCE, "nvidia.com/gpu"), "resources[0] must be an object"),
        (
            _with(f"{RESOURCE}.rename", "nvidia.com/gpu.shared"),
            "resources[0].rename is not supported",
        ),
        (_with(f"{RESOURCE}.devices", "all"), "resources[0].devices is not supported"),
        (_with(f"{RESOURCE}.memoryGB", 2), "resources[0]: unknown field(s) 'memoryGB'"),
        (_with(f"{RESOURCE}.replicas", 1), "replicas must be an integer of at least 2, not 1"),
        (_with(f"{RESOURCE}.replicas", 0), "at least 2, not 0"),
        (_with(f"{RESOURCE}.replicas", True), "at least 2, not True"),
        (_with(f"{RESOURCE}.replicas", "4"), "at least 2, not '4'"),
        (_with(f"{RESOURCE}.replicas", DELETE), "at least 2, not None"),
        (_with(f"{RESOURCE}.name", DELETE), "name must be a resource name string"),
        (_with(f"{RESOURCE}.name", "gpu"), "must be named nvidia.com/<name>"),
        (_with(f"{RESOURCE}.name", "amd.com/gpu"), "must be named nvidia.com/<name>"),
        (_with(f"{RESOURCE}.name", "nvidia.com/"), "after '/' must not be empty"),
        (_with(f"{RESOURCE}.name", "nvidia.com/gpu_x"), "lowercase DNS subdomain"),
        (_with(f"{RESOURCE}.name", "nvidia.com/" + "g" * 53), "at most 63 characters, not 64"),
    ],
)
def test_validation_rejects(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config)


def test_validation_rejects_a_resource_listed_twice() -> None:
    config = _with(RESOURCE.rsplit(".", 1)[0], [{"name": "nvidia.com/gpu", "replicas": 2}] * 2)
    with pytest.raises(ConfigError, match="more than once"):
        validate_config(config)


def test_the_longest_resource_name_may_be_renamed() -> None:
    # 63 characters is the plugin's limit; with ".shared" the name part is 59 characters,
    # still a valid extended-resource name for Kubernetes.
    config = SharingConfig(
        strategy="TimeSlicing", replicas=2, resource_name="nvidia.com/" + "g" * 52
    )
    validate_config(render_config(config))
    renamed = dataclasses.replace(config, rename_by_default=True)
    validate_config(render_config(renamed))
    assert advertised_resource(renamed) == "nvidia.com/" + "g" * 52 + ".shared"


def test_validation_accepts_the_default_and_both_strategies() -> None:
    validate_config(yaml.safe_load(render_default_text()))
    validate_config(render_config(TS))
    validate_config(render_config(MPS))
    validate_config(_with("flags.migStrategy", "mixed"))


# --- what nodes will show -----------------------------------------------------------------------


def test_advertised_resource() -> None:
    assert advertised_resource(TS) == "nvidia.com/gpu"
    assert advertised_resource(MPS) == "nvidia.com/gpu.shared"
    renamed = SharingConfig(
        strategy="TimeSlicing",
        replicas=2,
        resource_name="nvidia.com/mig-1g.10gb",
        rename_by_default=True,
    )
    assert advertised_resource(renamed) == "nvidia.com/mig-1g.10gb.shared"


def test_sharing_strategy_label() -> None:
    assert sharing_strategy_label(TS) == "time-slicing"
    assert sharing_strategy_label(MPS) == "mps"
    with pytest.raises(ConfigError):
        sharing_strategy_label(SharingConfig(strategy="None", replicas=2))


def test_mps_beyond_48_clients_is_refused_as_the_plugin_refuses_it() -> None:
    with pytest.raises(ConfigError, match="at most 48 for MPS, not 49"):
        render_config(SharingConfig(strategy="MPS", replicas=49))
    assert render_config(SharingConfig(strategy="TimeSlicing", replicas=64))


def test_exclusive_renders_without_a_sharing_section_under_a_key_of_its_own() -> None:
    config = SharingConfig(strategy="Exclusive", replicas=1)
    assert render_config(config) == {"version": "v1", "flags": {"migStrategy": "none"}}
    key = config_key(policy_name="training", config=config)
    digest = hashlib.sha256(render_config_text(config).encode()).hexdigest()[:6]
    assert key == f"training-excl-{digest}"
    assert advertised_resource(config) == "nvidia.com/gpu"
    assert sharing_strategy_label(config) == "none"
    with pytest.raises(ConfigError, match="Exclusive has 1 replica per GPU, not 2"):
        render_config(SharingConfig(strategy="Exclusive", replicas=2))


def test_replicas_of_one_in_a_sharing_section_are_refused() -> None:
    body = {
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}},
    }
    with pytest.raises(ConfigError, match="at least 2, not 1"):
        validate_config(body)


# --- MIG ----------------------------------------------------------------------------------------


MIG_KEY_SHAPE = re.compile(r"(?:(?P<policy>.+)-)?mig(?P<replicas>\d*)-(?P<hash>[0-9a-f]{6})")

MIG_SINGLE = SharingConfig(
    strategy="MIG", replicas=1, mig_strategy="single", mig_resources=("nvidia.com/gpu",)
)
MIG_MIXED_SHARED = SharingConfig(
    strategy="MIG",
    replicas=4,
    mig_strategy="mixed",
    fail_requests_greater_than_one=True,
    mig_resources=("nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"),
)

MIG_SINGLE_TEXT = """\
version: v1
flags:
  migStrategy: single
"""

MIG_MIXED_SHARED_TEXT = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/mig-1g.10gb
      replicas: 4
    - name: nvidia.com/mig-3g.40gb
      replicas: 4
"""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def mig_configs() -> st.SearchStrategy[SharingConfig]:
    profile = st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb", "1g.10gb+me"])

    def build(
        strategy: str, profiles: list[str], replicas: int, rename: bool, fail: bool
    ) -> SharingConfig:
        shared = replicas > 1
        return SharingConfig(
            strategy="MIG",
            replicas=replicas,
            mig_strategy=strategy,
            mig_resources=mig_resource_names(mig_strategy=strategy, profiles=profiles),
            rename_by_default=rename and shared,
            fail_requests_greater_than_one=fail and shared,
        )

    single = st.builds(
        build,
        st.just("single"),
        profile.map(lambda p: [p]),
        st.integers(1, 64),
        st.booleans(),
        st.booleans(),
    )
    mixed = st.builds(
        build,
        st.just("mixed"),
        st.lists(profile, min_size=1, max_size=5),
        st.integers(1, 64),
        st.booleans(),
        st.booleans(),
    )
    return single | mixed


def test_mig_golden_texts() -> None:
    assert render_config_text(MIG_SINGLE) == MIG_SINGLE_TEXT
    assert render_config_text(MIG_MIXED_SHARED) == MIG_MIXED_SHARED_TEXT


def test_mig_keys_carry_the_tag_and_the_replicas_when_shared() -> None:
    assert config_key(policy_name="inference", config=MIG_SINGLE) == (
        f"inference-mig-{_digest(MIG_SINGLE_TEXT)}"
    )
    assert config_key(policy_name="inference", config=MIG_MIXED_SHARED) == (
        f"inference-mig4-{_digest(MIG_MIXED_SHARED_TEXT)}"
    )


def test_the_old_strategies_keep_their_keys() -> None:
    # Adding MIG must not rename a key any node carries today.
    assert config_key(policy_name="inference", config=TS) == f"inference-ts4-{_digest(TS_TEXT)}"
    assert config_key(policy_name="batch", config=MPS) == f"batch-mps8-{_digest(MPS_TEXT)}"
    exclusive = SharingConfig(strategy="Exclusive", replicas=1)
    assert render_config_text(exclusive) == render_default_text()
    assert parse_config_text(TS_TEXT) == TS
    assert parse_config_text(MPS_TEXT) == MPS
    assert parse_config_text(render_default_text()) == exclusive


@given(policy_names(), mig_configs())
def test_mig_keys_are_valid_and_read_back(name: str, config: SharingConfig) -> None:
    key = config_key(policy_name=name, config=config)
    assert len(key) <= 63
    assert is_valid_label_value(key)
    found = MIG_KEY_SHAPE.fullmatch(key)
    assert found is not None
    assert found["replicas"] == (str(config.replicas) if config.replicas > 1 else "")
    text = render_config_text(config)
    assert found["hash"] == _digest(text)
    parsed = parse_config_text(text)
    if config.mig_strategy == "mixed" and config.replicas == 1:
        # Nothing in the text names the resources: they are the layout's.
        assert parsed == dataclasses.replace(config, mig_resources=())
        assert parsed is not None
        assert render_config_text(parsed) == text
    else:
        assert parsed == config


def test_mig_resource_names_follow_the_device_plugin() -> None:
    assert mig_resource_names(mig_strategy="single", profiles=["1g.10gb"]) == ("nvidia.com/gpu",)
    assert mig_resource_names(
        mig_strategy="mixed", profiles=["3g.40gb", "1g.10gb+me", "1g.10gb"]
    ) == (
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb.me",
        "nvidia.com/mig-3g.40gb",
    )
    assert mig_resource_names(mig_strategy="mixed", profiles=["1g.12gb-me"]) == (
        "nvidia.com/mig-1g.12gb-me",
    )
    # Every name reads back as the profile it came from, whatever its attribute.
    for profile in ("1g.12gb+me.all", "2g.24gb+gfx", "1g.10gb+me", "1g.12gb-me", "7g.80gb"):
        [resource] = mig_resource_names(mig_strategy="mixed", profiles=[profile])
        render_config(dataclasses.replace(MIG_MIXED, mig_resources=(resource,)))


@pytest.mark.parametrize(
    ("strategy", "profiles", "message"),
    [
        ("single", ["1g.10gb", "2g.20gb"], "MIG single needs one profile on every GPU"),
        ("single", [], "a MIG layout holds at least one profile"),
        (
            "mixed",
            ["1c.2g.20gb", "2g.20gb"],
            "no resource for compute-instance profiles ['1c.2g.20gb']",
        ),
        ("none", ["1g.10gb"], "MIG strategy must be single or mixed, not 'none'"),
        ("mixed", ["5g.50gb"], "not 5"),
    ],
)
def test_mig_resource_names_refuse_what_the_plugin_cannot_advertise(
    strategy: str, profiles: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        mig_resource_names(mig_strategy=strategy, profiles=profiles)


MIG_MIXED = SharingConfig(
    strategy="MIG", replicas=1, mig_strategy="mixed", mig_resources=("nvidia.com/mig-1g.10gb",)
)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            SharingConfig(strategy="MPS", replicas=4, mig_strategy="mixed"),
            "Sharing with MPS is currently not supported on devices with MIG enabled",
        ),
        (
            SharingConfig(strategy="MPS", replicas=4, mig_strategy="single"),
            "MPS cannot share MIG devices",
        ),
        (
            SharingConfig(strategy="TimeSlicing", replicas=4, mig_strategy="single"),
            "TimeSlicing has no MIG strategy or MIG resources; use strategy MIG",
        ),
        (
            SharingConfig(strategy="Exclusive", replicas=1, mig_resources=("nvidia.com/gpu",)),
            "Exclusive has no MIG strategy",
        ),
        (
            dataclasses.replace(MIG_SINGLE, mig_strategy="none"),
            "MIG needs migStrategy single or mixed",
        ),
        (dataclasses.replace(MIG_SINGLE, replicas=0), "not 0"),
        (dataclasses.replace(MIG_SINGLE, replicas=65), "2 to 64 to time-slice each, not 65"),
        (
            dataclasses.replace(MIG_SINGLE, resource_name="nvidia.com/a100"),
            "resourceName does not apply",
        ),
        (dataclasses.replace(MIG_SINGLE, rename_by_default=True), "time-sliced MIG devices only"),
        (
            dataclasses.replace(MIG_MIXED, fail_requests_greater_than_one=True),
            "time-sliced MIG devices only",
        ),
        (
            dataclasses.replace(MIG_SINGLE, mig_resources=("nvidia.com/mig-1g.10gb",)),
            "MIG single advertises nvidia.com/gpu only",
        ),
        (dataclasses.replace(MIG_SINGLE, mig_resources=()), "MIG single advertises nvidia.com/gpu"),
        (dataclasses.replace(MIG_MIXED_SHARED, mig_resources=()), "needs the layout's resources"),
        (
            dataclasses.replace(
                MIG_MIXED_SHARED, mig_resources=MIG_MIXED_SHARED.mig_resources[::-1]
            ),
            "must be distinct and sorted",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/mig-1g.10gb",) * 2),
            "must be distinct and sorted",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/gpu",)),
            "MIG mixed advertises nvidia.com/mig-<profile> resources, not 'nvidia.com/gpu'",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/mig-1g.10gb+me",)),
            "lowercase DNS subdomain",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/mig-5g.50gb",)),
            "not 5",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/mig-1g.10gb.foo",)),
            "must look like",
        ),
        (
            dataclasses.replace(MIG_MIXED, mig_resources=("nvidia.com/mig-1c.2g.20gb",)),
            "no resource for compute-instance profiles",
        ),
    ],
)
def test_mig_rendering_refuses(config: SharingConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        render_config(config)
    with pytest.raises(ConfigError):
        config_key(policy_name="p", config=config)


def test_mps_under_a_mig_strategy_is_refused_in_any_text() -> None:
    text = MPS_TEXT.replace("migStrategy: none", "migStrategy: single")
    with pytest.raises(ConfigError, match="Sharing with MPS is currently not supported"):
        validate_config(yaml.safe_load(text))
    assert parse_config_text(text) is None


@pytest.mark.parametrize(
    "text",
    [
        # whole GPUs time-sliced under mixed: valid for the plugin, never rendered by gpushare
        TS_TEXT.replace("migStrategy: none", "migStrategy: mixed"),
        MIG_MIXED_SHARED_TEXT.replace("replicas: 4\n    - name", "replicas: 3\n    - name"),
        MIG_MIXED_SHARED_TEXT.replace("mig-1g.10gb", "mig-1g.10gbx"),
        MIG_MIXED_SHARED_TEXT.replace("mig-1g.10gb", "mig-1c.2g.10gb"),
        MIG_MIXED_SHARED_TEXT.replace("mig-1g.10gb", "mig-4g.40gb"),  # out of order
        MIG_SINGLE_TEXT
        + TS_TEXT.split("\n", 3)[3].replace("nvidia.com/gpu", "nvidia.com/mig-1g.10gb"),
        MIG_MIXED_SHARED_TEXT.replace("replicas: 4", "replicas: 65"),
    ],
)
def test_mig_texts_we_would_not_render_read_as_unknown(text: str) -> None:
    assert parse_config_text(text) is None


def test_advertised_resources() -> None:
    assert advertised_resources(TS) == ("nvidia.com/gpu",)
    assert advertised_resources(MPS) == ("nvidia.com/gpu.shared",)
    assert advertised_resources(MIG_SINGLE) == ("nvidia.com/gpu",)
    assert advertised_resource(MIG_SINGLE) == "nvidia.com/gpu"
    assert advertised_resources(MIG_MIXED_SHARED) == MIG_MIXED_SHARED.mig_resources
    renamed = dataclasses.replace(MIG_MIXED_SHARED, rename_by_default=True)
    assert advertised_resources(renamed) == (
        "nvidia.com/mig-1g.10gb.shared",
        "nvidia.com/mig-3g.40gb.shared",
    )
    assert advertised_resource(MIG_MIXED) == "nvidia.com/mig-1g.10gb"
    with pytest.raises(ConfigError, match="use advertised_resources"):
        advertised_resource(MIG_MIXED_SHARED)
    with pytest.raises(ConfigError, match="the resources of its layout"):
        advertised_resource(dataclasses.replace(MIG_MIXED, mig_resources=()))


def test_mig_sharing_strategy_label_and_sharedness() -> None:
    assert sharing_strategy_label(MIG_SINGLE) == "none"
    assert not MIG_SINGLE.shared
    assert sharing_strategy_label(MIG_MIXED_SHARED) == "time-slicing"
    assert MIG_MIXED_SHARED.shared
