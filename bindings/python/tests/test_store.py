"""`Runtime(store_url=...)`: the runtime's state in a real PostgreSQL (Debian's `postgresql`, started here
as an unprivileged user in a temp dir on a loopback port, password authentication), kept across runtimes;
a database that cannot be reached is a clear error naming the URL without the password."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

import agenthold

PG_USER = "agenthold"
PG_PASSWORD = "pytest-pg-password-3b9e"
NOBODY = 65534


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Tuple[str, Path]]:
    """A throwaway PostgreSQL with database `py`: its URL (no password in it) and its binaries' dir."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not bins:
        pytest.fail("PostgreSQL is not installed (make test installs Debian's postgresql)")
    bindir = Path(bins[-1]).parent
    # Straight under /tmp: pytest's own temp dirs are private to root, and the server runs as nobody.
    root = Path(tempfile.mkdtemp(prefix="agenthold-pytest-pg-"))
    data = root / "data"
    data.mkdir()
    pwfile = root / "pwfile"
    pwfile.write_text(PG_PASSWORD)
    as_nobody = {}
    if os.geteuid() == 0:  # initdb and postgres refuse root
        for p in (root, data, pwfile):
            os.chown(p, NOBODY, NOBODY)
        as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    env = dict(os.environ, LC_ALL="C", HOME="/tmp")
    init = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "-A", "scram-sha-256",
                           f"--pwfile={pwfile}", "--no-sync", "--no-instructions"],
                          capture_output=True, text=True, env=env, **as_nobody)
    assert init.returncode == 0, f"initdb failed: {init.stderr}"
    port = _free_port()
    log = open(root / "server.log", "ab")
    server = subprocess.Popen([str(bindir / "postgres"), "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
                               "-k", str(root)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                              start_new_session=True, env=env, **as_nobody)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"]).returncode:
            assert server.poll() is None, (root / "server.log").read_text()
            assert time.monotonic() < deadline, "postgres did not start"
            time.sleep(0.1)
        subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, "py"],
                       check=True, capture_output=True, env=dict(env, PGPASSWORD=PG_PASSWORD))
        yield f"postgres://{PG_USER}@127.0.0.1:{port}/py", bindir
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _psql(url: str, bindir: Path, sql: str) -> str:
    out = subprocess.run([str(bindir / "psql"), url, "-X", "-A", "-t", "-c", sql], check=True,
                         capture_output=True, text=True, env=dict(os.environ, PGPASSWORD=PG_PASSWORD))
    return out.stdout.strip()


# covers: C2
def test_the_state_lives_in_postgres_and_outlives_the_runtime(postgres, tmp_path, monkeypatch) -> None:
    url, bindir = postgres
    monkeypatch.setenv("AGENTHOLD_STORE_PASSWORD", PG_PASSWORD)
    data_dir = tmp_path / "data"
    with agenthold.Runtime(data_dir=data_dir, store_url=url) as rt:
        sb = rt.create_sandbox(env={"WHERE": "postgres"})
        assert sb.exec(["sh", "-c", "echo $WHERE"]).stdout == b"postgres\n"
        ident = sb.id
    try:
        # The agent's record is in the database, not in a file of the data directory.
        assert _psql(url, bindir, f"SELECT count(*) FROM agenthold_kv WHERE tbl = 'agents' AND key = '{ident}'::bytea") == "1"
        assert not (data_dir / "db").exists()
        # A new runtime on the same database takes the sandbox over.
        with agenthold.Runtime(data_dir=data_dir, store_url=url) as rt:
            again = rt.sandbox(ident)
            assert again.exec(["sh", "-c", "echo $WHERE"]).stdout == b"postgres\n"
            again.remove()
    finally:
        with agenthold.Runtime(data_dir=data_dir, store_url=url) as rt:
            for left in rt.sandboxes():
                left.remove()


# covers: C2
def test_an_unreachable_database_names_the_url_not_the_password(tmp_path) -> None:
    port = _free_port()  # nothing listens there
    secret = "py-secret-never-shown-71"
    with pytest.raises(agenthold.Error) as info:
        agenthold.Runtime(data_dir=tmp_path / "data", store_url=f"postgres://agenthold:{secret}@127.0.0.1:{port}/x")
    message = str(info.value)
    assert f"postgres://agenthold:***@127.0.0.1:{port}/x" in message
    assert "cannot be reached" in message
    assert secret not in message
