"""The Dask cluster a run starts for itself (``--scheduler local``) and the one ``build --augment``
shares: no dashboard (and no warning when another cluster holds its usual port), one cluster for the
images and their variants, and a stopped variant run's hint that repeats ``--scheduler``."""

from __future__ import annotations

import contextlib
import socket
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _augment as aug
import pytest

import dlpack
from dlpack.cli import main

distributed = pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

MakeTree = Callable[..., Path]

#: The port a Dask scheduler's HTTP server takes by default.
DASHBOARD_PORT = 8787


@contextlib.contextmanager
def _port_taken(port: int) -> Iterator[None]:
    """``port`` on the loopback held for the block: by this test, or already by another process."""
    sock = socket.socket()
    try:
        with contextlib.suppress(OSError):  # another cluster has it already: as good
            sock.bind(("127.0.0.1", port))
            sock.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        yield
    finally:
        sock.close()


def test_a_local_cluster_build_starts_no_dashboard_and_warns_of_no_taken_port(
    make_tree: MakeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(4)})
    argv = ["build", str(src), str(tmp_path / "out.zarr"), "--size", "24x16", "--jobs", "1", "--quiet"]
    with _port_taken(DASHBOARD_PORT), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main([*argv, "--scheduler", "local"]) == 0
    said = [str(w.message) for w in caught] + [capsys.readouterr().err]
    assert not [s for s in said if "already in use" in s or "HTTP server" in s], said
    assert len(dlpack.open(tmp_path / "out.zarr")) == 4


class _Counted(distributed.LocalCluster):  # type: ignore[misc]
    """A real LocalCluster that counts the clusters started (in :attr:`started`)."""

    started: list[str] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _Counted.started.append(self.scheduler_address)


def test_build_augment_on_a_local_cluster_starts_one_cluster_for_images_and_variants(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json")
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(6)})
    monkeypatch.setattr(_Counted, "started", [])
    monkeypatch.setattr(distributed, "LocalCluster", _Counted)
    result = dlpack.build(
        src, tmp_path / "out.zarr", augment=2, augment_config=str(config), scheduler="local", jobs=1, quiet=True
    )
    assert result.augment is not None and "2 augmentation variants per image" in result.augment
    with dlpack.open(tmp_path / "out.zarr") as ds:
        assert len(ds) == 6 and ds.variants == 2
    assert len(_Counted.started) == 1, _Counted.started


def test_a_stopped_variant_run_of_a_cluster_build_repeats_its_scheduler(
    make_tree: MakeTree,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dask_cluster: Any,
) -> None:
    import dlpack.variants.run as run

    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json")
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(4)})
    out = tmp_path / "out.zarr"

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "augment_locked", interrupted)
    address = dask_cluster.scheduler_address
    args = ["build", str(src), str(out), "--augment", "2", "--augment-config", str(config), "--quiet"]
    assert main([*args, "--scheduler", address]) == 130
    err = capsys.readouterr().err
    assert f"run dlpack augment {out} --augment 2 --augment-config {config} --scheduler {address} to add" in err
    with dlpack.open(out) as ds:
        assert len(ds) == 4 and ds.variants == 0
