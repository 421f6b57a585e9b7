"""The manifest: JSON round trip (a Hypothesis property) and refusal of unknown versions."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlpack import FORMAT_VERSION, FormatVersionError, ImageSpec, Manifest, StoreError
from dlpack.errors import InputFileError
from dlpack.manifest import ArraySpec

text = st.text(max_size=12)
json_scalar = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text
json_value = st.recursive(
    json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8
)

image_specs = st.one_of(
    st.builds(
        ImageSpec,
        st.just("fixed"),
        st.sampled_from([1, 3]),
        st.sampled_from(["|u1", "<u2"]),
        st.integers(1, 4096),
        st.integers(1, 4096),
    ),
    st.builds(ImageSpec, st.just("variable"), st.sampled_from([1, 3]), st.sampled_from(["|u1", "<u2"])),
)

manifests = st.builds(
    Manifest,
    count=st.integers(0, 2**40),
    image=image_specs,
    backend=st.sampled_from(["zarr", "hdf5"]),
    classes=st.lists(text, max_size=4).map(tuple),
    labels=st.sampled_from(["folders", "none"]),
    resize=st.dictionaries(text, json_value, max_size=4),
    compression=st.sampled_from(["none", "lz4", "zstd"]),
    shard_rows=st.integers(0, 10**6),
    arrays=st.lists(
        st.builds(
            ArraySpec,
            st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True),
            st.sampled_from(["<i4", "<f8", "|u1", "<u2"]),
            st.lists(st.integers(1, 4096), max_size=3).map(tuple),
            st.booleans(),
            st.none() | text,
            st.sampled_from(["none", "lz4", "zstd"]),
        ),
        max_size=3,
    ).map(lambda specs: {a.name: a for a in specs}),
    skipped=st.lists(st.builds(InputFileError, text, text), max_size=3).map(tuple),
    conversions=st.dictionaries(text, st.integers(0, 10**6), max_size=3),
    plan=st.dictionaries(text, json_value, max_size=4),
    dlpack_version=text,
    task=st.none() | st.sampled_from(["classification", "detection", "segmentation", "anomaly", "none"]),
    mask_ignore=st.none() | st.sampled_from([0, 255, 65535]),
    defects=st.lists(text, max_size=3, unique=True).map(tuple),
    mask_classes=st.lists(st.tuples(st.integers(0, 65535), text), max_size=3, unique_by=lambda p: p[0]).map(tuple),
).map(lambda m: dataclasses.replace(m, class_ids=tuple(range(7, 7 + 3 * len(m.classes), 3))))


@given(manifests)
def test_manifest_round_trips_through_json(m: Manifest) -> None:
    # to_json sorts its keys, so an equal manifest read back also writes the same bytes.
    assert Manifest.from_json(m.to_json()) == m


def _json(**changes: object) -> str:
    d = Manifest(count=1, image=ImageSpec("fixed", 3, "|u1", 2, 2), backend="zarr").to_dict()
    d.update(changes)
    return json.dumps(d)


def test_newer_format_version_is_refused_with_upgrade_hint() -> None:
    with pytest.raises(FormatVersionError, match=r"format version 999.*reads up to 1.*pip install -U"):
        Manifest.from_json(_json(format_version=999), "train.zarr")


def test_current_format_version_is_accepted() -> None:
    assert Manifest.from_json(_json(format_version=FORMAT_VERSION)).format_version == FORMAT_VERSION


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not valid JSON"),
        (_json(format="other"), "not a dlpack manifest"),
        (_json(format_version="1"), "no integer format_version"),
        (_json(image={"layout": "fixed"}), "malformed"),
        (_json(plan=[1, 2]), "malformed"),
    ],
)
def test_broken_manifest_is_a_store_error(text: str, match: str) -> None:
    with pytest.raises(StoreError, match=match):
        Manifest.from_json(text)


def test_a_manifest_without_the_label_fields_reads_with_the_defaults() -> None:
    d = json.loads(_json(classes=["cat", "dog"], labels="folders"))
    assert not {"class_ids", "task", "mask_ignore", "defects", "mask_classes"} & set(d)
    m = Manifest.from_dict(d)
    assert (m.class_ids, m.task, m.mask_ignore, m.defects, m.mask_classes) == ((), None, None, (), ())
    assert m.resolved_class_ids == (0, 1) and m.resolved_task == "classification"
    assert Manifest.from_dict(json.loads(_json())).resolved_task == "none"
    assert "class_ids" not in m.to_dict()  # a store without them keeps its manifest's bytes


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"classes": ["a", "b"], "class_ids": [1]}, "class_ids has 1 ids for 2 classes"),
        ({"classes": ["a", "b"], "class_ids": [4, 4]}, "class_ids must be unique"),
        ({"classes": ["a"], "class_ids": ["1"]}, "class_ids must be integers"),
        ({"classes": ["a"], "class_ids": 1}, "class_ids must be a list"),
        ({"task": "captioning"}, "task must be one of classification, detection"),
        ({"mask_ignore": 70000}, "mask_ignore must be 0..65535"),
        ({"mask_ignore": "255"}, "mask_ignore must be an integer"),
        ({"defects": ["good", "good"]}, "defects must be unique names"),
        ({"mask_classes": [[1, "a"], [1, "b"]]}, "mask_classes ids must be unique"),
        ({"mask_classes": [["1", "a"]]}, r"each mask_classes entry must be \[id, name\]"),
    ],
)
def test_bad_label_fields_are_a_store_error(changes: dict[str, object], match: str) -> None:
    with pytest.raises(StoreError, match=f"malformed: {match}"):
        Manifest.from_json(_json(**changes))
