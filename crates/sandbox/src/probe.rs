//! Reachability probes with real packets from inside a network namespace: a TCP connect to the
//! target's probe listener (reading the line it answers, which names who it saw connecting)
//! and an ICMP echo over a raw socket. Sockets are created on a thread that entered the
//! namespace and used from the async runtime afterwards, so every probe of one source runs
//! concurrently and each is bounded by the timeout.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::AsyncReadExt;

use crate::netns;

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Target address.
    pub to: IpAddr,
    /// A TCP connection to the probe port was accepted.
    pub tcp: bool,
    /// An ICMP echo reply came back (IPv4 targets only).
    pub icmp: bool,
    /// The line the target's listener answered (`<who> <peer address it saw>`).
    pub answer: Option<String>,
}

/// Probes every target from namespace `ns` (TCP on `port`, and ICMP when `icmp`).
pub async fn probe_from(
    ns: &str,
    targets: &[IpAddr],
    port: u16,
    icmp: bool,
    timeout: Duration,
) -> std::io::Result<Vec<Probe>> {
    let fams: Vec<Domain> = targets
        .iter()
        .map(|t| {
            if t.is_ipv4() {
                Domain::IPV4
            } else {
                Domain::IPV6
            }
        })
        .collect();
    let (tcp_socks, raw) = netns::in_netns_async(ns, move || {
        let mut v = Vec::with_capacity(fams.len());
        for d in fams {
            let s = Socket::new(d, Type::STREAM, Some(Protocol::TCP))?;
            s.set_nonblocking(true)?;
            v.push(std::net::TcpStream::from(s));
        }
        let raw = if icmp {
            Some(Socket::new(
                Domain::IPV4,
                Type::RAW,
                Some(Protocol::ICMPV4),
            )?)
        } else {
            None
        };
        Ok((v, raw))
    })
    .await?;

    let ping_targets: Vec<Ipv4Addr> = targets
        .iter()
        .filter_map(|t| match t {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .collect();
    let pings = tokio::task::spawn_blocking(move || match raw {
        Some(raw) => ping_all(raw, &ping_targets, timeout),
        None => Ok(Vec::new()),
    });

    let conns = tcp_socks
        .into_iter()
        .zip(targets.iter().copied())
        .map(|(s, to)| async move {
            let sock = tokio::net::TcpSocket::from_std_stream(s);
            let attempt = async {
                let mut stream = sock.connect(SocketAddr::new(to, port)).await?;
                let mut buf = Vec::new();
                stream.read_to_end(&mut buf).await?;
                std::io::Result::Ok(String::from_utf8_lossy(&buf).trim().to_owned())
            };
            match tokio::time::timeout(timeout, attempt).await {
                Ok(Ok(answer)) => (to, true, Some(answer)),
                _ => (to, false, None),
            }
        });
    let tcp = futures::future::join_all(conns).await;
    let answered = pings
        .await
        .map_err(|e| std::io::Error::other(format!("ping task: {e}")))??;
    Ok(tcp
        .into_iter()
        .map(|(to, ok, answer)| Probe {
            to,
            tcp: ok,
            icmp: matches!(to, IpAddr::V4(v4) if answered.contains(&v4)),
            answer,
        })
        .collect())
}

/// Sends echo requests to every target not yet answered, again every 300 ms (a first packet
/// may be dropped while the userspace datapath resolves a tunnel neighbour), and collects who
/// answered within `timeout`.
fn ping_all(
    mut raw: Socket,
    targets: &[Ipv4Addr],
    timeout: Duration,
) -> std::io::Result<Vec<Ipv4Addr>> {
    let ident: u16 = rand::random();
    let mut answered: Vec<Ipv4Addr> = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut next_send = Instant::now();
    let mut round: u16 = 0;
    let mut buf = [0u8; 1500];
    while answered.len() < targets.len() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if now >= next_send {
            for (i, t) in targets.iter().enumerate() {
                if answered.contains(t) {
                    continue;
                }
                let seq = round.wrapping_mul(1024).wrapping_add(i as u16);
                // an unreachable target may fail at once (no route); that is a "no"
                let _ = raw.send_to(
                    &echo_request(ident, seq),
                    &SocketAddr::new(IpAddr::V4(*t), 0).into(),
                );
            }
            round = round.wrapping_add(1);
            next_send = now + Duration::from_millis(300);
        }
        let wait = deadline
            .min(next_send)
            .saturating_duration_since(Instant::now());
        raw.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        let n = match raw.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        if let Some(src) = parse_echo_reply(&buf[..n], ident)
            && targets.contains(&src)
            && !answered.contains(&src)
        {
            answered.push(src);
        }
    }
    Ok(answered)
}

/// ICMP echo from namespace `ns` to every target; returns those that answered in `timeout`.
pub async fn ping_from(
    ns: &str,
    targets: &[Ipv4Addr],
    timeout: Duration,
) -> std::io::Result<Vec<Ipv4Addr>> {
    let raw = netns::in_netns_async(ns, || {
        Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
    })
    .await?;
    let targets = targets.to_vec();
    tokio::task::spawn_blocking(move || ping_all(raw, &targets, timeout))
        .await
        .map_err(|e| std::io::Error::other(format!("ping task: {e}")))?
}

fn echo_request(ident: u16, seq: u16) -> Vec<u8> {
    let mut p = vec![8u8, 0, 0, 0];
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(b"ovnk-sandbox-probe");
    let c = inet_checksum(&p);
    p[2..4].copy_from_slice(&c.to_be_bytes());
    p
}

/// The source of an IPv4 packet carrying an echo reply with our identifier.
fn parse_echo_reply(pkt: &[u8], ident: u16) -> Option<Ipv4Addr> {
    let ihl = usize::from(pkt.first()? & 0x0f) * 4;
    if pkt.len() < ihl + 8 || pkt.get(9) != Some(&1) {
        return None;
    }
    let icmp = &pkt[ihl..];
    if icmp[0] != 0 || u16::from_be_bytes([icmp[4], icmp[5]]) != ident {
        return None;
    }
    Some(Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]))
}

fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = if chunk.len() == 2 {
            u16::from_be_bytes([chunk[0], chunk[1]])
        } else {
            u16::from_be_bytes([chunk[0], 0])
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_request_verifies() {
        let p = echo_request(0x1234, 7);
        assert_eq!(
            inet_checksum(&p),
            0,
            "a packet with its checksum sums to zero"
        );
    }

    #[test]
    fn reply_parsing() {
        let mut pkt = vec![
            0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 244, 1, 5, 10, 244, 2, 3,
        ];
        pkt.extend_from_slice(&[0, 0, 0, 0, 0x12, 0x34, 0, 7]);
        assert_eq!(
            parse_echo_reply(&pkt, 0x1234),
            Some(Ipv4Addr::new(10, 244, 1, 5))
        );
        assert_eq!(parse_echo_reply(&pkt, 0x9999), None);
        pkt[20] = 8; // a request, not a reply
        assert_eq!(parse_echo_reply(&pkt, 0x1234), None);
        assert_eq!(parse_echo_reply(&pkt[..10], 0x1234), None);
    }
}
