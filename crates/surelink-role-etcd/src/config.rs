//! The etcd backend's configuration (`role.backend = "etcd"`) and where
//! it keeps things in etcd.

use std::time::Duration;

use surelink_proto::NodeId;
use thiserror::Error;

/// How the role service uses etcd. The same on every node of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdRoleConfig {
    /// etcd's client URLs (`http://host:port`, or `host:port`). Any member
    /// will do: requests are balanced over them.
    pub endpoints: Vec<String>,
    /// Every key of this cluster lives under it: the election
    /// (`<prefix>/election`) and the table rows (`<prefix>/table/<node>`).
    /// Starts with `/`, does not end with one.
    pub prefix: String,
    /// The candidate's lease: a whole number of seconds, as etcd grants
    /// leases (etcd may grant more than asked — a single member's minimum
    /// is 2 s with its default timing — and the grant is what counts).
    pub lease_ttl: Duration,
    /// How often the lease is kept alive.
    pub keepalive_every: Duration,
    /// Taken off the lease's end for `t_valid`: covers the rate difference
    /// of this machine's clock and etcd's.
    pub margin: Duration,
    /// Longest wait for etcd's first answer (connecting, granting the lease).
    pub connect_timeout: Duration,
    /// Longest wait for one request (a table write, a read, opening a watch).
    pub request_timeout: Duration,
    /// Most table rows written in one transaction (etcd's `--max-txn-ops`,
    /// 128 by default, bounds it); a change to more rows takes several
    /// transactions, each conditioned on the election.
    pub max_txn_ops: usize,
    /// TLS to etcd (`https://` endpoints); `None`: plain `http://`.
    pub tls: Option<EtcdTls>,
    /// etcd user and password, where etcd's authentication is on
    /// (`etcdctl auth enable`); `None`: anonymous, or the client
    /// certificate's common name as the user.
    pub auth: Option<EtcdAuth>,
}

/// An etcd user's name and password. The user needs read-write on the
/// cluster's prefix (`etcdctl role grant-permission <role> --prefix
/// readwrite <prefix>/`). Without TLS the password crosses the network in
/// clear text, as with any etcd client.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// TLS to etcd: whom to trust, and this node's client certificate for
/// etcd's `--client-cert-auth` (its common name is the etcd user the
/// node acts as when etcd's auth is on).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM of the CA certificate(s) that sign etcd's server certificates.
    pub ca_pem: String,
    /// This node's client certificate and private key, PEM.
    pub client: Option<(String, String)>,
    /// The name etcd's certificate carries, when the endpoints' hosts are
    /// not it (IP addresses).
    pub server_name: Option<String>,
}

impl EtcdTls {
    /// The client's TLS options for etcd-client.
    pub(crate) fn options(&self) -> etcd_client::TlsOptions {
        use etcd_client::{Certificate, Identity, TlsOptions};
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.client {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        tls
    }
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("EtcdTls")
            .field("client_cert", &self.client.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Most bytes of row values put in one transaction (etcd refuses requests
/// above `--max-request-bytes`, 1.5 MiB by default).
pub(crate) const MAX_TXN_BYTES: usize = 1 << 20;

impl EtcdRoleConfig {
    /// The defaults for cluster `cluster` (prefix `/surelink/<cluster>`):
    /// a 2 s lease kept alive every 2/3 s, `t_valid` 200 ms before its end.
    pub fn for_cluster(cluster: &str, endpoints: Vec<String>) -> Self {
        let lease_ttl = Duration::from_secs(2);
        EtcdRoleConfig {
            endpoints,
            prefix: format!("/surelink/{cluster}"),
            lease_ttl,
            keepalive_every: lease_ttl / 3,
            margin: Duration::from_millis(200),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(1),
            max_txn_ops: 128,
            tls: None,
            auth: None,
        }
    }

    /// Checks the configuration once, before anything uses it.
    pub fn validate(&self) -> Result<(), EtcdConfigError> {
        if self.endpoints.is_empty() {
            return Err(EtcdConfigError::NoEndpoints);
        }
        for e in &self.endpoints {
            let rest = match (e.strip_prefix("http://"), e.strip_prefix("https://")) {
                (Some(_), _) if self.tls.is_some() => {
                    return Err(EtcdConfigError::PlainEndpointWithTls(e.clone()))
                }
                (_, Some(_)) if self.tls.is_none() => {
                    return Err(EtcdConfigError::TlsWithoutCa(e.clone()))
                }
                (Some(r), _) | (_, Some(r)) => r,
                (None, None) => e,
            };
            if rest.is_empty()
                || rest.contains("://")
                || rest.chars().any(|c| c.is_whitespace() || c == '/')
            {
                return Err(EtcdConfigError::BadEndpoint(e.clone()));
            }
        }
        if !self.prefix.starts_with('/')
            || self.prefix.len() < 2
            || self.prefix.ends_with('/')
            || self.prefix.chars().any(char::is_whitespace)
        {
            return Err(EtcdConfigError::BadPrefix(self.prefix.clone()));
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl.subsec_nanos() != 0 {
            return Err(EtcdConfigError::LeaseTtl(self.lease_ttl));
        }
        if self.keepalive_every.is_zero() {
            return Err(EtcdConfigError::Zero("keepalive_every"));
        }
        if self.margin >= self.lease_ttl {
            return Err(EtcdConfigError::MarginNotBelowTtl {
                margin: self.margin,
                ttl: self.lease_ttl,
            });
        }
        // One lost keep-alive must not fence a healthy leader: the next
        // one is acknowledged before `t_valid`.
        if self.keepalive_every * 2 + self.margin > self.lease_ttl {
            return Err(EtcdConfigError::KeepaliveTooRare {
                every: self.keepalive_every,
                margin: self.margin,
                ttl: self.lease_ttl,
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(EtcdConfigError::Zero("connect_timeout"));
        }
        if self.request_timeout.is_zero() {
            return Err(EtcdConfigError::Zero("request_timeout"));
        }
        if self.max_txn_ops == 0 {
            return Err(EtcdConfigError::Zero("max_txn_ops"));
        }
        if let Some(t) = &self.tls {
            if !t.ca_pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(EtcdConfigError::BadPem("the CA certificate"));
            }
            if let Some((cert, key)) = &t.client {
                if !cert.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(EtcdConfigError::BadPem("the client certificate"));
                }
                if !key.contains("PRIVATE KEY-----") {
                    return Err(EtcdConfigError::BadPem("the client key"));
                }
            }
            if t.server_name
                .as_ref()
                .is_some_and(|n| n.is_empty() || n.contains(char::is_whitespace))
            {
                return Err(EtcdConfigError::BadServerName);
            }
        }
        if let Some(a) = &self.auth {
            if a.user.is_empty() || a.user.contains(char::is_whitespace) {
                return Err(EtcdConfigError::BadUser);
            }
            if a.password.is_empty() {
                return Err(EtcdConfigError::EmptyPassword);
            }
        }
        Ok(())
    }

    /// The lease TTL in etcd's unit (whole seconds; after `validate`).
    pub(crate) fn ttl_secs(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_secs()).unwrap_or(i64::MAX)
    }

    /// The election's name: candidates' keys are `<name>/<lease id>`.
    pub fn election_name(&self) -> String {
        format!("{}/election", self.prefix)
    }

    /// The key holding `node`'s table row.
    pub fn table_key(&self, node: NodeId) -> String {
        format!("{}/table/{}", self.prefix, node.0)
    }

    /// The prefix of every table row's key.
    pub fn table_prefix(&self) -> String {
        format!("{}/table/", self.prefix)
    }
}

/// An etcd role configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EtcdConfigError {
    /// No etcd endpoint is listed.
    #[error("no etcd endpoints are listed")]
    NoEndpoints,
    /// An endpoint is not `http://host:port`, `https://host:port` or
    /// `host:port`.
    #[error("etcd endpoint {0:?} is not `http://host:port`, `https://host:port` or `host:port`")]
    BadEndpoint(String),
    /// An `https://` endpoint without TLS settings (whom to trust).
    #[error("etcd endpoint {0:?} is https:// but no CA certificate is given to trust")]
    TlsWithoutCa(String),
    /// An `http://` endpoint with TLS settings: every endpoint is TLS or
    /// none is.
    #[error("etcd endpoint {0:?} is plain http:// but TLS is configured")]
    PlainEndpointWithTls(String),
    /// A PEM text that is not one.
    #[error("{0} is not PEM")]
    BadPem(&'static str),
    /// The TLS server name is empty or holds whitespace.
    #[error("the TLS server name must be a host name")]
    BadServerName,
    /// The etcd user name is empty or holds whitespace.
    #[error("the etcd user name must be non-empty and hold no whitespace")]
    BadUser,
    /// The etcd password is empty.
    #[error("the etcd password is empty")]
    EmptyPassword,
    /// The key prefix is empty, does not start with `/`, ends with `/` or
    /// holds whitespace.
    #[error("etcd key prefix {0:?} must start with `/`, not end with `/`, and hold no whitespace")]
    BadPrefix(String),
    /// The lease TTL is below 1 s or not a whole number of seconds (etcd
    /// grants leases in seconds).
    #[error("`lease_ttl` ({0:?}) must be a whole number of seconds, at least 1")]
    LeaseTtl(Duration),
    /// The margin would leave no valid time.
    #[error("`margin` ({margin:?}) must be below `lease_ttl` ({ttl:?})")]
    MarginNotBelowTtl {
        /// `margin`.
        margin: Duration,
        /// `lease_ttl`.
        ttl: Duration,
    },
    /// Keep-alives so rare that one lost one fences a healthy leader.
    #[error(
        "`keepalive_every` ({every:?}) × 2 + `margin` ({margin:?}) must not exceed `lease_ttl` ({ttl:?})"
    )]
    KeepaliveTooRare {
        /// `keepalive_every`.
        every: Duration,
        /// `margin`.
        margin: Duration,
        /// `lease_ttl`.
        ttl: Duration,
    },
    /// A duration or count is zero.
    #[error("`{0}` must be greater than zero")]
    Zero(&'static str),
}
