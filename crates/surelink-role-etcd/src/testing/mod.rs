//! Test support (feature `test-util`): a throwaway etcd on loopback, and a
//! TCP relay that can be cut to partition one client from etcd.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Permission};
use surelink_proto::secure::TestCa;
use surelink_proto::ClusterId;

use crate::{EtcdAuth, EtcdTls};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, timeout, Instant};

/// The password of user `root` in [`EtcdProcess::start_auth`]'s etcd.
pub const ROOT_PASSWORD: &str = "root-secret";

/// What tests print, and return on, where etcd is not installed.
pub const SKIPPED: &str = "SKIPPED: etcd not installed (apt-get install etcd-server)";

/// The fixture could not start etcd although it is installed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// A file, a port or the process.
    #[error("etcd fixture: {0}")]
    Io(#[from] std::io::Error),
    /// The throwaway certificates could not be made.
    #[error("etcd fixture certificates: {0}")]
    Cert(String),
    /// etcd answered but refused to set up users and roles.
    #[error("etcd fixture: setting up authentication: {0}")]
    Setup(String),
    /// etcd started but did not answer.
    #[error("etcd did not become ready; its log ends:\n{0}")]
    NotReady(String),
}

/// The `etcd` binary on `PATH`, if any.
pub fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// One etcd member on loopback with random free ports and a temporary data
/// directory; killed, and its directory removed, on drop.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
    tls: Option<EtcdTls>,
}

/// The server side of [`EtcdProcess::start_tls`], PEM.
struct ServerTls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers; `Ok(None)` if the binary is
    /// not installed (the caller prints [`SKIPPED`]). Any other failure is
    /// an error: a test must not pass without etcd where it is installed.
    pub async fn start() -> Result<Option<EtcdProcess>, FixtureError> {
        EtcdProcess::launch(None, &[]).await
    }

    /// Starts etcd with authentication on: user `root` (password
    /// [`ROOT_PASSWORD`]) and user `surelink` (the returned credentials)
    /// with read-write on keys under `prefix` only; tokens live
    /// `token_ttl` (whole seconds, at least 1), so tests see them expire.
    /// `Ok(None)` if etcd is not installed.
    pub async fn start_auth(
        prefix: &str,
        token_ttl: Duration,
    ) -> Result<Option<(EtcdProcess, EtcdAuth)>, FixtureError> {
        let ttl = token_ttl.as_secs().max(1).to_string();
        let Some(etcd) = EtcdProcess::launch(None, &["--auth-token-ttl", &ttl]).await? else {
            return Ok(None);
        };
        let auth = EtcdAuth {
            user: "surelink".into(),
            password: "surelink-secret".into(),
        };
        let setup = async {
            let mut c = Client::connect([etcd.endpoint()], None).await?;
            c.user_add("root", ROOT_PASSWORD, None).await?;
            c.user_grant_role("root", "root").await?;
            c.role_add("surelink").await?;
            let keys = Permission::read_write(format!("{prefix}/")).with_prefix();
            c.role_grant_permission("surelink", keys).await?;
            c.user_add(auth.user.clone(), auth.password.clone(), None)
                .await?;
            c.user_grant_role(auth.user.clone(), "surelink").await?;
            c.auth_enable().await?;
            Ok::<_, etcd_client::Error>(())
        };
        setup
            .await
            .map_err(|e| FixtureError::Setup(e.to_string()))?;
        Ok(Some((etcd, auth)))
    }

    /// Starts etcd serving TLS only, with client certificates required
    /// (`--client-cert-auth`), its certificates from a throwaway CA; also
    /// returns the TLS settings of a client it accepts (server name
    /// `localhost`). `Ok(None)` if etcd is not installed.
    pub async fn start_tls() -> Result<Option<(EtcdProcess, EtcdTls)>, FixtureError> {
        let ca = TestCa::new(ClusterId(0)).map_err(|e| FixtureError::Cert(e.to_string()))?;
        let server = ca
            .issue_named("localhost")
            .map_err(|e| FixtureError::Cert(e.to_string()))?;
        let client = ca
            .issue_named("surelink-node")
            .map_err(|e| FixtureError::Cert(e.to_string()))?;
        let tls = EtcdTls {
            ca_pem: ca.cert_pem(),
            client: Some((client.cert_pem, client.key_pem)),
            server_name: Some("localhost".into()),
        };
        let files = ServerTls {
            ca_pem: ca.cert_pem(),
            cert_pem: server.cert_pem,
            key_pem: server.key_pem,
        };
        Ok(EtcdProcess::launch(Some((files, tls.clone())), &[])
            .await?
            .map(|e| (e, tls)))
    }

    async fn launch(
        tls: Option<(ServerTls, EtcdTls)>,
        extra: &[&str],
    ) -> Result<Option<EtcdProcess>, FixtureError> {
        let Some(bin) = etcd_binary() else {
            return Ok(None);
        };
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let mut last = String::new();
        for _ in 0..3 {
            let (client, peer) = (free_port()?, free_port()?);
            let dir = std::env::temp_dir().join(format!(
                "surelink-etcd-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            let log = std::fs::File::create(dir.join("etcd.log"))?;
            let scheme = if tls.is_some() { "https" } else { "http" };
            let c = format!("{scheme}://127.0.0.1:{client}");
            let p = format!("http://127.0.0.1:{peer}");
            let mut cmd = Command::new(&bin);
            if let Some((files, _)) = &tls {
                for (name, pem) in [
                    ("ca.pem", &files.ca_pem),
                    ("server.pem", &files.cert_pem),
                    ("server-key.pem", &files.key_pem),
                ] {
                    std::fs::write(dir.join(name), pem)?;
                }
                cmd.arg("--cert-file")
                    .arg(dir.join("server.pem"))
                    .arg("--key-file")
                    .arg(dir.join("server-key.pem"))
                    .arg("--trusted-ca-file")
                    .arg(dir.join("ca.pem"))
                    .arg("--client-cert-auth");
            }
            let child = cmd
                .arg("--data-dir")
                .arg(dir.join("data"))
                .args(["--name", "default"])
                .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
                .args([
                    "--listen-peer-urls",
                    &p,
                    "--initial-advertise-peer-urls",
                    &p,
                ])
                .args(["--initial-cluster", &format!("default={p}")])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            let mut etcd = EtcdProcess {
                child,
                dir,
                addr: SocketAddr::from(([127, 0, 0, 1], client)),
                tls: tls.as_ref().map(|(_, t)| t.clone()),
            };
            if etcd.wait_ready(Duration::from_secs(20)).await {
                return Ok(Some(etcd));
            }
            last = log_tail(&etcd.dir);
        }
        Err(FixtureError::NotReady(last))
    }

    async fn wait_ready(&mut self, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            let mut opts = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));
            if let Some(t) = &self.tls {
                opts = opts.with_tls(t.options());
            }
            let ready = timeout(Duration::from_secs(1), async {
                let mut c = Client::connect([self.endpoint()], Some(opts)).await?;
                c.status().await
            })
            .await;
            if matches!(ready, Ok(Ok(_))) {
                return true;
            }
            sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP relay on loopback in front of `target`. [`Relay::cut`] stops it
/// forwarding in both directions while keeping the connections open — a
/// network that goes silent, not one that refuses — and [`Relay::heal`]
/// lets the held bytes through again.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Starts relaying to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (ir, iw) = inbound.into_split();
                let (or, ow) = outbound.into_split();
                conns.spawn(pump(ir, ow, rx.clone()));
                conns.spawn(pump(or, iw, rx.clone()));
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Relay { addr, cut, task })
    }

    /// The URL to give a client instead of the target's.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops forwarding (bytes are held, connections stay open).
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again, the held bytes first.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Whether it is cut.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Read just as the relay was cut: held until it heals.
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if to
            .write_all(buf.get(..n).unwrap_or_default())
            .await
            .is_err()
        {
            return;
        }
    }
}

mod failover;
pub use failover::{failover_round, Fault, Round};
