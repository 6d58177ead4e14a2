//! Command-line flags of the ServiceFWMark node controller (each also from the environment).

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::BackendKind;
use crate::mark;

/// Flags for `ovnk node` (flatten this into the node command's Args).
#[derive(Clone, Debug, clap::Args)]
pub struct FwmarkArgs {
    /// Packet-filter interface used to mark ServiceFWMark traffic.
    #[arg(long = "fwmark-backend", env = "OVNK_FWMARK_BACKEND", value_enum, default_value_t = BackendKind::Nftables)]
    pub backend: BackendKind,

    /// Mask under which ServiceFWMark values are written (`mark = mark & ~mask | value`);
    /// decimal or 0x-hex. 0xffffffff replaces the whole mark, as in the seed.
    #[arg(long = "fwmark-mask", env = "OVNK_FWMARK_MASK", default_value = "0xffffffff", value_parser = mark::parse_mask)]
    pub mask: u32,

    /// Name of ovnk's own nftables table (family inet).
    #[arg(long = "fwmark-nft-table", env = "OVNK_FWMARK_NFT_TABLE", default_value = crate::nft::DEFAULT_TABLE)]
    pub nft_table: String,

    /// Directory holding nft / iptables-restore / iptables-save (default: $PATH and sbin).
    #[arg(long = "fwmark-bin-dir", env = "OVNK_FWMARK_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,

    /// Period of a full resync from the live ruleset (repairs drift), e.g. 300s, 5m.
    #[arg(long = "fwmark-resync-period", env = "OVNK_FWMARK_RESYNC_PERIOD", default_value = "300s", value_parser = parse_duration)]
    pub resync_period: Duration,

    /// Disable the ServiceFWMark node controller.
    #[arg(
        long = "fwmark-disable",
        env = "OVNK_FWMARK_DISABLE",
        default_value_t = false
    )]
    pub disable: bool,
}

impl Default for FwmarkArgs {
    fn default() -> Self {
        Self {
            backend: BackendKind::Nftables,
            mask: mark::FULL_MASK,
            nft_table: crate::nft::DEFAULT_TABLE.to_string(),
            bin_dir: None,
            resync_period: Duration::from_secs(300),
            disable: false,
        }
    }
}

/// Parse `300`, `300s`, `5m`, `1h`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(format!("invalid duration unit in {s:?} (use ms, s, m, h)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        fw: FwmarkArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let c = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(c.fw.backend, BackendKind::Nftables);
        assert_eq!(c.fw.mask, 0xffff_ffff);
        let c = Cli::try_parse_from([
            "x",
            "--fwmark-backend",
            "iptables",
            "--fwmark-mask",
            "0xffff",
            "--fwmark-resync-period",
            "5m",
        ])
        .expect("flags");
        assert_eq!(c.fw.backend, BackendKind::Iptables);
        assert_eq!(c.fw.mask, 0xffff);
        assert_eq!(c.fw.resync_period, Duration::from_secs(300));
        assert!(Cli::try_parse_from(["x", "--fwmark-mask", "0"]).is_err());
    }
}
