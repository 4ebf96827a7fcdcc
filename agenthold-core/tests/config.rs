//! The typed configuration (E17): defaults equal to the seeds', YAML, environment overrides, validation
//! errors that name the key, and resolv.conf parsing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agenthold_core::config::{ContainerRuntime, LeakGuard, default_data_dir, parse_resolv_conf};
use agenthold_core::{Config, Error};
use ipnet::IpNet;

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The (key, problem) of a configuration error.
fn config_error<T: std::fmt::Debug>(result: agenthold_core::Result<T>) -> (String, String) {
    match result {
        Err(Error::Config { key, problem }) => (key, problem),
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

fn fails_on(yaml: &str, key: &str) -> String {
    let (got, problem) = config_error(Config::from_yaml(yaml, no_env()));
    assert_eq!(got, key, "{yaml:?}: {problem}");
    problem
}

const FULL: &str = "\
data_dir: /srv/agenthold
egress:
  disabled: true
  proxy_port: 25001
  explicit_port: 25002
  dns_port: 25053
  tunnel_port: 25003
  dns_upstream: 192.0.2.53:5353
  log_keep: 100
  leak_guard: log
  sniff_timeout_secs: 3
  connect_timeout_secs: 4
  idle_timeout_secs: 60
  deny_cidrs: [45.77.0.0/16, 2a0e:97c0:1::/48]
  dns_agent_qps: 50
  dns_agent_burst: 60
  dns_gateway_qps: 500
  dns_gateway_burst: 700
  dns_gateway_reserve: 100
secrets:
  master_key_file: /run/secrets/agenthold.key
sandbox:
  runtime: sysbox-runc
  image: example/agent:1
  cpus: 0.5
  memory_bytes: 536870912
  pids: 64
  subnet_pool: 10.99.0.0/20
server:
  listen: 0.0.0.0:9090
";

// covers: E17
#[test]
fn empty_yaml_gives_the_seeds_defaults() {
    for text in ["", "\n", "# nothing\n", "~", "egress:\nsecrets:\n"] {
        let c = Config::from_yaml(text, no_env()).unwrap();
        assert_eq!(c, Config::default(), "{text:?}");
        assert_eq!(c.data_dir, PathBuf::new());
        let e = &c.egress;
        assert!(!e.disabled);
        assert_eq!(e.proxy_port, 15001);
        assert_eq!(e.explicit_port, 15002);
        assert_eq!(e.dns_port, 15053);
        assert_eq!(e.tunnel_port, 15003);
        assert_eq!(e.dns_upstream, "");
        assert_eq!(e.log_keep, 5000);
        assert_eq!(e.leak_guard, LeakGuard::Block);
        assert_eq!(e.sniff_timeout(), Duration::from_secs(10));
        assert_eq!(e.connect_timeout(), Duration::from_secs(10));
        assert_eq!(e.idle_timeout(), Duration::from_secs(600));
        assert_eq!(c.secrets.master_key_file, PathBuf::new());
        let s = &c.sandbox;
        assert_eq!(s.runtime, ContainerRuntime::Runc);
        assert_eq!(s.runtime.as_str(), "runc");
        assert_eq!(s.image, "agenthold/dev:latest");
        assert!((s.cpus - 2.0).abs() < f64::EPSILON);
        assert_eq!(s.memory_bytes, 2_147_483_648);
        assert_eq!(s.pids, 512);
        assert_eq!(s.subnet_pool.to_string(), "10.213.0.0/16");
        assert_eq!(s.subnet_prefix, 28);
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
    }
}

// covers: E17
#[test]
fn master_key_file_defaults_to_data_dir() {
    let c = Config::from_yaml("data_dir: /srv/ah\n", no_env()).unwrap();
    assert_eq!(c.data_dir().unwrap(), Path::new("/srv/ah"));
    assert_eq!(c.master_key_file().unwrap(), Path::new("/srv/ah/master.key"));
    let c = Config::from_yaml("secrets:\n  master_key_file: /k/m.key\n", no_env()).unwrap();
    assert_eq!(c.master_key_file().unwrap(), Path::new("/k/m.key"));
    // With no data_dir, the key still lives in the (derived) data directory.
    let c = Config::default();
    if let Ok(dir) = c.data_dir() {
        assert!(dir.ends_with("agenthold"), "{}", dir.display());
        assert_eq!(c.master_key_file().unwrap(), dir.join("master.key"));
    }
}

// covers: E17
#[test]
fn default_data_dir_rules() {
    fn s(p: &str) -> Option<&OsStr> {
        Some(OsStr::new(p))
    }
    let p = |p: &str| Some(PathBuf::from(p));
    assert_eq!(
        default_data_dir(true, s("/x"), s("/root")),
        p("/var/lib/agenthold")
    );
    assert_eq!(
        default_data_dir(false, s("/x/data"), s("/home/u")),
        p("/x/data/agenthold")
    );
    assert_eq!(
        default_data_dir(false, None, s("/home/u")),
        p("/home/u/.local/share/agenthold")
    );
    // A relative XDG_DATA_HOME is ignored, as the XDG specification says.
    assert_eq!(
        default_data_dir(false, s("rel"), s("/home/u")),
        p("/home/u/.local/share/agenthold")
    );
    assert_eq!(
        default_data_dir(false, s(""), s("/home/u")),
        p("/home/u/.local/share/agenthold")
    );
    assert_eq!(default_data_dir(false, None, None), None);
    assert_eq!(default_data_dir(false, None, s("")), None);
}

// covers: E17
#[test]
fn full_yaml_round_trips() {
    let c = Config::from_yaml(FULL, no_env()).unwrap();
    assert_eq!(c.data_dir, Path::new("/srv/agenthold"));
    assert!(c.egress.disabled);
    assert_eq!(
        (
            c.egress.proxy_port,
            c.egress.explicit_port,
            c.egress.dns_port,
            c.egress.tunnel_port
        ),
        (25001, 25002, 25053, 25003)
    );
    assert_eq!(
        c.egress.dns_upstream().unwrap(),
        "192.0.2.53:5353".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(c.egress.log_keep, 100);
    assert_eq!(c.egress.leak_guard, LeakGuard::Log);
    assert_eq!(c.egress.idle_timeout(), Duration::from_secs(60));
    assert_eq!(
        c.egress.deny_cidrs,
        [
            "45.77.0.0/16".parse::<IpNet>().unwrap(),
            "2a0e:97c0:1::/48".parse().unwrap()
        ]
    );
    let e = &c.egress;
    assert_eq!(
        (
            e.dns_agent_qps,
            e.dns_agent_burst,
            e.dns_gateway_qps,
            e.dns_gateway_burst,
            e.dns_gateway_reserve
        ),
        (50, 60, 500, 700, 100)
    );
    assert_eq!(
        c.master_key_file().unwrap(),
        Path::new("/run/secrets/agenthold.key")
    );
    assert_eq!(c.sandbox.runtime, ContainerRuntime::SysboxRunc);
    assert_eq!(c.sandbox.image, "example/agent:1");
    assert!((c.sandbox.cpus - 0.5).abs() < f64::EPSILON);
    assert_eq!((c.sandbox.memory_bytes, c.sandbox.pids), (536_870_912, 64));
    assert_eq!(c.sandbox.subnet_pool.to_string(), "10.99.0.0/20");
    assert_eq!(c.server.listen.to_string(), "0.0.0.0:9090");

    let yaml = serde_saphyr::to_string(&c).unwrap();
    assert_eq!(Config::from_yaml(&yaml, no_env()).unwrap(), c, "{yaml}");
    let defaults = serde_saphyr::to_string(&Config::default()).unwrap();
    assert_eq!(
        Config::from_yaml(&defaults, no_env()).unwrap(),
        Config::default(),
        "{defaults}"
    );
}

// covers: E17
#[test]
fn runtimes_and_leak_guard_values() {
    for (name, runtime) in [
        ("runc", ContainerRuntime::Runc),
        ("runsc", ContainerRuntime::Runsc),
        ("sysbox-runc", ContainerRuntime::SysboxRunc),
    ] {
        let c = Config::from_yaml(&format!("sandbox:\n  runtime: {name}\n"), no_env()).unwrap();
        assert_eq!(c.sandbox.runtime, runtime);
        assert_eq!(runtime.as_str(), name);
    }
    let problem = fails_on("sandbox:\n  runtime: kata\n", "sandbox.runtime");
    assert!(
        problem.contains("runsc") && problem.contains("sysbox-runc"),
        "{problem}"
    );
    let problem = fails_on("egress:\n  leak_guard: warn\n", "egress.leak_guard");
    assert!(problem.contains("block") && problem.contains("log"), "{problem}");
}

// covers: E17
#[test]
fn unknown_keys_fail_naming_the_path() {
    let problem = fails_on("egress:\n  proxy_prot: 1\n", "egress.proxy_prot");
    assert!(problem.contains("proxy_port"), "known keys are listed: {problem}");
    fails_on("egres:\n  proxy_port: 1\n", "egres");
    fails_on("secrets:\n  master_key: x\n", "secrets.master_key");
    fails_on("sandbox:\n  memory: 1\n", "sandbox.memory");
    fails_on("server:\n  port: 1\n", "server.port");
    fails_on("data_dir: /x\nextra: 1\n", "extra");
}

// covers: E17
#[test]
fn wrong_types_fail_naming_the_key() {
    for (yaml, key) in [
        ("egress:\n  proxy_port: abc\n", "egress.proxy_port"),
        ("egress:\n  proxy_port: 1.5\n", "egress.proxy_port"),
        ("egress:\n  proxy_port: [1]\n", "egress.proxy_port"),
        ("egress:\n  disabled: maybe\n", "egress.disabled"),
        ("egress:\n  log_keep: -1\n", "egress.log_keep"),
        (
            "egress:\n  idle_timeout_secs: forever\n",
            "egress.idle_timeout_secs",
        ),
        ("sandbox:\n  cpus: two\n", "sandbox.cpus"),
        ("sandbox:\n  subnet_pool: fd00::/64\n", "sandbox.subnet_pool"),
        ("sandbox:\n  subnet_pool: 10.0.0.0\n", "sandbox.subnet_pool"),
        ("server:\n  listen: localhost\n", "server.listen"),
        ("egress: 5\n", "egress"),
        ("egress:\n  proxy_port:\n", "egress.proxy_port"),
        ("data_dir: [a]\n", "data_dir"),
    ] {
        fails_on(yaml, key);
    }
    let (key, problem) = config_error(Config::from_yaml("- a\n- b\n", no_env()));
    assert!(problem.contains("mapping"), "{key}: {problem}");
    let (_, problem) = config_error(Config::from_yaml("egress: [1\n", no_env()));
    assert!(problem.contains("YAML"), "{problem}");
}

// covers: E17
#[test]
fn out_of_range_values_fail_naming_the_key() {
    for (yaml, key, expected) in [
        ("egress:\n  proxy_port: 0\n", "egress.proxy_port", "1 to 65535"),
        ("egress:\n  dns_port: 70000\n", "egress.dns_port", "70000"),
        ("egress:\n  tunnel_port: 0\n", "egress.tunnel_port", "1 to 65535"),
        ("egress:\n  log_keep: 0\n", "egress.log_keep", "at least 1"),
        (
            "egress:\n  log_max_bytes: 100\n",
            "egress.log_max_bytes",
            "at least 4096",
        ),
        (
            "egress:\n  max_connections_per_agent: 0\n",
            "egress.max_connections_per_agent",
            "at least 1",
        ),
        (
            "egress:\n  max_requests_per_agent: 0\n",
            "egress.max_requests_per_agent",
            "at least 1",
        ),
        (
            "egress:\n  sniff_timeout_secs: 0\n",
            "egress.sniff_timeout_secs",
            "at least 1",
        ),
        (
            "egress:\n  dns_upstream: dns.example\n",
            "egress.dns_upstream",
            "IP",
        ),
        (
            "egress:\n  dns_upstream: 192.0.2.1:0\n",
            "egress.dns_upstream",
            "IP",
        ),
        ("sandbox:\n  cpus: 0\n", "sandbox.cpus", "greater than 0"),
        ("sandbox:\n  cpus: -1.5\n", "sandbox.cpus", "greater than 0"),
        (
            "sandbox:\n  memory_bytes: 1048576\n",
            "sandbox.memory_bytes",
            "16 MiB",
        ),
        ("sandbox:\n  pids: 15\n", "sandbox.pids", "at least 16"),
        (
            "sandbox:\n  subnet_pool: 10.0.0.0/29\n",
            "sandbox.subnet_pool",
            "/28",
        ),
        (
            "sandbox:\n  subnet_pool: 10.0.0.0/25\n  subnet_prefix: 24\n",
            "sandbox.subnet_pool",
            "/24",
        ),
        (
            "sandbox:\n  subnet_prefix: 30\n",
            "sandbox.subnet_prefix",
            "16 to 29",
        ),
        (
            "sandbox:\n  subnet_prefix: 15\n",
            "sandbox.subnet_prefix",
            "16 to 29",
        ),
        (
            "sandbox:\n  subnet_pool: 10.213.1.0/16\n",
            "sandbox.subnet_pool",
            "10.213.0.0/16",
        ),
        ("sandbox:\n  image: ''\n", "sandbox.image", "empty"),
        ("data_dir: relative/dir\n", "data_dir", "absolute"),
        (
            "secrets:\n  master_key_file: key\n",
            "secrets.master_key_file",
            "absolute",
        ),
    ] {
        let problem = fails_on(yaml, key);
        assert!(problem.contains(expected), "{yaml:?}: {problem}");
    }
    // Boundaries that are fine.
    let ok = "egress:\n  proxy_port: 1\n  explicit_port: 65535\n  log_keep: 1\n\
              sandbox:\n  memory_bytes: 16777216\n  pids: 16\n  subnet_pool: 10.0.0.0/24\n  cpus: 0.01\n";
    Config::from_yaml(ok, no_env()).unwrap();
}

// covers: E17
#[test]
fn duplicate_ports_fail() {
    let problem = fails_on("egress:\n  explicit_port: 15001\n", "egress.explicit_port");
    assert!(problem.contains("egress.proxy_port"), "{problem}");
    fails_on("egress:\n  tunnel_port: 15053\n", "egress.tunnel_port");
    fails_on("egress:\n  dns_port: 15002\n", "egress.dns_port");
    // Swapping two ports is fine.
    Config::from_yaml("egress:\n  proxy_port: 15002\n  explicit_port: 15001\n", no_env()).unwrap();
    // Duplicate keys in the YAML itself are refused too.
    config_error(Config::from_yaml(
        "egress:\n  dns_port: 1\n  dns_port: 2\n",
        no_env(),
    ));
}

// covers: E17
#[test]
fn env_overrides_win_over_the_file() {
    let c = Config::from_yaml(
        FULL,
        env(&[
            ("AGENTHOLD_EGRESS_PROXY_PORT", "35001"),
            ("AGENTHOLD_EGRESS_DISABLED", "false"),
            ("AGENTHOLD_DATA_DIR", "/var/data"),
            ("AGENTHOLD_SECRETS_MASTER_KEY_FILE", "/etc/ah: key"),
            ("AGENTHOLD_SANDBOX_CPUS", "4"),
            ("AGENTHOLD_SANDBOX_RUNTIME", "runsc"),
            ("AGENTHOLD_EGRESS_LEAK_GUARD", "block"),
            ("AGENTHOLD_SERVER_LISTEN", "[::1]:8081"),
            ("AGENTHOLD_EGRESS_DNS_UPSTREAM", "2001:db8::53"),
        ]),
    )
    .unwrap();
    assert_eq!(c.egress.proxy_port, 35001);
    assert_eq!(
        c.egress.explicit_port, 25002,
        "keys without a variable keep the file's value"
    );
    assert!(!c.egress.disabled);
    assert_eq!(c.data_dir, Path::new("/var/data"));
    assert_eq!(
        c.master_key_file().unwrap(),
        Path::new("/etc/ah: key"),
        "text values are taken verbatim"
    );
    assert!((c.sandbox.cpus - 4.0).abs() < f64::EPSILON);
    assert_eq!(c.sandbox.runtime, ContainerRuntime::Runsc);
    assert_eq!(c.egress.leak_guard, LeakGuard::Block);
    assert_eq!(c.server.listen.to_string(), "[::1]:8081");
    assert_eq!(c.egress.dns_upstream().unwrap().to_string(), "[2001:db8::53]:53");
    // Over the defaults too, and the last value of a repeated variable wins.
    let c = Config::from_yaml(
        "",
        env(&[
            ("AGENTHOLD_EGRESS_LOG_KEEP", "10"),
            ("AGENTHOLD_EGRESS_LOG_KEEP", "20"),
        ]),
    )
    .unwrap();
    assert_eq!(c.egress.log_keep, 20);
}

// covers: E17
#[test]
fn unknown_agenthold_variables_are_ignored() {
    let c = Config::from_yaml(
        "",
        env(&[
            ("AGENTHOLD_MASTER_KEY", "not a config key"),
            ("AGENTHOLD_EGRESS_PROXY_PROT", "1"),
            ("agenthold_egress_proxy_port", "1"),
            ("PATH", "/bin"),
        ]),
    )
    .unwrap();
    assert_eq!(c, Config::default());
}

// covers: E17
#[test]
fn bad_env_values_name_the_variable() {
    for (var, value, expected) in [
        ("AGENTHOLD_EGRESS_PROXY_PORT", "abc", "egress.proxy_port"),
        ("AGENTHOLD_EGRESS_PROXY_PORT", "0", "1 to 65535"),
        ("AGENTHOLD_EGRESS_PROXY_PORT", "15002", "egress.explicit_port"),
        ("AGENTHOLD_EGRESS_PROXY_PORT", "", "egress.proxy_port"),
        ("AGENTHOLD_EGRESS_DISABLED", "perhaps", "egress.disabled"),
        ("AGENTHOLD_EGRESS_LOG_KEEP", "a: b", "egress.log_keep"),
        ("AGENTHOLD_EGRESS_LOG_KEEP", "[1", "egress.log_keep"),
        ("AGENTHOLD_SANDBOX_RUNTIME", "kata", "sandbox.runtime"),
        ("AGENTHOLD_SANDBOX_PIDS", "1", "at least 16"),
        ("AGENTHOLD_DATA_DIR", "relative", "absolute"),
        ("AGENTHOLD_EGRESS_DNS_UPSTREAM", "nope", "egress.dns_upstream"),
        ("AGENTHOLD_SERVER_PUBLIC_URL", "ftp://x", "server.public_url"),
        ("AGENTHOLD_SERVER_PUBLIC_URL", "https://x/path", "without a path"),
        ("AGENTHOLD_AUTH_SESSION_IDLE_SECS", "0", "auth.session_idle_secs"),
    ] {
        let (key, problem) = config_error(Config::from_yaml("", env(&[(var, value)])));
        assert_eq!(key, var, "{value:?}: {problem}");
        assert!(problem.contains(expected), "{var}={value:?}: {problem}");
    }
}

// covers: E17
#[test]
fn every_key_has_a_variable() {
    let vars = Config::environment_variables().unwrap();
    for (var, key) in [
        ("AGENTHOLD_DATA_DIR", "data_dir"),
        ("AGENTHOLD_STORE", "store"),
        ("AGENTHOLD_STORE_PASSWORD_FILE", "store_password_file"),
        ("AGENTHOLD_EGRESS_PROXY_PORT", "egress.proxy_port"),
        ("AGENTHOLD_EGRESS_IDLE_TIMEOUT_SECS", "egress.idle_timeout_secs"),
        ("AGENTHOLD_SECRETS_MASTER_KEY_FILE", "secrets.master_key_file"),
        ("AGENTHOLD_SANDBOX_SUBNET_POOL", "sandbox.subnet_pool"),
        ("AGENTHOLD_SANDBOX_SUBNET_PREFIX", "sandbox.subnet_prefix"),
        ("AGENTHOLD_SERVER_LISTEN", "server.listen"),
        ("AGENTHOLD_SERVER_PUBLIC_URL", "server.public_url"),
        ("AGENTHOLD_AUTH_RATE_PER_USER", "auth.rate_per_user"),
    ] {
        assert!(vars.contains(&(var.to_owned(), key.to_owned())), "{var}");
    }
    let harness_logins = vars
        .iter()
        .filter(|(_, k)| k.starts_with("harness_logins."))
        .count();
    // Two of its own, nine per provider (Claude, ChatGPT).
    assert_eq!(harness_logins, 2 + 2 * 9);
    // data_dir, the store's three keys, then egress, secrets, sandbox, server, auth, its providers.
    assert_eq!(vars.len(), 1 + 3 + 26 + 1 + 8 + 2 + 6 + 5 + 5 + harness_logins);
    for key in [
        "auth.oidc.issuer",
        "auth.oidc.scopes",
        "auth.github.token_url",
        "harness_logins.recheck_secs",
        "harness_logins.claude.token_url",
        "harness_logins.chatgpt.client_id",
    ] {
        assert!(vars.iter().any(|(_, k)| k == key), "{key}");
    }
    // The master key variable is not a configuration key, so it can never be mistaken for one.
    assert!(vars.iter().all(|(var, _)| var != "AGENTHOLD_MASTER_KEY"));
}

// covers: E17
#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agenthold.yaml");
    std::fs::write(&path, "egress:\n  log_keep: 7\n").unwrap();
    let c = Config::load(Some(&path)).unwrap();
    // The process environment of the test runner carries no AGENTHOLD_EGRESS_LOG_KEEP.
    if std::env::var_os("AGENTHOLD_EGRESS_LOG_KEEP").is_none() {
        assert_eq!(c.egress.log_keep, 7);
    }
    std::fs::write(&path, "egress: [1\n").unwrap();
    let (key, _) = config_error(Config::load(Some(&path)));
    assert_eq!(key, path.display().to_string());
    assert!(matches!(
        Config::load(Some(&dir.path().join("missing.yaml"))),
        Err(Error::Io { .. })
    ));
}

// covers: E17
#[test]
fn dns_upstream_forms() {
    for (value, expected) in [
        ("192.0.2.1", "192.0.2.1:53"),
        ("192.0.2.1:5353", "192.0.2.1:5353"),
        ("2001:db8::1", "[2001:db8::1]:53"),
        ("[2001:db8::1]", "[2001:db8::1]:53"),
        ("[2001:db8::1]:5353", "[2001:db8::1]:5353"),
    ] {
        let c = Config::from_yaml(&format!("egress:\n  dns_upstream: '{value}'\n"), no_env()).unwrap();
        assert_eq!(c.egress.dns_upstream().unwrap().to_string(), expected, "{value}");
    }
}

// covers: E17
#[test]
fn resolv_conf_parsing() {
    let ns = |text: &str| parse_resolv_conf(text).map(|a| a.to_string());
    assert_eq!(ns("nameserver 192.0.2.53\n"), Some("192.0.2.53:53".into()));
    assert_eq!(
        ns(
            "# generated\n; comment\nsearch example.com\noptions ndots:5\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n"
        ),
        Some("10.0.0.2:53".into())
    );
    assert_eq!(
        ns("#nameserver 1.1.1.1\nnameserver 9.9.9.9 # trailing\n"),
        Some("9.9.9.9:53".into())
    );
    assert_eq!(
        ns("  nameserver\t2001:db8::53  \n"),
        Some("[2001:db8::53]:53".into())
    );
    // A link-local address with a numeric zone keeps it; one with an interface name is skipped.
    assert_eq!(ns("nameserver fe80::1%2\n"), Some("[fe80::1%2]:53".into()));
    assert_eq!(
        ns("nameserver fe80::1%eth0\nnameserver 192.0.2.9\n"),
        Some("192.0.2.9:53".into())
    );
    // Garbage is skipped, not fatal.
    assert_eq!(
        ns("nameserver\nnameserver not-an-ip\nnameservers 1.2.3.4\nnameserver 127.0.0.53\n"),
        Some("127.0.0.53:53".into())
    );
    assert_eq!(ns(""), None);
    assert_eq!(ns("search example.com\n# nameserver 1.1.1.1\n"), None);
    assert_eq!(ns("nameserver fe80::1%eth0\n"), None);
}

// covers: E22, E20
#[test]
fn deny_cidrs_and_dns_budgets_have_documented_defaults_and_are_checked() {
    let e = Config::default().egress;
    assert!(e.deny_cidrs.is_empty());
    assert_eq!(
        (
            e.dns_agent_qps,
            e.dns_agent_burst,
            e.dns_gateway_qps,
            e.dns_gateway_burst,
            e.dns_gateway_reserve
        ),
        (200, 400, 2000, 4000, 1000)
    );
    let c = Config::from_yaml(
        "egress:\n  deny_cidrs:\n    - 203.0.113.0/24\n    - fd00::/8\n",
        no_env(),
    )
    .unwrap();
    assert_eq!(c.egress.deny_cidrs.len(), 2);
    for (yaml, key, expected) in [
        (
            "egress:\n  deny_cidrs: [45.77.0.0/33]\n",
            "egress.deny_cidrs[0]",
            "",
        ),
        (
            "egress:\n  deny_cidrs: [8.8.8.8/32, nonsense]\n",
            "egress.deny_cidrs[1]",
            "",
        ),
        (
            "egress:\n  deny_cidrs: [45.77.1.2/16]\n",
            "egress.deny_cidrs[0]",
            "did you mean 45.77.0.0/16",
        ),
        (
            "egress:\n  deny_cidrs: [\"2a0e::1/16\"]\n",
            "egress.deny_cidrs[0]",
            "host bits",
        ),
        ("egress:\n  deny_cidrs: 10.0.0.0/8\n", "egress.deny_cidrs", ""),
        (
            "egress:\n  dns_agent_qps: 0\n",
            "egress.dns_agent_qps",
            "at least 1",
        ),
        (
            "egress:\n  dns_agent_burst: 0\n",
            "egress.dns_agent_burst",
            "at least 1",
        ),
        (
            "egress:\n  dns_gateway_qps: 0\n",
            "egress.dns_gateway_qps",
            "at least 1",
        ),
        (
            "egress:\n  dns_gateway_burst: 10\n",
            "egress.dns_gateway_reserve",
            "less than",
        ),
        (
            "egress:\n  dns_gateway_reserve: 4000\n",
            "egress.dns_gateway_reserve",
            "less than",
        ),
        ("egress:\n  dns_agent_qps: -5\n", "egress.dns_agent_qps", ""),
        (
            "egress:\n  dns_upstream_sockets: 0\n",
            "egress.dns_upstream_sockets",
            "at least 1",
        ),
        (
            "egress:\n  dns_cache_min_ttl_secs: 7200\n",
            "egress.dns_cache_min_ttl_secs",
            "must not exceed",
        ),
    ] {
        let problem = fails_on(yaml, key);
        assert!(problem.contains(expected), "{yaml:?}: {problem}");
    }
    // From the environment: a comma-separated list, replacing the file's.
    let c = Config::from_yaml(
        FULL,
        env(&[
            ("AGENTHOLD_EGRESS_DENY_CIDRS", " 198.51.100.0/24, 2001:db8::/32 ,"),
            ("AGENTHOLD_EGRESS_DNS_AGENT_QPS", "7"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.egress.deny_cidrs,
        [
            "198.51.100.0/24".parse::<IpNet>().unwrap(),
            "2001:db8::/32".parse().unwrap()
        ]
    );
    assert_eq!(c.egress.dns_agent_qps, 7);
    let c = Config::from_yaml(FULL, env(&[("AGENTHOLD_EGRESS_DENY_CIDRS", "")])).unwrap();
    assert!(
        c.egress.deny_cidrs.is_empty(),
        "an empty variable empties the list"
    );
    let (key, problem) = config_error(Config::from_yaml(
        "",
        env(&[("AGENTHOLD_EGRESS_DENY_CIDRS", "10.0.0.0/8,bad")]),
    ));
    assert_eq!(key, "AGENTHOLD_EGRESS_DENY_CIDRS", "{problem}");
    assert!(problem.contains("egress.deny_cidrs"), "{problem}");
    let (key, _) = config_error(Config::from_yaml(
        "",
        env(&[("AGENTHOLD_EGRESS_DENY_CIDRS", "10.0.0.1/8")]),
    ));
    assert_eq!(key, "AGENTHOLD_EGRESS_DENY_CIDRS");
}

// covers: E17, S6
#[test]
fn login_providers_are_optional_sections_with_checked_keys() {
    let c = Config::from_yaml("", no_env()).unwrap();
    assert!(c.auth.oidc.is_none() && c.auth.github.is_none());
    for off in ["auth:\n  oidc:\n", "auth:\n  oidc: null\n  github: ~\n"] {
        let c = Config::from_yaml(off, no_env()).unwrap();
        assert!(c.auth.oidc.is_none() && c.auth.github.is_none(), "{off}");
    }
    let yaml = "auth:\n  oidc:\n    issuer: https://id.example.com/realms/x\n    client_id: agenthold\n    client_secret_file: /run/s\n  github:\n    client_id: gh\n    client_secret_file: /run/g\n";
    let c = Config::from_yaml(yaml, no_env()).unwrap();
    let o = c.auth.oidc.clone().unwrap();
    assert_eq!(o.name, "OIDC");
    assert_eq!(o.scopes, ["openid", "email", "profile"]);
    let g = c.auth.github.clone().unwrap();
    assert_eq!(g.authorize_url, "https://github.com/login/oauth/authorize");
    assert_eq!(g.token_url, "https://github.com/login/oauth/access_token");
    assert_eq!(g.api_url, "https://api.github.com");
    let round = serde_saphyr::to_string(&c).unwrap();
    assert_eq!(Config::from_yaml(&round, no_env()).unwrap(), c, "{round}");

    let problem = fails_on(
        "auth:\n  oidc:\n    issuer: https://x\n    client_id: a\n    client_secret_file: /s\n    colour: red\n",
        "auth.oidc.colour",
    );
    assert!(problem.contains("unknown key"), "{problem}");
    let problem = fails_on(
        "auth:\n  oidc:\n    issuer: http://id.example.com\n    client_id: a\n    client_secret_file: /s\n",
        "auth.oidc.issuer",
    );
    assert_eq!(problem, "must be https unless the host is loopback");
    for loopback in [
        "http://127.0.0.1:5556/dex",
        "http://localhost:8080",
        "http://[::1]:9000",
    ] {
        let yaml =
            format!("auth:\n  oidc:\n    issuer: {loopback}\n    client_id: a\n    client_secret_file: /s\n");
        Config::from_yaml(&yaml, no_env()).unwrap();
    }
    fails_on(
        "auth:\n  oidc:\n    client_id: a\n    client_secret_file: /s\n",
        "auth.oidc.issuer",
    );
    fails_on(
        "auth:\n  oidc:\n    issuer: https://x\n    client_secret_file: /s\n",
        "auth.oidc.client_id",
    );
    fails_on(
        "auth:\n  oidc:\n    issuer: https://x\n    client_id: a\n    client_secret_file: rel\n",
        "auth.oidc.client_secret_file",
    );
    fails_on(
        "auth:\n  oidc:\n    issuer: https://x\n    client_id: a\n    client_secret_file: /s\n    scopes: [email]\n",
        "auth.oidc.scopes",
    );
    fails_on(
        "auth:\n  github:\n    client_id: a\n    client_secret_file: /s\n    token_url: http://github.example.com/t\n",
        "auth.github.token_url",
    );
    fails_on(
        "auth:\n  github:\n    client_secret_file: /s\n",
        "auth.github.client_id",
    );

    // Environment variables reach the keys of an absent section (and so turn it on).
    let c = Config::from_yaml(
        "",
        env(&[
            ("AGENTHOLD_AUTH_GITHUB_CLIENT_ID", "from-env"),
            ("AGENTHOLD_AUTH_GITHUB_CLIENT_SECRET_FILE", "/run/gh"),
        ]),
    )
    .unwrap();
    assert_eq!(c.auth.github.unwrap().client_id, "from-env");
    let (key, _) = config_error(Config::from_yaml(
        "",
        env(&[("AGENTHOLD_AUTH_OIDC_ISSUER", "ftp://x")]),
    ));
    assert_eq!(key, "AGENTHOLD_AUTH_OIDC_ISSUER");
}

// covers: S6
#[test]
fn client_secret_files_are_read_and_errors_name_the_key() {
    use agenthold_core::config::read_client_secret;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    std::fs::write(&path, "s3cret\n").unwrap();
    assert_eq!(
        read_client_secret("auth.github.client_secret_file", &path).unwrap(),
        "s3cret"
    );
    let missing = dir.path().join("missing");
    let (key, problem) = config_error(read_client_secret("auth.github.client_secret_file", &missing));
    assert_eq!(key, "auth.github.client_secret_file");
    assert!(problem.starts_with("cannot read "), "{problem}");
    std::fs::write(&path, " \n").unwrap();
    let (_, problem) = config_error(read_client_secret("auth.oidc.client_secret_file", &path));
    assert!(problem.ends_with("is empty"), "{problem}");
}

// covers: E17, C2
/// `store` is empty (the redb file) or a PostgreSQL URL; anything else fails naming the key, and a
/// password in a refused value is not repeated. The password and CA files must be absolute paths.
#[test]
fn store_is_a_postgres_url_or_empty() {
    let config = Config::from_yaml(
        "store: postgres://agenthold@db.internal:5432/agenthold?sslmode=require\n\
         store_password_file: /etc/agenthold/db-password\n",
        no_env(),
    )
    .unwrap();
    assert_eq!(
        config.store,
        "postgres://agenthold@db.internal:5432/agenthold?sslmode=require"
    );
    assert!(Config::from_yaml("", no_env()).unwrap().store.is_empty());
    let problem = fails_on("store: mysql://root:hunter2@db/x\n", "store");
    assert!(problem.contains("postgres://"), "{problem}");
    assert!(!problem.contains("hunter2"), "{problem}");
    fails_on("store_password_file: db-password\n", "store_password_file");
    fails_on("store_ca_file: ca.pem\n", "store_ca_file");
    let (key, problem) = config_error(Config::from_yaml(
        "",
        env(&[("AGENTHOLD_STORE", "sqlite:///tmp/x")]),
    ));
    assert_eq!(key, "AGENTHOLD_STORE", "{problem}");
}

// covers: C2
/// A PostgreSQL store in a build without the `postgres` feature is a configuration error that says what
/// to build, never a silent fallback to the file.
#[cfg(not(feature = "postgres"))]
#[test]
fn a_postgres_store_needs_the_feature() {
    let config = Config::from_yaml(
        "store: postgres://u:pw-x@h/d\ndata_dir: /nonexistent-agenthold\n",
        no_env(),
    )
    .unwrap();
    let err = block_on_now(agenthold_core::store::open_configured(&config))
        .map(drop)
        .unwrap_err();
    assert_eq!(err.kind(), agenthold_core::ErrorKind::Config);
    assert!(err.to_string().contains("feature `postgres`"), "{err}");
    assert!(!err.to_string().contains("pw-x"), "{err}");
}

/// Poll a future that never waits on anything (the feature check answers at once).
#[cfg(not(feature = "postgres"))]
fn block_on_now<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}
