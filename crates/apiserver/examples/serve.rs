//! Run the embedded API server alone (what `ovnk sandbox apiserver` does):
//! `cargo run -p ovnk-apiserver --example serve -- --dir /tmp/sandbox`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: apiserver::cli::ApiserverArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver::install_crypto_provider();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    apiserver::cli::run_apiserver(Cli::parse().args).await
}
