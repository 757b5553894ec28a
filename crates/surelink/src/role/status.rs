//! This node's view of the role service, as `surelink status`, the
//! metrics exporter and `Endpoint::role_status` show it.

use surelink_proto::role::{PathStatus, TableView};
use surelink_proto::{NodeId, Time};

/// This node's view of the role service (from
/// [`Endpoint::role_status`](crate::Endpoint::role_status)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoleStatus {
    /// The table row this node holds (`None`: none yet).
    pub table: Option<TableView>,
    /// When it was applied, on the endpoint's clock.
    pub applied_at: Option<Time>,
    /// How long ago it was applied (when the snapshot was taken).
    pub table_age: Option<std::time::Duration>,
    /// Tables applied since start.
    pub tables_applied: u64,
    /// Pushed tables refused (stale, wrong owner, wrong row).
    pub tables_rejected: u64,
    /// The role epoch this node serves, if it is the role server
    /// (refreshed on the role task's timer, every quarter refresh).
    pub serving: Option<u64>,
    /// The matrix this node's role server holds (reporter, peer, network,
    /// status, age in µs), when it serves (refreshed likewise).
    pub matrix: Vec<(NodeId, NodeId, u8, PathStatus, u64)>,
    /// Reports sent.
    pub reports_sent: u64,
    /// Tables come from an external backend (an election outside
    /// surelink, such as etcd's), not from the embedded candidates.
    pub external: bool,
}

impl RoleStatus {
    /// Prometheus text: the held table's epoch, version and age, the
    /// epoch served, counters.
    pub fn to_prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        let (epoch, version) = self.table.as_ref().map_or((0, 0), |t| (t.epoch, t.version));
        let gauges: [(&str, &str, f64); 4] = [
            (
                "surelink_role_table_epoch",
                "Role epoch of the routing table held (0: none).",
                epoch as f64,
            ),
            (
                "surelink_role_table_version",
                "Version of the routing table held.",
                version as f64,
            ),
            (
                "surelink_role_table_age_seconds",
                "Seconds since the held routing table was applied (-1: none).",
                self.table_age.map_or(-1.0, |d| d.as_secs_f64()),
            ),
            (
                "surelink_role_serving_epoch",
                "Role epoch this node serves as role server (0: not serving).",
                self.serving.unwrap_or(0) as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let counters: [(&str, &str, u64); 3] = [
            (
                "surelink_role_tables_applied_total",
                "Routing tables applied.",
                self.tables_applied,
            ),
            (
                "surelink_role_tables_rejected_total",
                "Pushed routing tables refused (stale, wrong owner or row).",
                self.tables_rejected,
            ),
            (
                "surelink_role_reports_sent_total",
                "Status reports sent to the role-server candidates.",
                self.reports_sent,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        o
    }

    /// A human-readable rendering (`surelink status`): the table row held,
    /// and the matrix when this node serves.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut o = String::new();
        match &self.table {
            None => o.push_str("table: none yet\n"),
            Some(t) => {
                let age = self
                    .table_age
                    .map_or_else(|| "?".into(), |d| format!("{} ms", d.as_millis()));
                let _ = writeln!(
                    o,
                    "table: role server node {}, epoch {}, version {}, applied {age} ago",
                    t.role, t.epoch, t.version
                );
                if t.routes.is_empty() {
                    o.push_str("routes: every pair uses every network alike\n");
                }
                for r in &t.routes {
                    let paths: Vec<String> = r
                        .paths
                        .iter()
                        .map(|p| format!("net{} {:?} w{}", p.network, p.status, p.weight))
                        .collect();
                    let _ = writeln!(o, "route {} -> {}: {}", r.from, r.to, paths.join(", "));
                }
                let ring: Vec<String> = t
                    .ring
                    .iter()
                    .map(|m| format!("{}:{:?}", m.node, m.state))
                    .collect();
                let _ = writeln!(o, "ring: {}", ring.join(" "));
                for h in &t.helpers {
                    let _ = writeln!(
                        o,
                        "helper node {} at {}: load level {}",
                        h.node, h.addr, h.level
                    );
                }
            }
        }
        if self.external {
            o.push_str("role backend: external (an outside election names the role server)\n");
        }
        match self.serving {
            Some(e) => {
                let _ = writeln!(o, "serving as role server, epoch {e}");
                if self.matrix.is_empty() {
                    o.push_str("matrix: nothing unusual reported\n");
                }
                for (from, to, net, s, age) in &self.matrix {
                    let _ = writeln!(
                        o,
                        "matrix {from} -> {to} net{net}: {s:?} ({} ms old)",
                        age / 1000
                    );
                }
            }
            None => o.push_str("not serving as role server\n"),
        }
        let _ = writeln!(
            o,
            "tables applied {}, refused {}; reports sent {}",
            self.tables_applied, self.tables_rejected, self.reports_sent
        );
        o
    }
}
