use crate::support::*;

#[tokio::test]
#[ignore = "explore"]
async fn explore() {
    let env = Env::start().await;
    env.guard(async {
        let a = env.sandbox(None).await;
        let c = container(&a).await;
        let n = network(&a).await;
        eprintln!("{c:?}\n{n:?}");
        let out = env.sh(&a, "ip -d addr; ip route; ip -6 route; cat /proc/sys/net/ipv4/ping_group_range; cat /proc/sys/net/ipv6/conf/all/disable_ipv6; cat /proc/self/status | grep Cap; mount | grep cgroup; cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max; cat /sys/fs/cgroup/memory/memory.limit_in_bytes; env | sort; id; ls -la /.agenthold; cat /proc/1/environ | head -c 100; echo; which ping nc ss").await;
        eprintln!("{out}");
        let out = host("ip", &["-d", "addr", "show", "dev", &n.bridge]);
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        let out = host("nft", &["list", "table", "inet", "agenthold_host"]);
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    }).await;
}
