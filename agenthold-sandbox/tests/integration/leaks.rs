//! No leaks (issue 5, item 7), by counting: this installation's containers, networks and volumes (by
//! label), the agents' bridges and veth ends on the host, their `DOCKER-USER` accepts and their entries in
//! the host nftables table, and the gateway holder; after a create and remove, after failed creates, and
//! after two agents are removed (the idle holder stays until the runtime shuts down).
//!
//! Counts are scoped to this test's installation and agents: other runtimes may be using the engine at the
//! same time, so global totals are printed but not compared.

use agenthold_core::secret::{SecretRule, SecretSpec};
use agenthold_core::{AgentId, SandboxSpec};
use agenthold_sandbox::docker::network::AgentNetwork;

use crate::support::*;

/// What exists of an installation and a set of its agents.
#[derive(Debug, Default, PartialEq, Eq)]
struct Footprint {
    containers: Vec<String>,
    networks: Vec<String>,
    volumes: Vec<String>,
    /// Bridges (of the given ones) that exist on the host.
    bridges: Vec<String>,
    /// Veth ends (of the given ones) that exist on the host.
    veths: Vec<String>,
    /// `DOCKER-USER` rules naming one of the bridges.
    docker_user: Vec<String>,
    /// The bridges (of the given ones) the host table names.
    host_table: Vec<String>,
}

fn bridge_of(agent: &AgentId) -> String {
    AgentNetwork::for_agent(agent, "10.0.0.0/24".parse().unwrap()).bridge
}

/// Host interfaces enslaved to `bridge` (the sandbox's and the holder's veth ends).
fn veths_of(bridge: &str) -> Vec<String> {
    let out = host("ip", &["-o", "link", "show", "master", bridge]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

fn links() -> Vec<String> {
    let out = host("ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

async fn footprint(instance: &str, bridges: &[String], veths: &[String]) -> Footprint {
    let (containers, networks, volumes) = engine_objects(instance).await;
    let links = links();
    let rules = String::from_utf8_lossy(&host("iptables", &["-S", "DOCKER-USER"]).stdout).into_owned();
    let table = host(
        "nft",
        &[
            "list",
            "table",
            "inet",
            &agenthold_sandbox::docker::hostfw::host_table(instance),
        ],
    );
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let named = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| bridges.iter().any(|b| l.contains(b.as_str())))
            .map(str::to_owned)
            .collect()
    };
    Footprint {
        containers,
        networks,
        volumes,
        bridges: bridges.iter().filter(|b| links.contains(b)).cloned().collect(),
        veths: veths.iter().filter(|v| links.contains(v)).cloned().collect(),
        docker_user: named(&rules),
        host_table: bridges
            .iter()
            .filter(|b| table.contains(b.as_str()))
            .cloned()
            .collect(),
    }
}

/// Engine-wide totals, for the record.
async fn totals() -> String {
    let docker = docker().await;
    let containers = docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .len();
    let networks = docker
        .list_networks(None::<bollard::query_parameters::ListNetworksOptions>)
        .await
        .unwrap()
        .len();
    let volumes = docker
        .list_volumes(None::<bollard::query_parameters::ListVolumesOptions>)
        .await
        .unwrap()
        .volumes
        .unwrap_or_default()
        .len();
    let rules = String::from_utf8_lossy(&host("iptables", &["-S", "DOCKER-USER"]).stdout)
        .lines()
        .count();
    format!(
        "containers {containers}, networks {networks}, volumes {volumes}, links {}, \
         DOCKER-USER rules {rules}",
        links().len(),
    )
}

/// A secret that `SecretSpec::new` would refuse (an invalid environment variable name, no rules), built
/// field by field as the public struct allows.
pub fn bad_secret() -> SecretSpec {
    SecretSpec {
        name: "bad secret!".into(),
        value: "v".into(),
        env: Some("1-NOT VALID".into()),
        rules: Vec::<SecretRule>::new(),
    }
}

// covers: C5, P1, S1
#[tokio::test]
#[ignore = "needs root and Docker: run with make test"]
async fn nothing_is_left_after_remove_or_a_failed_create() {
    let env = Env::start().await;
    env.guard(async {
        eprintln!("engine totals before: {}", totals().await);
        // An installation keeps its gateway holder up, idle (no networks, rules or listeners), from the
        // runtime's start to its shutdown, so no create has to start it.
        let empty = Footprint::default();
        let idle = Footprint {
            containers: vec![format!("/agenthold-gw-{}", env.instance)],
            ..Footprint::default()
        };
        let started = wait_for(std::time::Duration::from_secs(60), || async {
            footprint(&env.instance, &[], &[]).await == idle
        })
        .await;
        assert!(
            started.is_some(),
            "a fresh installation owns its idle holder only: {:#?}",
            footprint(&env.instance, &[], &[]).await
        );

        // (a) create, then remove.
        let a = env.sandbox(None).await;
        let bridge = bridge_of(&a);
        assert_eq!(network(&a).await.bridge, bridge);
        let (bridges, veths) = (vec![bridge.clone()], veths_of(&bridge));
        let during = footprint(&env.instance, &bridges, &veths).await;
        let engine = |f: &Footprint| (f.containers.len(), f.networks.len(), f.volumes.len());
        let host_side = |f: &Footprint| (f.bridges.len(), f.veths.len(), f.docker_user.len());
        assert_eq!(
            engine(&during),
            (2, 1, 1),
            "sandbox + holder, network, volume: {during:#?}"
        );
        assert_eq!(
            host_side(&during),
            (1, 2, 0),
            "bridge, two veth ends, no per-bridge DOCKER-USER rule (the host table has it): {during:#?}"
        );
        assert_eq!(during.host_table, bridges, "the host table names the bridge");
        assert!(
            agenthold_sandbox::docker::hostfw::mark_rule_exists(),
            "DOCKER-USER accepts what the host table marks"
        );
        env.runtime.remove(&a).await.unwrap();
        assert_eq!(
            footprint(&env.instance, &bridges, &veths).await,
            idle,
            "after remove"
        );
        assert!(env.runtime.sandboxes().await.unwrap().is_empty());

        // (b) failed creates leave nothing, and do not disturb an agent that is running.
        let keeper = env.sandbox(None).await;
        let missing_image = format!("agenthold/missing-{}:never", std::process::id());
        let spec_missing = SandboxSpec {
            image: missing_image.clone(),
            ..spec()
        };
        let wanted = [missing_image.as_str(), "agenthold image build-dev"];
        failed_create_leaves_nothing(&env, &keeper, "missing image", spec_missing, &wanted).await;
        let spec_runtime = SandboxSpec {
            runtime: Some("no-such-runtime".into()),
            ..spec()
        };
        failed_create_leaves_nothing(
            &env,
            &keeper,
            "unknown runtime",
            spec_runtime,
            &["no-such-runtime"],
        )
        .await;

        // (c) two agents, both removed: the holder stays, idle; it goes at shutdown.
        let second = env.sandbox(None).await;
        let bridges = vec![bridge_of(&keeper), bridge_of(&second)];
        let veths: Vec<String> = bridges.iter().flat_map(|b| veths_of(b)).collect();
        let during = footprint(&env.instance, &bridges, &veths).await;
        assert_eq!(
            (engine(&during), host_side(&during)),
            ((3, 2, 2), (2, 4, 0)),
            "{during:#?}"
        );
        assert_eq!(during.host_table, bridges, "the host table names both bridges");
        env.runtime.remove(&keeper).await.unwrap();
        let between = footprint(&env.instance, &bridges, &veths).await;
        assert_eq!(
            engine(&between),
            (2, 1, 1),
            "the holder stays for the second agent: {between:#?}"
        );
        env.runtime.remove(&second).await.unwrap();
        assert_eq!(
            footprint(&env.instance, &bridges, &veths).await,
            idle,
            "after removing both"
        );
        assert!(
            !agenthold_sandbox::docker::hostfw::host_table_exists(&env.instance),
            "the installation's host table outlived its last agent"
        );
        env.runtime.shutdown().await;
        let gone = wait_for(std::time::Duration::from_secs(30), || async {
            footprint(&env.instance, &bridges, &veths).await == empty
        })
        .await;
        assert!(
            gone.is_some(),
            "the idle holder outlived the runtime: {:#?}",
            footprint(&env.instance, &bridges, &veths).await
        );
        eprintln!("engine totals after: {}", totals().await);
    })
    .await;
}

/// Create with `spec` (which must fail with an error naming each of `wanted`) while `keeper` runs: nothing
/// of the new agent is left, and `keeper` keeps its egress.
pub async fn failed_create_leaves_nothing(
    env: &Env,
    keeper: &AgentId,
    case: &str,
    spec: SandboxSpec,
    wanted: &[&str],
) {
    let baseline = footprint(&env.instance, &[], &[]).await;
    let agent = env.next_agent();
    let bridge = bridge_of(&agent);
    let message = match env.runtime.create_sandbox_with_id(&agent, spec).await {
        Ok(_) => {
            env.runtime.remove(&agent).await.unwrap();
            panic!("{case}: the create succeeded");
        }
        Err(e) => e.to_string(),
    };
    eprintln!("{case}: {message}");
    for w in wanted {
        assert!(
            message.contains(w),
            "{case}: the error does not name {w:?}: {message}"
        );
    }
    let after = footprint(&env.instance, &[bridge], &[]).await;
    assert_eq!(after.bridges, Vec::<String>::new(), "{case}: bridge left");
    assert_eq!(
        (&after.docker_user, &after.host_table),
        (&vec![], &vec![]),
        "{case}: rules left"
    );
    let objects = |f: &Footprint| (f.containers.clone(), f.networks.clone(), f.volumes.clone());
    assert_eq!(objects(&after), objects(&baseline), "{case}: engine objects left");
    assert_eq!(
        env.runtime.sandboxes().await.unwrap(),
        vec![keeper.clone()],
        "{case}: record left"
    );
    let curl =
        format!("curl -sS -m 5 --noproxy '*' -o /dev/null -w '%{{http_code}}' https://{ALLOWED}/keeper");
    let out = env.sh(keeper, &curl).await;
    assert_eq!(out.stdout, "200", "{case}: the running agent lost egress:\n{out}");
}
