//! A process's file joined to its cluster file: the example files, which
//! say only what is each process's own, load into the configuration the
//! files of before (which repeated the cluster file) gave; those older
//! files still load, their repeats listed as redundant; an entry that
//! contradicts the cluster file, and what is missing from it, are typed
//! errors that name both values and what to change. Everything runs on a
//! temporary copy of `examples/`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use surelink_node::config_file::{self, ConfigError, LoadError, Loaded, Redundant};
use surelink_node::error_chain;
use surelink_node::surelink::proto::NodeId;
use surelink_node::surelink::{Keypair, PeerConfig, PublicKey};

const PROXY_KEY: &str = "p+VITH9M8YQfOZq55ehd1GfG/qCm2Xw+FL+dxZ5FUQQ=";
const NODE_KEYS: [&str; 3] = [
    "3vtNa4ROknZDhymYYC7OHcJ+9wtbtTf2Apw502657H8=",
    "42XOKxhhah/OiA8vPdFPeonTRoFWM6rulAv4c+7Wh2Q=",
    "2l2dnCb5SIWtcTVg/p/s0ehhYmahLuJYrxORgkaEHj8=",
];

/// The example cache node `n`'s file as it was written before a process's
/// file could leave the cluster file's facts out.
fn old_node(n: u64) -> String {
    format!(
        "node = {n}\ncluster = 11\nkey_file = \"node{n}.key\"\ncluster_file = \"cluster.toml\"\n\
         metrics = \"127.0.0.1:921{n}\"\nlisten = [\"127.0.1.1{n}:7201\", \"127.0.2.1{n}:7201\"]\n\n\
         [cache]\nmemory_mb = 64\n\n[[members]]\nnode = 100\npublic_key = \"{PROXY_KEY}\"\n"
    )
}

/// The example proxy's file as it was written before.
fn old_proxy() -> String {
    let mut s =
        "node = 100\ncluster = 11\nkey_file = \"proxy.key\"\ncluster_file = \"cluster.toml\"\n\
                 metrics = \"127.0.0.1:9210\"\ndial_from = [\"127.0.1.10:0\", \"127.0.2.10:0\"]\n\n\
                 [proxy]\nlisten = \"127.0.0.1:11311\"\n"
            .to_string();
    for (i, key) in NODE_KEYS.iter().enumerate() {
        s += &format!("\n[[members]]\nnode = {}\npublic_key = \"{key}\"\n", i + 1);
    }
    for n in 1..=3 {
        s += &format!(
            "\n[[peers]]\nnode = {n}\naddrs = [\"127.0.1.1{n}:7201\", \"127.0.2.1{n}:7201\"]\n"
        );
    }
    s
}

/// What a process ends up with: cluster, members, peers (by node),
/// listen, dial_from, metrics, whether the role service is on, the ring.
type Effective = (
    u64,
    Vec<(NodeId, PublicKey)>,
    Vec<PeerConfig>,
    Vec<SocketAddr>,
    Vec<SocketAddr>,
    Option<SocketAddr>,
    bool,
    Vec<NodeId>,
);

fn effective(l: &Loaded) -> Effective {
    let c = &l.config;
    let mut peers = c.peers.clone();
    peers.sort_by_key(|p| p.node);
    (
        c.cluster.0,
        c.members.iter().collect(),
        peers,
        c.listen.clone(),
        c.dial_from.clone(),
        l.metrics,
        c.role == l.cluster.as_ref().map(|cl| cl.role.clone()) && c.role.is_some(),
        l.ring(),
    )
}

/// A temporary copy of the examples; `cache/` in it.
fn cache_copy(name: &str) -> (common::TempDir, PathBuf) {
    let dir = common::TempDir::new(name);
    common::copy_examples(dir.path());
    let cache = dir.path().join("cache");
    (dir, cache)
}

fn load_text(dir: &Path, file: &str, text: &str) -> Result<Loaded, LoadError> {
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    config_file::load(&path)
}

/// The error a file's text gives, unwrapped from [`LoadError::Invalid`]
/// (which names the file), with its whole message.
fn refused(dir: &Path, file: &str, text: &str) -> (ConfigError, String) {
    match load_text(dir, file, text) {
        Err(e @ LoadError::Invalid { .. }) => {
            let chain = error_chain(&e);
            assert!(chain.contains(file), "names the file: {chain}");
            let LoadError::Invalid { source, .. } = e else {
                unreachable!()
            };
            (source, chain)
        }
        other => panic!("{file}: expected a refusal, got {other:?}"),
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn key(s: &str) -> PublicKey {
    s.parse().unwrap()
}

#[test]
fn the_short_example_files_give_what_the_old_ones_did() {
    let (_dir, cache) = cache_copy("join-same");
    for n in 1..=3u64 {
        let new = config_file::load(&cache.join(format!("node{n}.toml"))).unwrap();
        assert!(new.redundant.is_empty(), "{:?}", new.redundant);
        let old = load_text(&cache, &format!("old{n}.toml"), &old_node(n)).unwrap();
        assert_eq!(effective(&new), effective(&old), "node {n}");
        assert_eq!(
            old.redundant,
            vec![
                Redundant::Cluster,
                Redundant::Listen,
                Redundant::Metrics,
                Redundant::Member(NodeId(100)),
            ],
            "node {n}"
        );
        // What the cluster file gives: listen and metrics, every node's
        // key, the nodes listed before it to dial.
        let (cluster, members, peers, listen, _, metrics, role, ring) = effective(&new);
        assert_eq!(cluster, 11);
        assert_eq!(members.len(), 4);
        assert_eq!(
            listen,
            vec![
                addr(&format!("127.0.1.1{n}:7201")),
                addr(&format!("127.0.2.1{n}:7201"))
            ]
        );
        assert_eq!(metrics, Some(addr(&format!("127.0.0.1:921{n}"))));
        let dialled: Vec<u64> = peers.iter().map(|p| p.node.0).collect();
        assert_eq!(dialled, (1..n).collect::<Vec<_>>());
        assert!(role && ring.is_empty());
        // Every other node's addresses are members' (room kept for them),
        // also those listed after it, which dial it, and the proxy's
        // dial_from addresses.
        let mut want: Vec<std::net::IpAddr> = (1..=3u64)
            .filter(|&m| m != n)
            .flat_map(|m| [format!("127.0.1.1{m}"), format!("127.0.2.1{m}")])
            .chain(["127.0.1.10".to_string(), "127.0.2.10".to_string()])
            .map(|s| s.parse().unwrap())
            .collect();
        let mut got = new.config.member_addrs.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "node {n}");
    }
    let new = config_file::load(&cache.join("proxy.toml")).unwrap();
    assert!(new.redundant.is_empty(), "{:?}", new.redundant);
    let old = load_text(&cache, "old-proxy.toml", &old_proxy()).unwrap();
    assert_eq!(effective(&new), effective(&old));
    let mut repeats = vec![Redundant::Cluster, Redundant::DialFrom, Redundant::Metrics];
    repeats.extend((1..=3).map(|n| Redundant::Member(NodeId(n))));
    repeats.extend((1..=3).map(|n| Redundant::Peer(NodeId(n))));
    assert_eq!(old.redundant, repeats);
    let (_, members, peers, listen, dial_from, metrics, role, ring) = effective(&new);
    assert_eq!(members.len(), 4);
    assert_eq!(peers.len(), 3);
    assert_eq!(
        peers[1],
        PeerConfig::new(
            NodeId(2),
            vec![Some(addr("127.0.1.12:7201")), Some(addr("127.0.2.12:7201"))]
        )
    );
    assert!(listen.is_empty());
    assert_eq!(
        dial_from,
        vec![addr("127.0.1.10:0"), addr("127.0.2.10:0")],
        "the proxy's dial_from comes from the cluster file"
    );
    assert_eq!(metrics, Some(addr("127.0.0.1:9210")));
    assert!(role);
    assert_eq!(ring, vec![NodeId(1), NodeId(2), NodeId(3)]);
    // Without the cluster file, a file that lists everything itself
    // works as before: its own members and peers, no role service.
    let alone = old_proxy().replace("cluster_file = \"cluster.toml\"\n", "");
    let l = load_text(&cache, "alone.toml", &alone).unwrap();
    assert!(l.cluster.is_none() && l.redundant.is_empty() && l.config.role.is_none());
    assert_eq!(l.config.members.len(), 4);
    assert_eq!(l.ring(), vec![NodeId(1), NodeId(2), NodeId(3)]);
}

#[test]
fn own_values_override_the_cluster_file_and_own_only_entries_stay() {
    let (_dir, cache) = cache_copy("join-override");
    // Bind elsewhere than the others dial; metrics on every interface.
    let text = std::fs::read_to_string(cache.join("node2.toml"))
        .unwrap()
        .replace(
        "[cache]\n",
        "listen = [\"0.0.0.0:7202\", \"127.0.2.12:7201\"]\nmetrics = \"0.0.0.0:9300\"\n\n[cache]\n",
    );
    let l = load_text(&cache, "bind-all.toml", &text).unwrap();
    assert_eq!(
        l.config.listen,
        vec![addr("0.0.0.0:7202"), addr("127.0.2.12:7201")]
    );
    assert_eq!(l.metrics, Some(addr("0.0.0.0:9300")));
    assert!(l.redundant.is_empty(), "{:?}", l.redundant);
    // A client the cluster file does not list, with its own key and a
    // peer of its own: kept beside the cluster file's.
    let extra = Keypair::generate().unwrap();
    let text = format!(
        "node = 3\nkey_file = \"node3.key\"\ncluster_file = \"cluster.toml\"\n\
         [[members]]\nnode = 50\npublic_key = \"{}\"\n\
         [[peers]]\nnode = 50\naddrs = [\"127.0.1.50:7201\"]\n",
        extra.public()
    );
    let l = load_text(&cache, "extra.toml", &text).unwrap();
    assert_eq!(l.config.members.key_of(NodeId(50)), Some(&extra.public()));
    let peers: Vec<u64> = l.config.peers.iter().map(|p| p.node.0).collect();
    assert_eq!(peers, vec![50, 1, 2]);
    assert!(l.redundant.is_empty());
}

#[test]
fn an_entry_that_contradicts_the_cluster_file_is_refused_naming_both_values() {
    let (_dir, cache) = cache_copy("join-contradict");
    let node1 = std::fs::read_to_string(cache.join("node1.toml")).unwrap();
    let top = |extra: &str| node1.replace("[cache]\n", &format!("{extra}\n[cache]\n"));

    let (e, msg) = refused(&cache, "cluster.bad.toml", &top("cluster = 12"));
    assert!(
        matches!(
            e,
            ConfigError::OtherCluster {
                own: 12,
                cluster: 11,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        msg.contains("cluster = 12")
            && msg.contains("cluster 11's")
            && msg.contains("remove `cluster`"),
        "{msg}"
    );

    let stranger = Keypair::generate().unwrap().public();
    let text = format!("{node1}\n[[members]]\nnode = 100\npublic_key = \"{stranger}\"\n");
    let (e, msg) = refused(&cache, "member.bad.toml", &text);
    assert!(
        matches!(&e, ConfigError::MemberKey { node: NodeId(100), own, cluster, .. }
            if *own == stranger && *cluster == key(PROXY_KEY)),
        "{e:?}"
    );
    assert!(
        msg.contains(&stranger.to_string())
            && msg.contains(PROXY_KEY)
            && msg.contains("[[members]] node 100")
            && msg.contains("remove this [[members]] entry"),
        "{msg}"
    );

    // Node 2 dials node 1: its [[peers]] entry names node 1 elsewhere.
    let node2 = std::fs::read_to_string(cache.join("node2.toml")).unwrap();
    let text = format!(
        "{node2}\n[[peers]]\nnode = 1\naddrs = [\"127.0.1.11:7209\", \"127.0.2.11:7201\"]\n"
    );
    let (e, msg) = refused(&cache, "peer.bad.toml", &text);
    assert!(
        matches!(&e, ConfigError::PeerAddrs { node: NodeId(1), own, cluster, .. }
            if own[0] == Some(addr("127.0.1.11:7209")) && cluster[0] == Some(addr("127.0.1.11:7201"))),
        "{e:?}"
    );
    assert!(
        msg.contains("\"127.0.1.11:7209\"")
            && msg.contains("[\"127.0.1.11:7201\", \"127.0.2.11:7201\"]")
            && msg.contains("remove this [[peers]] entry"),
        "{msg}"
    );
    // The proxy (node 100) has no address in the cluster file: an own
    // peer entry giving it some contradicts it too.
    let text = format!("{node2}\n[[peers]]\nnode = 100\naddrs = [\"127.0.1.10:7201\"]\n");
    let (e, _) = refused(&cache, "peer100.bad.toml", &text);
    assert!(
        matches!(&e, ConfigError::PeerAddrs { node: NodeId(100), cluster, .. } if cluster.is_empty()),
        "{e:?}"
    );

    // Node 1's file with node 2's secret.
    let (e, msg) = refused(
        &cache,
        "keyfile.bad.toml",
        &node1.replace("node1.key", "node2.key"),
    );
    assert!(
        matches!(&e, ConfigError::KeyFileMismatch { node: NodeId(1), own, cluster, .. }
            if *own == key(NODE_KEYS[1]) && *cluster == key(NODE_KEYS[0])),
        "{e:?}"
    );
    assert!(
        msg.contains("key_file") && msg.contains(NODE_KEYS[0]) && msg.contains(NODE_KEYS[1]),
        "{msg}"
    );
}

#[test]
fn what_the_cluster_file_lacks_is_named() {
    let (_dir, cache) = cache_copy("join-missing");
    let cluster = std::fs::read_to_string(cache.join("cluster.toml")).unwrap();
    // A node the cluster file does not list.
    let k = Keypair::generate().unwrap();
    surelink_node::keys::write_secret(&cache.join("node4.key"), &k).unwrap();
    let (e, msg) = refused(
        &cache,
        "node4.toml",
        "node = 4\nkey_file = \"node4.key\"\ncluster_file = \"cluster.toml\"\n",
    );
    assert!(
        matches!(
            e,
            ConfigError::NotInCluster {
                node: NodeId(4),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(msg.contains("add a [[nodes]] entry"), "{msg}");
    // Without a cluster file, `cluster` is required.
    let (e, _) = refused(
        &cache,
        "nocluster.toml",
        "node = 1\nkey_file = \"node1.key\"\n",
    );
    assert!(matches!(e, ConfigError::NoCluster), "{e:?}");

    // Node 2's key left out of the cluster file: node 3, which dials it,
    // and node 2 itself are refused, node 2 told which key to add.
    let line = format!("public_key = \"{}\"\n", NODE_KEYS[1]);
    std::fs::write(cache.join("cluster.toml"), cluster.replace(&line, "")).unwrap();
    let e = config_file::load(&cache.join("node3.toml")).unwrap_err();
    assert!(
        matches!(
            e,
            LoadError::Invalid {
                source: ConfigError::PeerKeyMissing {
                    node: NodeId(2),
                    ..
                },
                ..
            }
        ),
        "{e:?}"
    );
    let e = config_file::load(&cache.join("node2.toml")).unwrap_err();
    assert!(
        matches!(
            &e,
            LoadError::Invalid {
                source: ConfigError::OwnKeyMissing { node: NodeId(2), own, .. },
                ..
            } if *own == key(NODE_KEYS[1])
        ),
        "{e:?}"
    );
    assert!(
        error_chain(&e).contains(&format!("add public_key = \"{}\"", NODE_KEYS[1])),
        "{e}"
    );

    // Node 1 not on network 0: it cannot listen from the cluster file alone.
    let gap = cluster.replace(
        "addrs = [\"127.0.1.11:7201\", \"127.0.2.11:7201\"]",
        "addrs = [\"\", \"127.0.2.11:7201\"]",
    );
    std::fs::write(cache.join("cluster.toml"), gap).unwrap();
    let e = config_file::load(&cache.join("node1.toml")).unwrap_err();
    assert!(
        matches!(
            e,
            LoadError::Invalid {
                source: ConfigError::ListenGap {
                    node: NodeId(1),
                    network: 0,
                    ..
                },
                ..
            }
        ),
        "{e:?}"
    );
    std::fs::write(cache.join("cluster.toml"), &cluster).unwrap();

    // A proxy's ring: a node not in the cluster file, or without
    // addresses there, cannot be in it.
    let proxy = std::fs::read_to_string(cache.join("proxy.toml")).unwrap();
    for (nodes, reason) in [("[1, 7]", "is not listed"), ("[1, 100]", "has no addrs")] {
        let text = proxy.replace("# nodes = [1, 2, 3]", &format!("nodes = {nodes}"));
        let (e, msg) = refused(&cache, "ring.bad.toml", &text);
        assert!(
            matches!(e, ConfigError::ProxyNode { reason: r, .. } if r == reason),
            "{e:?}"
        );
        assert!(msg.contains("remove it from `nodes`"), "{msg}");
    }
    // A proxy with no node to route to: none with addresses but the
    // role server, which is the proxy itself.
    let only = "cluster = 11\n[role]\ncandidates = [100]\n\
                [[nodes]]\nnode = 100\naddrs = [\"127.0.1.10:7201\", \"127.0.2.10:7201\"]\n"
        .to_string()
        + &format!("public_key = \"{PROXY_KEY}\"\n");
    std::fs::write(cache.join("cluster.toml"), only).unwrap();
    let (e, msg) = refused(&cache, "proxy.toml", &proxy);
    assert!(matches!(e, ConfigError::ProxyNoNodes), "{e:?}");
    assert!(msg.contains("no cache node to route to"), "{msg}");
    // And without a cluster file: a [proxy] without [[peers]].
    let (e, _) = refused(
        &cache,
        "bare-proxy.toml",
        "node = 100\ncluster = 11\ninsecure = true\n[proxy]\nlisten = \"127.0.0.1:11311\"\n",
    );
    assert!(matches!(e, ConfigError::ProxyNoNodes), "{e:?}");
}

/// Mutual TLS and `insecure` need no keys in the cluster file; the rest
/// of what a process's file may say (here `dial_from`, `[detector]`,
/// `[runtime]`) is read as without one.
#[test]
fn tls_and_insecure_nodes_need_no_keys_in_the_cluster_file() {
    let (_dir, cache) = cache_copy("join-tls");
    surelink_node::certs::certs(&cache.join("tls"), 11, &[1, 2, 3, 100]).unwrap();
    let cluster = std::fs::read_to_string(cache.join("cluster.toml")).unwrap();
    let keyless: String = cluster
        .lines()
        .filter(|l| !l.starts_with("public_key"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(cache.join("cluster.toml"), keyless).unwrap();
    let text = "node = 3\ncluster_file = \"cluster.toml\"\n\
                dial_from = [\"127.0.1.13:0\", \"127.0.2.13:0\"]\n\
                [tls]\ncert = \"tls/node-3.crt\"\nkey = \"tls/node-3.key.pem\"\nca = \"tls/ca.crt\"\n\
                [detector]\nmode = \"plain\"\n[runtime]\nworker_threads = 3\n";
    let l = load_text(&cache, "tls3.toml", text).unwrap();
    assert!(l.config.tls.is_some() && l.config.members.is_empty());
    let peers: Vec<u64> = l.config.peers.iter().map(|p| p.node.0).collect();
    assert_eq!(peers, vec![1, 2]);
    assert_eq!(l.config.dial_from.len(), 2);
    assert_eq!(l.config.listen.len(), 2);
    let text = "node = 100\ncluster_file = \"cluster.toml\"\ninsecure = true\n\
                dial_from = [\"127.0.1.10:0\", \"127.0.2.10:0\"]\n[proxy]\nlisten = \"127.0.0.1:11311\"\n";
    let l = load_text(&cache, "insecure-proxy.toml", text).unwrap();
    assert_eq!(l.ring(), vec![NodeId(1), NodeId(2), NodeId(3)]);
}

/// A proxy dials every node with addresses, wherever the cluster file
/// lists it; another process only those listed before it.
#[test]
fn a_proxy_dials_every_node_wherever_it_is_listed() {
    let (_dir, cache) = cache_copy("join-proxy-first");
    let cluster = std::fs::read_to_string(cache.join("cluster.toml")).unwrap();
    let (head, proxy_entry) = cluster.rsplit_once("[[nodes]]\nnode = 100").unwrap();
    let first = head.replacen(
        "[[nodes]]",
        &format!("[[nodes]]\nnode = 100{proxy_entry}\n[[nodes]]"),
        1,
    );
    std::fs::write(cache.join("cluster.toml"), first).unwrap();
    let l = config_file::load(&cache.join("proxy.toml")).unwrap();
    let peers: Vec<u64> = l.config.peers.iter().map(|p| p.node.0).collect();
    assert_eq!(peers, vec![1, 2, 3]);
    assert_eq!(l.ring(), vec![NodeId(1), NodeId(2), NodeId(3)]);
    // The same file without [proxy] is a client listed first: it dials
    // nobody (and nobody can dial it).
    let text = std::fs::read_to_string(cache.join("proxy.toml")).unwrap();
    let client = text.split("[proxy]").next().unwrap();
    let l = load_text(&cache, "client.toml", client).unwrap();
    assert!(l.config.peers.is_empty() && l.ring().is_empty());
    // A ring narrower than the peers: `[proxy] nodes`.
    let two = text.replace("# nodes = [1, 2, 3]", "nodes = [1, 3]");
    let l = load_text(&cache, "two.toml", &two).unwrap();
    assert_eq!(l.config.peers.len(), 3);
    assert_eq!(l.ring(), vec![NodeId(1), NodeId(3)]);
}
