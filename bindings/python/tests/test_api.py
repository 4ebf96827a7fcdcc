"""The API's shape and construction-time validation: no Docker needed."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest

import agenthold


def test_exception_hierarchy() -> None:
    for name in ("PolicyError", "SecretError", "SandboxError", "EngineError"):
        cls = getattr(agenthold, name)
        assert issubclass(cls, agenthold.Error)
        assert cls.__module__ == "agenthold"
        assert cls.__doc__
    assert issubclass(agenthold.Error, Exception)


def test_runtime_signature() -> None:
    params = inspect.signature(agenthold.Runtime).parameters
    assert list(params) == ["data_dir", "dns_upstream", "dangerous_connect_to", "dangerous_upstream_ca", "warm_pool",
                            "store_url"]
    assert all(p.default is None for p in params.values())
    sig = inspect.signature(agenthold.Runtime.create_sandbox).parameters
    assert list(sig)[1:] == ["image", "policy", "secrets", "env", "cpus", "memory", "pids"]
    assert sig["image"].default == "agenthold/dev:latest"
    assert list(inspect.signature(agenthold.Sandbox.exec).parameters)[1:5] == ["argv", "timeout", "env", "cwd"]
    assert list(inspect.signature(agenthold.aio.Runtime).parameters) == list(params)


def test_every_public_name_has_a_docstring() -> None:
    names = [n for n in agenthold.__all__ if n not in ("DEFAULT_IMAGE",)]
    for name in names:
        obj = getattr(agenthold, name)
        assert (obj.__doc__ or "").strip(), name
    for cls in (agenthold.Runtime, agenthold.Sandbox, agenthold.aio.Runtime, agenthold.aio.Sandbox,
                agenthold.Policy, agenthold.Secret, agenthold.ExecResult, agenthold.LogEntry, agenthold.ExecStream):
        for attr, member in vars(cls).items():
            if attr.startswith("_"):
                continue
            assert (getattr(member, "__doc__", None) or "").strip(), f"{cls.__name__}.{attr}"


def test_policy_constructors() -> None:
    assert agenthold.Policy.open().mode == "open"
    p = agenthold.Policy.allowlist(["github.com", "*.npmjs.org", "github.com:22", "registry.example.com:*",
                                    "203.0.113.0/24:443"])
    assert p.mode == "allowlist"
    assert p.entries[0] == "github.com"
    r = agenthold.Policy.report_only(["github.com"])
    assert r.mode == "report_only"
    assert "github.com" in repr(r)
    assert agenthold.Policy.allowlist(["a.example"]) == agenthold.Policy.allowlist(["a.example"])


@pytest.mark.parametrize("entry", ["not a valid entry!", "", "http://github.com", "github.com:99999", "*.", "a..b"])
def test_invalid_policy_entry_fails_at_construction(entry: str) -> None:
    with pytest.raises(agenthold.PolicyError) as e:
        agenthold.Policy.allowlist([entry])
    assert repr(entry)[1:-1] in str(e.value) or entry == ""
    with pytest.raises(agenthold.PolicyError):
        agenthold.Policy.report_only([entry])


def test_policy_entries_must_be_a_list() -> None:
    with pytest.raises(TypeError):
        agenthold.Policy.allowlist("github.com")  # type: ignore[arg-type]


def test_secret_value_cannot_be_read_back() -> None:
    value = "sk-never-shown-123"
    s = agenthold.Secret("api", value, env="API_KEY", hosts=["api.example.test"], header="Authorization",
                         template="Bearer {{.Value}}")
    assert value not in repr(s) and value not in str(s)
    for attr in dir(s):
        try:
            got = getattr(s, attr)
        except Exception:
            continue
        assert value not in repr(got), attr
    assert not hasattr(s, "value")
    assert not hasattr(s, "__dict__")
    with pytest.raises(Exception):
        pickle.dumps(s)
    with pytest.raises(Exception):
        copy.copy(s)
    assert (s.name, s.env, s.hosts) == ("api", "API_KEY", ["api.example.test"])


def test_secret_preset() -> None:
    s = agenthold.Secret.preset("anthropic", "sk-ant-xyz", env="ANTHROPIC_API_KEY")
    assert s.name == "anthropic" and s.preset_name == "anthropic"
    assert s.hosts == ["api.anthropic.com"]
    assert "sk-ant-xyz" not in repr(s)
    assert agenthold.Secret.preset("GitHub", "ghp_x").hosts == ["api.github.com", "github.com"]


def test_also_in_names_further_places() -> None:
    s = agenthold.Secret("g", "v", hosts=["api.example.test"], header="x-goog-api-key",
                         also_in={"headers": ["X-Other"], "query": ["key"]})
    assert s.name == "g"


def test_unknown_preset() -> None:
    with pytest.raises(agenthold.SecretError, match="anthropic, openai, github, gitlab, openrouter"):
        agenthold.Secret.preset("nope", "v")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(template="Bearer {{.Nope}}"), "template"),
        (dict(template="Bearer {{.Value"), "template"),
        (dict(header="Bad Header"), "header name"),
        (dict(hosts=["10.0.0.1"]), "must be a name"),
        (dict(hosts=["api.example.test:443"]), "must not have a port"),
        (dict(hosts=[]), "hosts="),
        (dict(env="1BAD"), "environment variable"),
        (dict(template="a\r\nX-Injected: 1 {{.Value}}"), "line break"),
        (dict(also_in={"path": ["x"]}), "also_in"),
        (dict(also_in={"headers": ["bad header"]}), "header name"),
        (dict(also_in={"headers": ["Authorization"]}), "sets anyway"),
        (dict(also_in={"query": ["a&b"]}), "query parameter"),
    ],
)
def test_invalid_secret_fails_at_construction(kwargs: dict, needle: str) -> None:
    args = dict(hosts=["api.example.test"])
    args.update(kwargs)
    with pytest.raises(agenthold.SecretError, match=needle) as e:
        agenthold.Secret("api", "sk-value-zzz", **args)
    assert "sk-value-zzz" not in str(e.value)


def test_bad_secret_name() -> None:
    with pytest.raises(agenthold.SecretError, match="names are"):
        agenthold.Secret("bad name!", "v", hosts=["a.example"])


def test_runtime_argument_errors() -> None:
    with pytest.raises(agenthold.Error, match="dns_upstream"):
        agenthold.Runtime(dns_upstream="not-an-address")
    with pytest.raises(agenthold.Error, match="NAME:PORT"):
        agenthold.Runtime(dangerous_connect_to={"api.example.test": "127.0.0.1:1"})
    with pytest.raises(agenthold.Error, match="IP:PORT"):
        agenthold.Runtime(dangerous_connect_to={"api.example.test:443": "localhost"})
    with pytest.raises(agenthold.Error, match="PEM"):
        agenthold.Runtime(dangerous_upstream_ca="/nonexistent/ca.pem")
