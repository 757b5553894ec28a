//! The role-server scale model at 10 nodes (`surelink_sim::role_scale`;
//! the figures at 10/100/1 000 nodes come from
//! `cargo run --release -p surelink-sim --example role_scale`, see
//! docs/role.md): tables reach every node, faults reach every node's
//! table, and a healthy cluster's role traffic is its empty reports only.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use surelink_proto::role::{self, RoleMessage, StatusReport};
use surelink_proto::NodeId;
use surelink_sim::role_scale::{run, ScaleConfig, MESSAGE_OVERHEAD};

/// On the wire, the report of a node that sees nothing unusual.
fn empty_report_bytes() -> usize {
    let mut b = Vec::new();
    role::encode(
        &RoleMessage::Report(StatusReport {
            reporter: NodeId(1),
            seq: 1,
            watched: 999,
            held: (1, 1),
            peers: Vec::new(),
        }),
        &mut b,
    );
    b.len() + MESSAGE_OVERHEAD
}

#[test]
fn ten_nodes_through_a_deaf_network_and_a_death() {
    let cfg = ScaleConfig::new(10);
    let (deaf_from, deaf_to) = cfg.deaf.unwrap();
    let death = cfg.death.unwrap();
    let refresh = cfg.role.refresh;
    let r = run(cfg);
    assert_eq!(r.decode_errors, 0);

    // Every live node ends holding the last version, and every version
    // reached every live node.
    assert_eq!(r.live, 9);
    assert_eq!(r.holding_final, r.live, "{r:?}");
    assert_eq!(r.changes.last().map(|c| c.version), Some(r.final_version));
    let (_, never) = r.push_times(Duration::ZERO, r.simulated);
    assert_eq!(never, 0, "a version never reached every live node");

    // The deaf network: one version for it, at every node within a
    // refresh of its report reaching the server; every node (the deaf
    // one included) then avoided that network towards the deaf node.
    let (times, never) = r.push_times(deaf_from, deaf_to);
    assert_eq!((times.len(), never), (1, 0), "{:?}", r.changes);
    assert!(times[0] < refresh, "{times:?}");
    assert_eq!(r.avoided_deaf, 10);
    // And back when it hears again.
    let (times, _) = r.push_times(deaf_to, death);
    assert_eq!(times.len(), 1, "{:?}", r.changes);

    // The death: every live node's table has the dead node down, and every
    // version of it reached every live node within a refresh.
    assert_eq!(r.saw_death, r.live);
    let (times, never) = r.push_times(death, r.simulated);
    assert!(!times.is_empty() && never == 0);
    assert!(times.iter().all(|t| *t < refresh), "{times:?}");
}

/// A healthy cluster's role traffic is one empty report per node per
/// refresh, up, and nothing down: reports list only the unusual, so the
/// per-node rate does not grow with the cluster, and a table that does
/// not change is not pushed again.
#[test]
fn a_healthy_cluster_costs_an_empty_report_per_refresh_whatever_its_size() {
    let bound = empty_report_bytes() as f64 * 10.0; // refresh 100 ms: 10 per second
    for nodes in [10, 40] {
        let cfg = ScaleConfig {
            run: Duration::from_secs(2),
            deaf: None,
            death: None,
            ..ScaleConfig::new(nodes)
        };
        let r = run(cfg);
        // The first second is the start: the first reports make versions.
        let (up, down) = r.per_node_between(Duration::from_secs(1), Duration::from_secs(2));
        assert!(up <= bound + 1e-6, "{nodes} nodes: {up} B/node/s up");
        assert!(up >= bound * 0.9, "{nodes} nodes: {up} B/node/s up");
        assert_eq!(down, 0.0, "{nodes} nodes: a table pushed in a steady state");
        assert_eq!(r.holding_final, r.live);
    }
}

/// Rows carrying the ring as changes: every version still reaches every
/// live node, and the server sends a fraction of the bytes of whole rows
/// (same faults, same seed).
#[test]
fn ring_deltas_carry_the_same_tables_in_fewer_bytes() {
    let whole = run(ScaleConfig {
        whole_rows: true,
        ..ScaleConfig::new(40)
    });
    let delta = run(ScaleConfig::new(40));
    for r in [&whole, &delta] {
        assert_eq!(r.decode_errors, 0);
        assert_eq!(r.holding_final, r.live, "{r:?}");
        assert_eq!(r.push_times(Duration::ZERO, r.simulated).1, 0);
        assert_eq!(r.saw_death, r.live);
        assert_eq!(r.avoided_deaf, 40);
    }
    let (whole_down, _) = whole.down_per_node();
    let (delta_down, _) = delta.down_per_node();
    assert!(
        delta_down < whole_down / 2.0,
        "down B/node/s: delta {delta_down:.0} vs whole {whole_down:.0}"
    );
}
