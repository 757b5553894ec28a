//! Recovery groups on real loopback sockets: a group that fails recovers
//! alone (suspended queue, clean-up blocks newest first, its own recovery,
//! then re-drive or typed failure), within its bound σ, while the other
//! groups keep serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use surelink::proto::{ChannelId, NodeId};
use surelink::testing::Loopback;
use surelink::{
    CallError, Config, ConfigError, Endpoint, GroupConfig, GroupError, GroupEvent, GroupId,
    HandlerError, RecoveryPolicy, RemoteError, Request, Routing,
};

const SERVER: NodeId = NodeId(1);
const A: GroupId = GroupId(0);
const B: GroupId = GroupId(1);

/// Groups `a` (channel 0) and `b` (channel 1), `a` as `edit` makes it.
async fn pair(edit: impl FnOnce(&mut GroupConfig)) -> (Endpoint, Endpoint) {
    let mut lb = Loopback::new();
    lb.server.max_concurrent_requests = 8;
    let mut a = GroupConfig::new("a");
    edit(&mut a);
    lb.server.executor.groups = vec![a, GroupConfig::new("b")];
    lb.server.executor.channels = vec![(ChannelId(0), A), (ChannelId(1), B)];
    let p = lb.start().await.unwrap();
    (p.server, p.client)
}

async fn call(client: &Endpoint, channel: u16, body: &'static str) -> Result<Bytes, CallError> {
    client
        .call(
            SERVER,
            channel,
            Bytes::from_static(body.as_bytes()),
            Duration::from_secs(10),
        )
        .await
}

fn log() -> Arc<Mutex<Vec<String>>> {
    Arc::new(Mutex::new(Vec::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_group_recovers_alone_while_the_other_keeps_serving() {
    let (server, client) = pair(|_| {}).await;
    let steps = log();
    let s = steps.clone();
    server.serve(move |req: Request| {
        let s = s.clone();
        async move {
            if req.body == "panic" {
                let (s1, s2) = (s.clone(), s.clone());
                req.cleanup
                    .push(move || s1.lock().unwrap().push("undo 1".into()));
                req.cleanup
                    .push(move || s2.lock().unwrap().push("undo 2".into()));
                tokio::time::sleep(Duration::from_millis(20)).await;
                panic!("handler fault");
            }
            if req.group == A {
                s.lock()
                    .unwrap()
                    .push(format!("ran {}", String::from_utf8_lossy(&req.body)));
            }
            Ok::<_, HandlerError>(req.body)
        }
    });
    let s = steps.clone();
    server
        .on_recovery(A, move |g| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(format!("recover {}", g.0));
                tokio::time::sleep(Duration::from_millis(300)).await;
                s.lock().unwrap().push("recovered".into());
            }
        })
        .unwrap();
    let mut events = server.recovery_events();
    let failed = call(&client, 0, "panic").await;
    assert!(
        matches!(failed, Err(CallError::Remote(RemoteError::Panicked))),
        "{failed:?}"
    );
    // A recovers for 300 ms: its requests wait; B's are served at once.
    let started = Instant::now();
    let waiting: Vec<_> = ["w1", "w2", "w3"]
        .into_iter()
        .map(|b| {
            let c = client.clone();
            tokio::spawn(async move { (call(&c, 0, b).await, started.elapsed()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(call(&client, 1, "b").await.unwrap(), "b");
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "group b waited {:?} behind a's recovery",
            t.elapsed()
        );
    }
    let mid = server.groups();
    assert!(
        matches!(mid[0].stats.state, surelink::GroupState::Recovering { .. }),
        "{mid:?}"
    );
    assert_eq!(mid[0].stats.queued, 3, "a's requests wait: {mid:?}");
    for w in waiting {
        let (r, at) = w.await.unwrap();
        r.unwrap();
        assert!(
            at >= Duration::from_millis(200),
            "ran during recovery: {at:?}"
        );
    }
    let steps = steps.lock().unwrap().clone();
    assert_eq!(
        &steps[..4],
        ["undo 2", "undo 1", "recover 0", "recovered"],
        "clean-up blocks newest first, then the group's own recovery: {steps:?}"
    );
    assert_eq!(
        steps.len(),
        7,
        "every queued request re-driven once: {steps:?}"
    );
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        assert_eq!(e.name, "a");
        seen.push(e.event);
    }
    assert!(
        matches!(seen[0], GroupEvent::RecoveryStarted { group: A, .. }),
        "{seen:?}"
    );
    assert!(
        matches!(seen[1], GroupEvent::CleanUp { group: A }),
        "{seen:?}"
    );
    assert!(
        matches!(seen[2], GroupEvent::Recovered { group: A, failed: 0, took } if took >= Duration::from_millis(300)),
        "{seen:?}"
    );
    let g = server.groups();
    assert_eq!((g[0].stats.recoveries, g[0].stats.failed), (1, 1));
    assert_eq!(g[1].stats.recoveries, 0);
    assert!(server
        .stats()
        .to_prometheus()
        .contains("surelink_group_recoveries_total{group=\"a\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_fail_policy_running_requests_are_cancelled_and_waiting_ones_refused() {
    let (server, client) = pair(|a| {
        a.policy = RecoveryPolicy::Fail;
        a.cancel_running = true;
        a.sigma = Some(2);
    })
    .await;
    let steps = log();
    let s = steps.clone();
    server.serve(move |req: Request| {
        let s = s.clone();
        async move {
            match &req.body[..] {
                b"long" => {
                    req.cleanup
                        .push(move || s.lock().unwrap().push("undo long".into()));
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(req.body)
                }
                b"fatal" => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(HandlerError::fatal(7, "backend lost"))
                }
                _ => Ok(req.body),
            }
        }
    });
    let long = {
        let c = client.clone();
        tokio::spawn(async move { call(&c, 0, "long").await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let fatal = {
        let c = client.clone();
        tokio::spawn(async move { call(&c, 0, "fatal").await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    // σ = 2: these wait behind the two running.
    let queued: Vec<_> = (0..3)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { call(&c, 0, "quick").await })
        })
        .collect();
    let t = Instant::now();
    let fatal = fatal.await.unwrap();
    assert!(
        matches!(
            &fatal,
            Err(CallError::Remote(RemoteError::App { code: 7, .. }))
        ),
        "{fatal:?}"
    );
    let long = long.await.unwrap();
    assert!(
        matches!(&long, Err(CallError::Remote(RemoteError::Recovering { group, started: true })) if group == "a"),
        "{long:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "not cancelled: {:?}",
        t.elapsed()
    );
    for q in queued {
        let r = q.await.unwrap();
        assert!(
            matches!(
                &r,
                Err(CallError::Remote(RemoteError::Recovering {
                    started: false,
                    ..
                }))
            ),
            "{r:?}"
        );
    }
    assert_eq!(*steps.lock().unwrap(), ["undo long"]);
    // Back to normal: new requests run.
    assert_eq!(call(&client, 0, "after").await.unwrap(), "after");
    let g = &server.groups()[0];
    assert_eq!((g.stats.recoveries, g.stats.handed_back), (1, 3), "{g:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_never_holds_more_than_its_bound() {
    let (server, client) = pair(|a| a.sigma = Some(2)).await;
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), most.clone());
    server.serve(move |req: Request| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            if req.group == A {
                let k = n.fetch_add(1, Ordering::SeqCst) + 1;
                m.fetch_max(k, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                n.fetch_sub(1, Ordering::SeqCst);
            }
            req.body
        }
    });
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { call(&c, 0, "a").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Group b has the other workers.
    let t = Instant::now();
    assert_eq!(call(&client, 1, "b").await.unwrap(), "b");
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    for c in calls {
        c.await.unwrap().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "σ = 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_routes_requests_and_puts_a_group_into_recovery() {
    let (server, client) = pair(|_| {}).await;
    // By the body's first byte, whatever the channel.
    server.route_requests(|r| if r.body.first() == Some(&b'b') { B } else { A });
    server
        .serve_group(B, |req: Request| async move {
            Bytes::from(format!("b:{}", req.group.0))
        })
        .unwrap();
    server.serve(|req: Request| async move { Bytes::from(format!("any:{}", req.group.0)) });
    assert_eq!(call(&client, 0, "b1").await.unwrap(), "b:1");
    assert_eq!(call(&client, 1, "a1").await.unwrap(), "any:0");
    assert_eq!(
        server.serve_group(GroupId(9), |r: Request| async move { r.body }),
        Err(GroupError::Unknown(GroupId(9), 2))
    );
    let mut events = server.recovery_events();
    assert!(server.enter_recovery(B).unwrap());
    assert!(matches!(
        events.recv().await.unwrap().event,
        GroupEvent::RecoveryStarted { group: B, .. }
    ));
    // Nothing ran in it, nothing registered: it comes straight back.
    let mut recovered = false;
    for _ in 0..2 {
        recovered |= matches!(
            events.recv().await.unwrap().event,
            GroupEvent::Recovered { group: B, .. }
        );
    }
    assert!(recovered);
    assert_eq!(call(&client, 0, "b2").await.unwrap(), "b:1");
    assert_eq!(
        server.enter_recovery(GroupId(5)),
        Err(GroupError::Unknown(GroupId(5), 2))
    );
}

#[test]
fn groups_are_checked_with_the_configuration() {
    let mut c = Config::new(NodeId(1), surelink::proto::ClusterId(1));
    c.insecure = true;
    c.executor.channels = vec![(ChannelId(0), GroupId(1))];
    assert!(matches!(
        c.validate(),
        Err(ConfigError::Invalid {
            field: "executor.channels",
            ..
        })
    ));
    let mut g = GroupConfig::new("a");
    g.sigma = Some(0);
    c.executor.groups = vec![g, GroupConfig::new("b")];
    assert!(
        matches!(c.validate(), Err(ConfigError::Recovery(_))),
        "{:?}",
        c.validate()
    );
    c.executor.groups[0].sigma = Some(1);
    c.validate().unwrap();
}

/// Homes name the runtime's pools, which are known at bind: a home past
/// pool 0 is not refused by the configuration's check.
#[test]
fn homes_are_not_checked_against_one_pool() {
    let mut c = Config::new(NodeId(1), surelink::proto::ClusterId(1));
    c.insecure = true;
    let mut g = GroupConfig::new("a");
    g.home = vec![surelink::proto::rpc::recovery::PoolId(1)];
    c.executor.groups = vec![g];
    c.executor.mapping = surelink::Mapping::Static;
    c.validate().unwrap();
}

/// ... but binding on a runtime with fewer pools than a home names is a
/// typed error, not a silent fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_past_the_runtimes_pools_is_refused_at_bind() {
    let mut lb = Loopback::new();
    let mut g = GroupConfig::new("a");
    g.home = vec![surelink::proto::rpc::recovery::PoolId(5)];
    lb.server.executor.groups = vec![g];
    lb.server.executor.mapping = surelink::Mapping::Static;
    let r = Endpoint::bind(lb.server).await;
    assert!(
        matches!(
            r,
            Err(surelink::BindError::Config(ConfigError::Recovery(_)))
        ),
        "{:?}",
        r.err()
    );
}

/// Requests of two groups interleaved, with some that span groups: each
/// spanning one starts after every request sent before it and before
/// every one sent after it, whatever the groups (the others keep order
/// only within their group).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_spans_groups_keeps_its_place() {
    let (server, client) = pair(|_| {}).await;
    server.route_requests(|r| match r.body.first() {
        Some(b'b') => Routing::from(B),
        Some(b's') => Routing::spanning(A),
        _ => Routing::from(A),
    });
    let started = log();
    let s = started.clone();
    server.serve(move |req: Request| {
        s.lock()
            .unwrap()
            .push(String::from_utf8_lossy(&req.body).into_owned());
        async move {
            tokio::task::yield_now().await;
            req.body
        }
    });
    let bodies: Vec<String> = (0..400)
        .map(|i| {
            let kind = if i % 25 == 24 {
                's'
            } else if i % 2 == 0 {
                'a'
            } else {
                'b'
            };
            format!("{kind}{i}")
        })
        .collect();
    let calls = bodies
        .iter()
        .map(|b| client.call(SERVER, 0, Bytes::from(b.clone()), Duration::from_secs(10)));
    for r in futures_util::future::join_all(calls).await {
        r.unwrap();
    }
    let started = started.lock().unwrap().clone();
    assert_eq!(started.len(), bodies.len());
    let at = |b: &str| started.iter().position(|s| s == b).unwrap();
    for (i, b) in bodies
        .iter()
        .enumerate()
        .filter(|(_, b)| b.starts_with('s'))
    {
        let pos = at(b);
        for (j, other) in bodies.iter().enumerate() {
            let p = at(other);
            assert!(
                (j < i && p < pos) || (j > i && p > pos) || j == i,
                "{other} (sent {j}) started at {p}, {b} (sent {i}) at {pos}"
            );
        }
    }
}
