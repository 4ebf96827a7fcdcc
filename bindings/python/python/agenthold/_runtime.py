"""The blocking API: ``Runtime`` and ``Sandbox``. Every call releases the GIL while it waits."""

from __future__ import annotations

import os
import weakref
from types import TracebackType
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union

from . import _native
from ._native import ExecResult, ExecStream, LogEntry, Policy, Secret

#: A path: a string or an ``os.PathLike``.
StrPath = Union[str, "os.PathLike[str]"]

#: The image sandboxes run when none is given (build it with ``agenthold image build-dev``).
DEFAULT_IMAGE = "agenthold/dev:latest"


def _argv(argv: Sequence[str]) -> List[str]:
    if isinstance(argv, (str, bytes)):
        raise TypeError(f"argv must be a list of strings, e.g. ['sh', '-c', {argv!r}], not a single string")
    out = list(argv)
    for a in out:
        if not isinstance(a, str):
            raise TypeError(f"argv items must be strings, got {type(a).__name__}: {a!r}")
    return out


def _env(env: Optional[Mapping[str, str]], what: str = "env") -> Dict[str, str]:
    if env is None:
        return {}
    out = dict(env)
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"{what} maps strings to strings; got {k!r}: {v!r}")
    return out


def _bytes(data: Union[bytes, bytearray, memoryview, str], what: str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, got {type(data).__name__}")


def _connect_to(mapping: Optional[Mapping[str, str]]) -> Dict[str, str]:
    return _env(mapping, "dangerous_connect_to")


def _secrets(secrets: Iterable[Secret]) -> List[Secret]:
    if isinstance(secrets, Secret):
        secrets = [secrets]
    out = list(secrets)
    for s in out:
        if not isinstance(s, Secret):
            raise TypeError(f"secrets must be agenthold.Secret objects, got {type(s).__name__}")
    return out


def _policy(policy: Optional[Policy]) -> Optional[Policy]:
    if policy is not None and not isinstance(policy, Policy):
        raise TypeError(
            "policy must be an agenthold.Policy (Policy.open(), Policy.allowlist([...]), "
            f"Policy.report_only([...])), got {type(policy).__name__}"
        )
    return policy


def _path(path: Union[str, "os.PathLike[str]"]) -> str:
    p = os.fspath(path)
    if not isinstance(p, str):
        raise TypeError("path must be a str")
    return p


class Runtime:
    """An embedded agenthold runtime: the egress gateway and the Docker sandbox runtime, in this process.

    ``data_dir`` holds the store, the master key and the CA (default: ``/var/lib/agenthold`` for root).
    ``dns_upstream`` (``"IP:PORT"``) is the DNS server the gateway forwards allowed queries to (default:
    the host's resolver). ``dangerous_connect_to`` (``{"NAME:PORT": "IP:PORT"}``) and
    ``dangerous_upstream_ca`` (a PEM file path) are for tests only, with the meaning of the ``agenthold run``
    flags of the same names: dial a fixed address for a name even if it is private, and trust an extra CA
    for upstream TLS. ``warm_pool`` (default: ``sandbox.warm_pool`` of the configuration, 0) keeps that many
    sandboxes started ahead of time, with no egress until handed out; ``create_sandbox`` with the default
    image and no ``env``, ``secrets`` or limits takes one, which saves the container start.
    ``store_url`` (default: the configuration's ``store``, the file in ``data_dir``) keeps the state in a
    PostgreSQL database instead: ``"postgres://user@host:5432/database"``, with the password in the
    ``AGENTHOLD_STORE_PASSWORD`` environment variable (a password in the URL works too, and is never shown).
    A database that cannot be reached raises ``EngineError`` naming the URL without its password.

    Use it as a context manager, or call ``close()``: that cancels running commands, stops the gateway and
    joins every thread the runtime started. Sandboxes outlive the runtime (a runtime started later on the
    same ``data_dir`` takes them over); remove them with ``Sandbox.remove()``.
    Raises ``EngineError`` when Docker cannot be reached.
    """

    def __init__(
        self,
        data_dir: Optional[StrPath] = None,
        dns_upstream: Optional[str] = None,
        dangerous_connect_to: Optional[Mapping[str, str]] = None,
        dangerous_upstream_ca: Optional[StrPath] = None,
        warm_pool: Optional[int] = None,
        store_url: Optional[str] = None,
    ) -> None:
        native = _native.Runtime(
            _path(data_dir) if data_dir is not None else None,
            dns_upstream,
            _connect_to(dangerous_connect_to),
            _path(dangerous_upstream_ca) if dangerous_upstream_ca is not None else None,
            warm_pool,
            store_url,
        )
        self._native = native
        # close() at garbage collection and at interpreter exit too, so no thread outlives the runtime.
        self._finalizer = weakref.finalize(self, native.close)

    @property
    def data_dir(self) -> str:
        """The data directory in use."""
        return os.fspath(self._native.data_dir)

    @property
    def ca_pem(self) -> str:
        """The installation's CA certificate (PEM) that sandboxes trust for intercepted hosts."""
        return self._native.ca_pem

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran."""
        return self._native.closed

    @property
    def warm_pool_ready(self) -> int:
        """Warm-pool sandboxes ready to hand out right now (0 without a pool, or after ``close()``)."""
        return self._native.warm_pool_ready

    def close(self) -> None:
        """Cancel running commands, stop the gateway and join the runtime's threads. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<agenthold.Runtime data_dir={self.data_dir!r} {state}>"

    def create_sandbox(
        self,
        image: str = DEFAULT_IMAGE,
        policy: Optional[Policy] = None,
        secrets: Iterable[Secret] = (),
        env: Optional[Mapping[str, str]] = None,
        cpus: Optional[float] = None,
        memory: Optional[int] = None,
        pids: Optional[int] = None,
    ) -> Sandbox:
        """Create and start a sandbox.

        ``policy`` is its network policy (``None``: open). ``secrets`` are injected by the gateway; the
        sandbox sees placeholders (in each secret's ``env`` variable). ``env`` adds environment variables.
        ``cpus`` (cores, fractions allowed), ``memory`` (bytes) and ``pids`` (a count) limit resources;
        ``None`` keeps the runtime's defaults. Raises ``SandboxError`` for a missing image (build
        ``agenthold/dev:latest`` with ``agenthold image build-dev``), ``SecretError`` for conflicting
        secrets, ``EngineError`` when Docker fails.
        """
        agent = self._native.create_sandbox(
            image,
            _policy(policy),
            _secrets(secrets),
            _env(env),
            None if cpus is None else float(cpus),
            None if memory is None else int(memory),
            None if pids is None else int(pids),
        )
        return Sandbox(self, agent)

    def sandbox(self, id: str) -> Sandbox:
        """A handle on an existing sandbox by its id (no call is made)."""
        return Sandbox(self, id)

    def sandboxes(self) -> List[Sandbox]:
        """Every sandbox this runtime knows (including ones a previous runtime on ``data_dir`` created)."""
        return [Sandbox(self, a) for a in self._native.sandboxes()]


class Sandbox:
    """A sandbox: a Docker container whose network goes only through the runtime's egress gateway.

    Get one from ``Runtime.create_sandbox``. As a context manager it removes itself on exit.
    """

    def __init__(self, runtime: Runtime, id: str) -> None:
        self._runtime = runtime
        self._id = id

    @property
    def id(self) -> str:
        """The sandbox's id (its agent id)."""
        return self._id

    @property
    def runtime(self) -> Runtime:
        """The runtime the sandbox belongs to."""
        return self._runtime

    def __repr__(self) -> str:
        return f"<agenthold.Sandbox id={self._id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other._id == self._id and other._runtime is self._runtime

    def __hash__(self) -> int:
        return hash(self._id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._runtime.closed:
            self.remove()

    def exec(
        self,
        argv: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
    ) -> ExecResult:
        """Run a command (``argv``: program and arguments, no shell) and wait for it to finish.

        ``timeout`` (seconds) kills the command and everything it started when it runs longer; the
        result then has ``timed_out`` set and exit code 124. ``env`` adds environment variables, ``cwd``
        sets the working directory (absolute), ``stdin`` is fed to standard input. Ctrl-C (KeyboardInterrupt)
        while waiting kills the command in the sandbox before it propagates. A non-zero exit code is not an
        error: check ``result.exit_code``.
        """
        result: ExecResult = self._runtime._native.exec(
            self._id,
            _argv(argv),
            _env(env),
            cwd,
            None if stdin is None else _bytes(stdin, "stdin"),
            None if timeout is None else float(timeout),
        )
        return result

    def exec_stream(
        self,
        argv: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
    ) -> ExecStream:
        """Start a command and iterate over its output as it comes: ``for stream, data in
        sb.exec_stream([...])`` where ``stream`` is ``"stdout"`` or ``"stderr"``; afterwards the stream's
        ``exit_code`` is set. Arguments as for ``exec``."""
        return self._runtime._native.exec_stream(
            self._id,
            _argv(argv),
            _env(env),
            cwd,
            None if stdin is None else _bytes(stdin, "stdin"),
            None if timeout is None else float(timeout),
        )

    def write_file(self, path: str, data: Union[bytes, str]) -> None:
        """Create or replace the file at ``path`` (absolute) with ``data`` (str is written as UTF-8);
        parent directories are created."""
        self._runtime._native.write_file(self._id, _path(path), _bytes(data, "data"))

    def read_file(self, path: str) -> bytes:
        """The content of the file at ``path`` (absolute). Raises ``SandboxError`` when it does not exist."""
        data: bytes = self._runtime._native.read_file(self._id, _path(path))
        return data

    def set_policy(self, policy: Policy) -> None:
        """Replace the network policy; the next connection and DNS query use it (no restart)."""
        checked = _policy(policy)
        if checked is None:
            raise TypeError("set_policy needs a Policy; use Policy.open() for an open policy")
        self._runtime._native.set_policy(self._id, checked)

    def request_log(self) -> List[LogEntry]:
        """The sandbox's request log, oldest first: every DNS query, connection and HTTP request the
        gateway decided, with ``decision``, ``reason`` and whether a secret was injected."""
        return self._runtime._native.request_log(self._id)

    def state(self) -> str:
        """``"running"`` or ``"stopped"``."""
        state: Tuple[str, str] = self._runtime._native.inspect(self._id)
        return state[0]

    def stop(self) -> None:
        """Stop the sandbox; its files and settings stay."""
        self._runtime._native.stop(self._id)

    def start(self) -> None:
        """Start a stopped sandbox again."""
        self._runtime._native.start(self._id)

    def remove(self) -> None:
        """Remove the sandbox with its network, rules and files. Idempotent."""
        self._runtime._native.remove(self._id)
