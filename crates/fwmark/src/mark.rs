//! Firewall-mark values, the node mask, and the list of mark bits ovnk refuses to write.
//!
//! A ServiceFWMark value `v` is applied on a node as `value/mask`: the packet mark becomes
//! `(mark & !mask) | (v & mask)`. The default mask `0xffffffff` is the seed's whole-mark
//! behaviour (the mark is replaced); a narrower mask leaves the other bits to other components.
//!
//! Collisions are judged on bits, not on equal values: with mask `m`, the bits ovnk controls are
//! `v & m`; the remaining bits of the resulting mark are whatever the packet already had. A value
//! collides with a reserved entry when some packet could end up carrying that entry's mark (or
//! flag bit) because of ovnk's write. See [`RESERVED`] and `docs/fwmark.md`.

use std::fmt;

/// The mask that replaces the whole packet mark (the seed's behaviour).
pub const FULL_MASK: u32 = 0xffff_ffff;

/// How a reserved entry is matched by its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// The owner matches the whole mark against this exact value (e.g. `ip rule fwmark 0x3f0`).
    Exact(u32),
    /// The owner matches the whole mark against values in this inclusive range.
    Range(u32, u32),
    /// The owner uses these bits as flags (`mark & bits != 0`); ovnk must not set them.
    Bits(u32),
}

/// One reserved mark, who uses it and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservedMark {
    pub owner: &'static str,
    pub what: &'static str,
    pub reserved: Reserved,
}

/// Marks OVN-Kubernetes, ovnk and kube-proxy use on a node. ovnk refuses a ServiceFWMark value
/// whose written bits could produce one of these. (Cilium, Calico and Tailscale bits are
/// documented in `docs/fwmark.md` but not enforced: they do not run alongside OVN-K.)
pub const RESERVED: &[ReservedMark] = &[
    ReservedMark {
        owner: "OVN-Kubernetes",
        what: "pkt_mark 0x3f0 (1008) on local-gateway traffic to the host, matched by `ip rule fwmark 0x3f0`",
        reserved: Reserved::Exact(0x3f0),
    },
    ReservedMark {
        owner: "OVN-Kubernetes",
        what: "UDN packet marks 0x1000 + network id (ip rule prio 2000)",
        reserved: Reserved::Range(0x1000, 0x1fff),
    },
    ReservedMark {
        owner: "OVN-Kubernetes",
        what: "EgressIP marks 50000-55000 (k8s.ovn.org/egressip-mark)",
        reserved: Reserved::Range(50_000, 55_000),
    },
    ReservedMark {
        owner: "OVN-Kubernetes",
        what: "ITP mark 0x1745ec (`fwmark 0x1745ec lookup 7`)",
        reserved: Reserved::Exact(0x1745ec),
    },
    ReservedMark {
        owner: "kube-proxy",
        what: "KUBE-MARK-MASQ 0x4000 and KUBE-MARK-DROP 0x8000 flag bits",
        reserved: Reserved::Bits(0xc000),
    },
];

/// Why a mark value cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    #[error("fwmark {value} is outside the allowed range {min}..={max}")]
    OutOfRange { value: i64, min: i64, max: i64 },
    #[error("fwmark {value:#x} has bits outside the node mask {mask:#x}")]
    OutsideMask { value: u32, mask: u32 },
    #[error("fwmark {value} ({value:#x}) with mask {mask:#x} collides with {owner}: {what}")]
    Reserved {
        value: u32,
        mask: u32,
        owner: &'static str,
        what: &'static str,
    },
    #[error("fwmark mask must not be 0")]
    ZeroMask,
}

/// A checked mark: the value ovnk writes and the node mask it writes it under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mark {
    value: u32,
    mask: u32,
}

impl Mark {
    /// The value written (always a subset of [`Mark::mask`]).
    pub fn value(self) -> u32 {
        self.value
    }
    /// The node mask.
    pub fn mask(self) -> u32 {
        self.mask
    }
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}/{:#x}", self.value, self.mask)
    }
}

/// Could a packet end up with a mark inside `res` after ovnk writes `value` under `mask`?
fn collides(value: u32, mask: u32, res: Reserved) -> bool {
    // The resulting mark is `(old & !mask) | value`: the bits under `mask` are fixed to `value`,
    // the others are free. A reserved exact mark `x` is reachable iff `x & mask == value`.
    match res {
        Reserved::Exact(x) => x & mask == value,
        Reserved::Range(lo, hi) => {
            if mask == FULL_MASK {
                (lo..=hi).contains(&value)
            } else {
                (lo..=hi).any(|x| x & mask == value)
            }
        }
        Reserved::Bits(bits) => value & bits != 0,
    }
}

/// Validate a ServiceFWMark value against the schema range and the reserved list, for `mask`.
pub fn validate(value: i64, mask: u32) -> Result<Mark, MarkError> {
    use k8s_api::service_fwmark::{FWMARK_MAX, FWMARK_MIN};
    if mask == 0 {
        return Err(MarkError::ZeroMask);
    }
    if !(FWMARK_MIN..=FWMARK_MAX).contains(&value) {
        return Err(MarkError::OutOfRange {
            value,
            min: FWMARK_MIN,
            max: FWMARK_MAX,
        });
    }
    // In range, so it fits in u32.
    let v = u32::try_from(value).map_err(|_| MarkError::OutOfRange {
        value,
        min: FWMARK_MIN,
        max: FWMARK_MAX,
    })?;
    if v & !mask != 0 {
        return Err(MarkError::OutsideMask { value: v, mask });
    }
    for r in RESERVED {
        if collides(v, mask, r.reserved) {
            return Err(MarkError::Reserved {
                value: v,
                mask,
                owner: r.owner,
                what: r.what,
            });
        }
    }
    Ok(Mark { value: v, mask })
}

/// Reserved flag bits a node mask would clear on every marked packet (the mask trade-off);
/// the node logs these once at start.
pub fn mask_clobbers(mask: u32) -> Vec<&'static ReservedMark> {
    RESERVED
        .iter()
        .filter(|r| matches!(r.reserved, Reserved::Bits(b) if b & mask != 0))
        .collect()
}

/// Parse a mask given as decimal or `0x` hex.
pub fn parse_mask(s: &str) -> Result<u32, String> {
    let s = s.trim();
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse::<u32>(),
    };
    match parsed {
        Ok(0) => Err("mask must not be 0".into()),
        Ok(m) => Ok(m),
        Err(e) => Err(format!("invalid mask {s:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_range_without_1008_is_valid_under_full_mask() {
        for v in 1000..=2000_i64 {
            let r = validate(v, FULL_MASK);
            if v == 1008 {
                assert!(matches!(r, Err(MarkError::Reserved { .. })), "{v}");
            } else {
                assert_eq!(r.map(|m| m.value()), Ok(v as u32), "{v}");
            }
        }
    }

    #[test]
    fn out_of_range_rejected() {
        assert!(matches!(
            validate(999, FULL_MASK),
            Err(MarkError::OutOfRange { .. })
        ));
        assert!(matches!(
            validate(2001, FULL_MASK),
            Err(MarkError::OutOfRange { .. })
        ));
        assert!(matches!(
            validate(-1, FULL_MASK),
            Err(MarkError::OutOfRange { .. })
        ));
    }

    #[test]
    fn bits_not_values_decide_under_a_narrow_mask() {
        // Under mask 0x3ff, 2000 (0x7d0) would be truncated; it is rejected as outside the mask.
        assert!(matches!(
            validate(2000, 0x3ff),
            Err(MarkError::OutsideMask { .. })
        ));
        // Under mask 0x3f0 the written bits of 1008 are 0x3f0, so any packet gets 1008's low
        // bits: 1008 itself collides; and 0x3f0 & 0x3f0 == 1008 & 0x3f0.
        assert!(matches!(
            validate(1008, 0x3f0),
            Err(MarkError::Reserved { .. })
        ));
        // Under mask 0x7ff, value 1000 can never produce 0x3f0 (bit 3 is forced to 1), but a
        // packet already carrying UDN mark 0x1000 would become 0x13e8, another UDN's mark.
        assert!(matches!(
            validate(1000, 0x7ff),
            Err(MarkError::Reserved {
                owner: "OVN-Kubernetes",
                ..
            })
        ));
        // Mask 0xffff owns every bit OVN-K marks use: only equal values collide.
        assert!(validate(1000, 0xffff).is_ok());
        assert!(validate(1008, 0xffff).is_err());
        // Under mask 0x7f0 value 1008 is exactly the reserved mark's masked bits.
        assert!(validate(1008, 0x7f0).is_err());
        // A mask covering only the low byte leaves 0x3f0's upper bits free: 0x3f0 & 0xff = 0xf0,
        // so writing 0xf0 (240) under 0xff could yield 1008 — but 240 is out of range anyway;
        // the range check comes first.
        assert!(matches!(
            validate(240, 0xff),
            Err(MarkError::OutOfRange { .. })
        ));
    }

    #[test]
    fn kube_proxy_bits_are_flags() {
        assert!(collides(0x4000, FULL_MASK, Reserved::Bits(0xc000)));
        assert!(!collides(0x3e8, FULL_MASK, Reserved::Bits(0xc000)));
        assert_eq!(mask_clobbers(FULL_MASK).len(), 1);
        assert!(mask_clobbers(0x7ff).is_empty());
    }

    #[test]
    fn mask_parsing() {
        assert_eq!(parse_mask("0xffffffff"), Ok(FULL_MASK));
        assert_eq!(parse_mask("2047"), Ok(2047));
        assert!(parse_mask("0").is_err());
        assert!(parse_mask("zz").is_err());
    }
}
