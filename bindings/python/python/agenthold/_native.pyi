"""Type stubs of the native module ``agenthold._native`` (Rust, pyo3). Public names are re-exported by
``agenthold``; ``Runtime`` and ``Op`` here are internal (use ``agenthold.Runtime``)."""

from os import PathLike
from typing import Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Union, final

__version__: str

class Error(Exception):
    """Base class of every error agenthold raises. Catch this to handle them all."""

class PolicyError(Error):
    """A network policy is invalid: an allowlist entry that does not parse."""

class SecretError(Error):
    """A secret is invalid: bad name, environment variable, host, header, template or preset."""

class SandboxError(Error):
    """A sandbox operation failed for a reason on the caller's side: unknown sandbox, missing image,
    missing file, bad path or command, or a runtime that was closed."""

class EngineError(Error):
    """The container engine (Docker) or the egress gateway failed, or cannot be reached."""

@final
class Policy:
    """A network policy: which destinations a sandbox may reach.

    Entries: ``github.com`` (ports 80 and 443), ``*.npmjs.org`` (subdomains only), ``github.com:22``,
    ``registry.example.com:*`` (any port), ``203.0.113.0/24:443``. Under an allowlist, DNS queries for
    names no entry covers get NXDOMAIN. Private, loopback and metadata addresses are never reachable.
    """

    @staticmethod
    def open() -> Policy:
        """Any public destination (the default)."""
    @staticmethod
    def allowlist(entries: Sequence[str]) -> Policy:
        """Only the destinations the entries cover. Raises ``PolicyError`` for an entry that does not parse."""
    @staticmethod
    def report_only(entries: Sequence[str]) -> Policy:
        """Like an allowlist, but only logs what it would deny (``reason`` starts with ``report_only:``)."""
    @property
    def mode(self) -> Literal["open", "allowlist", "report_only"]:
        """The policy's mode."""
    @property
    def entries(self) -> List[str]:
        """The entries as given."""
    def __eq__(self, other: object) -> bool: ...

@final
class Secret:
    """A secret the gateway injects as ``header: template`` on HTTPS requests to ``hosts``; the sandbox
    sees only a placeholder (in the environment variable ``env``). Defaults: ``header="Authorization"``,
    ``template="Bearer {{.Value}}"``. The value cannot be read back. Raises ``SecretError`` when invalid.
    """

    def __init__(
        self,
        name: str,
        value: str,
        env: Optional[str] = None,
        hosts: Sequence[str] = (),
        header: Optional[str] = None,
        template: Optional[str] = None,
        also_in: Optional[Mapping[str, Sequence[str]]] = None,
    ) -> None:
        """``also_in={"headers": [...], "query": [...]}``: further headers and query parameters whose
        placeholder is replaced by the value. A placeholder anywhere else in a request to ``hosts`` is
        refused with 403 (``placeholder_misplaced``), and answers from ``hosts`` are scrubbed of the value."""
    @staticmethod
    def preset(preset: str, value: str, env: Optional[str] = None) -> Secret:
        """A secret with a provider's rules: ``anthropic``, ``openai``, ``github``, ``gitlab``, ``openrouter``."""
    @property
    def name(self) -> str:
        """The secret's name (unique per sandbox)."""
    @property
    def env(self) -> Optional[str]:
        """The environment variable holding the placeholder in the sandbox."""
    @property
    def hosts(self) -> List[str]:
        """The hosts the value may be sent to."""
    @property
    def header(self) -> Optional[str]:
        """The header set (``None``: the default ``Authorization``, or a preset's)."""
    @property
    def template(self) -> Optional[str]:
        """The header template (``None``: the default ``Bearer {{.Value}}``, or a preset's)."""
    @property
    def preset_name(self) -> Optional[str]:
        """The preset's name for ``Secret.preset(...)``."""

@final
class ExecResult:
    """The outcome of ``Sandbox.exec``."""

    @property
    def exit_code(self) -> int:
        """Exit code (128 + signal when killed by a signal, 124 on timeout, -1 when unknown)."""
    @property
    def stdout(self) -> bytes:
        """Standard output (capped at 64 MiB)."""
    @property
    def stderr(self) -> bytes:
        """Standard error (capped at 64 MiB)."""
    @property
    def timed_out(self) -> bool:
        """Whether the command outran its timeout and was killed."""
    @property
    def ok(self) -> bool:
        """``exit_code == 0``."""

@final
class LogEntry:
    """One line of a sandbox's request log (the fields of ``agenthold run --log``)."""

    @property
    def time(self) -> str:
        """When the decision was made, RFC 3339 in UTC."""
    @property
    def agent(self) -> str:
        """The sandbox's id."""
    @property
    def kind(self) -> Literal["dns", "tcp", "tls", "http", "connect"]:
        """What was logged."""
    @property
    def host(self) -> Optional[str]:
        """Host name (or address)."""
    @property
    def port(self) -> Optional[int]:
        """Destination port."""
    @property
    def method(self) -> Optional[str]:
        """HTTP method, or the DNS query type."""
    @property
    def path(self) -> Optional[str]:
        """HTTP path without the query string."""
    @property
    def status(self) -> Optional[int]:
        """HTTP status, or the DNS response code."""
    @property
    def decision(self) -> Literal["allowed", "denied"]:
        """Whether the traffic was let through."""
    @property
    def reason(self) -> Optional[str]:
        """Why it was denied (or would have been), or what failed upstream."""
    @property
    def secret_injected(self) -> bool:
        """Whether a secret was injected."""
    @property
    def secret(self) -> Optional[str]:
        """Name of the injected secret (never its value)."""
    @property
    def bytes_up(self) -> int:
        """Bytes from the sandbox towards the upstream."""
    @property
    def bytes_down(self) -> int:
        """Bytes from the upstream towards the sandbox."""
    @property
    def phase(self) -> Optional[Literal["open", "closed"]]:
        """For long-lived connections: ``"open"`` (written when it opened) or ``"closed"`` (with its bytes);
        ``None`` for one-shot entries."""
    def to_dict(self) -> Dict[str, Any]:
        """The entry as a dict with the JSON line's keys."""

@final
class ExecStream:
    """A running command's output: iterate for ``(stream, data)`` tuples; then ``exit_code`` is set."""

    def __iter__(self) -> Iterator[Tuple[Literal["stdout", "stderr"], bytes]]: ...
    def __next__(self) -> Tuple[Literal["stdout", "stderr"], bytes]: ...
    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the output is exhausted, else ``None``."""
    def cancel(self) -> None:
        """Kill the command in the sandbox."""

Done = Callable[[bool, Any], None]

@final
class Op:
    """A running asyncio operation (internal)."""

    def cancel(self) -> None:
        """Cancel it; a running command is killed in the sandbox."""

@final
class Runtime:
    """The native runtime behind ``agenthold.Runtime`` (internal)."""

    def __init__(
        self,
        data_dir: Optional[Union[str, PathLike[str]]] = None,
        dns_upstream: Optional[str] = None,
        dangerous_connect_to: Dict[str, str] = ...,
        dangerous_upstream_ca: Optional[Union[str, PathLike[str]]] = None,
        warm_pool: Optional[int] = None,
        store_url: Optional[str] = None,
    ) -> None: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def ca_pem(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def warm_pool_ready(self) -> int: ...
    def close(self) -> None: ...
    def create_sandbox(
        self,
        image: str,
        policy: Optional[Policy],
        secrets: Sequence[Secret],
        env: Dict[str, str],
        cpus: Optional[float],
        memory: Optional[int],
        pids: Optional[int],
        done: Optional[Done] = None,
    ) -> Any: ...
    def exec(
        self,
        agent: str,
        argv: List[str],
        env: Dict[str, str],
        cwd: Optional[str],
        stdin: Optional[bytes],
        timeout: Optional[float],
        done: Optional[Done] = None,
    ) -> Any: ...
    def exec_stream(
        self,
        agent: str,
        argv: List[str],
        env: Dict[str, str],
        cwd: Optional[str],
        stdin: Optional[bytes],
        timeout: Optional[float],
    ) -> ExecStream: ...
    def read_file(self, agent: str, path: str, done: Optional[Done] = None) -> Any: ...
    def write_file(self, agent: str, path: str, data: bytes, done: Optional[Done] = None) -> Any: ...
    def set_policy(self, agent: str, policy: Policy, done: Optional[Done] = None) -> Any: ...
    def request_log(self, agent: str) -> List[LogEntry]: ...
    def stop(self, agent: str, done: Optional[Done] = None) -> Any: ...
    def start(self, agent: str, done: Optional[Done] = None) -> Any: ...
    def remove(self, agent: str, done: Optional[Done] = None) -> Any: ...
    def inspect(self, agent: str, done: Optional[Done] = None) -> Any: ...
    def sandboxes(self, done: Optional[Done] = None) -> Any: ...
