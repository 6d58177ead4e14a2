//! Test helper: send UDP probes from a given source address (run inside a network namespace).
//!
//! `ovnk-fwmark-probe send <src> <dst> <count>` / `ovnk-fwmark-probe blast <src> <dst> <millis>`;
//! prints the number of datagrams sent.

use std::net::IpAddr;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = (|| -> Result<u64, String> {
        let [mode, src, dst, n] = args.as_slice() else {
            return Err("usage: ovnk-fwmark-probe send|blast <src> <dst> <count|millis>".into());
        };
        let src: IpAddr = src.parse().map_err(|e| format!("src {src}: {e}"))?;
        let dst: IpAddr = dst.parse().map_err(|e| format!("dst {dst}: {e}"))?;
        let n: u64 = n.parse().map_err(|e| format!("count {n}: {e}"))?;
        match mode.as_str() {
            "send" => fwmark::testbed::send_udp(src, dst, n).map_err(|e| e.to_string()),
            "blast" => fwmark::testbed::blast_udp(src, dst, std::time::Duration::from_millis(n))
                .map_err(|e| e.to_string()),
            m => Err(format!("unknown mode {m}")),
        }
    })();
    match parsed {
        Ok(sent) => {
            println!("{sent}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ovnk-fwmark-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
