#!/usr/bin/env python3
"""Where an agent's create spends its time as the number of agents grows, from the engine's events.

Usage (as root, beside a density run; docs/benchmarks.md "Issue 14: density"):

    docker events --format '{{json .}}' > events.jsonl &
    BENCH_ONLY=grow BENCH_DENSITY_MAX=250 cargo bench -p agenthold-benches --bench density
    scripts/bench-create-phases.py events.jsonl

For every agent network (`agenthold-<id>`) it takes the times of the network's create, the first
`network connect` to it (the holder's join through the engine before 2026-12-02 evening; since then the holder
joins with the runtime's own veth pair and the first connect is the sandbox's endpoint at its start), the
container's create and start, and prints the medians of the gaps per 50 agents, in milliseconds from the
network's create.
"""
import json, sys, statistics
ev = []
for line in open(sys.argv[1]):
    try:
        ev.append(json.loads(line))
    except Exception:
        pass
agents = {}   # name -> dict of step -> t
order = []
for e in ev:
    t = e.get("timeNano", 0) / 1e6
    typ, act = e.get("Type"), e.get("Action", "")
    attrs = e.get("Actor", {}).get("Attributes", {})
    name = attrs.get("name", "")
    if typ == "network" and act == "create" and name.startswith("agenthold-"):
        agents.setdefault(name, {})["net"] = t; order.append(name)
    elif typ == "network" and act == "connect" and name in agents:
        agents[name].setdefault("connect", t)
    elif typ == "volume" and act == "create":
        vid = e.get("Actor", {}).get("ID", "")
        if vid in agents: agents[vid].setdefault("volume", t)
    elif typ == "container" and name in agents:
        key = {"create": "ccreate", "extract-to-dir": "files", "start": "start"}.get(act)
        if key: agents[name].setdefault(key, t)
prev_start = None
rows = []
for i, name in enumerate(order, 1):
    a = agents[name]
    if not all(k in a for k in ("net", "connect", "ccreate", "start")):
        continue
    rows.append((i, a["connect"] - a["net"], a["ccreate"] - a["net"], a["start"] - a["ccreate"],
                 a["net"] - prev_start if prev_start else float("nan"), a["start"] - a["net"]))
    prev_start = a["start"]
def show(lo, hi):
    sel = [r for r in rows if lo <= r[0] <= hi]
    if not sel: return
    med = lambda j: statistics.median(r[j] for r in sel if r[j] == r[j])
    print(f"agents {lo:>3}-{hi:<3} n={len(sel):>3} | net->holder connect {med(1):7.0f} | net->container create {med(2):7.0f} | create->start {med(3):7.0f} | prev start->net {med(4):7.0f} | net->start {med(5):7.0f} ms")
for lo in range(1, len(order) + 1, 50):
    show(lo + (1 if lo == 1 else 0), lo + 49)
