//! The configuration file as a library user sees it: good files give a
//! validated configuration, bad ones a typed error whose message says what
//! to change. The example files are read from temporary copies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use surelink_node::config_file::{self, ConfigError, LoadError, Loaded};
use surelink_node::error_chain;
use surelink_node::keys::KeyFileError;
use surelink_node::surelink::proto::NodeId;
use surelink_node::surelink::{DetectorMode, DetectorPriority, WriteBatching};

fn parse(text: &str) -> Result<Loaded, ConfigError> {
    config_file::parse(&format!("insecure = true\n{text}"), Path::new("."))
}

#[test]
fn keys_and_members_are_read_and_required() {
    let dir = common::TempDir::new("cfg-keys");
    surelink_node::keys::make_key_dir(dir.path(), &[NodeId(1), NodeId(2)]).unwrap();
    let pub2 = std::fs::read_to_string(dir.path().join("node-2.pub")).unwrap();
    let text = format!(
        "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\nlisten = [\"127.0.1.1:7100\"]\n\
         [[members]]\nnode = 2\npublic_key = \"{}\"\n\
         [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n",
        pub2.trim()
    );
    let l = config_file::parse(&text, dir.path()).unwrap();
    assert!(l.config.identity.is_some());
    assert_eq!(l.config.members.len(), 2);
    assert!(!l.config.insecure);
    // No key file and not insecure: refused with the way out named.
    let err = config_file::parse("node = 1\ncluster = 7\n", dir.path()).unwrap_err();
    assert!(matches!(err, ConfigError::NoKey { node: 1 }), "{err:?}");
    assert!(error_chain(&err).contains("surelink keygen"), "{err}");
    // A dialled peer without a member key: refused.
    let err = config_file::parse(
        "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\nlisten = [\"127.0.1.1:7100\"]\n\
         [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n",
        dir.path(),
    )
    .unwrap_err();
    assert!(matches!(err, ConfigError::Invalid(_)), "{err:?}");
    assert!(error_chain(&err).contains("no public key"), "{err}");
    let err = config_file::parse(
        "node = 1\ncluster = 7\nkey_file = \"node-1.key\"\n[[members]]\nnode = 2\npublic_key = \"xyz\"\n",
        dir.path(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ConfigError::Key(KeyFileError::Public { .. })),
        "{err:?}"
    );
    assert!(error_chain(&err).contains("member 2"), "{err}");
    // A key file that is not there: named.
    let err = config_file::parse(
        "node = 3\ncluster = 7\nkey_file = \"node-3.key\"\n",
        dir.path(),
    )
    .unwrap_err();
    assert!(
        matches!(err, ConfigError::Key(KeyFileError::ReadSecret { .. })),
        "{err:?}"
    );
    assert!(error_chain(&err).contains("node-3.key"), "{err}");
}

#[test]
fn parses_the_documented_example_and_refuses_typos() {
    let ok = r#"
        node = 1
        cluster = 7
        listen = ["127.0.1.1:7100", "127.0.2.1:7100"]
        metrics = "127.0.0.1:9100"
        [[peers]]
        node = 2
        addrs = ["127.0.1.2:7100", ""]
        [core]
        linger_ms = 5000
    "#;
    let l = parse(ok).unwrap();
    assert_eq!(l.config.peers[0].addrs[1], None);
    assert_eq!(l.config.core.linger, Duration::from_secs(5));
    assert!(l.metrics.is_some());
    let err = parse("node = 1\ncluster = 7\nlisten_typo = []\n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)), "{err:?}");
    let err = parse("node = 0\ncluster = 7\n").unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid(_)),
        "node 0 is refused by validation: {err:?}"
    );
    let err =
        parse("node = 1\ncluster = 7\n[[peers]]\nnode = 2\naddrs = [\"nope\"]\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::PeerAddress { node: 2, addr } if addr == "nope"),
        "{err:?}"
    );
    assert!(error_chain(&err).contains("bad address"));
    let l =
        parse("node = 1\ncluster = 7\n[detector]\nmode = \"plain\"\ninterval_ms = 100\n").unwrap();
    assert_eq!(l.config.detector.mode, DetectorMode::Plain);
    assert_eq!(l.config.detector.timeout, Duration::from_millis(1500));
    // A window the fence cannot back is refused.
    let err = parse("node = 1\ncluster = 7\n[detector]\ntimeout_ms = 20\n").unwrap_err();
    assert!(matches!(err, ConfigError::Invalid(_)), "{err:?}");
    assert!(error_chain(&err).contains("detector.timeout"), "{err}");
    // The pace following answers: one interval by default (scaled with
    // `interval_ms`), set in ms, 0 for off, and no longer than the idle
    // interval.
    let l = parse("node = 1\ncluster = 7\n").unwrap();
    assert_eq!(
        l.config.detector.answer_grace,
        Some(Duration::from_millis(10))
    );
    let l = parse("node = 1\ncluster = 7\n[detector]\ninterval_ms = 20\n").unwrap();
    assert_eq!(
        l.config.detector.answer_grace,
        Some(Duration::from_millis(20))
    );
    let l = parse("node = 1\ncluster = 7\n[detector]\nanswer_grace_ms = 30\n").unwrap();
    assert_eq!(
        l.config.detector.answer_grace,
        Some(Duration::from_millis(30))
    );
    let l = parse("node = 1\ncluster = 7\n[detector]\nanswer_grace_ms = 0\n").unwrap();
    assert_eq!(l.config.detector.answer_grace, None);
    let err = parse("node = 1\ncluster = 7\n[detector]\nanswer_grace_ms = 500\n").unwrap_err();
    assert!(error_chain(&err).contains("detector.answer_grace"), "{err}");
    // A slow peer's grace grows up to 200 ms by default (no more than the
    // idle interval), or as set; never below the grace itself.
    let ms = Duration::from_millis;
    let m = parse("node = 1\ncluster = 7\n").unwrap();
    assert_eq!(m.config.detector.answer_grace_max, ms(200));
    let m = parse("node = 1\ncluster = 7\n[detector]\ninterval_ms = 20\n").unwrap();
    assert_eq!(m.config.detector.answer_grace_max, ms(80));
    let m = parse("node = 1\ncluster = 7\n[detector]\nanswer_grace_max_ms = 30\n").unwrap();
    assert_eq!(m.config.detector.answer_grace_max, ms(30));
    let err = parse("node = 1\ncluster = 7\n[detector]\nanswer_grace_max_ms = 5\n").unwrap_err();
    assert!(error_chain(&err).contains("answer_grace_max"), "{err}");
    // Slow pairs: after 10 s by default (at least five idle rounds), in
    // ms (0: off), a factor of 1 to 16.
    assert_eq!(l.config.detector.slow_after, Some(Duration::from_secs(10)));
    let l = parse("node = 1\ncluster = 7\n[detector]\ninterval_ms = 200\n").unwrap();
    assert_eq!(l.config.detector.slow_after, Some(Duration::from_secs(10)));
    let l = parse("node = 1\ncluster = 7\n[detector]\ninterval_ms = 1000\n").unwrap();
    assert_eq!(l.config.detector.slow_after, Some(Duration::from_secs(20)));
    let l = parse("node = 1\ncluster = 7\n[detector]\nslow_after_ms = 0\n").unwrap();
    assert_eq!(l.config.detector.slow_after, None);
    let l = parse("node = 1\ncluster = 7\n[detector]\nslow_after_ms = 10000\nslow_factor = 8\n")
        .unwrap();
    assert_eq!(l.config.detector.slow_after, Some(Duration::from_secs(10)));
    assert_eq!(l.config.detector.slow_factor, 8);
    let err = parse("node = 1\ncluster = 7\n[detector]\nslow_after_ms = 10000\nslow_factor = 0\n")
        .unwrap_err();
    assert!(error_chain(&err).contains("detector.slow_factor"), "{err}");
    let err = parse("node = 1\ncluster = 7\n[detector]\nslow_after_ms = 100\n").unwrap_err();
    assert!(error_chain(&err).contains("detector.slow_after"), "{err}");
    let err = parse("node = 1\ncluster = 7\n[detector]\nmode = \"fast\"\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::DetectorMode(m) if m == "fast"),
        "{err:?}"
    );
    // A path report probes 8 peers of its network by default, 1 to 4096.
    assert_eq!(
        parse("node = 1\ncluster = 7\n")
            .unwrap()
            .config
            .detector
            .probe_peers,
        8
    );
    let l = parse("node = 1\ncluster = 7\n[detector]\nprobe_peers = 32\n").unwrap();
    assert_eq!(l.config.detector.probe_peers, 32);
    assert_eq!(l.config.detector.crowd_budget, Some(2000), "the default");
    let l = parse("node = 1\ncluster = 7\n[detector]\ncrowd_budget = 500\n").unwrap();
    assert_eq!(l.config.detector.crowd_budget, Some(500));
    let l = parse("node = 1\ncluster = 7\n[detector]\ncrowd_budget = 0\n").unwrap();
    assert_eq!(l.config.detector.crowd_budget, None, "0: no cap");
    let err = parse("node = 1\ncluster = 7\n[detector]\nprobe_peers = 0\n").unwrap_err();
    assert!(error_chain(&err).contains("detector.probe_peers"), "{err}");
    // The sender's class: unchanged by default, "raised" on request.
    let l = parse("node = 1\ncluster = 7\n").unwrap();
    assert_eq!(l.config.detector_priority, DetectorPriority::Unchanged);
    let l = parse("node = 1\ncluster = 7\n[detector]\nsender_priority = \"raised\"\n").unwrap();
    assert_eq!(l.config.detector_priority, DetectorPriority::Raised);
    let err = parse("node = 1\ncluster = 7\n[detector]\nsender_priority = \"max\"\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::SenderPriority(m) if m == "max"),
        "{err:?}"
    );
    let err = parse("node = 1\ncluster = 7\nprotection = \"none\"\n").unwrap_err();
    assert!(matches!(err, ConfigError::Protection(_)), "{err:?}");
    // The record cipher: the faster here unless named.
    let l = parse("node = 1\ncluster = 7\n").unwrap();
    assert_eq!(l.config.record_cipher, None);
    let l = parse("node = 1\ncluster = 7\nrecord_cipher = \"chacha20-poly1305\"\n").unwrap();
    assert_eq!(
        l.config.record_cipher,
        Some(surelink::proto::secure::RecordCipher::ChaCha20Poly1305)
    );
    let err = parse("node = 1\ncluster = 7\nrecord_cipher = \"aes-128-gcm\"\n").unwrap_err();
    assert!(
        matches!(&err, ConfigError::RecordCipher(m) if m == "aes-128-gcm"),
        "{err:?}"
    );
    assert!(err.to_string().contains("chacha20-poly1305"), "{err}");
}

#[test]
fn runtime_threads_and_write_batching_are_read_and_checked() {
    let l = parse("node = 1\ncluster = 7\n").unwrap();
    assert_eq!(l.config.write_batching, WriteBatching::Auto);
    let text = "node = 1\ncluster = 7\nwrite_batching = \"turn\"\n[runtime]\nworker_threads = 4\n";
    let l = parse(text).unwrap();
    assert_eq!(l.config.write_batching, WriteBatching::Turn);
    // The runtime's size is read on its own, before the runtime exists.
    let dir = common::TempDir::new("cfg-runtime");
    let file = dir.path().join("rt.toml");
    std::fs::write(&file, text).unwrap();
    assert_eq!(config_file::runtime(&file).unwrap().worker_threads, Some(4));
    std::fs::write(&file, "[runtime]\nworker_threads = 0\n").unwrap();
    let err = config_file::runtime(&file).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Invalid {
                source: ConfigError::WorkerThreads { value: 0, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(error_chain(&err).contains("must be 1..=1024"), "{err}");
    let err = config_file::runtime(&dir.path().join("missing.toml")).unwrap_err();
    assert!(matches!(err, LoadError::Read { .. }), "{err:?}");
    let err = parse("node = 1\ncluster = 7\n[runtime]\nworker_threads = 0\n").unwrap_err();
    assert!(
        error_chain(&err).contains("runtime.worker_threads"),
        "{err}"
    );
    let err = parse("node = 1\ncluster = 7\nwrite_batching = \"sometimes\"\n").unwrap_err();
    assert!(matches!(err, ConfigError::WriteBatching(_)), "{err:?}");
    assert!(error_chain(&err).contains("auto, idle or turn"), "{err}");
    let err = parse("node = 1\ncluster = 7\n[runtime]\nthreads = 2\n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)), "{err:?}");
}

/// Every example file loads as shipped (from a temporary copy): the
/// cluster file joins each cache process to the others, the proxy dials
/// the three nodes (what each takes from it: `tests/cluster_join.rs`).
#[test]
fn the_example_files_load() {
    let dir = common::TempDir::new("cfg-examples");
    common::copy_examples(dir.path());
    for f in ["server.toml", "client.toml"] {
        let l = config_file::load(&dir.path().join(f)).unwrap();
        assert!(l.config.identity.is_some(), "{f}");
    }
    let cache = dir.path().join("cache");
    for n in 1..=3u64 {
        let l = config_file::load(&cache.join(format!("node{n}.toml"))).unwrap();
        assert_eq!(l.config.node, NodeId(n));
        assert!(l.cache.is_some() && l.metrics.is_some());
        let cluster = l.cluster.expect("names the cluster file");
        assert_eq!(cluster.nodes.len(), 4);
        // Each node dials the nodes listed before it.
        assert_eq!(
            cluster.dials(NodeId(n)).count(),
            usize::try_from(n - 1).unwrap()
        );
        assert!(l.config.role.is_some());
    }
    let l = config_file::load(&cache.join("proxy.toml")).unwrap();
    let proxy = l.proxy.as_ref().expect("[proxy]");
    assert!(proxy.nodes.is_empty(), "default: every node with addresses");
    let mut peers: Vec<u64> = l.config.peers.iter().map(|p| p.node.0).collect();
    peers.sort_unstable();
    assert_eq!(peers, vec![1, 2, 3]);
    assert_eq!(l.ring(), vec![NodeId(1), NodeId(2), NodeId(3)]);
    // The cluster id is the cluster file's alone: a process's file that
    // does not repeat it follows the cluster file.
    let other = std::fs::read_to_string(cache.join("cluster.toml"))
        .unwrap()
        .replace("cluster = 11", "cluster = 12");
    std::fs::write(cache.join("cluster.toml"), other).unwrap();
    let l = config_file::load(&cache.join("node1.toml")).unwrap();
    assert_eq!(l.config.cluster.0, 12);
    // A missing cluster file is named.
    std::fs::remove_file(cache.join("cluster.toml")).unwrap();
    let err = config_file::load(&cache.join("node1.toml")).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Invalid {
                source: ConfigError::ClusterFile { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(error_chain(&err).contains("cluster.toml"), "{err}");
}

#[test]
fn admission_limits_are_read_and_checked() {
    let l = parse("node = 1\ncluster = 7\n").unwrap();
    let d = surelink_node::surelink::Config::new(NodeId(1), l.config.cluster);
    assert_eq!(
        (l.config.max_handshaking_per_ip, l.config.handshake_rate),
        (d.max_handshaking_per_ip, d.handshake_rate)
    );
    assert_eq!(l.config.connections_per_member(), 16);
    let text =
        "node = 1\ncluster = 7\nmax_handshaking_per_ip = 2\nmax_handshaking_per_prefix = 4\n\
                handshake_prefix_v4 = 16\nhandshake_prefix_v6 = 48\nhandshake_rate = 5\n\
                handshake_rate_total = 50\nmember_addrs = [\"10.0.0.7\", \"fd00::7\"]\n\
                member_reserve = 32\nmax_connections_per_member = 3\n";
    let c = parse(text).unwrap().config;
    assert_eq!(
        (
            c.max_handshaking_per_ip,
            c.max_handshaking_per_prefix,
            c.handshake_prefix_v4,
            c.handshake_prefix_v6,
            c.handshake_rate,
            c.handshake_rate_total,
            c.member_reserve,
            c.connections_per_member()
        ),
        (2, 4, 16, 48, 5, 50, 32, 3)
    );
    assert_eq!(
        c.member_addrs,
        vec![
            "10.0.0.7".parse::<std::net::IpAddr>().unwrap(),
            "fd00::7".parse().unwrap()
        ]
    );
    for bad in [
        "handshake_prefix_v4 = 33",
        "handshake_rate = 0",
        "max_handshaking_per_prefix = 0",
        "max_connections_per_member = 0",
    ] {
        let err = parse(&format!("node = 1\ncluster = 7\n{bad}\n")).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid(_)), "{bad}: {err:?}");
        let field = bad.split(' ').next().unwrap();
        assert!(error_chain(&err).contains(field), "{bad}: {err}");
    }
    let err = parse("node = 1\ncluster = 7\nmember_addrs = [\"nope\"]\n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)), "{err:?}");
}
