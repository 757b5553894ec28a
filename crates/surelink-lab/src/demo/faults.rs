//! The demo's fault schedule: what it does to the cluster, when, and what
//! the proxy's events say meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use surelink::NetEvent;
use surelink_cache::local::LocalCluster;
use surelink_relay::Direction;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::cluster::{DemoRelay, Timeline, SHARD, SHARD_EVERY, SHARD_NODE, VICTIM};

/// Runs the fault schedule against the cluster and watches the proxy's
/// events until told to stop; gives the cluster back.
pub(super) async fn faults(
    mut cluster: LocalCluster,
    relay: DemoRelay,
    start: Instant,
    d: f64,
    mut stop: oneshot::Receiver<()>,
) -> Result<(LocalCluster, Timeline)> {
    let at = |f: f64| start + Duration::from_secs_f64(f * d);
    let since = move || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut tl = Timeline::default();
    let mut events = cluster.proxy_ep.events();
    // Skip the replay of what is up now.
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(1), events.recv()).await {}
    let steps: [(f64, u8); 7] = [
        (0.2, 0),
        (0.35, 1),
        (0.5, 2),
        (0.55, 5),
        (0.62, 6),
        (0.65, 3),
        (0.85, 4),
    ];
    let mut next = 0;
    let mut shard_task: Option<(Arc<AtomicBool>, tokio::task::JoinHandle<u64>)> = None;
    loop {
        let wake = steps.get(next).map(|(f, _)| at(*f));
        tokio::select! {
            () = async { tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)).await }, if wake.is_some() => {
                let step = steps[next].1;
                next += 1;
                let t = since();
                match step {
                    0 => {
                        tl.kill_net0 = t;
                        tl.connections_killed = relay.network(0).kill();
                    }
                    1 => {
                        tl.mute.0 = t;
                        relay.network(1).blackhole(Direction::Up);
                    }
                    2 => {
                        relay.network(1).heal();
                        tl.mute.1 = t;
                    }
                    5 => {
                        tl.shard_fault.0 = t;
                        if let Some(ep) = cluster.node(SHARD_NODE).cloned() {
                            shard_task = Some(failing_shard(ep));
                        }
                    }
                    6 => {
                        tl.shard_fault.1 = t;
                        if let Some((stop, task)) = shard_task.take() {
                            stop.store(true, Ordering::Relaxed);
                            tl.shard_recoveries = task.await.unwrap_or(0);
                        }
                    }
                    3 => {
                        tl.kill_node = t;
                        cluster.kill_node(VICTIM);
                        // Its host no longer listens: connects are refused.
                        if let Some(l) = relay.to_node(VICTIM) {
                            l.refuse();
                        }
                    }
                    _ => {
                        tl.restart_node = t;
                        cluster
                            .restart_node(VICTIM)
                            .await
                            .context("restarting node 2")?;
                        if let Some(l) = relay.to_node(VICTIM) {
                            l.heal();
                        }
                    }
                }
            }
            e = events.recv() => match e {
                Ok(NetEvent::PeerDead { peer }) if peer == VICTIM => {
                    tl.node_out.get_or_insert((since(), "its detector reported it dead"));
                }
                Ok(NetEvent::PeerRefused { peer }) if peer == VICTIM => {
                    tl.node_out.get_or_insert((since(), "both networks refused connections: its process is gone"));
                }
                Ok(NetEvent::PeerUp { peer, .. } | NetEvent::PeerAlive { peer })
                    if peer == VICTIM && tl.restart_node > 0 =>
                {
                    tl.node_back.get_or_insert(since());
                }
                Ok(NetEvent::PathDown { .. }) => tl.paths_down += 1,
                Ok(NetEvent::RoutingTable { .. }) => {
                    tl.tables += 1;
                    let t = since();
                    if let Some(table) = cluster.proxy_ep.role_status().and_then(|s| s.table) {
                        let nodes = cluster.node_ids();
                        let off1 = nodes
                            .iter()
                            .all(|n| table.route_to(*n).is_some_and(|r| !r.usable(1)));
                        if tl.mute.0 > 0 && tl.mute.1 == 0 && off1 {
                            tl.table_avoid.get_or_insert(t);
                        }
                        if tl.mute.1 > 0 && tl.table_avoid.is_some() && !off1 {
                            tl.table_clear.get_or_insert(t);
                        }
                        let down = table.member(VICTIM) == Some(surelink::proto::role::MemberState::Down);
                        if tl.kill_node > 0 && tl.restart_node == 0 && down {
                            tl.table_node_down.get_or_insert(t);
                        }
                    }
                }
                Ok(_) => {}
                Err(surelink::RecvError::Lagged(_)) => {}
                Err(_) => break,
            },
            _ = &mut stop => break,
        }
    }
    Ok((cluster, tl))
}

/// Puts node 1's store shard into recovery every [`SHARD_EVERY`] until
/// told to stop (the node's service finding the shard's state suspect,
/// again and again); returns how many recoveries began.
fn failing_shard(ep: surelink::Endpoint) -> (Arc<AtomicBool>, tokio::task::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let group = surelink::GroupId(u16::try_from(SHARD).unwrap_or(0));
        let mut n = 0;
        let mut tick = tokio::time::interval(SHARD_EVERY);
        while !s.load(Ordering::Relaxed) {
            tick.tick().await;
            n += u64::from(ep.enter_recovery(group).unwrap_or(false));
        }
        n
    });
    (stop, task)
}
