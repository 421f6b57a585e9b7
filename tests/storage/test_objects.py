"""The byte-level storage contract, on a local folder and on the loopback S3 server alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlpack.errors import OptionError, StoreError, StoreNotFoundError
from dlpack.storage.location import Location, parse_storage_options
from dlpack.storage.objects import ConditionFailed, StorageAccessError, storage_for


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        return storage_for(Location.parse(tmp_path / "root"))
    s3 = request.getfixturevalue("s3")
    return storage_for(Location.parse(s3.url("root.zarr")))


def test_whole_objects_ranges_and_listing(storage: Any) -> None:
    info = storage.put("a/b.bin", b"0123456789")
    assert info.size == 10 and info.etag
    assert storage.get("a/b.bin") == b"0123456789"
    assert storage.get_range("a/b.bin", 2, 5) == b"234"
    assert storage.get_ranges("a/b.bin", [(0, 2), (8, 10)]) == [b"01", b"89"]
    assert storage.head("a/b.bin").size == 10
    assert storage.head("missing") is None
    storage.put("c.json", b"{}")
    assert sorted(i.key for i in storage.list()) == ["a/b.bin", "c.json"]
    assert [i.key for i in storage.list("a/")] == ["a/b.bin"]
    storage.delete(["a/b.bin", "not-there"])
    assert [i.key for i in storage.list()] == ["c.json"]
    with pytest.raises(StoreNotFoundError):
        storage.get("a/b.bin")


def test_conditional_writes(storage: Any) -> None:
    first = storage.put("lease", b"one", create=True)
    with pytest.raises(ConditionFailed):
        storage.put("lease", b"two", create=True)
    assert storage.get("lease") == b"one"
    second = storage.put("lease", b"three", if_match=first.etag)
    with pytest.raises(ConditionFailed):
        storage.put("lease", b"four", if_match=first.etag)  # that version is gone
    assert storage.get("lease", if_match=second.etag) == b"three"
    with pytest.raises(ConditionFailed):
        storage.get_range("lease", 0, 1, if_match=first.etag)


def test_a_sibling_prefix_is_not_listed(s3: Any) -> None:
    a = storage_for(Location.parse(s3.url("x.zarr")))
    b = storage_for(Location.parse(s3.url("x.zarr2")))
    a.put("zarr.json", b"a")
    b.put("zarr.json", b"b")
    assert [i.key for i in a.list()] == ["zarr.json"]


def test_locations_parse_once() -> None:
    loc = Location.parse("s3://my-bucket//data/x.zarr/")
    assert (loc.url, loc.bucket, loc.key, loc.name, loc.suffix) == (
        "s3://my-bucket/data/x.zarr", "my-bucket", "data/x.zarr", "x.zarr", ".zarr"
    )  # fmt: skip
    assert loc.child("images", "c").url == "s3://my-bucket/data/x.zarr/images/c"
    assert Location.parse("rel/x.zarr").local == Path("rel/x.zarr").absolute()
    with pytest.raises(OptionError, match="gs://"):
        Location.parse("gs://b/x.zarr")
    with pytest.raises(OptionError, match="valid bucket"):
        Location.parse("s3://B/x.zarr")
    with pytest.raises(OptionError, match="not to the local path"):
        Location.parse("x.zarr", {"region": "eu-west-1"})
    with pytest.raises(TypeError):
        Path(loc)  # a URL never becomes a local path


def test_storage_options_are_checked_before_any_request() -> None:
    assert parse_storage_options(["endpoint=http://127.0.0.1:9", "anon=yes"]) == (
        ("anonymous", "true"), ("endpoint_url", "http://127.0.0.1:9")
    )  # fmt: skip
    with pytest.raises(OptionError, match="did you mean retries"):
        parse_storage_options({"retrie": 2})
    with pytest.raises(OptionError, match="KEY=VALUE"):
        parse_storage_options(["region"])
    with pytest.raises(OptionError, match="positive number"):
        parse_storage_options({"timeout": "0"})
    with pytest.raises(OptionError, match="http"):
        parse_storage_options({"endpoint_url": "127.0.0.1:9000"})


def test_secrets_never_in_the_location_text() -> None:
    loc = Location.parse("s3://bkt/x.zarr", {"secret_access_key": "hunter2"})
    assert "hunter2" not in str(loc) and "hunter2" not in repr(storage_for(loc).where())


@pytest.mark.slow
def test_an_unreachable_endpoint_is_named_within_seconds(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from _s3 import _free_port

    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    storage = storage_for(Location.parse(s3.url("x.zarr")))
    t0 = time.monotonic()
    with pytest.raises(StorageAccessError, match="cannot reach the object store at " + dead):
        storage.get("zarr.json")
    assert time.monotonic() - t0 < 20


@pytest.mark.slow
def test_refused_credentials_are_named() -> None:
    from _s3 import client_env, running_server, skip_without_s3

    skip_without_s3()
    with running_server(check_credentials=True) as server:
        loc = Location.parse("s3://some-bucket/x.zarr")
        env = client_env(server.endpoint)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            with pytest.raises(StoreError, match="refused the credentials"):
                storage_for(loc).get("zarr.json")


def test_fetch_returns_the_version_it_read(storage: Any) -> None:
    info = storage.put("s.bin", b"0123456789")
    data, got = storage.fetch("s.bin")
    assert data == b"0123456789" and (got.size, got.etag) == (10, info.etag)
    assert storage.fetch("s.bin", 2, 5)[0] == b"234"
    tail, whole = storage.fetch("s.bin", -3)
    assert tail == b"789" and whole.size == 10  # the object's size, not the range's
    storage.put("s.bin", b"changed!")
    with pytest.raises(ConditionFailed):
        storage.fetch("s.bin", 0, 2, if_match=info.etag)
    with pytest.raises(StoreNotFoundError):
        storage.fetch("gone.bin")


def test_a_timing_in_an_error_text_is_not_taken_for_a_status_code() -> None:
    from dlpack.storage.objects import map_error

    class GenericError(Exception):  # the client's name for "something went wrong", as obstore raises it
        pass

    text = "Generic S3 error: Error performing GET http://127.0.0.1:9/b/k in 354.412783ms, after 3 retries - HTTP error: error sending request"
    err = map_error(GenericError(text), "s3://b/k", "read", "http://127.0.0.1:9", "b")
    assert isinstance(err, StorageAccessError) and not isinstance(err, ConditionFailed)
    refused = map_error(
        GenericError("Server returned non-2xx status code: 412 Precondition Failed"), "s3://b/k", "write", "e", "b"
    )
    assert isinstance(refused, ConditionFailed)
