"""A loopback S3-compatible server for the tests: moto's server mode on 127.0.0.1, started and stopped here.

Every server listens on 127.0.0.1 only, on a free port, and is stopped (terminate, then kill) by the
fixture that started it. Buckets are made with a plain HTTP PUT, so the tests need no AWS SDK of their own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

#: What every test client sends: moto accepts any key unless the server checks credentials.
KEY_ID, SECRET = "dlpack-test-key", "dlpack-test-secret"


def have_s3() -> str | None:
    """Why the object-store tests cannot run here (None: they can)."""
    try:
        import moto.server  # noqa: F401
        import obstore  # noqa: F401
    except ImportError as exc:
        return f"the s3 extra and moto[server] are not installed ({exc.name})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running moto server: its endpoint and process."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)

    def new_bucket(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(*, check_credentials: bool = False) -> Server:
    """Start ``python -m moto.server`` on 127.0.0.1 and wait until it answers (about a second)."""
    port = _free_port()
    env = dict(os.environ)
    if check_credentials:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"  # moto then checks every request's key
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint + "/", timeout=2).close()
            break
        except urllib.error.HTTPError:
            break  # it answers (with auth on, an anonymous listing is refused)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(Exception):
                    proc.kill()
                raise RuntimeError(f"moto server did not start on {endpoint}") from None
            time.sleep(0.1)
    return Server(endpoint, proc)


def client_env(endpoint: str) -> dict[str, str]:
    """The AWS environment a client of ``endpoint`` gets in the tests (no config files read)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


@contextlib.contextmanager
def running_server(**kwargs: bool) -> Iterator[Server]:
    server = start_server(**kwargs)
    try:
        yield server
    finally:
        server.stop()


def skip_without_s3() -> None:
    why = have_s3()
    if why:
        pytest.skip(why)


def upload(local_dir: os.PathLike[str] | str, url: str, threads: int = 8) -> int:
    """PUT every file of the local folder ``local_dir`` (a store dlpack built locally) under ``url``
    (keys relative to the folder); returns how many objects were written."""
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from dlpack.storage.location import Location
    from dlpack.storage.objects import storage_for

    root = Path(local_dir)
    storage = storage_for(Location.parse(url))
    files = sorted(p for p in root.rglob("*") if p.is_file())
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: storage.put(p.relative_to(root).as_posix(), p.read_bytes()), files))
    return len(files)
