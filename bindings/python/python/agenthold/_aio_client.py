"""The asyncio client of an agenthold server: ``agenthold.aio.Client`` and ``agenthold.aio.RemoteSandbox``,
the blocking ``agenthold.Client`` with ``async`` methods.

Each call runs the blocking one on a short-lived thread of its own (joined when it returns), so the event
loop never waits on the network and no thread stays behind. Cancelling an awaiting task shuts the call's
socket down: the thread ends at once and the task sees ``CancelledError``. A cancelled ``exec`` stops
waiting, but the command goes on in the sandbox until its ``timeout`` (the server keeps execs it runs).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from types import TracebackType
from typing import (Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar,
                    Union)

from . import _client, _runs
from ._client import PolicyLike, RemoteExecResult, WorkspaceRef
from ._http import DEFAULT_TIMEOUT, Abort, set_thread_abort

__all__ = ["Client", "RemoteSandbox", "Run"]

T = TypeVar("T")

#: How long a cancelled call's thread may take to notice (seconds) before the task stops waiting for it.
_CANCEL_WAIT = 5.0


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread of its own; cancelling the awaiting task aborts its request."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()
    # A result that comes after the task stopped waiting is retrieved here, so asyncio does not report it.
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    abort = Abort()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def run() -> None:
        set_thread_abort(abort)
        try:
            result: Any = fn(*args, **kwargs)
            ok = True
        except BaseException as e:  # handed to the awaiting coroutine
            result, ok = e, False
        finally:
            set_thread_abort(None)
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
            pass

    thread = threading.Thread(target=run, name="agenthold-aio-client", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        abort.abort()
        await asyncio.wait({fut}, timeout=_CANCEL_WAIT)
        raise
    finally:
        if fut.done():
            thread.join()


class Client:
    """The asyncio flavour of ``agenthold.Client`` (same arguments; the constructor makes no call):
    ``async with agenthold.aio.Client(url, token) as rt``. Methods are those of ``agenthold.Client``,
    awaited; ``sandbox(id)`` makes no call and is not awaited."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        workspace: Optional[WorkspaceRef] = None,
        timeout: float = DEFAULT_TIMEOUT,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        self._sync = _client.Client(url, token, workspace=workspace, timeout=timeout, ssl_context=ssl_context)

    @property
    def sync(self) -> _client.Client:
        """The underlying blocking ``agenthold.Client``."""
        return self._sync

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._sync.url

    @property
    def workspace(self) -> Optional[str]:
        """The default workspace's id, once given or found."""
        return self._sync.workspace

    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran."""
        return self._sync.closed

    async def close(self) -> None:
        """Refuse further calls. Idempotent."""
        self._sync.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<agenthold.aio.Client url={self.url!r} {'closed' if self.closed else 'open'}>"

    async def me(self) -> Dict[str, Any]:
        """The caller (see ``agenthold.Client.me``)."""
        return await _run(self._sync.me)

    async def workspaces(self) -> List[Dict[str, Any]]:
        """The caller's workspaces."""
        return await _run(self._sync.workspaces)

    async def create_workspace(self, name: str) -> Dict[str, Any]:
        """Create a workspace (the caller becomes its owner)."""
        return await _run(self._sync.create_workspace, name)

    async def create_sandbox(
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
        """Create and start a sandbox (see ``agenthold.Client.create_sandbox``)."""
        sb = await _run(self._sync.create_sandbox, image, policy, allow=allow, env=env, cpus=cpus, memory=memory,
                        pids=pids, workspace=workspace, name=name, labels=labels)
        return RemoteSandbox(self, sb)

    async def run(
        self,
        workspace: Optional[WorkspaceRef],
        agent: Union[str, "RemoteSandbox", _client.RemoteSandbox],
        harness: str,
        prompt: str,
        argv: Optional[Sequence[str]] = None,
        *,
        resume: Optional[str] = None,
        model: Optional[str] = None,
    ) -> Run:
        """Start a harness run (see ``agenthold.Client.run``); ``async for event in run`` follows it."""
        target = agent.sync if isinstance(agent, RemoteSandbox) else agent
        return Run(await _run(self._sync.run, workspace, target, harness, prompt, argv, resume=resume,
                              model=model))

    async def runs(self, workspace: Optional[WorkspaceRef],
                   agent: Union[str, "RemoteSandbox", _client.RemoteSandbox]) -> List[Run]:
        """The runs of an agent, newest first."""
        target = agent.sync if isinstance(agent, RemoteSandbox) else agent
        return [Run(r) for r in await _run(self._sync.runs, workspace, target)]

    def sandbox(self, id: str, workspace: Optional[WorkspaceRef] = None) -> RemoteSandbox:
        """A handle on an existing sandbox by its id (no call is made)."""
        return RemoteSandbox(self, self._sync.sandbox(id, workspace))

    async def sandboxes(self, workspace: Optional[WorkspaceRef] = None) -> List[RemoteSandbox]:
        """The sandboxes of a workspace the caller may see."""
        return [RemoteSandbox(self, sb) for sb in await _run(self._sync.sandboxes, workspace)]


class Run:
    """The asyncio flavour of ``agenthold.Run``: ``id``, ``info``, ``state``; ``await refresh()``,
    ``cancel()``, ``wait()``, ``output()``; ``async for event in run`` yields its events as dicts up to and
    including ``end`` (one thread follows the stream while the loop iterates; it ends with the iteration)."""

    def __init__(self, sync: _runs.Run) -> None:
        self._sync = sync

    @property
    def sync(self) -> _runs.Run:
        """The underlying blocking ``agenthold.Run``."""
        return self._sync

    @property
    def id(self) -> str:
        """The run's id (``run_…``)."""
        return self._sync.id

    @property
    def info(self) -> Dict[str, Any]:
        """The run as the server last described it."""
        return self._sync.info

    @property
    def state(self) -> str:
        """Its state when last seen."""
        return self._sync.state

    def __repr__(self) -> str:
        return f"<agenthold.aio.Run id={self.id!r} state={self.state!r}>"

    async def refresh(self) -> Dict[str, Any]:
        """Ask the server for the run and remember it."""
        return await _run(self._sync.refresh)

    async def cancel(self) -> Dict[str, Any]:
        """Kill the run's whole process group; answers the run once it ended."""
        return await _run(self._sync.cancel)

    async def output(self) -> List[str]:
        """The raw standard output lines of the ended run."""
        return await _run(self._sync.output)

    async def wait(self) -> Dict[str, Any]:
        """Follow the run to its end and answer it."""
        async for _ in self:
            pass
        return await self.refresh()

    def __aiter__(self) -> AsyncIterator[Dict[str, Any]]:
        return self._events()

    async def _events(self) -> AsyncIterator[Dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Tuple[str, Any]] = asyncio.Queue()
        abort = Abort()

        def put(item: Tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
                pass

        def follow() -> None:
            set_thread_abort(abort)
            try:
                for event in self._sync.events():
                    if abort.aborted:
                        return
                    put(("event", event))
                put(("done", None))
            except BaseException as e:  # handed to the iterating coroutine
                put(("error", e))
            finally:
                set_thread_abort(None)

        thread = threading.Thread(target=follow, name="agenthold-aio-run", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "event":
                    yield value
                elif kind == "done":
                    return
                else:
                    raise value
        finally:
            abort.abort()
            deadline = loop.time() + _CANCEL_WAIT
            while thread.is_alive() and loop.time() < deadline:
                await asyncio.sleep(0.01)


class RemoteSandbox:
    """The asyncio flavour of ``agenthold.RemoteSandbox``; ``async with`` removes it on exit."""

    def __init__(self, client: Client, sync: _client.RemoteSandbox) -> None:
        self._client = client
        self._sync = sync

    @property
    def sync(self) -> _client.RemoteSandbox:
        """The underlying blocking ``agenthold.RemoteSandbox``."""
        return self._sync

    @property
    def id(self) -> str:
        """The sandbox's id (its agent id)."""
        return self._sync.id

    @property
    def workspace(self) -> Optional[str]:
        """The id of its workspace."""
        return self._sync.workspace

    @property
    def client(self) -> Client:
        """The client the handle calls through."""
        return self._client

    @property
    def name(self) -> Optional[str]:
        """Its name, when known."""
        return self._sync.name

    @property
    def info(self) -> Dict[str, Any]:
        """The agent as the server last described it."""
        return self._sync.info

    def __repr__(self) -> str:
        return f"<agenthold.aio.RemoteSandbox id={self.id!r} workspace={self.workspace!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteSandbox) and other._sync == self._sync

    def __hash__(self) -> int:
        return hash(self._sync)

    async def __aenter__(self) -> RemoteSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if not self._client.closed:
            await self.remove()

    async def exec(
        self,
        argv: Sequence[str],
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> RemoteExecResult:
        """Run a command and wait for it (see ``agenthold.RemoteSandbox.exec``)."""
        return await _run(self._sync.exec, argv, timeout, env, cwd)

    async def write_file(self, path: str, data: Union[bytes, str]) -> None:
        """Create or replace a file."""
        await _run(self._sync.write_file, path, data)

    async def read_file(self, path: str) -> bytes:
        """Read a file."""
        return await _run(self._sync.read_file, path)

    async def list_files(self, path: str) -> List[Dict[str, Any]]:
        """The entries of a directory."""
        return await _run(self._sync.list_files, path)

    async def delete_file(self, path: str) -> None:
        """Delete a file or directory."""
        await _run(self._sync.delete_file, path)

    async def set_policy(self, policy: Optional[PolicyLike] = None, *, allow: Optional[Sequence[str]] = None) -> None:
        """Replace the network policy; the next connection and DNS query use it."""
        await _run(self._sync.set_policy, policy, allow=allow)

    async def policy(self) -> Dict[str, Any]:
        """The network policy in force."""
        return await _run(self._sync.policy)

    async def request_log(self) -> List[Dict[str, Any]]:
        """The sandbox's request log, oldest first (dicts)."""
        return await _run(self._sync.request_log)

    async def refresh(self) -> Dict[str, Any]:
        """Ask the server for the agent and remember it."""
        return await _run(self._sync.refresh)

    async def state(self) -> str:
        """``"running"`` or ``"stopped"``."""
        return await _run(self._sync.state)

    async def stop(self) -> None:
        """Stop the sandbox; its files and settings stay."""
        await _run(self._sync.stop)

    async def start(self) -> None:
        """Start a stopped sandbox again."""
        await _run(self._sync.start)

    async def remove(self) -> None:
        """Remove the sandbox. Idempotent."""
        await _run(self._sync.remove)
