"""The asyncio API: ``agenthold.aio.Runtime`` and ``agenthold.aio.Sandbox``, the same API as
``agenthold.Runtime`` and ``agenthold.Sandbox`` with ``async`` methods.

Operations run on the runtime's own native threads and complete the awaiting coroutine through the event
loop: no executor thread is used. Cancelling an awaited ``exec`` (``task.cancel()``, ``asyncio.wait_for``)
kills the command in the sandbox.

    import asyncio, agenthold

    async def main():
        async with agenthold.aio.Runtime() as rt:
            sb = await rt.create_sandbox(policy=agenthold.Policy.allowlist(["pypi.org"]))
            try:
                print((await sb.exec(["echo", "hi"])).stdout)
            finally:
                await sb.remove()

    asyncio.run(main())

``agenthold.aio.Client`` is the same for a server (``agenthold.Client`` with ``async`` methods): each call
runs on a short-lived thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Type, TypeVar, Union

from . import _runtime
from ._native import ExecResult, LogEntry, Policy, Secret
from ._runtime import DEFAULT_IMAGE, StrPath, _argv, _bytes, _env, _path, _policy, _secrets

__all__ = ["Client", "RemoteSandbox", "Run", "Runtime", "Sandbox"]

T = TypeVar("T")


async def _call(start: Callable[[Callable[[bool, Any], None]], Any]) -> Any:
    """Start a native operation with a completion callback and await it. The callback runs on a native
    thread; it hands the result to the loop. Cancelling the awaiting task cancels the operation."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def done(ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
            pass

    op = start(done)
    try:
        return await fut
    except asyncio.CancelledError:
        op.cancel()
        raise


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking call on a short-lived thread (joined when it returns), not on an executor that would
    keep idle threads alive."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def run() -> None:
        try:
            result: Any = fn()
            ok = True
        except BaseException as e:  # handed to the awaiting coroutine
            result, ok = e, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:
            pass

    thread = threading.Thread(target=run, name="agenthold-aio-call", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(fut)
    finally:
        if fut.done():
            thread.join()


class Runtime:
    """The asyncio flavour of ``agenthold.Runtime`` (same arguments). Nothing starts in the constructor:
    ``async with agenthold.aio.Runtime(...) as rt`` (or ``await rt.start()``) starts the runtime off the
    event loop; ``create_sandbox`` also starts it when needed. ``await rt.close()`` stops it."""

    def __init__(
        self,
        data_dir: Optional[StrPath] = None,
        dns_upstream: Optional[str] = None,
        dangerous_connect_to: Optional[Mapping[str, str]] = None,
        dangerous_upstream_ca: Optional[StrPath] = None,
        warm_pool: Optional[int] = None,
        store_url: Optional[str] = None,
    ) -> None:
        self._args = dict(
            data_dir=data_dir,
            dns_upstream=dns_upstream,
            dangerous_connect_to=dangerous_connect_to,
            dangerous_upstream_ca=dangerous_upstream_ca,
            warm_pool=warm_pool,
            store_url=store_url,
        )
        self._sync: Optional[_runtime.Runtime] = None
        self._lock: Optional[asyncio.Lock] = None

    @property
    def sync(self) -> _runtime.Runtime:
        """The underlying blocking ``agenthold.Runtime``. Raises ``SandboxError`` before ``start()``."""
        if self._sync is None:
            from ._native import SandboxError

            raise SandboxError("the runtime is not started: use `async with agenthold.aio.Runtime()` or `await rt.start()`")
        return self._sync

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran."""
        return self._sync is not None and self._sync.closed

    async def start(self) -> Runtime:
        """Start the runtime (idempotent). Raises ``EngineError`` when Docker cannot be reached."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._sync is None:
                self._sync = await _in_thread(lambda: _runtime.Runtime(**self._args))  # type: ignore[arg-type]
        return self

    async def close(self) -> None:
        """Cancel running commands, stop the gateway and join the runtime's threads. Idempotent."""
        if self._sync is not None:
            await _in_thread(self._sync.close)

    async def __aenter__(self) -> Runtime:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        if self._sync is None:
            return "<agenthold.aio.Runtime not started>"
        return f"<agenthold.aio.Runtime data_dir={self._sync.data_dir!r} {'closed' if self.closed else 'open'}>"

    async def create_sandbox(
        self,
        image: str = DEFAULT_IMAGE,
        policy: Optional[Policy] = None,
        secrets: Iterable[Secret] = (),
        env: Optional[Mapping[str, str]] = None,
        cpus: Optional[float] = None,
        memory: Optional[int] = None,
        pids: Optional[int] = None,
    ) -> Sandbox:
        """Create and start a sandbox (see ``agenthold.Runtime.create_sandbox``)."""
        await self.start()
        native = self.sync._native
        args = (
            image,
            _policy(policy),
            _secrets(secrets),
            _env(env),
            None if cpus is None else float(cpus),
            None if memory is None else int(memory),
            None if pids is None else int(pids),
        )
        agent = await _call(lambda done: native.create_sandbox(*args, done))
        return Sandbox(self, agent)

    def sandbox(self, id: str) -> Sandbox:
        """A handle on an existing sandbox by its id (no call is made)."""
        return Sandbox(self, id)

    async def sandboxes(self) -> List[Sandbox]:
        """Every sandbox this runtime knows."""
        await self.start()
        native = self.sync._native
        ids = await _call(lambda done: native.sandboxes(done))
        return [Sandbox(self, a) for a in ids]


class Sandbox:
    """The asyncio flavour of ``agenthold.Sandbox``; ``async with`` removes it on exit."""

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

    @property
    def _native(self) -> Any:
        return self._runtime.sync._native

    def __repr__(self) -> str:
        return f"<agenthold.aio.Sandbox id={self._id!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other._id == self._id and other._runtime is self._runtime

    def __hash__(self) -> int:
        return hash(self._id)

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._runtime.closed:
            await self.remove()

    async def exec(
        self,
        argv: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Union[bytes, str]] = None,
    ) -> ExecResult:
        """Run a command and wait for it (see ``agenthold.Sandbox.exec``). Cancelling the awaiting task
        kills the command in the sandbox."""
        native = self._native
        args = (
            self._id,
            _argv(argv),
            _env(env),
            cwd,
            None if stdin is None else _bytes(stdin, "stdin"),
            None if timeout is None else float(timeout),
        )
        result: ExecResult = await _call(lambda done: native.exec(*args, done))
        return result

    async def write_file(self, path: str, data: Union[bytes, str]) -> None:
        """Create or replace a file (see ``agenthold.Sandbox.write_file``)."""
        native, args = self._native, (self._id, _path(path), _bytes(data, "data"))
        await _call(lambda done: native.write_file(*args, done))

    async def read_file(self, path: str) -> bytes:
        """Read a file (see ``agenthold.Sandbox.read_file``)."""
        native, args = self._native, (self._id, _path(path))
        data: bytes = await _call(lambda done: native.read_file(*args, done))
        return data

    async def set_policy(self, policy: Policy) -> None:
        """Replace the network policy; the next connection and DNS query use it."""
        checked = _policy(policy)
        if checked is None:
            raise TypeError("set_policy needs a Policy; use Policy.open() for an open policy")
        native = self._native
        await _call(lambda done: native.set_policy(self._id, checked, done))

    async def request_log(self) -> List[LogEntry]:
        """The sandbox's request log, oldest first."""
        log: List[LogEntry] = self._native.request_log(self._id)
        return log

    async def state(self) -> str:
        """``"running"`` or ``"stopped"``."""
        native = self._native
        state = await _call(lambda done: native.inspect(self._id, done))
        return str(state[0])

    async def stop(self) -> None:
        """Stop the sandbox; its files and settings stay."""
        native = self._native
        await _call(lambda done: native.stop(self._id, done))

    async def start(self) -> None:
        """Start a stopped sandbox again."""
        native = self._native
        await _call(lambda done: native.start(self._id, done))

    async def remove(self) -> None:
        """Remove the sandbox with its network, rules and files. Idempotent."""
        native = self._native
        await _call(lambda done: native.remove(self._id, done))


from ._aio_client import Client, RemoteSandbox, Run  # noqa: E402  (the server client, same shape as Runtime)
