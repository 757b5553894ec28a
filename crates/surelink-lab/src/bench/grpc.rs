//! The gRPC contender: tonic (the gRPC of Rust) with its default
//! transport — HTTP/2 over one TCP connection from 127.0.1.2 to a server
//! on 127.0.1.1, `TCP_NODELAY` on both ends (tonic's default), no TLS
//! (like every other contender but surelink's encrypted default) — and
//! protobuf messages (`prost`), as tonic's users run it.
//!
//! The service is written out by hand rather than generated from a
//! `.proto` file (so the build needs no `protoc`); it is what
//! `tonic-build` would generate for
//!
//! ```text
//! message Echo { bytes payload = 1; }
//! service Bench {
//!   rpc Call (Echo) returns (Echo);          // latency: unary echo
//!   rpc Sink (stream Echo) returns (Echo);   // throughput: client streaming
//! }
//! ```
//!
//! * Latency: callers (tokio tasks) clone the one channel, as a generated
//!   client is cloned per task, and loop unary `Call`s; HTTP/2 multiplexes
//!   them over the connection.
//! * Throughput: one client-streaming `Sink` call per round whose request
//!   stream yields messages until the round stops; the server counts each
//!   message as it decodes it. HTTP/2 flow control holds the sender back
//!   (nothing is dropped), and the call ends once the server has read the
//!   whole stream.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result};
use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::{ClientStreamingService, NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use super::fixture::{Delivered, CALL_TIMEOUT, CLIENT_IPS, SERVER_IPS};
use super::report::ThroughputRound;
use super::throughput::{measure_task, Delivery};
use super::Plan;

/// The service's name on the wire.
const SERVICE: &str = "surelink.bench.Bench";
const CALL_PATH: &str = "/surelink.bench.Bench/Call";
const SINK_PATH: &str = "/surelink.bench.Bench/Sink";

/// What this contender is, for `bench.json`.
pub(super) const DESCRIPTION: &str =
    "gRPC: tonic 0.14 server and client (prost messages, `bytes payload = 1`), one HTTP/2 \
     connection over TCP from 127.0.1.2 to 127.0.1.1, no TLS, tonic's defaults (TCP_NODELAY on); \
     unary calls, one client-streaming call per throughput round";

/// The one message: `message Echo { bytes payload = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Echo {
    #[prost(bytes = "bytes", tag = "1")]
    pub(super) payload: Bytes,
}

/// The server side: the service, as `tonic-build` would generate it.
#[derive(Clone)]
struct BenchService {
    delivered: Arc<Delivered>,
}

impl NamedService for BenchService {
    const NAME: &'static str = SERVICE;
}

/// `Call`: the echo.
struct CallSvc;

impl UnaryService<Echo> for CallSvc {
    type Response = Echo;
    type Future = std::future::Ready<Result<Response<Echo>, Status>>;

    fn call(&mut self, request: Request<Echo>) -> Self::Future {
        std::future::ready(Ok(Response::new(request.into_inner())))
    }
}

/// `Sink`: counts every message of the stream.
struct SinkSvc(Arc<Delivered>);

impl ClientStreamingService<Echo> for SinkSvc {
    type Response = Echo;
    type Future = BoxFuture<Response<Echo>, Status>;

    fn call(&mut self, request: Request<Streaming<Echo>>) -> Self::Future {
        let delivered = self.0.clone();
        Box::pin(async move {
            let mut stream = request.into_inner();
            while let Some(m) = stream.message().await? {
                delivered.add(m.payload.len());
            }
            Ok(Response::new(Echo::default()))
        })
    }
}

impl<B> Service<http::Request<B>> for BenchService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            CALL_PATH => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::<Echo, Echo>::default());
                Ok(grpc.unary(CallSvc, req).await)
            }),
            SINK_PATH => {
                let sink = SinkSvc(self.delivered.clone());
                Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Echo, Echo>::default());
                    Ok(grpc.client_streaming(sink, req).await)
                })
            }
            _ => Box::pin(std::future::ready(Ok(Status::unimplemented(
                "no such method",
            )
            .into_http()))),
        }
    }
}

/// The gRPC contender: the server task and the client's channel.
pub(super) struct GrpcContender {
    channel: Channel,
    delivered: Arc<Delivered>,
    server: ServerTask,
    stop_server: oneshot::Sender<()>,
}

/// The server's task, aborted if the contender is dropped without a
/// shutdown (an error or Ctrl-C during the run).
struct ServerTask(JoinHandle<()>);

impl Drop for ServerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl GrpcContender {
    /// Starts the server on a free port of 127.0.1.1 and connects the
    /// client from 127.0.1.2.
    pub(super) async fn setup() -> Result<GrpcContender> {
        let delivered = Arc::new(Delivered::default());
        let incoming = TcpIncoming::bind(SocketAddr::new(IpAddr::V4(SERVER_IPS[0]), 0))
            .context("binding the gRPC server")?
            .with_nodelay(Some(true));
        let addr = incoming.local_addr().context("the gRPC server's address")?;
        let (stop_server, stopped) = oneshot::channel::<()>();
        let svc = BenchService {
            delivered: delivered.clone(),
        };
        let server = tokio::spawn(async move {
            let r = Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = r {
                eprintln!("warning: the gRPC server stopped: {e}");
            }
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .context("the gRPC server's URI")?
            .local_address(Some(IpAddr::V4(CLIENT_IPS[0])))
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting the gRPC client to {addr}"))?;
        Ok(GrpcContender {
            channel,
            delivered,
            server: ServerTask(server),
            stop_server,
        })
    }

    /// A latency caller.
    pub(super) fn caller(&self) -> GrpcCaller {
        GrpcCaller(tonic::client::Grpc::new(self.channel.clone()))
    }

    /// One throughput round: one client-streaming call whose stream yields
    /// messages until the round stops.
    pub(super) async fn throughput_round(
        &self,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        let (round, ()) = measure_task(&self.delivered, plan, Delivery::Reliable, |stop| {
            sink_call(self.channel.clone(), payload.clone(), stop)
        })
        .await?;
        Ok(round)
    }

    /// Closes the client's channel and stops the server (gracefully, for
    /// [`CALL_TIMEOUT`] at most).
    pub(super) async fn shutdown(self) {
        let GrpcContender {
            channel,
            mut server,
            stop_server,
            ..
        } = self;
        drop(channel);
        let _ = stop_server.send(());
        if tokio::time::timeout(CALL_TIMEOUT, &mut server.0)
            .await
            .is_err()
        {
            // Dropping `server` aborts its accept loop (connections run
            // in tasks of their own and end with the runtime).
            eprintln!("warning: the gRPC server did not stop within {CALL_TIMEOUT:?}");
        }
    }
}

/// A latency caller: unary `Call`s on its clone of the channel.
#[derive(Clone)]
pub(super) struct GrpcCaller(tonic::client::Grpc<Channel>);

impl GrpcCaller {
    pub(super) async fn call(&self, payload: &Bytes) -> Result<Bytes> {
        // A generated client's method takes `&mut self`: each call works on
        // a clone (a handle to the same connection).
        let mut grpc = self.0.clone();
        grpc.ready().await.context("gRPC channel not ready")?;
        let mut req = Request::new(Echo {
            payload: payload.clone(),
        });
        req.set_timeout(CALL_TIMEOUT);
        let reply = grpc
            .unary(
                req,
                http::uri::PathAndQuery::from_static(CALL_PATH),
                ProstCodec::<Echo, Echo>::default(),
            )
            .await
            .context("gRPC call")?;
        Ok(reply.into_inner().payload)
    }
}

/// The throughput sender: one `Sink` call streaming `payload` until
/// `stop`; returns how many messages the stream yielded.
async fn sink_call(channel: Channel, payload: Bytes, stop: Arc<AtomicBool>) -> Result<((), u64)> {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    let stream = futures_util::stream::unfold((), move |()| {
        let more = !stop.load(Ordering::Relaxed);
        let msg = more.then(|| {
            counted.fetch_add(1, Ordering::Relaxed);
            (
                Echo {
                    payload: payload.clone(),
                },
                (),
            )
        });
        std::future::ready(msg)
    });
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.context("gRPC channel not ready")?;
    grpc.client_streaming(
        Request::new(stream),
        http::uri::PathAndQuery::from_static(SINK_PATH),
        ProstCodec::<Echo, Echo>::default(),
    )
    .await
    .context("gRPC streaming call")?;
    Ok(((), sent.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn echoes_counts_every_streamed_message_and_refuses_unknown_methods() {
        let grpc = GrpcContender::setup().await.unwrap();
        let body = Bytes::from_static(b"ping");
        assert_eq!(grpc.caller().call(&body).await.unwrap(), body);
        let plan = Plan::tiny();
        let round = grpc.throughput_round(&body, &plan).await.unwrap();
        // Reliable: everything the stream yielded was counted by the server.
        assert!(round.sent > 0 && round.lost == 0, "{round:?}");
        assert_eq!(grpc.delivered.msgs(), round.sent);
        // A method the service does not have: a typed status, no hang.
        let mut raw = tonic::client::Grpc::new(grpc.channel.clone());
        raw.ready().await.unwrap();
        let err = raw
            .unary(
                Request::new(Echo::default()),
                http::uri::PathAndQuery::from_static("/surelink.bench.Bench/Nope"),
                ProstCodec::<Echo, Echo>::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        grpc.shutdown().await;
    }
}
