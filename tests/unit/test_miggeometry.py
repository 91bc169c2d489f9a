"""MIG geometry: the tables agree with NVIDIA's MIG User Guide, and fits are exact.

The guide's "Supported MIG Profiles" tables give each profile's share of memory and SMs and its
instance count; its ``nvidia-smi mig -lgipp`` example gives NVML's placements. They are written
out below by hand, independently of the package data, so a wrong correction in migtables.json
fails here. Fits are checked against an oracle that works differently from the module's search
(left to right over the memory slices instead of instance by instance).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_operator.core.hardware import miggeometry
from gpushare_operator.core.hardware.miggeometry import GpuModel, Placement, Profile

H100 = "NVIDIA-H100-80GB-HBM3"
A100_40 = "NVIDIA-A100-SXM4-40GB"
A30 = "NVIDIA-A30-PCIE-24GB"

# Per profile: (compute slices, memory slices, instances), from the guide's tables. The guide's
# A100 table gives 1g.10gb "1/8" of memory, but its own -lgipp example places that profile
# (ID 15) on 2 slices, {0,2,4,6}:2, as its H100 table (1g.20gb, 1/4) does: 2 it is.
_EIGHT_SLICE = ((1, 1, 7), (1, 1, 1), (1, 2, 4), (2, 2, 3), (3, 4, 2), (4, 4, 1), (7, 8, 1))


def _table(*names: str) -> dict[str, tuple[int, int, int]]:
    return dict(zip(names, _EIGHT_SLICE, strict=True))


_A100_40 = _table("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_80GB = _table("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
GUIDE = {
    "NVIDIA-A100-PCIE-40GB": _A100_40,
    "NVIDIA-A100-SXM4-40GB": _A100_40,
    "NVIDIA-A100-PCIE-80GB": _80GB,
    "NVIDIA-A100-SXM4-80GB": _80GB,
    H100: _80GB,
    "NVIDIA-H200-141GB-HBM3e": _table(
        "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
    ),
    "NVIDIA-B200-180GB-HBM3e": _table(
        "1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"
    ),
    A30: {
        "1g.6gb": (1, 1, 4),
        "1g.6gb+me": (1, 1, 1),
        "2g.12gb": (2, 2, 2),
        "2g.12gb+me": (2, 2, 1),
        "4g.24gb": (4, 4, 1),
    },
}
# NVML's placement starts by (compute, memory) slices on an 8-slice GPU (the guide's -lgipp).
_STARTS = {
    (1, 1): (0, 1, 2, 3, 4, 5, 6),
    (1, 2): (0, 2, 4, 6),
    (2, 2): (0, 2, 4),
    (3, 4): (0, 4),
    (4, 4): (0,),
    (7, 8): (0,),
}


def test_the_tables_hold_exactly_the_guides_models() -> None:
    assert set(miggeometry.products()) == set(GUIDE)


@pytest.mark.parametrize("product", sorted(GUIDE))
def test_profiles_match_the_guide(product: str) -> None:
    model = miggeometry.model(product)
    assert model is not None
    got = {
        name: (p.compute_slices, p.memory_slices, p.instances) for name, p in model.profiles.items()
    }
    assert got == GUIDE[product]
    slices = 4 if product == A30 else 8
    assert (model.compute_slices, model.memory_slices) == (slices - (slices == 8), slices)


@pytest.mark.parametrize("product", sorted(set(GUIDE) - {A30}))
def test_placements_are_nvmls(product: str) -> None:
    model = miggeometry.model(product)
    assert model is not None
    for profile in model.profiles.values():
        starts = _STARTS[profile.compute_slices, profile.memory_slices]
        assert profile.placements == tuple(Placement(s, profile.memory_slices) for s in starts)


def test_the_a30_has_four_slices_of_each() -> None:
    model = miggeometry.model(A30)
    assert model is not None
    assert {n: p.placements for n, p in model.profiles.items()} == {
        "1g.6gb": tuple(Placement(s, 1) for s in range(4)),
        "1g.6gb+me": tuple(Placement(s, 1) for s in range(4)),
        "2g.12gb": (Placement(0, 2), Placement(2, 2)),
        "2g.12gb+me": (Placement(0, 2), Placement(2, 2)),
        "4g.24gb": (Placement(0, 4),),
    }


def _must(product: str) -> GpuModel:
    model = miggeometry.model(product)
    assert model is not None
    return model


@pytest.mark.parametrize(
    "layout",
    [
        {"1g.5gb": 7},
        {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1},
        {"4g.20gb": 1, "3g.20gb": 1},
        {"3g.20gb": 2},
        {"2g.10gb": 3, "1g.5gb": 1},
        {"1g.10gb": 4},
        {"1g.10gb": 1, "1g.5gb": 6},
        {"7g.40gb": 1},
        {"1g.5gb+me": 1, "1g.5gb": 6},
        {},
    ],
)
def test_layouts_an_a100_40gb_holds(layout: dict[str, int]) -> None:
    assert miggeometry.layout_error(_must(A100_40), layout) is None


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ({"1g.5gb": 8}, "at most 7 GPU instance(s) of 1g.5gb, the layout asks for 8"),
        ({"1g.5gb+me": 2}, "at most 1 GPU instance(s) of 1g.5gb+me"),
        ({"3g.20gb": 2, "1g.5gb": 1}, "needs 9 memory slices, NVIDIA-A100-SXM4-40GB has 8"),
        ({"4g.20gb": 1, "2g.10gb": 2}, "needs 8 compute slices, NVIDIA-A100-SXM4-40GB has 7"),
        ({"1g.10gb": 1}, None),
        ({"1g.20gb": 1}, "NVIDIA-A100-SXM4-40GB has no MIG profile 1g.20gb (it has 1g.10gb, "),
        ({"1g.5gb": -1}, "the count of 1g.5gb is -1"),
    ],
)
def test_layouts_an_a100_40gb_refuses(layout: dict[str, int], words: str | None) -> None:
    error = miggeometry.layout_error(_must(A100_40), layout)
    if words is None:
        assert error is None
    else:
        assert error is not None and words in error


def test_an_h100_refuses_four_1g20gb_and_a_1g10gb_that_go_nvmls_table_accepts() -> None:
    layout = {"1g.20gb": 4, "1g.10gb": 1}
    error = miggeometry.layout_error(_must(H100), layout)
    assert error == "1x 1g.10gb + 4x 1g.20gb needs 9 memory slices, NVIDIA-H100-80GB-HBM3 has 8"
    assert miggeometry.layout_error(_go_nvml_model(H100), layout) is None
    assert miggeometry.layout_error(_must(H100), {"1g.20gb": 4}) is None


def test_a_layout_within_the_sums_can_still_not_be_placed() -> None:
    # Four slices; "b" may start only at 0 or 2, and "a" (2 slices) only at 0 or 2: two b's
    # leave no start for a, though 1 + 1 + 2 slices is exactly the GPU.
    model = GpuModel(
        product="Test-GPU",
        memory_mib=4096,
        profiles=MappingProxyType(
            {
                "1g.1gb": Profile("1g.1gb", 1, 1, 1024, 2, (Placement(0, 1), Placement(2, 1))),
                "2g.2gb": Profile("2g.2gb", 2, 2, 2048, 1, (Placement(0, 2), Placement(2, 2))),
            }
        ),
        compute_slices=4,
        memory_slices=4,
        nvml_name="Test GPU",
    )
    error = miggeometry.layout_error(model, {"1g.1gb": 2, "2g.2gb": 1})
    assert error is not None
    assert "2g.2gb + 2x 1g.1gb cannot all be placed on one Test-GPU without overlapping" in error
    assert miggeometry.arrangement(model, {"1g.1gb": 1, "2g.2gb": 1}) in {
        (("1g.1gb", Placement(0, 1)), ("2g.2gb", Placement(2, 2))),
        (("2g.2gb", Placement(0, 2)), ("1g.1gb", Placement(2, 1))),
    }


@pytest.mark.parametrize(
    ("product", "profile", "count"),
    [
        (A100_40, "1g.5gb", 7),
        (A100_40, "1g.10gb", 4),
        (A100_40, "2g.10gb", 3),
        (A100_40, "3g.20gb", 2),
        (A100_40, "7g.40gb", 1),
        (H100, "1g.10gb", 7),
        (H100, "1g.20gb", 4),
        (H100, "1g.10gb+me", 1),
        (A30, "1g.6gb", 4),
        (A30, "2g.12gb", 2),
    ],
)
def test_uniform_is_as_many_as_fit(product: str, profile: str, count: int) -> None:
    assert miggeometry.uniform(_must(product), profile) == {profile: count}


def test_uniform_of_a_profile_the_model_lacks_is_none() -> None:
    assert miggeometry.uniform(_must(H100), "1g.5gb") is None


def test_models_are_looked_up_by_the_base_product_only() -> None:
    assert miggeometry.model(None) is None
    assert miggeometry.model("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb") is None
    assert miggeometry.model("Tesla-T4") is None
    assert miggeometry.model(H100) is miggeometry.model(H100)
    assert hash(_must(H100)) == hash(dataclasses.replace(_must(H100)))


def test_bad_package_data_fails_at_load() -> None:
    raw = {
        "nvmlName": "X",
        "memoryMiB": 1,
        "computeSlices": 7,
        "memorySlices": 8,
        "profiles": {
            "1g.1gb": {
                "giProfileId": 0,
                "computeSlices": 1,
                "memorySlices": 1,
                "memoryMiB": 1,
                "instances": 1,
                "placements": [{"start": 7, "size": 2}],
            }
        },
    }
    with pytest.raises(ValueError, match=r"X-GPU 1g\.1gb: bad placements"):
        miggeometry._parse_model("X-GPU", raw)


# -- exactness: the search against an oracle -------------------------------------------------------


def _fits_oracle(model: GpuModel, layout: dict[str, int]) -> bool:
    """Left to right over the memory slices: each slice is skipped or starts an instance."""
    names = sorted(layout)

    @functools.cache
    def go(position: int, remaining: tuple[int, ...]) -> bool:
        if not any(remaining):
            return True
        if position >= model.memory_slices:
            return False
        if go(position + 1, remaining):
            return True
        for index, name in enumerate(names):
            if remaining[index] == 0:
                continue
            for placement in model.profiles[name].placements:
                if placement.start == position:
                    left = (*remaining[:index], remaining[index] - 1, *remaining[index + 1 :])
                    if go(position + placement.size, left):
                        return True
        return False

    return go(0, tuple(layout[name] for name in names))


@st.composite
def _model_and_layout(draw: st.DrawFn) -> tuple[GpuModel, dict[str, int]]:
    model = draw(st.sampled_from([_must(p) for p in sorted(GUIDE)] + [_go_nvml_model(H100)]))
    names = sorted(model.profiles)
    chosen = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    layout = {n: draw(st.integers(0, model.profiles[n].instances + 1)) for n in chosen}
    return model, layout


@settings(max_examples=400, deadline=None)
@given(_model_and_layout())
def test_layout_error_is_exact(case: tuple[GpuModel, dict[str, int]]) -> None:
    model, layout = case
    within = all(count <= model.profiles[name].instances for name, count in layout.items())
    error = miggeometry.layout_error(model, layout)
    assert (error is None) == (within and _fits_oracle(model, layout)), error
    placed = miggeometry.arrangement(model, layout)
    assert (placed is None) == (error is not None)
    if placed is None:
        return
    counts: dict[str, int] = {}
    used = 0
    for name, placement in placed:
        assert placement in model.profiles[name].placements
        assert used & placement.mask == 0
        used |= placement.mask
        counts[name] = counts.get(name, 0) + 1
    assert counts == {name: count for name, count in layout.items() if count}


def _go_nvml_model(product: str) -> GpuModel:
    """The model with go-nvml's values back where migtables.json corrects them."""
    text = resources.files("gpushare_operator.core.hardware").joinpath("migtables.json").read_text()
    corrections = json.loads(text)["corrections"]
    model = _must(product)
    profiles = dict(model.profiles)
    fields = {"memorySlices": "memory_slices", "placements": "placements"}
    memory_slices = model.memory_slices
    for c in corrections:
        if c["model"] != product or c["field"] not in fields:
            continue
        if c["profile"] is None:
            memory_slices = c["goNvml"]
            continue
        value = c["goNvml"]
        if c["field"] == "placements":
            value = tuple(Placement(p["start"], p["size"]) for p in value)
        profiles[c["profile"]] = dataclasses.replace(
            profiles[c["profile"]], **{fields[c["field"]]: value}
        )
    return dataclasses.replace(
        model, profiles=MappingProxyType(profiles), memory_slices=memory_slices
    )
