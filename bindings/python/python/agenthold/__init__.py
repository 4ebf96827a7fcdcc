"""agenthold: run untrusted AI agents in Docker sandboxes behind an egress gateway you control.

Every connection a sandbox makes goes through agenthold's gateway, which decides by name (``Policy``),
never dials private or metadata addresses, logs every DNS query, connection and HTTP request
(``Sandbox.request_log``), and injects secrets into requests to the hosts you allow (``Secret``): the
sandbox only ever sees placeholders.

    import agenthold

    key = agenthold.Secret.preset("anthropic", "sk-ant-...", env="ANTHROPIC_API_KEY")
    with agenthold.Runtime() as rt:
        sb = rt.create_sandbox(policy=agenthold.Policy.allowlist(["api.anthropic.com"]), secrets=[key])
        try:
            print(sb.exec(["sh", "-c", "echo $ANTHROPIC_API_KEY"]).stdout)  # a placeholder
        finally:
            sb.remove()

``agenthold.Client(url, token)`` has the same shape over an agenthold server's HTTP API (``agenthold
serve``): ``create_sandbox``, ``exec``, ``request_log``, ``set_policy``, files. ``agenthold.aio`` has both
with ``async`` methods. Errors derive from ``agenthold.Error``.
Needs Docker on Linux, root, and the image ``agenthold/dev:latest`` (``agenthold image build-dev``).
"""

from __future__ import annotations

from . import _native
from ._native import (
    EngineError,
    Error,
    ExecResult,
    ExecStream,
    LogEntry,
    Policy,
    PolicyError,
    SandboxError,
    Secret,
    SecretError,
)
from ._runtime import DEFAULT_IMAGE, Runtime, Sandbox
from ._http import RemoteEngineError, RemoteError, RemotePolicyError, RemoteSandboxError
from ._client import Client, RemoteExecResult, RemoteSandbox
from ._runs import Run
from . import aio  # noqa: E402  (after the classes it wraps)

__version__: str = _native.__version__

__all__ = [
    "Client",
    "DEFAULT_IMAGE",
    "EngineError",
    "Error",
    "ExecResult",
    "ExecStream",
    "LogEntry",
    "Policy",
    "PolicyError",
    "RemoteEngineError",
    "RemoteError",
    "RemoteExecResult",
    "RemotePolicyError",
    "RemoteSandbox",
    "RemoteSandboxError",
    "Run",
    "Runtime",
    "Sandbox",
    "SandboxError",
    "Secret",
    "SecretError",
    "aio",
]

