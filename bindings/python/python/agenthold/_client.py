"""The blocking client of an agenthold server: ``Client`` and ``RemoteSandbox``, the shape of the embedded
``Runtime`` and ``Sandbox`` over the server's HTTP API (``/api/v1``).

    import agenthold

    with agenthold.Client("http://127.0.0.1:8080", token) as rt:  # or agenthold.Runtime()
        with rt.create_sandbox(policy=agenthold.Policy.allowlist(["pypi.org"])) as sb:
            print(sb.exec(["echo", "hi"]).stdout)

Every call is one HTTP request (or a few, for paged lists) with a timeout; errors are ``RemoteError``s that
are also the embedded runtime's classes (``SandboxError``, ``PolicyError``, ``EngineError``).
"""

from __future__ import annotations

import base64
import os
import secrets
import ssl
import urllib.parse
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Type, Union

from ._http import DEFAULT_TIMEOUT, RemotePolicyError, RemoteSandboxError, Transport
from ._native import Policy
from ._runtime import _argv, _bytes, _env, _path
from ._runs import HARNESSES, Run

__all__ = ["Client", "RemoteExecResult", "RemoteSandbox", "Run"]

#: How long an ``exec`` without ``timeout`` may wait for its answer (seconds).
EXEC_WAIT = 3600.0
#: Added to an ``exec``'s ``timeout`` for the HTTP wait: the server answers after killing the command.
EXEC_MARGIN = 30.0

#: A workspace: its id, or a dict with an ``id`` (as ``workspaces()`` and ``create_workspace()`` return).
WorkspaceRef = Union[str, Mapping[str, Any]]
#: A network policy: a ``Policy``, or a dict ``{"mode": "open" | "allowlist", "entries": [...]}``.
PolicyLike = Union[Policy, Mapping[str, Any]]


def _q(segment: str) -> str:
    """A path segment, escaped."""
    return urllib.parse.quote(segment, safe="")


def _ws_id(workspace: WorkspaceRef) -> str:
    if isinstance(workspace, str):
        return workspace
    if isinstance(workspace, Mapping) and isinstance(workspace.get("id"), str):
        return str(workspace["id"])
    raise TypeError(f"workspace must be an id or a dict with an 'id', got {type(workspace).__name__}")


def _policy_body(policy: Optional[PolicyLike], allow: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
    """The JSON of a policy argument; entries are sent as given, so the server checks them."""
    if policy is not None and allow is not None:
        raise TypeError("pass either policy= or allow=, not both")
    if allow is not None:
        if isinstance(allow, (str, bytes)):
            raise TypeError("allow must be a list of entries, e.g. ['github.com'], not a single string")
        return {"mode": "allowlist", "entries": [str(e) for e in allow]}
    if policy is None:
        return None
    if isinstance(policy, Policy):
        return {"mode": policy.mode, "entries": list(policy.entries)}
    if isinstance(policy, Mapping):
        return {"mode": str(policy.get("mode", "allowlist")), "entries": [str(e) for e in policy.get("entries", [])]}
    raise TypeError(
        "policy must be an agenthold.Policy or a dict {'mode': ..., 'entries': [...]}, "
        f"got {type(policy).__name__}"
    )


class RemoteExecResult:
    """The outcome of ``RemoteSandbox.exec``, with the attributes of ``agenthold.ExecResult``:
    ``exit_code``, ``stdout`` and ``stderr`` (bytes), ``timed_out``, ``ok``; plus ``id``, the server's
    exec id."""

    __slots__ = ("_exit_code", "_stdout", "_stderr", "_timed_out", "_id")

    def __init__(self, exit_code: int, stdout: bytes, stderr: bytes, timed_out: bool = False,
                 id: Optional[str] = None) -> None:
        self._exit_code = exit_code
        self._stdout = stdout
        self._stderr = stderr
        self._timed_out = timed_out
        self._id = id

    @property
    def exit_code(self) -> int:
        """Exit code (128 + signal when killed by a signal, 124 on timeout, -1 when unknown)."""
        return self._exit_code

    @property
    def stdout(self) -> bytes:
        """Standard output, byte for byte."""
        return self._stdout

    @property
    def stderr(self) -> bytes:
        """Standard error, byte for byte."""
        return self._stderr

    @property
    def timed_out(self) -> bool:
        """Whether the command outran its timeout and was killed."""
        return self._timed_out

    @property
    def ok(self) -> bool:
        """``exit_code == 0``."""
        return self._exit_code == 0

    @property
    def id(self) -> Optional[str]:
        """The exec's id on the server."""
        return self._id

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RemoteExecResult:
        """From the server's answer: the ``*_b64`` fields when present (exact bytes), else the text ones."""

        def stream(name: str) -> bytes:
            b64 = body.get(f"{name}_b64")
            if isinstance(b64, str):
                return base64.b64decode(b64)
            text = body.get(name)
            return text.encode() if isinstance(text, str) else b""

        code = body.get("exit_code")
        timed_out = bool(body.get("timed_out", False)) or body.get("state") == "timed_out"
        return cls(int(code) if isinstance(code, int) else -1, stream("stdout"), stream("stderr"), timed_out,
                   None if body.get("id") is None else str(body["id"]))

    def __repr__(self) -> str:
        return (f"RemoteExecResult(exit_code={self._exit_code}, stdout=<{len(self._stdout)} bytes>, "
                f"stderr=<{len(self._stderr)} bytes>, timed_out={self._timed_out})")


class Client:
    """A client of an agenthold server, with the shape of ``agenthold.Runtime``: ``create_sandbox``,
    ``sandboxes``, ``sandbox``; plus the server's users and workspaces (``me``, ``workspaces``,
    ``create_workspace``).

    ``url`` is the server (``http://HOST:PORT`` or ``https://…``; default: ``$AGENTHOLD_URL``), ``token`` a
    personal token (``ahp_…``; default: ``$AGENTHOLD_TOKEN``). ``workspace`` is the workspace sandboxes
    are created in and listed from when a call names none (default: the caller's only workspace).
    ``timeout`` (seconds) bounds connecting and each wait for data of every request; ``ssl_context`` checks
    an HTTPS server (default: the system's CAs). The token never appears in a repr or an error.

    The client holds no connection: ``close()`` only refuses further calls. Sandboxes live on the server.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        workspace: Optional[WorkspaceRef] = None,
        timeout: float = DEFAULT_TIMEOUT,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        url = url if url is not None else os.environ.get("AGENTHOLD_URL")
        token = token if token is not None else os.environ.get("AGENTHOLD_TOKEN")
        if url is None:
            raise ValueError("no server: pass url= or set AGENTHOLD_URL")
        if token is None:
            raise ValueError("no token: pass token= or set AGENTHOLD_TOKEN")
        self._http = Transport(url, token, timeout, ssl_context)
        self._workspace = None if workspace is None else _ws_id(workspace)
        self._closed = False

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._http.url

    @property
    def workspace(self) -> Optional[str]:
        """The default workspace's id, once given or found."""
        return self._workspace

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran."""
        return self._closed

    def close(self) -> None:
        """Refuse further calls (the client holds no connection). Idempotent."""
        self._closed = True

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<agenthold.Client url={self.url!r} {'closed' if self._closed else 'open'}>"

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._closed:
            raise RemoteSandboxError("the client is closed", code="closed", method=method, path=path)
        return self._http.json(method, "/api/v1" + path, **kwargs)

    def _raw(self, method: str, path: str, **kwargs: Any) -> bytes:
        if self._closed:
            raise RemoteSandboxError("the client is closed", code="closed", method=method, path=path)
        return self._http.request(method, "/api/v1" + path, **kwargs)[2]

    def _resolve(self, workspace: Optional[WorkspaceRef]) -> str:
        """The workspace a call acts in: the one given, the client's, or the caller's only one."""
        if workspace is not None:
            return _ws_id(workspace)
        if self._workspace is None:
            mine = self.me().get("workspaces") or []
            if len(mine) != 1:
                raise ValueError(
                    f"this user is a member of {len(mine)} workspaces: pass workspace= (or "
                    "agenthold.Client(..., workspace=...))"
                    + ("; create one with client.create_workspace(name)" if not mine else "")
                )
            self._workspace = str(mine[0]["id"])
        return self._workspace

    def _pages(self, path: str, query: Optional[Dict[str, Any]] = None, **kwargs: Any) -> List[Dict[str, Any]]:
        """Every item of a paged list (``{items, next_cursor}``)."""
        items: List[Dict[str, Any]] = []
        query = dict(query or {})
        seen: Set[str] = set()
        while True:
            page = self._call("GET", path, query=query, **kwargs)
            items.extend(page.get("items") or [])
            cursor = page.get("next_cursor")
            if not cursor or cursor in seen:
                return items
            seen.add(cursor)
            query["cursor"] = cursor

    def me(self) -> Dict[str, Any]:
        """The caller: ``{id, name, email, provider, credential, workspaces: [{id, name, role}]}``."""
        me: Dict[str, Any] = self._call("GET", "/me")
        return me

    def workspaces(self) -> List[Dict[str, Any]]:
        """The caller's workspaces: ``[{id, name, created_at, role}]``."""
        return list(self._call("GET", "/workspaces").get("items") or [])

    def create_workspace(self, name: str) -> Dict[str, Any]:
        """Create a workspace (the caller becomes its owner): ``{id, name, created_at, role}``."""
        ws: Dict[str, Any] = self._call("POST", "/workspaces", json_body={"name": name})
        return ws

    def run(
        self,
        workspace: Optional[WorkspaceRef],
        agent: Union[str, RemoteSandbox],
        harness: str,
        prompt: str,
        argv: Optional[Sequence[str]] = None,
        *,
        resume: Optional[str] = None,
        model: Optional[str] = None,
    ) -> Run:
        """Start a harness run in an agent and answer the ``Run`` at once (iterate it for its events).

        ``workspace`` (``None``: the client's), ``agent`` (its id or a ``RemoteSandbox``), ``harness``
        (``"claude"``, ``"codex"`` or ``"custom"``), ``prompt`` (at most 256 KiB; the harness reads it on
        standard input), ``argv`` (the command, for ``custom`` only), ``resume`` (a session id of an earlier
        run), ``model``. Raises ``SandboxError`` for bad input (400), a prompt over 256 KiB (413,
        ``code == "prompt_too_large"``), an agent that does not run (409); ``agenthold.Error`` without the
        operator role (403)."""
        if harness not in HARNESSES:
            raise ValueError(f"harness must be one of {', '.join(HARNESSES)}, got {harness!r}")
        if not isinstance(prompt, str):
            raise TypeError("prompt must be a str")
        agent_id = agent.id if isinstance(agent, RemoteSandbox) else str(agent)
        if workspace is None and isinstance(agent, RemoteSandbox) and agent.workspace is not None:
            workspace = agent.workspace
        ws = self._resolve(workspace)
        body: Dict[str, Any] = {"harness": harness, "prompt": prompt}
        if argv is not None:
            body["argv"] = _argv(argv)
        if resume is not None:
            body["resume"] = resume
        if model is not None:
            body["model"] = model
        info = self._call("POST", f"/workspaces/{_q(ws)}/agents/{_q(agent_id)}/runs", json_body=body,
                          timeout=max(self._http.timeout, 60.0))
        return Run(self, ws, agent_id, info)

    def runs(self, workspace: Optional[WorkspaceRef], agent: Union[str, RemoteSandbox]) -> List[Run]:
        """The runs of an agent, newest first."""
        agent_id = agent.id if isinstance(agent, RemoteSandbox) else str(agent)
        ws = self._resolve(workspace)
        items = self._pages(f"/workspaces/{_q(ws)}/agents/{_q(agent_id)}/runs", {"limit": 500})
        return [Run(self, ws, agent_id, item) for item in items]

    def create_sandbox(
        self,
        image: Optional[str] = None,
        policy: Optional[PolicyLike] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cpus: Optional[float] = None,
        memory: Optional[Union[int, str]] = None,
        pids: Optional[int] = None,
        workspace: Optional[WorkspaceRef] = None,
        name: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> RemoteSandbox:
        """Create and start a sandbox (an agent) on the server; the caller becomes its admin.

        As ``Runtime.create_sandbox``: ``image`` (default: the server's ``sandbox.image``), ``policy``
        (``None``: open), ``env``, ``cpus``, ``memory`` (bytes, or ``"512m"``), ``pids``. ``allow=[...]`` is
        an allowlist given as entries, checked by the server. ``workspace`` (default: the client's),
        ``name`` (unique in the workspace; default: a random ``sb-…``), ``labels`` for filtering.
        Raises ``SandboxError`` (400 bad input, including a policy entry the server refuses; 409 name
        taken; 404 unknown workspace).
        """
        ws = self._resolve(workspace)
        body: Dict[str, Any] = {"name": name if name is not None else "sb-" + secrets.token_hex(4)}
        if image is not None:
            body["image"] = image
        policy_json = _policy_body(policy, allow)
        if policy_json is not None:
            body["policy"] = policy_json
        if env:
            body["env"] = _env(env)
        if cpus is not None:
            body["cpus"] = float(cpus)
        if memory is not None:
            body["memory"] = memory if isinstance(memory, str) else int(memory)
        if pids is not None:
            body["pids"] = int(pids)
        if labels:
            body["labels"] = _env(labels, "labels")
        view = self._call("POST", f"/workspaces/{_q(ws)}/agents", json_body=body,
                          timeout=max(self._http.timeout, 120.0))
        return RemoteSandbox(self, ws, str(view["id"]), view)

    def sandbox(self, id: str, workspace: Optional[WorkspaceRef] = None) -> RemoteSandbox:
        """A handle on an existing sandbox by its id (no call is made; without ``workspace``, the default
        workspace is found at the handle's first call)."""
        return RemoteSandbox(self, None if workspace is None else _ws_id(workspace), id)

    def sandboxes(self, workspace: Optional[WorkspaceRef] = None) -> List[RemoteSandbox]:
        """The sandboxes of a workspace the caller may see (default: the client's workspace)."""
        ws = self._resolve(workspace)
        return [RemoteSandbox(self, ws, str(v["id"]), v)
                for v in self._pages(f"/workspaces/{_q(ws)}/agents", {"limit": 500})]


class RemoteSandbox:
    """A sandbox on an agenthold server, with the shape of ``agenthold.Sandbox``: ``exec``, ``read_file``,
    ``write_file``, ``set_policy``, ``request_log``, ``state``, ``stop``, ``start``, ``remove``; plus
    ``policy``, ``list_files``, ``delete_file`` and ``refresh``. As a context manager it removes itself on
    exit."""

    def __init__(self, client: Client, workspace: Optional[str], id: str,
                 info: Optional[Mapping[str, Any]] = None) -> None:
        self._client = client
        self._workspace = workspace
        self._id = id
        self._info: Dict[str, Any] = dict(info or {})

    @property
    def id(self) -> str:
        """The sandbox's id (its agent id)."""
        return self._id

    @property
    def workspace(self) -> Optional[str]:
        """The id of its workspace (``None`` for a handle from ``Client.sandbox(id)`` before its first call)."""
        return self._workspace

    @property
    def client(self) -> Client:
        """The client the handle calls through."""
        return self._client

    @property
    def name(self) -> Optional[str]:
        """Its name, when known (from creation, a list or ``refresh()``)."""
        name = self._info.get("name")
        return None if name is None else str(name)

    @property
    def info(self) -> Dict[str, Any]:
        """The agent as the server last described it (``{id, name, state, labels, role, …}``)."""
        return dict(self._info)

    @property
    def _base(self) -> str:
        if self._workspace is None:
            self._workspace = self._client._resolve(None)
        return f"/workspaces/{_q(self._workspace)}/agents/{_q(self._id)}"

    def __repr__(self) -> str:
        return f"<agenthold.RemoteSandbox id={self._id!r} workspace={self._workspace!r}>"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RemoteSandbox) and other._id == self._id
                and other._workspace == self._workspace and other._client is self._client)

    def __hash__(self) -> int:
        return hash(self._id)

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._client.closed:
            self.remove()

    def exec(
        self,
        argv: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> RemoteExecResult:
        """Run a command (``argv``: program and arguments, no shell) and wait for it, as
        ``Sandbox.exec``: ``timeout`` (seconds) kills it and everything it started when it runs longer,
        ``env`` adds variables, ``cwd`` sets the working directory. A non-zero exit code is not an error.
        Without ``timeout`` the client waits up to an hour for the answer."""
        body: Dict[str, Any] = {"argv": _argv(argv)}
        if timeout is not None:
            # Whole seconds go as an integer, which a server reading integral seconds accepts too.
            seconds = float(timeout)
            body["timeout"] = int(seconds) if seconds.is_integer() else seconds
        if env:
            body["env"] = _env(env)
        if cwd is not None:
            body["cwd"] = cwd
        wait = EXEC_WAIT if timeout is None else float(timeout) + EXEC_MARGIN
        answer = self._client._call("POST", f"{self._base}/execs", json_body=body, timeout=wait)
        return RemoteExecResult.from_json(answer)

    def write_file(self, path: str, data: Union[bytes, str]) -> None:
        """Create or replace the file at ``path`` (absolute) with ``data`` (str is written as UTF-8)."""
        self._client._raw("PUT", f"{self._base}/files/content", query={"path": _path(path)},
                          data=_bytes(data, "data"), content_type="application/octet-stream")

    def read_file(self, path: str) -> bytes:
        """The content of the file at ``path`` (absolute). Raises ``SandboxError`` when it does not exist."""
        return self._client._raw("GET", f"{self._base}/files/content", query={"path": _path(path)},
                                 accept="application/octet-stream")

    def list_files(self, path: str) -> List[Dict[str, Any]]:
        """The entries of the directory at ``path`` (absolute), as the server describes them."""
        answer = self._client._call("GET", f"{self._base}/files", query={"path": _path(path)})
        return list(answer.get("items") or []) if isinstance(answer, dict) else list(answer or [])

    def delete_file(self, path: str) -> None:
        """Delete the file or directory at ``path`` (absolute)."""
        self._client._call("DELETE", f"{self._base}/files", query={"path": _path(path)})

    def set_policy(self, policy: Optional[PolicyLike] = None, *, allow: Optional[Sequence[str]] = None) -> None:
        """Replace the network policy; the next connection and DNS query use it (no restart). ``policy`` is a
        ``Policy`` or ``{"mode", "entries"}``; ``allow=[...]`` an allowlist. Raises ``PolicyError`` for an
        entry the server refuses."""
        body = _policy_body(policy, allow)
        if body is None:
            raise TypeError("set_policy needs a policy; use Policy.open() for an open policy")
        self._client._call("PUT", f"{self._base}/network-policy", json_body=body, bad_request=RemotePolicyError)

    def policy(self) -> Dict[str, Any]:
        """The network policy in force: ``{"mode": "open" | "allowlist", "entries": [...]}``."""
        policy: Dict[str, Any] = self._client._call("GET", f"{self._base}/network-policy")
        return policy

    def request_log(self) -> List[Dict[str, Any]]:
        """The sandbox's request log, oldest first: dicts with the fields of ``LogEntry.to_dict()`` (time,
        kind, host, port, method, path, status, decision, reason, secret_injected, secret, …)."""
        items = self._client._pages(f"{self._base}/requests")
        if all(isinstance(e.get("seq"), int) for e in items):
            items.sort(key=lambda e: int(e["seq"]))
        return items

    def refresh(self) -> Dict[str, Any]:
        """Ask the server for the agent (``{id, name, state, image, policy, …}``) and remember it."""
        self._info = dict(self._client._call("GET", self._base))
        return dict(self._info)

    def state(self) -> str:
        """``"running"`` or ``"stopped"`` (or ``"missing"`` when the server lost the container)."""
        return str(self.refresh().get("state"))

    @property
    def _slow(self) -> float:
        """The wait for calls that start or stop containers."""
        return max(self._client._http.timeout, 60.0)

    def stop(self) -> None:
        """Stop the sandbox; its files and settings stay."""
        self._info = dict(self._client._call("POST", f"{self._base}/stop", timeout=self._slow))

    def start(self) -> None:
        """Start a stopped sandbox again."""
        self._info = dict(self._client._call("POST", f"{self._base}/start", timeout=self._slow))

    def remove(self) -> None:
        """Remove the sandbox with its network, rules and files. Idempotent (a sandbox that is already
        gone, or that the caller may no longer see, is not an error)."""
        try:
            self._client._call("DELETE", self._base, timeout=self._slow)
        except RemoteSandboxError as e:
            if e.status != 404:
                raise
