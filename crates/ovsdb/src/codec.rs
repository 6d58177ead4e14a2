//! Streaming framing of concatenated JSON texts (OVSDB sends JSON-RPC messages back to back
//! with no delimiter).
//!
//! The framer keeps its scan state between reads, so every byte is looked at once however the
//! stream is split: O(n) in the message size. A message that grows past the configured maximum
//! is an error before it is buffered further.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

/// Default cap on one message: far above what an OVN database at scale sends in one reply.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("message exceeds the maximum size of {max} bytes (at least {seen} bytes buffered)")]
    TooLarge { max: usize, seen: usize },
    #[error(
        "invalid JSON-RPC framing: unexpected byte {byte:#04x} ({desc}) where a message must start"
    )]
    BadStart { byte: u8, desc: &'static str },
    #[error("stream ended inside a message ({len} bytes buffered)")]
    Truncated { len: usize },
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Splits a byte stream into complete JSON values (objects or arrays).
#[derive(Debug)]
pub struct JsonFramer {
    max: usize,
    /// Index of the next unscanned byte in the buffer.
    pos: usize,
    depth: u32,
    in_string: bool,
    escape: bool,
    started: bool,
}

impl JsonFramer {
    pub fn new(max_message_bytes: usize) -> Self {
        JsonFramer {
            max: max_message_bytes,
            pos: 0,
            depth: 0,
            in_string: false,
            escape: false,
            started: false,
        }
    }

    /// Finds the end of the next complete message, advancing the scan state (leading
    /// whitespace is consumed from `buf`). Returns the message length when one is complete;
    /// the bytes stay in `buf`.
    pub fn scan(&mut self, buf: &mut BytesMut) -> Result<Option<usize>, FrameError> {
        if !self.started {
            // Skip whitespace between messages.
            let skip = buf.iter().take_while(|b| b.is_ascii_whitespace()).count();
            buf.advance(skip);
            let Some(&first) = buf.first() else {
                return Ok(None);
            };
            if first != b'{' && first != b'[' {
                return Err(FrameError::BadStart {
                    byte: first,
                    desc: "not '{' or '['",
                });
            }
            self.started = true;
            self.pos = 0;
            self.depth = 0;
        }
        let bytes = &buf[..];
        let mut i = self.pos;
        while i < bytes.len() {
            let b = bytes[i];
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
            } else {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth = self.depth.saturating_sub(1);
                        if self.depth == 0 {
                            self.started = false;
                            self.pos = 0;
                            return Ok(Some(i + 1));
                        }
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        self.pos = i;
        if i > self.max {
            return Err(FrameError::TooLarge {
                max: self.max,
                seen: i,
            });
        }
        Ok(None)
    }
}

impl Decoder for JsonFramer {
    /// One complete message's bytes (parse with [`crate::rpc::Incoming::parse`]).
    type Item = bytes::Bytes;
    type Error = FrameError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, FrameError> {
        match self.scan(buf)? {
            None => {
                // Reserve for the rest of a large message in bigger steps than the default.
                if self.started && buf.capacity() - buf.len() < 64 * 1024 {
                    buf.reserve(buf.len().clamp(64 * 1024, 8 * 1024 * 1024));
                }
                Ok(None)
            }
            Some(len) => {
                if len > self.max {
                    return Err(FrameError::TooLarge {
                        max: self.max,
                        seen: len,
                    });
                }
                Ok(Some(buf.split_to(len).freeze()))
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, FrameError> {
        match self.decode(buf)? {
            Some(v) => Ok(Some(v)),
            None if buf.iter().all(u8::is_ascii_whitespace) => Ok(None),
            None => Err(FrameError::Truncated { len: buf.len() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn feed(chunks: &[&[u8]], max: usize) -> Result<Vec<serde_json::Value>, FrameError> {
        let mut f = JsonFramer::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for c in chunks {
            buf.extend_from_slice(c);
            while let Some(v) = f.decode(&mut buf)? {
                out.push(serde_json::from_slice(&v).expect("a complete frame is JSON here"));
            }
        }
        if let Some(v) = f.decode_eof(&mut buf)? {
            out.push(serde_json::from_slice(&v).expect("a complete frame is JSON here"));
        }
        Ok(out)
    }

    #[test]
    fn splits_back_to_back_messages_with_tricky_strings() {
        let input = br#"{"a":"}{\"]"} [1,{"b":"\\"}]
{"c":[]}"#;
        let out = feed(&[input], 1 << 20).expect("frames");
        assert_eq!(
            out,
            vec![
                json!({"a":"}{\"]"}),
                json!([1, {"b":"\\"}]),
                json!({"c":[]})
            ]
        );
    }

    #[test]
    fn truncated_frame_is_an_error_at_eof() {
        let err = feed(&[br#"{"id":1,"result":"#], 1 << 20).expect_err("truncated");
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
    }

    #[test]
    fn invalid_json_inside_balanced_braces_is_framed_then_refused_by_the_parser() {
        let mut f = JsonFramer::new(1 << 20);
        let mut buf = BytesMut::from(&br#"{"id":1 "x"}"#[..]);
        let frame = f.decode(&mut buf).expect("framed").expect("one frame");
        let err = crate::rpc::Incoming::parse(&frame).expect_err("invalid");
        assert!(
            matches!(err, crate::rpc::ParseError::InvalidJson { .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_start_is_an_error() {
        let err = feed(&[b"hello"], 1 << 20).expect_err("garbage");
        assert!(
            matches!(err, FrameError::BadStart { byte: b'h', .. }),
            "{err}"
        );
    }

    #[test]
    fn oversized_message_is_refused_before_completion() {
        let mut f = JsonFramer::new(100);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"{\"x\":\"");
        buf.extend_from_slice(&[b'a'; 200]);
        let err = f.decode(&mut buf).expect_err("too large");
        assert!(
            matches!(err, FrameError::TooLarge { max: 100, .. }),
            "{err}"
        );
    }

    proptest! {
        /// Any split of a stream of messages yields the same messages.
        #[test]
        fn any_split_gives_the_same_messages(
            msgs in proptest::collection::vec(arb_json(), 1..6),
            cuts in proptest::collection::vec(0usize..4000, 0..12),
        ) {
            let mut stream = Vec::new();
            for m in &msgs {
                stream.extend_from_slice(serde_json::to_string(m).expect("ser").as_bytes());
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts { chunks.push(&stream[last..c]); last = c; }
            chunks.push(&stream[last..]);
            let out = feed(&chunks, 1 << 20).expect("frames");
            prop_assert_eq!(out, msgs);
        }
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            any::<i64>().prop_map(|i| json!(i)),
            any::<bool>().prop_map(|b| json!(b)),
            "[ -~\\\\\"{}\\[\\]é]{0,12}".prop_map(|s| json!(s)),
            Just(serde_json::Value::Null),
        ];
        let inner = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-z{}\"]{1,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }
}
