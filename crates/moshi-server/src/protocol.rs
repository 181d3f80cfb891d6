//! Kyutai's websocket protocol at `/api/chat` (kyutai-labs/moshi `rust/protocol.md`, the web
//! client's `client/src/protocol/encoder.ts`): binary messages whose first byte is the kind.
//!
//! Kinds: 0 handshake, 1 audio (Ogg/Opus pages, 24 kHz mono), 2 text, 3 control, 4 metadata
//! (JSON), 5 error, 6 ping, 7 colored text. Kyutai's web client throws on any other kind, so the
//! server only ever sends 0, 1, 2, 4 and 5.

use std::fmt;

/// The kind byte of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageKind {
    Handshake = 0,
    Audio = 1,
    Text = 2,
    Control = 3,
    Metadata = 4,
    Error = 5,
    Ping = 6,
    ColoredText = 7,
}

impl MessageKind {
    /// The kind of a first byte, `None` for a byte the protocol does not define.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0 => Self::Handshake,
            1 => Self::Audio,
            2 => Self::Text,
            3 => Self::Control,
            4 => Self::Metadata,
            5 => Self::Error,
            6 => Self::Ping,
            7 => Self::ColoredText,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Handshake => "handshake",
            Self::Audio => "audio",
            Self::Text => "text",
            Self::Control => "control",
            Self::Metadata => "metadata",
            Self::Error => "error",
            Self::Ping => "ping",
            Self::ColoredText => "colored text",
        }
    }
}

/// A binary message from a client, as far as the server cares.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientMessage<'a> {
    /// Ogg/Opus bytes (one or several pages, or a part of one).
    Audio(&'a [u8]),
    /// A kind the protocol defines but a full-duplex session has no use for (control, ping, ...):
    /// discarded, as `protocol.md` asks.
    Unused(MessageKind),
    /// A kind byte the protocol does not define (8 and above): discarded too, as
    /// `protocol.md` says of unknown types.
    UnknownKind(u8),
}

/// A client message the server cannot accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    Empty,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "empty message: every message starts with its kind byte"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Splits a client's binary message into its kind and payload.
pub fn parse_client_message(bytes: &[u8]) -> Result<ClientMessage<'_>, ProtocolError> {
    let (&kind, payload) = bytes.split_first().ok_or(ProtocolError::Empty)?;
    match MessageKind::from_byte(kind) {
        Some(MessageKind::Audio) => Ok(ClientMessage::Audio(payload)),
        Some(other) => Ok(ClientMessage::Unused(other)),
        None => Ok(ClientMessage::UnknownKind(kind)),
    }
}

/// Protocol version sent in the handshake (`protocol.md`: always 0 for now).
pub const PROTOCOL_VERSION: u32 = 0;
/// Model version sent in the handshake (Kyutai's servers send 0).
pub const MODEL_VERSION: u32 = 0;

/// The handshake: kind 0, then the protocol and model versions as little-endian u32 (as Kyutai's
/// Rust server sends it; the web client only looks at the kind byte).
pub fn handshake() -> Vec<u8> {
    let mut m = vec![MessageKind::Handshake as u8];
    m.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    m.extend_from_slice(&MODEL_VERSION.to_le_bytes());
    m
}

fn with_kind(kind: MessageKind, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + payload.len());
    m.push(kind as u8);
    m.extend_from_slice(payload);
    m
}

/// Kind 1: Ogg pages.
pub fn audio(ogg_pages: &[u8]) -> Vec<u8> {
    with_kind(MessageKind::Audio, ogg_pages)
}

/// Kind 2: words as generated (UTF-8).
pub fn text(piece: &str) -> Vec<u8> {
    with_kind(MessageKind::Text, piece.as_bytes())
}

/// Kind 4: a JSON object.
pub fn metadata(json: &serde_json::Value) -> Vec<u8> {
    with_kind(MessageKind::Metadata, json.to_string().as_bytes())
}

/// Kind 5: a sentence a person can read.
pub fn error(sentence: &str) -> Vec<u8> {
    with_kind(MessageKind::Error, sentence.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshake_is_kind_0_and_two_zero_u32() {
        assert_eq!(handshake(), vec![0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn server_messages_start_with_their_kind() {
        assert_eq!(audio(b"OggS"), b"\x01OggS");
        assert_eq!(text(" hello"), b"\x02 hello");
        assert_eq!(error("busy"), b"\x05busy");
        let m = metadata(&serde_json::json!({"a": 1}));
        assert_eq!(m[0], 4);
        assert_eq!(&m[1..], br#"{"a":1}"#);
    }

    #[test]
    fn client_messages_are_split_by_kind() {
        assert_eq!(
            parse_client_message(b"\x01OggS"),
            Ok(ClientMessage::Audio(b"OggS"))
        );
        assert_eq!(parse_client_message(b"\x01"), Ok(ClientMessage::Audio(b"")));
        assert_eq!(
            parse_client_message(b"\x03\x00"),
            Ok(ClientMessage::Unused(MessageKind::Control))
        );
        assert_eq!(
            parse_client_message(b"\x06"),
            Ok(ClientMessage::Unused(MessageKind::Ping))
        );
        assert_eq!(parse_client_message(b""), Err(ProtocolError::Empty));
        assert_eq!(
            parse_client_message(b"\x08abc"),
            Ok(ClientMessage::UnknownKind(8))
        );
        assert_eq!(
            parse_client_message(b"\xffabc"),
            Ok(ClientMessage::UnknownKind(255))
        );
    }

    #[test]
    fn every_kind_byte_round_trips() {
        for b in 0..=255u8 {
            if let Some(k) = MessageKind::from_byte(b) {
                assert_eq!(k as u8, b);
                assert!(!k.name().is_empty());
            } else {
                assert!(b > 7);
            }
        }
    }
}
