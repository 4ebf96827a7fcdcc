//! Results: every run of every metric on every path, their medians and ratios, as a table and as JSON.

use std::fmt::Write as _;

use serde_json::{Value, json};

/// The paths a client takes to the same upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// From this process's namespace to the upstream on loopback: no veth, no gateway.
    DirectLoopback,
    /// From a client namespace across one veth pair to the upstream bound in the namespace on the other
    /// side: the same hop a sandbox has, without the gateway.
    DirectVeth,
    /// From the sandbox through the gateway (nftables redirect, proxy, loopback to the upstream).
    Gateway,
}

impl Route {
    /// Every route, in table order.
    pub const ALL: [Route; 3] = [Route::DirectLoopback, Route::DirectVeth, Route::Gateway];

    /// The JSON key and short label.
    pub fn key(self) -> &'static str {
        match self {
            Route::DirectLoopback => "direct_loopback",
            Route::DirectVeth => "direct_veth",
            Route::Gateway => "gateway",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One measured quantity on every route.
#[derive(Debug, Clone)]
pub struct Metric {
    /// What is measured (`TLS bulk download, spliced`).
    pub name: String,
    /// Unit of every value (`MB/s`, `conn/s`, `req/s`, `qps`).
    pub unit: &'static str,
    /// Client and settings (`curl, 1 GiB`).
    pub client: String,
    /// The lowest acceptable gateway / direct (veth) ratio, when the issue sets one.
    pub target: Option<f64>,
    /// Every run's value, per route (in [`Route::ALL`] order); empty when a route was not measured.
    pub runs: [Vec<f64>; 3],
    /// Failed operations summed over the runs, per route.
    pub errors: [u64; 3],
    /// Average number of busy CPUs during each run (the whole machine), per route.
    pub busy: [Vec<f64>; 3],
    /// Remarks printed under the table (`direct columns shared with …`).
    pub note: Option<String>,
    /// CPU µs per operation of each run, per route (rate metrics; empty when not measured).
    pub cpu: [CpuPerOp; 3],
}

/// CPU time per operation (request, connection, query) of one route's runs, in µs: the gateway's threads,
/// the upstream's threads and the whole machine (busy CPUs × run time / operations). What is left of the
/// machine's share (machine − gateway − upstream) is the client, the kernel work charged to none of them,
/// and anything else running.
#[derive(Debug, Clone, Default)]
pub struct CpuPerOp {
    /// The gateway's threads, per run.
    pub gateway: Vec<f64>,
    /// The upstream's threads, per run.
    pub upstream: Vec<f64>,
    /// The whole machine, per run.
    pub machine: Vec<f64>,
}

impl Metric {
    /// A metric with no runs yet.
    pub fn new(name: &str, unit: &'static str, client: &str, target: Option<f64>) -> Self {
        Self {
            name: name.to_owned(),
            unit,
            client: client.to_owned(),
            target,
            runs: Default::default(),
            errors: [0; 3],
            busy: Default::default(),
            note: None,
            cpu: Default::default(),
        }
    }

    /// Records the CPU µs per operation of one run on `route` (gateway threads, upstream threads, machine).
    pub fn push_cpu(&mut self, route: Route, gateway: f64, upstream: f64, machine: f64) {
        let cpu = &mut self.cpu[route.index()];
        cpu.gateway.push(gateway);
        cpu.upstream.push(upstream);
        cpu.machine.push(machine);
    }

    /// One line on the CPU µs per operation of every measured route (medians), if any was measured.
    pub fn cpu_line(&self) -> Option<String> {
        let us = |v: &[f64]| median(v).map_or_else(|| "-".to_owned(), |m| format!("{m:.1}"));
        let parts: Vec<String> = Route::ALL
            .into_iter()
            .filter(|r| !self.cpu[r.index()].machine.is_empty())
            .map(|r| {
                let c = &self.cpu[r.index()];
                let rest: Vec<f64> = c
                    .machine
                    .iter()
                    .zip(&c.gateway)
                    .zip(&c.upstream)
                    .map(|((m, g), u)| m - g - u)
                    .collect();
                format!(
                    "{}: machine {}, gateway {}, upstream {}, client and the rest {}",
                    r.key(),
                    us(&c.machine),
                    us(&c.gateway),
                    us(&c.upstream),
                    us(&rest)
                )
            })
            .collect();
        (!parts.is_empty()).then(|| format!("CPU µs per {}: {}", self.op_name(), parts.join("; ")))
    }

    fn op_name(&self) -> &'static str {
        match self.unit {
            "conn/s" => "connection",
            "qps" => "query",
            _ => "request",
        }
    }

    /// Records one run on `route`.
    pub fn push(&mut self, route: Route, value: f64, errors: u64) {
        self.runs[route.index()].push(value);
        self.errors[route.index()] += errors;
    }

    /// Records how many CPUs were busy during one run on `route`.
    pub fn push_busy(&mut self, route: Route, cores: f64) {
        self.busy[route.index()].push(cores);
    }

    /// The median of `route`'s runs.
    pub fn median(&self, route: Route) -> Option<f64> {
        median(&self.runs[route.index()])
    }

    /// The gateway's ratio to `direct`: the median over rounds of (gateway run / direct run of the same
    /// round). Runs of one round are seconds apart, so pairing them cancels drift and bursts of other
    /// work on the machine better than a ratio of medians, which is the fallback when the run counts
    /// differ.
    pub fn ratio(&self, direct: Route) -> Option<f64> {
        let (gateway, base) = (&self.runs[Route::Gateway.index()], &self.runs[direct.index()]);
        if gateway.len() == base.len() {
            let paired: Vec<f64> = gateway.iter().zip(base).map(|(g, d)| g / d).collect();
            return median(&paired);
        }
        Some(self.median(Route::Gateway)? / self.median(direct)?)
    }

    /// Whether the gateway meets the target (against the veth path); `None` without a target.
    pub fn meets_target(&self) -> Option<bool> {
        Some(self.ratio(Route::DirectVeth)? >= self.target?)
    }
}

/// The median of `values` (mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn cell(value: Option<f64>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// The table printed at the end of a run: one row per metric, medians per route and the ratios.
pub fn table(metrics: &[Metric]) -> String {
    let header = [
        "metric",
        "unit",
        "direct (lo)",
        "direct (veth)",
        "gateway",
        "gw/veth",
        "gw/lo",
        "target",
        "errors lo/veth/gw",
        "CPUs busy lo/veth/gw",
    ];
    let rows: Vec<[String; 10]> = metrics
        .iter()
        .map(|m| {
            let target = match (m.target, m.meets_target()) {
                (Some(t), Some(true)) => format!(">= {t} ok"),
                (Some(t), _) => format!(">= {t} MISSED"),
                (None, _) => String::new(),
            };
            [
                m.name.clone(),
                m.unit.to_owned(),
                cell(m.median(Route::DirectLoopback)),
                cell(m.median(Route::DirectVeth)),
                cell(m.median(Route::Gateway)),
                cell(m.ratio(Route::DirectVeth)),
                cell(m.ratio(Route::DirectLoopback)),
                target,
                format!("{}/{}/{}", m.errors[0], m.errors[1], m.errors[2]),
                Route::ALL
                    .map(|r| median(&m.busy[r.index()]).map_or_else(|| "-".to_owned(), |b| format!("{b:.1}")))
                    .join("/"),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let mut text = String::from("|");
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            // Text columns left-aligned, numbers right-aligned.
            if !(2..7).contains(&i) {
                let _ = write!(text, " {c:<w$} |");
            } else {
                let _ = write!(text, " {c:>w$} |");
            }
        }
        out.push_str(&text);
        out.push('\n');
    };
    line(&mut out, &header.map(str::to_owned));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &rule);
    for row in &rows {
        line(&mut out, row);
    }
    for m in metrics {
        let _ = writeln!(out, "  {}: {}", m.name, m.client);
        if let Some(note) = &m.note {
            let _ = writeln!(out, "    note: {note}");
        }
        if let Some(cpu) = m.cpu_line() {
            let _ = writeln!(out, "    {cpu}");
        }
    }
    out
}

/// Every metric with all its runs, medians and ratios, plus `settings` (machine, durations, …).
pub fn to_json(metrics: &[Metric], settings: &Value) -> Value {
    let metrics: Vec<Value> = metrics
        .iter()
        .map(|m| {
            let mut routes = serde_json::Map::new();
            for route in Route::ALL {
                routes.insert(
                    route.key().to_owned(),
                    json!({
                        "median": m.median(route),
                        "runs": m.runs[route.index()],
                        "errors": m.errors[route.index()],
                        "cpus_busy": m.busy[route.index()],
                        "cpu_us_per_op": {
                            "gateway_threads": m.cpu[route.index()].gateway,
                            "upstream_threads": m.cpu[route.index()].upstream,
                            "machine": m.cpu[route.index()].machine,
                        },
                    }),
                );
            }
            json!({
                "metric": m.name,
                "unit": m.unit,
                "client": m.client,
                "routes": routes,
                "ratio_gateway_vs_direct_veth": m.ratio(Route::DirectVeth),
                "ratio_of_medians_vs_direct_veth": m.median(Route::Gateway).zip(m.median(Route::DirectVeth)).map(|(g, d)| g / d),
                "ratio_gateway_vs_direct_loopback": m.ratio(Route::DirectLoopback),
                "target_ratio": m.target,
                "meets_target": m.meets_target(),
                "note": m.note,
            })
        })
        .collect();
    json!({ "settings": settings, "metrics": metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let mut m = Metric::new("x", "req/s", "test", Some(0.5));
        for (route, v) in [
            (Route::DirectLoopback, 100.0),
            (Route::DirectVeth, 80.0),
            (Route::Gateway, 60.0),
        ] {
            m.push(route, v, 0);
        }
        assert_eq!(m.ratio(Route::DirectVeth), Some(0.75));
        // Paired by round: a burst of other work in round 2 slows both routes alike.
        m.push(Route::DirectLoopback, 50.0, 0);
        m.push(Route::DirectVeth, 40.0, 0);
        m.push(Route::Gateway, 30.0, 0);
        m.push(Route::DirectLoopback, 100.0, 0);
        m.push(Route::DirectVeth, 80.0, 0);
        m.push(Route::Gateway, 100.0, 0);
        assert_eq!(m.ratio(Route::DirectVeth), Some(0.75));
        assert_eq!(m.meets_target(), Some(true));
        let table = table(&[m]);
        assert!(table.contains(">= 0.5 ok"), "{table}");
    }
}
