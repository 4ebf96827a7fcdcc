#!/usr/bin/env python3
"""Keep docs/architecture.md true to the tree (run by `make test` through `make lint`).

Two checks:

1. Crate arrows. Every dependency between workspace packages (`cargo metadata`, normal and build
   dependencies; dev-dependencies may point anywhere a test needs) must be one of ALLOWED below, which is the
   crate map drawn in docs/architecture.md. A new arrow fails until the map and this list say so.
2. Requirement map. Source files say which guarantees they enforce with a line comment
   `// enforces: E6 E22` (`# enforces:` in scripts, Makefile and Cargo.toml; IDs from the design's REQUIREMENTS.md). The table between the
   `requirements-map` markers in docs/architecture.md is generated from those tags; `--write` regenerates
   it, the default mode fails when it differs. When `../shared/REQUIREMENTS.md` exists (beside our
   checkouts), every ID it numbers must have a row; IDs with no tag yet say "not built yet".

Usage: scripts/architecture-check.py [--write]
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "architecture.md")
REQUIREMENTS = os.path.join(ROOT, "..", "shared", "REQUIREMENTS.md")
BEGIN, END = "<!-- requirements-map:begin -->", "<!-- requirements-map:end -->"

# The crate map (docs/architecture.md, "Crates"): who may depend on whom. Arrows point down only.
ALLOWED = {
    "agenthold-core": set(),
    "sandboxd": set(),
    "agenthold-egress": {"agenthold-core"},
    "agenthold-auth": {"agenthold-core"},
    "agenthold-sandbox": {"agenthold-core", "agenthold-egress", "sandboxd"},
    "agenthold-server": {"agenthold-core", "agenthold-egress", "agenthold-sandbox", "agenthold-auth", "sandboxd"},
    "agenthold-python": {"agenthold-core", "agenthold-egress", "agenthold-sandbox"},
    "agenthold-testsupport": {"agenthold-core", "agenthold-egress"},
    "agenthold-examples": {"agenthold-core", "agenthold-egress", "agenthold-sandbox", "agenthold-testsupport"},
    "agenthold-benches": {
        "agenthold-core", "agenthold-egress", "agenthold-sandbox", "agenthold-server", "agenthold-testsupport",
    },
}
TAG = re.compile(r"^\s*(?://!?|#)\s*enforces:\s*(.+)$")
ID = re.compile(r"\b([A-Z][0-9]{1,2})\b")
SKIP_DIRS = {"target", "tests", ".git", ".venv", "corpus", "seeds", "regressions", "node_modules", "docs"}
TAGGED = (".rs", ".sh", ".toml", "Makefile")


def crate_arrows():
    out = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    packages = json.loads(out)["packages"]
    names = {p["name"] for p in packages}
    errors = []
    for p in packages:
        for d in p["dependencies"]:
            if d["name"] not in names or d["kind"] == "dev":
                continue
            if d["name"] not in ALLOWED.get(p["name"], set()):
                errors.append(f"{p['name']} -> {d['name']} is not an arrow of the crate map")
    unknown = names - ALLOWED.keys()
    errors += [f"package {n} is not on the crate map (scripts/architecture-check.py ALLOWED)" for n in unknown]
    return errors


def tags():
    found = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            if not f.endswith(TAGGED) or f == "architecture-check.py":
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    m = TAG.match(line)
                    if m:
                        for rid in ID.findall(m.group(1)):
                            found.setdefault(rid, set()).add(os.path.relpath(path, ROOT))
    return found


def id_key(rid):
    return ("CESRP".find(rid[0]) if rid[0] in "CESRP" else 99, rid[0], int(rid[1:]))


def requirement_ids(doc_text):
    if os.path.exists(REQUIREMENTS):
        with open(REQUIREMENTS, encoding="utf-8") as fh:
            ids = set(re.findall(r"^- ([A-Z][0-9]{1,2}) ", fh.read(), re.M))
        return ids, True
    # A contributor's clone without the design folder: the rows already in the doc.
    section = doc_text.split(BEGIN, 1)[-1].split(END, 1)[0]
    return set(re.findall(r"^\| ([A-Z][0-9]{1,2}) \|", section, re.M)), False


def table(found, ids):
    rows = ["| ID | Enforced in |", "| --- | --- |"]
    for rid in sorted(ids | found.keys(), key=id_key):
        where = ", ".join(f"`{p}`" for p in sorted(found.get(rid, ()))) or "not built yet"
        rows.append(f"| {rid} | {where} |")
    return "\n".join(rows)


def main():
    write = "--write" in sys.argv[1:]
    errors = crate_arrows()
    with open(DOC, encoding="utf-8") as fh:
        doc = fh.read()
    if BEGIN not in doc or END not in doc:
        errors.append(f"{DOC}: the {BEGIN} … {END} markers are missing")
    else:
        ids, authoritative = requirement_ids(doc)
        found = tags()
        if authoritative:
            errors += [f"`enforces: {rid}` names no requirement" for rid in sorted(found.keys() - ids)]
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        new = f"{head}{BEGIN}\n{table(found, ids)}\n{END}{tail}"
        if new != doc:
            if write:
                with open(DOC, "w", encoding="utf-8") as fh:
                    fh.write(new)
                print("architecture-check: requirement map rewritten")
            else:
                errors.append("docs/architecture.md's requirement map is out of date: "
                              "run scripts/architecture-check.py --write")
    for e in errors:
        print(f"architecture-check: {e}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print("architecture-check: crate arrows and requirement map ok")


if __name__ == "__main__":
    main()
