"""HTTP for ``agenthold.Client``: one request per connection (``http.client``), a timeout on every
request, the server's ``application/problem+json`` answers turned into the package's exceptions, and a
way for another thread to abort a request that is waiting (``Abort``). Standard library only.

The token is sent as ``Authorization: Bearer`` and kept in one private attribute: it is never part of a
repr, an exception message or an exception's attributes. Redirects are not followed (a redirect could
carry the header elsewhere): a 3xx answer is an error.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Type

from ._native import EngineError, Error, PolicyError, SandboxError

#: Seconds to wait to connect, and for each piece of an answer, unless a call says otherwise.
DEFAULT_TIMEOUT = 30.0

#: Largest answer body read (exec output is capped at 64 MiB per stream by the server; base64 and JSON
#: escaping make its JSON larger).
MAX_BODY = 512 * 1024 * 1024

#: Longest line of an event stream read (a run's events stay far below).
MAX_EVENT_LINE = 64 * 1024 * 1024


class RemoteError(Error):
    """An error from an agenthold server (``agenthold.Client``): an error answer, or no answer at all.

    Every such error is also an instance of the class the embedded runtime raises for the same cause:
    ``SandboxError`` for 400, 404, 409, 413 and 503 (``PolicyError`` for a policy ``set_policy`` sent that
    the server refused),
    ``EngineError`` for 5xx and for a server that cannot be reached or answers too slowly, and plain
    ``agenthold.Error`` for 401, 403 and 429. Attributes: ``status`` (the HTTP status; ``None`` without an
    answer), ``code`` (the problem's machine-readable code, such as ``not_found``, ``bad_request``,
    ``forbidden``; ``unreachable`` or ``timeout`` without an answer), ``detail`` (the server's explanation),
    ``method`` and ``path`` (the request, without the query string), ``retry_after`` (seconds, on 429).
    """

    def __init__(
        self,
        detail: str,
        *,
        status: Optional[int] = None,
        code: str = "",
        method: str = "",
        path: str = "",
        retry_after: Optional[float] = None,
    ) -> None:
        where = f" ({method} {path})" if method else ""
        head = f"{status} {code}" if status is not None else code
        super().__init__(f"{head}: {detail}{where}" if head else f"{detail}{where}")
        self.status = status
        self.code = code
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after = retry_after


class RemoteSandboxError(RemoteError, SandboxError):
    """A ``RemoteError`` on the caller's side: bad input, an unknown or hidden sandbox (404), a conflict."""


class RemotePolicyError(RemoteError, PolicyError):
    """A ``RemoteError`` for a network policy the server refused (400 with the entry named in ``detail``)."""


class RemoteEngineError(RemoteError, EngineError):
    """A ``RemoteError`` on the server's side (5xx), or a server that cannot be reached or is too slow."""


for _cls in (RemoteError, RemoteSandboxError, RemotePolicyError, RemoteEngineError):
    _cls.__module__ = "agenthold"


def error_class(status: int, bad_request: Type[RemoteError] = RemoteSandboxError) -> Type[RemoteError]:
    """The exception class of an error answer with ``status`` (``bad_request`` for 400)."""
    if status == 400:
        return bad_request
    if status in (404, 405, 409, 410, 413, 415, 422, 503):
        return RemoteSandboxError
    if status >= 500:
        return RemoteEngineError
    return RemoteError


class Abort:
    """Lets another thread abort a request that is waiting: ``abort()`` shuts its socket down, so the
    waiting call fails at once instead of after its timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None
        self.aborted = False

    def attach(self, conn: Optional[http.client.HTTPConnection]) -> None:
        with self._lock:
            self._conn = conn
            if conn is not None and self.aborted:
                _shutdown(conn)

    def abort(self) -> None:
        """Abort the request (idempotent; harmless after it finished)."""
        with self._lock:
            self.aborted = True
            if self._conn is not None:
                _shutdown(self._conn)


def _shutdown(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


_local = threading.local()


def set_thread_abort(abort: Optional[Abort]) -> None:
    """Make ``abort`` the ``Abort`` of every request this thread sends (``None``: none); the asyncio client
    sets it on the short-lived thread that runs one call."""
    _local.abort = abort


class Transport:
    """Requests to one server with one token."""

    def __init__(self, url: str, token: str, timeout: float, ssl_context: Optional[ssl.SSLContext]) -> None:
        if not isinstance(url, str):
            raise TypeError("url must be a string such as 'https://agenthold.example.com'")
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http://HOST[:PORT] or https://HOST[:PORT], got {url!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError("url must not carry credentials: pass the token as `token`")
        if parts.query or parts.fragment:
            raise ValueError("url must not have a query or fragment")
        if not isinstance(token, str) or not token:
            raise ValueError("token must be a non-empty string (a personal token, `ahp_…`)")
        if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in token) or not token.isascii():
            raise ValueError("token contains whitespace or characters a token never has (it is not shown)")
        if not (timeout > 0):
            raise ValueError("timeout must be a positive number of seconds")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.base_path = parts.path.rstrip("/")
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        self.url = f"{parts.scheme}://{netloc}{'' if parts.port is None else f':{parts.port}'}{self.base_path}"
        self.timeout = float(timeout)
        self._ssl = ssl_context if ssl_context is not None else (
            ssl.create_default_context() if parts.scheme == "https" else None
        )
        self.__token = token

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        json_body: Any = None,
        data: Optional[bytes] = None,
        content_type: Optional[str] = None,
        accept: str = "application/json",
        timeout: Optional[float] = None,
        bad_request: Type[RemoteError] = RemoteSandboxError,
        abort: Optional[Abort] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        """Send a request; answer ``(status, headers, body)`` for a 2xx, raise a ``RemoteError`` otherwise.

        ``path`` starts with ``/api/v1``; ``query`` values that are ``None`` are left out. ``timeout``
        (default: the client's) bounds connecting and each wait for data.
        """
        if abort is None:
            abort = getattr(_local, "abort", None)
        target = self.base_path + path
        if query:
            pairs = {k: str(v) for k, v in query.items() if v is not None}
            if pairs:
                target += "?" + urllib.parse.urlencode(pairs)
        headers = {
            "Authorization": "Bearer " + self.__token,
            "Accept": accept,
            "User-Agent": "agenthold-python",
        }
        body: Optional[bytes] = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            body = data
            headers["Content-Type"] = content_type or "application/octet-stream"
        wait = self.timeout if timeout is None else float(timeout)
        if abort is not None and abort.aborted:
            raise RemoteEngineError("the request was cancelled", code="cancelled", method=method, path=path)
        conn = self._connection(wait)
        try:
            try:
                conn.connect()
                if abort is not None:
                    # After connecting: an abort that came while connecting shuts the socket down here.
                    abort.attach(conn)
                conn.request(method, target, body=body, headers=headers)
                response = conn.getresponse()
                raw = response.read(MAX_BODY + 1)
            except (socket.timeout, TimeoutError) as e:
                raise RemoteEngineError(
                    f"no answer from {self.url} within {wait:g} s", code="timeout", method=method, path=path
                ) from e
            except (OSError, http.client.HTTPException) as e:
                if abort is not None and abort.aborted:
                    raise RemoteEngineError("the request was cancelled", code="cancelled", method=method,
                                            path=path) from None
                raise RemoteEngineError(
                    f"cannot reach {self.url}: {e}", code="unreachable", method=method, path=path
                ) from e
        finally:
            if abort is not None:
                abort.attach(None)
            conn.close()
        if len(raw) > MAX_BODY:
            raise RemoteEngineError(f"the answer is larger than {MAX_BODY} bytes", code="too_large",
                                    status=response.status, method=method, path=path)
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        if 200 <= response.status < 300:
            return response.status, answer_headers, raw
        raise _problem(response.status, answer_headers, raw, method, path, bad_request)

    def stream(
        self,
        path: str,
        *,
        last_event_id: Optional[str] = None,
        timeout: Optional[float] = None,
        abort: Optional[Abort] = None,
    ) -> Iterator[Tuple[str, str, str]]:
        """``GET path`` as a server-sent event stream: yields ``(id, event, data)`` until the server ends
        the stream. An error answer raises a ``RemoteError``; a broken connection or a silence longer than
        ``timeout`` raises ``RemoteEngineError`` (code ``unreachable`` or ``timeout``)."""
        if abort is None:
            abort = getattr(_local, "abort", None)
        headers = {
            "Authorization": "Bearer " + self.__token,
            "Accept": "text/event-stream",
            "User-Agent": "agenthold-python",
        }
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        wait = self.timeout if timeout is None else float(timeout)
        if abort is not None and abort.aborted:
            raise RemoteEngineError("the request was cancelled", code="cancelled", method="GET", path=path)
        conn = self._connection(wait)

        def broken(e: BaseException) -> RemoteError:
            if abort is not None and abort.aborted:
                return RemoteEngineError("the request was cancelled", code="cancelled", method="GET", path=path)
            if isinstance(e, (socket.timeout, TimeoutError)):
                return RemoteEngineError(f"no event from {self.url} within {wait:g} s", code="timeout",
                                         method="GET", path=path)
            return RemoteEngineError(f"cannot reach {self.url}: {e}", code="unreachable", method="GET", path=path)

        try:
            try:
                conn.connect()
                if abort is not None:
                    abort.attach(conn)
                conn.request("GET", self.base_path + path, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise broken(e) from e
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
            if not 200 <= response.status < 300:
                raise _problem(response.status, answer_headers, response.read(MAX_BODY), "GET", path,
                               RemoteSandboxError)
            event_id, event, data = "", "", []
            while True:
                try:
                    raw = response.readline(MAX_EVENT_LINE + 1)
                except (OSError, http.client.HTTPException) as e:
                    raise broken(e) from e
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line:
                    if data:
                        yield event_id, event or "message", "\n".join(data)
                    event, data = "", []
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "id":
                    event_id = value
                elif name == "event":
                    event = value
                elif name == "data":
                    data.append(value)
        finally:
            if abort is not None:
                abort.attach(None)
            conn.close()

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """``request`` with a JSON answer, parsed (``None`` for an empty body, as with 204)."""
        _, _, raw = self.request(method, path, **kwargs)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise RemoteEngineError("the server's answer is not JSON", code="bad_answer", method=method,
                                    path=path) from None


def _problem(
    status: int,
    headers: Mapping[str, str],
    raw: bytes,
    method: str,
    path: str,
    bad_request: Type[RemoteError],
) -> RemoteError:
    """The exception for an error answer; the body is problem+json when the server wrote it."""
    detail, code = "", ""
    if headers.get("content-type", "").split(";")[0].strip() in ("application/problem+json", "application/json"):
        try:
            problem = json.loads(raw)
        except ValueError:
            problem = None
        if isinstance(problem, dict):
            detail = str(problem.get("detail") or problem.get("title") or "")
            code = str(problem.get("code") or "")
    if not detail:
        text = raw[:300].decode("utf-8", "replace").strip()
        detail = text or http.client.responses.get(status, "error")
    if not code:
        code = {301: "redirect", 302: "redirect", 307: "redirect", 308: "redirect"}.get(status, f"http_{status}")
        if 300 <= status < 400:
            detail += f" (redirects are not followed; the server points to {headers.get('location', '?')!r})"
    retry_after: Optional[float] = None
    if "retry-after" in headers:
        try:
            retry_after = float(headers["retry-after"])
        except ValueError:
            retry_after = None
    cls = error_class(status, bad_request)
    return cls(detail, status=status, code=code, method=method, path=path, retry_after=retry_after)
