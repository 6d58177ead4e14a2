//! The benchmark baseline: a bare rustls + hyper HTTP/1.1 server that decodes the same
//! AdmissionReview JSON as the webhook and always answers "allowed". No routing, no checks,
//! no metrics. Used by `ovnk-bench webhook` to put the webhook's numbers in context.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::review::{self, Outcome};

async fn answer(req: Request<Incoming>) -> Result<Response<Full<bytes::Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    let out = match review::decode(&body) {
        Ok(r) => review::encode(&r.uid, &Outcome::Allowed),
        Err((uid, e)) => review::encode(&uid, &Outcome::from(e)),
    };
    let mut resp = Response::new(Full::new(bytes::Bytes::from(out)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Serves on `listener` with `tls` until the returned task is aborted.
pub fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>) -> tokio::task::JoinHandle<()> {
    let acceptor = TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(tls), service_fn(answer))
                    .await;
            });
        }
    })
}

/// Binds `addr` and serves; returns the bound address and the task.
pub async fn bind(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, serve(listener, tls)))
}
