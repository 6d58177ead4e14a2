//! `ovnk sandbox apiserver` and `ovnk sandbox kubeconfig`.

use crate::server::{ApiServer, ServerConfig};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// `ovnk sandbox apiserver --dir DIR [--port P]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiserverArgs {
    /// Sandbox state dir (CA, state, kubeconfig).
    #[arg(long, env = "OVNK_SANDBOX_DIR")]
    pub dir: PathBuf,
    /// Port (0 = any free port).
    #[arg(long, env = "OVNK_APISERVER_PORT", default_value_t = 0)]
    pub port: u16,
    /// Address to bind (loopback by default).
    #[arg(long, env = "OVNK_APISERVER_BIND", default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub bind: IpAddr,
    /// Extra names/IPs for the serving certificate.
    #[arg(
        long = "tls-san",
        env = "OVNK_APISERVER_TLS_SANS",
        value_delimiter = ','
    )]
    pub tls_sans: Vec<String>,
    /// Service ClusterIP range.
    #[arg(long, env = "OVNK_SERVICE_CIDR", default_value = "10.96.0.0/16")]
    pub service_cidr: ipnet::Ipv4Net,
    /// Smallest CSR expirationSeconds accepted (a real server: 600).
    #[arg(long, env = "OVNK_APISERVER_MIN_CSR_SECONDS", default_value_t = 600)]
    pub min_csr_expiration_seconds: u64,
}

/// Serve until SIGINT/SIGTERM; writes `DIR/kubeconfig` (admin).
pub async fn run_apiserver(args: ApiserverArgs) -> anyhow::Result<()> {
    let cfg = ServerConfig {
        dir: Some(args.dir.clone()),
        addr: SocketAddr::new(args.bind, args.port),
        extra_sans: args.tls_sans,
        service_cidr: args.service_cidr,
        min_csr_expiration_seconds: args.min_csr_expiration_seconds,
        ..ServerConfig::default()
    };
    let server = ApiServer::start(cfg).await?;
    println!("{}", server.url());
    eprintln!(
        "admin kubeconfig: {}",
        args.dir.join("kubeconfig").display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    server.shutdown().await?;
    Ok(())
}

/// `ovnk sandbox kubeconfig --dir DIR --user U [--group G]...`.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeconfigArgs {
    /// Sandbox state dir.
    #[arg(long, env = "OVNK_SANDBOX_DIR")]
    pub dir: PathBuf,
    /// User name (certificate CN).
    #[arg(long)]
    pub user: String,
    /// Groups (certificate O), repeatable.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Server URL (default: the one the running server wrote to DIR/apiserver.url).
    #[arg(long)]
    pub server: Option<String>,
}

/// Print a kubeconfig for that identity to stdout.
pub async fn run_kubeconfig(args: KubeconfigArgs) -> anyhow::Result<()> {
    if !args.dir.join("ca.crt").exists() {
        anyhow::bail!(
            "{} holds no sandbox CA; start `ovnk sandbox apiserver --dir {}` first",
            args.dir.display(),
            args.dir.display()
        );
    }
    let yaml =
        crate::kubeconfig::from_dir(&args.dir, &args.user, &args.groups, args.server.as_deref())?;
    print!("{yaml}");
    Ok(())
}

/// Both subcommands, for embedding under `ovnk sandbox`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Run the embedded API server until stopped; writes DIR/kubeconfig (admin).
    Apiserver(ApiserverArgs),
    /// Print a kubeconfig for any user/groups, signed by the sandbox CA in DIR.
    Kubeconfig(KubeconfigArgs),
}

/// Run either subcommand.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Apiserver(a) => run_apiserver(a).await,
        Command::Kubeconfig(a) => run_kubeconfig(a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: Command,
    }

    #[test]
    fn parses() {
        let t = Top::try_parse_from(["x", "apiserver", "--dir", "/tmp/d", "--port", "6443"])
            .expect("parse");
        assert!(matches!(
            t.cmd,
            Command::Apiserver(ApiserverArgs { port: 6443, .. })
        ));
        let t = Top::try_parse_from([
            "x",
            "kubeconfig",
            "--dir",
            "/tmp/d",
            "--user",
            "u",
            "--group",
            "a",
            "--group",
            "b",
        ])
        .expect("parse");
        match t.cmd {
            Command::Kubeconfig(k) => assert_eq!(k.groups, vec!["a", "b"]),
            _ => panic!("wrong subcommand"),
        }
    }
}
