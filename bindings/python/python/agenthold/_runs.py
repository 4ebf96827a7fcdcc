"""Harness runs on an agenthold server: ``Client.run(workspace, agent, harness, prompt, argv=None)`` starts
one (``POST …/agents/{agent}/runs``) and answers a ``Run``: its ``id`` and, iterated, its normalised events
as dicts (``{"type": "message", "role": ..., "text": ...}``, ``tool_call``, ``tool_result``, ``usage``,
``result``, ``raw``, ``state``, ``session``) up to and including the final ``end`` event.

    run = client.run(ws, agent, "claude", "Summarise README.md")
    for event in run:
        print(event["type"], event)
    print(run.refresh()["state"])

The iterator follows the server's event stream; when the connection breaks it reattaches with the last
event id it saw (``Last-Event-ID``), so no event is lost or repeated. The run itself goes on on the server
whether or not anyone follows it.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from ._http import RemoteEngineError

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Run", "HARNESSES"]

#: The harnesses a run can use.
HARNESSES = ("claude", "codex", "custom")
#: Reattach attempts after a broken stream before giving up.
REATTACH_TRIES = 5
#: Seconds without any byte (the server sends a keep-alive every 15 s) before a stream counts as broken.
STREAM_SILENCE = 60.0


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class Run:
    """A harness run on the server: ``id``, ``info`` (the run as last seen), ``refresh()``, ``cancel()``,
    ``wait()``, ``output()``; iterating it yields its events as dicts up to and including ``end``."""

    def __init__(self, client: Client, workspace: str, agent: str, info: Dict[str, Any]) -> None:
        self._client = client
        self._workspace = workspace
        self._agent = agent
        self._info = dict(info)
        self._id = str(info["id"])
        self.last_event_id: Optional[str] = None

    @property
    def id(self) -> str:
        """The run's id (``run_…``)."""
        return self._id

    @property
    def workspace(self) -> str:
        """The id of its workspace."""
        return self._workspace

    @property
    def agent(self) -> str:
        """The id of its agent."""
        return self._agent

    @property
    def info(self) -> Dict[str, Any]:
        """The run as the server last described it (``{id, state, exit_code, session_id, usage, result, …}``)."""
        return dict(self._info)

    @property
    def state(self) -> str:
        """Its state when last seen: ``queued``, ``running``, ``succeeded``, ``failed``, ``cancelled`` or
        ``lost`` (``refresh()`` asks again)."""
        return str(self._info.get("state"))

    @property
    def _path(self) -> str:
        return f"/workspaces/{_q(self._workspace)}/agents/{_q(self._agent)}/runs/{_q(self._id)}"

    def __repr__(self) -> str:
        return f"<agenthold.Run id={self._id!r} state={self.state!r}>"

    def refresh(self) -> Dict[str, Any]:
        """Ask the server for the run and remember it."""
        self._info = dict(self._client._call("GET", self._path))
        return dict(self._info)

    def cancel(self) -> Dict[str, Any]:
        """Kill the run's whole process group; answers the run once it ended (a no-op on an ended run)."""
        self._info = dict(self._client._call("POST", f"{self._path}/cancel", timeout=60.0))
        return dict(self._info)

    def output(self) -> List[str]:
        """The raw standard output lines of the ended run (what its events were parsed from)."""
        return list(self._client._call("GET", f"{self._path}/output").get("lines") or [])

    def events(self, after: Optional[str] = None) -> Iterator[Dict[str, Any]]:
        """The run's events after event id ``after`` (default: after the last one this object yielded, or
        from the start), following new ones, up to and including ``end``. Reattaches after a broken
        connection; raises ``RemoteEngineError`` when the server stays unreachable."""
        last = after if after is not None else self.last_event_id
        tries = 0
        while True:
            if self._client.closed:
                raise RemoteEngineError("the client is closed", code="closed", method="GET", path=self._path)
            try:
                for event_id, name, data in self._client._http.stream(
                    "/api/v1" + self._path + "/events", last_event_id=last, timeout=STREAM_SILENCE
                ):
                    try:
                        event = json.loads(data)
                    except ValueError:
                        event = {"type": name, "data": data}
                    if name == "end" and "state" not in event:
                        # The server is shutting down, not the run ending: reattach.
                        break
                    tries = 0
                    if event_id:
                        last = event_id
                        self.last_event_id = event_id
                    yield event
                    if name == "end":
                        self._info["state"] = event.get("state", self._info.get("state"))
                        return
            except RemoteEngineError as e:
                if e.code == "cancelled":
                    raise
                tries += 1
                if tries > REATTACH_TRIES:
                    raise
            else:
                # The stream ended without an `end` after `last`: the run ended before it (a resume from its
                # last event), or the server went away.
                if self.refresh().get("state") not in ("queued", "running"):
                    return
                tries += 1
                if tries > REATTACH_TRIES:
                    raise RemoteEngineError("the event stream keeps ending before the run's end event",
                                            code="unreachable", method="GET", path=self._path)
            time.sleep(min(0.2 * 2 ** tries, 5.0))

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return self.events()

    def wait(self) -> Dict[str, Any]:
        """Follow the run to its end and answer it (``{state, exit_code, result, usage, …}``)."""
        for _ in self.events():
            pass
        return self.refresh()
