//! A small HTTP/1.1 keep-alive client and load generator over TLS (or plain TCP), used by the
//! webhook tests and by `ovnk-bench webhook`. Only what those need: `Content-Length` bodies.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// One keep-alive HTTP/1.1 connection.
#[derive(Debug)]
pub struct Conn<S> {
    stream: S,
    buf: Vec<u8>,
    host: String,
}

/// A TLS client config trusting `roots` (PEM certificates), HTTP/1.1 ALPN, ring provider.
pub fn client_config(roots_pem: &[&[u8]]) -> Result<Arc<rustls::ClientConfig>, std::io::Error> {
    use rustls_pki_types::pem::PemObject;
    let mut store = rustls::RootCertStore::empty();
    for pem in roots_pem {
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| std::io::Error::other(e.to_string()))?;
            store
                .add(c)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

impl Conn<TlsStream<TcpStream>> {
    /// Connects with TLS, verifying the server as `server_name`.
    pub async fn connect_tls(
        addr: SocketAddr,
        server_name: &str,
        cfg: Arc<rustls::ClientConfig>,
    ) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let stream = TlsConnector::from(cfg).connect(name, tcp).await?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(8192),
            host: server_name.to_string(),
        })
    }

    /// The server's leaf certificate.
    pub fn peer_certificate(&self) -> Option<CertificateDer<'static>> {
        self.stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.clone().into_owned())
    }
}

impl Conn<TcpStream> {
    /// Plain-TCP connection.
    pub async fn connect_plain(addr: SocketAddr) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(Conn {
            stream: tcp,
            buf: Vec::with_capacity(8192),
            host: addr.to_string(),
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Sends one request and reads the response: (status, body).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let mut out = Vec::with_capacity(head.len() + body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(body);
        self.stream.write_all(&out).await?;
        self.stream.flush().await?;
        self.read_response().await
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    async fn read_response(&mut self) -> std::io::Result<(u16, Vec<u8>)> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|_| bad("non-UTF-8 head"))?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut len = None;
        for l in lines {
            if let Some((k, v)) = l.split_once(':')
                && k.trim().eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse::<usize>().ok();
            }
        }
        let len = len.ok_or_else(|| bad("no Content-Length"))?;
        let start = head_end + 4;
        while self.buf.len() < start + len {
            self.fill().await?;
        }
        let body = self.buf[start..start + len].to_vec();
        self.buf.drain(..start + len);
        Ok((status, body))
    }
}

/// Result of a load run.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    pub ok: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Per-request latencies. Open loop: from the scheduled send time when the connection was
    /// still busy with the previous request then (the server's queueing counts), otherwise from
    /// the actual send (the load generator's own timer lateness does not).
    pub latencies: Vec<Duration>,
    /// Open loop: every latency from the scheduled send time, timer lateness included.
    pub from_schedule: Vec<Duration>,
}

impl LoadResult {
    pub fn throughput_rps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 { self.ok as f64 / s } else { 0.0 }
    }

    /// Latency quantile `q` in [0, 1], in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies, q)
    }

    /// Like [`quantile_ms`](Self::quantile_ms), over [`from_schedule`](Self::from_schedule).
    pub fn quantile_from_schedule_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.from_schedule, q)
    }

    fn merge(&mut self, other: LoadResult) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.latencies.extend(other.latencies);
        self.from_schedule.extend(other.from_schedule);
    }
}

fn quantile_ms(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    let mut v = latencies.to_vec();
    v.sort_unstable();
    let idx = ((v.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    v[idx.min(v.len() - 1)].as_secs_f64() * 1000.0
}

/// Load target.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub server_name: String,
    pub tls: Arc<rustls::ClientConfig>,
    pub path: String,
    pub body: Arc<Vec<u8>>,
}

/// Closed loop: `conns` connections each sending back-to-back for `duration`.
pub async fn closed_loop(
    target: &Target,
    conns: usize,
    duration: Duration,
) -> std::io::Result<LoadResult> {
    let mut tasks = Vec::new();
    let start = Instant::now();
    for _ in 0..conns.max(1) {
        let t = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = LoadResult::default();
            let mut c = Conn::connect_tls(t.addr, &t.server_name, t.tls.clone()).await?;
            while start.elapsed() < duration {
                let sent = Instant::now();
                match c.request("POST", &t.path, &t.body).await {
                    Ok((200, _)) => {
                        r.ok += 1;
                        r.latencies.push(sent.elapsed());
                    }
                    Ok(_) => r.errors += 1,
                    Err(_) => {
                        r.errors += 1;
                        c = Conn::connect_tls(t.addr, &t.server_name, t.tls.clone()).await?;
                    }
                }
            }
            Ok::<_, std::io::Error>(r)
        }));
    }
    let mut total = LoadResult::default();
    for t in tasks {
        let r = t
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
        total.merge(r);
    }
    total.elapsed = start.elapsed();
    Ok(total)
}

/// Open loop: `rate` requests/s spread over `conns` connections for `duration`.
///
/// Each connection is driven by its own OS thread that sleeps with the OS timer (tens of
/// microseconds of slack) until a request is due, so the schedule is kept precisely; tokio's
/// timer, with its millisecond granularity, would add up to a millisecond to every latency.
/// A request whose connection was still waiting for the previous answer at its scheduled time
/// is measured from that scheduled time (no coordinated omission: a slow server is charged for
/// the queueing it causes); one sent on an idle connection is measured from its actual send.
/// [`LoadResult::from_schedule`] keeps every latency from the scheduled time as well.
pub async fn open_loop(
    target: &Target,
    rate: f64,
    conns: usize,
    duration: Duration,
) -> std::io::Result<LoadResult> {
    let conns = conns.max(1);
    let total_reqs = (rate * duration.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(conns as f64 / rate.max(1.0));
    let start = Instant::now() + Duration::from_millis(100);
    let mut threads = Vec::new();
    for i in 0..conns {
        let t = target.clone();
        let offset = Duration::from_secs_f64(i as f64 / rate.max(1.0));
        let n = total_reqs / conns as u64 + u64::from((i as u64) < total_reqs % conns as u64);
        threads.push(std::thread::spawn(
            move || -> std::io::Result<LoadResult> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async move {
                    let mut r = LoadResult::default();
                    let mut c = Conn::connect_tls(t.addr, &t.server_name, t.tls.clone()).await?;
                    let mut prev_done = start;
                    for k in 0..n {
                        let due = start + offset + interval * (k as u32);
                        // this thread drives only this connection: a blocking sleep is precise
                        // and holds up nothing else
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        let origin = if prev_done > due { due } else { Instant::now() };
                        let res = c.request("POST", &t.path, &t.body).await;
                        let done = Instant::now();
                        prev_done = done;
                        match res {
                            Ok((200, _)) => {
                                r.ok += 1;
                                r.latencies.push(done.saturating_duration_since(origin));
                                r.from_schedule.push(done.saturating_duration_since(due));
                            }
                            Ok(_) => r.errors += 1,
                            Err(_) => {
                                r.errors += 1;
                                c = Conn::connect_tls(t.addr, &t.server_name, t.tls.clone())
                                    .await?;
                            }
                        }
                    }
                    Ok(r)
                })
            },
        ));
    }
    let mut total = tokio::task::spawn_blocking(move || -> std::io::Result<LoadResult> {
        let mut total = LoadResult::default();
        for t in threads {
            let r = t
                .join()
                .map_err(|_| std::io::Error::other("a load thread panicked"))??;
            total.merge(r);
        }
        Ok(total)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))??;
    total.elapsed = start.elapsed();
    Ok(total)
}

/// A throwaway CA and a serving certificate for `localhost` and `127.0.0.1`
/// (PEMs: ca, cert, key), for benchmarks and local tests.
pub fn localhost_pki() -> Result<(String, String, String), rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ovnk throwaway CA");
    ca.distinguished_name = dn;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "ovnk webhook");
    leaf.distinguished_name = dn;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((ca_cert.pem(), cert.pem(), key.serialize_pem()))
}
