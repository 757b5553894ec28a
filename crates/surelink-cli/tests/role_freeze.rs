//! The role server's process frozen (SIGSTOP, as a cgroup freeze or a long
//! GC pause does), on the example cache cluster (a temporary copy on free
//! ports), four `surelink` processes on one host. The other candidate must
//! take over once SafeTimer reports the frozen one dead — although the
//! frozen process's own heartbeat socket overflows meanwhile, on this very
//! host — and the thawed process, fenced by its missed deadlines, must come
//! back as a standby: it neither takes the role back nor claims epoch after
//! epoch while its fence is shut.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

fn signal(pid: u32, sig: &str) {
    let ok = surelink_lab::child::run(&["kill", sig, &pid.to_string()]).is_ok();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn a_frozen_role_server_is_replaced_and_comes_back_as_a_standby() {
    // A temporary copy on free ports: the example's fixed ports clash with
    // a user running the example cluster on this machine.
    let copy = common::example_cluster("role-freeze");
    let dir = copy.path().to_path_buf();
    let proxy = common::proxy_addr(&copy);
    let procs = common::Procs(vec![
        common::start_cache(&dir, "node", "node1.toml"),
        common::start_cache(&dir, "node", "node2.toml"),
        common::start_cache(&dir, "node", "node3.toml"),
        common::start_cache(&dir, "proxy", "proxy.toml"),
    ]);
    let node1 = procs.0[0].pid();
    common::until("node 1's table everywhere", Duration::from_secs(30), || {
        let (_, nodes) = common::role_status(&dir, None);
        (nodes.len() == 4
            && nodes.iter().all(|n| n.1 == (1, 1))
            && nodes.iter().filter(|n| n.2 == Some(1)).count() == 1)
            .then_some(())
    });
    // Freeze the role server for 4 s: twice the detector's peer window.
    let frozen = Instant::now();
    signal(node1, "-STOP");
    // Timed on the proxy (a status call to the frozen node would wait out
    // its read timeout); then the others.
    let took = common::until(
        "node 2's table on the proxy",
        Duration::from_secs(4),
        || {
            let (_, nodes) = common::role_status(&dir, Some(100));
            nodes
                .first()
                .filter(|n| n.1 .0 == 2)
                .map(|n| (frozen.elapsed(), n.1 .1))
        },
    );
    let (took, epoch) = took;
    eprintln!(
        "role server frozen: node 2's table (epoch {epoch}) on the proxy {took:?} after the freeze"
    );
    assert_eq!(epoch, 2, "node 2 claims the next epoch it owns");
    for n in [2, 3] {
        let (text, nodes) = common::role_status(&dir, Some(n));
        let serving = (n == 2).then_some(2);
        assert!(
            nodes
                .first()
                .is_some_and(|x| x.1 == (2, 2) && x.2 == serving),
            "node {n} during the freeze:\n{text}"
        );
    }
    let hold = Duration::from_secs(4).saturating_sub(frozen.elapsed());
    std::thread::sleep(hold);
    signal(node1, "-CONT");
    let thawed = Instant::now();
    // The thawed process applies node 2's table and serves nothing.
    common::until("node 1 back as a standby", Duration::from_secs(10), || {
        let (_, nodes) = common::role_status(&dir, None);
        (nodes.len() == 4 && nodes.iter().all(|n| n.1 == (2, 2))).then_some(())
    });
    eprintln!(
        "thawed node 1 holds node 2's table {:?} after SIGCONT",
        thawed.elapsed()
    );
    // And stays one: for 2 s more, one server, node 2, epoch 2, everywhere.
    let settled = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settled {
        let (text, nodes) = common::role_status(&dir, None);
        let serving: Vec<_> = nodes.iter().filter_map(|n| n.2).collect();
        assert!(
            nodes.iter().all(|n| n.1 == (2, 2)) && serving == vec![2],
            "after the thaw:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The cache answers through it all.
    common::until("a set through the proxy", Duration::from_secs(5), || {
        (common::ask(proxy, b"set after 0 0 2\r\nok\r\n", b"\r\n").as_deref()
            == Some(b"STORED\r\n"))
        .then_some(())
    });
    drop(procs);
}
