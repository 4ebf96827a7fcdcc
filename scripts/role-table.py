#!/usr/bin/env python3
"""Print the role table of the reference server's API as markdown: every operation of the OpenAPI
document with its minimum role (the `x-agenthold-role` extension), from a running server or a saved file.

Usage:
    scripts/role-table.py http://127.0.0.1:8080/api/v1/openapi.json
    scripts/role-table.py openapi.json

An operation without a role prints as MISSING and the script exits 1 (the role-matrix test fails on it too).
"""

import json
import sys
import urllib.request

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

# What each role means (SERVER.md §1; the role-matrix test expects exactly this).
MEANING = {
    "public": "anyone, no credentials",
    "self": "any signed-in user, on their own account",
    "session": "a browser session (a personal token gets 403)",
    "member": "a member of the workspace",
    "workspace_admin": "a workspace admin or owner",
    "owner": "a workspace owner",
    "viewer": "viewer, operator or admin of the agent (workspace admins and owners are agent admins)",
    "operator": "operator or admin of the agent",
    "agent_admin": "admin of the agent (its creator, or a workspace admin or owner)",
}


def load(source):
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=30) as response:
            return json.load(response)
    with open(source, encoding="utf-8") as f:
        return json.load(f)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    doc = load(sys.argv[1])
    rows, missing = [], 0
    for path, item in doc.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            role = op.get("x-agenthold-role")
            if role is None:
                missing += 1
            rows.append((path, METHODS.index(method), method.upper(), role or "MISSING"))
    rows.sort()
    print("| method | path | minimum role | who may call it |")
    print("|---|---|---|---|")
    for path, _, method, role in rows:
        print(f"| `{method}` | `{path}` | `{role}` | {MEANING.get(role, '?')} |")
    if missing:
        print(f"role-table: {missing} operation(s) without x-agenthold-role", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
