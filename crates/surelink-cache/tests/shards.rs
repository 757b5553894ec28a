//! The cache node's store shards are recovery groups: a shard put into
//! recovery is emptied (and only it), its requests wait while the other
//! shards answer, and it serves again afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use surelink::proto::NodeId;
use surelink::testing::Loopback;
use surelink::{Endpoint, GroupEvent, GroupId};
use surelink_cache::node::{configure, serve_store};
use surelink_cache::text::Limits;
use surelink_cache::{Shards, CACHE_CHANNEL};

const NODE: NodeId = NodeId(1);

async fn cmd(client: &Endpoint, c: String) -> String {
    let r = client
        .call(NODE, CACHE_CHANNEL, Bytes::from(c), Duration::from_secs(5))
        .await
        .unwrap();
    String::from_utf8(r.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovering_shard_is_emptied_alone_and_serves_again() {
    let mut lb = Loopback::new();
    configure(&mut lb.server, 4);
    let p = lb.start().await.unwrap();
    let store = Arc::new(Shards::new(1 << 20, 4));
    serve_store(&p.server, store.clone(), Limits::default());
    assert_eq!(p.server.groups().len(), 4);
    let keys: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
    for k in &keys {
        assert_eq!(
            cmd(&p.client, format!("set {k} 0 0 2\r\nhi\r\n")).await,
            "STORED\r\n"
        );
    }
    let victim = store.shard_of(b"key0");
    let mut events = p.server.recovery_events();
    assert!(p
        .server
        .enter_recovery(GroupId(u16::try_from(victim).unwrap()))
        .unwrap());
    loop {
        let e = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("recovered")
            .unwrap();
        if matches!(e.event, GroupEvent::Recovered { .. }) {
            assert_eq!(e.name, format!("shard-{victim}"));
            break;
        }
    }
    for k in &keys {
        let got = cmd(&p.client, format!("get {k}\r\n")).await;
        if store.shard_of(k.as_bytes()) == victim {
            assert_eq!(got, "END\r\n", "{k} was in the recovered shard");
        } else {
            assert_eq!(got, format!("VALUE {k} 0 2\r\nhi\r\nEND\r\n"), "{k} kept");
        }
    }
    // The shard serves again.
    assert_eq!(
        cmd(&p.client, "set key0 0 0 1\r\nx\r\n".into()).await,
        "STORED\r\n"
    );
    assert_eq!(
        cmd(&p.client, "get key0\r\n".into()).await,
        "VALUE key0 0 1\r\nx\r\nEND\r\n"
    );
    let g = &p.server.groups()[victim];
    assert_eq!(g.stats.recoveries, 1);
}
