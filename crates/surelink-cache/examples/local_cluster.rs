//! Three cache nodes and a proxy in one process on loopback (two
//! networks), for trying memcached clients by hand:
//! `cargo run --release -p surelink-cache --example local_cluster -- 127.0.0.1:11311`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[tokio::main]
async fn main() {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:11311".into())
        .parse()
        .expect("a listen address");
    let c = surelink_cache::local::LocalCluster::start(3, 64 << 20, listen)
        .await
        .unwrap();
    println!("memcached proxy on {}; Ctrl-C stops", c.proxy.local_addr());
    tokio::signal::ctrl_c().await.unwrap();
    c.shutdown().await;
}
