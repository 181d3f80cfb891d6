//! Kyutai `moshi-server`'s text-to-speech protocol at `/api/tts_streaming` (its
//! `rust/moshi-server/src/py_module.rs` and `tts.rs`), what Kyutai's `tts_rust_server.py` and
//! unmute speak. The query names the voice (`voice`), the output `format` (`OggOpus`, Kyutai's
//! default; `OggOpusMessagePack`; `PcmMessagePack`; `Pcm`) and the key (`auth_id`).
//!
//! Client to server: binary MessagePack maps whose `"type"` names the message, `Text {text}`
//! (words to say, any number per message), `Voice {embeddings, shape}` (the stream's voice, before
//! its first text) and `Eos` (the text is complete), or a websocket text
//! message (its text), or the single byte 0 (end of text). Server to client, MessagePack
//! formats: `Ready` first, then `Audio {pcm: [f32]}` (1920 samples, 24 kHz) or `OggOpus {data}`
//! per frame, `Text {text, start_s, stop_s}` per word said, `Error {message}`; the raw formats
//! send only the audio (little-endian f32 samples, or Ogg pages). The server closes the socket
//! once the last frame is sent.

use serde::{Deserialize, Serialize};

use crate::asr_protocol::serde_bytes_compat::Bytes;

/// A message from a client.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type")]
pub enum TtsClientMessage {
    Text {
        text: String,
    },
    /// The stream's voice, sent before its first `Text`: a speaker embedding as a voice file
    /// holds it (`shape` [1, dim, frames], values channels first), as moshi-server's TTS takes
    /// it from unmute.
    Voice {
        embeddings: Vec<f32>,
        shape: Vec<usize>,
    },
    Eos,
}

/// A message to a client (MessagePack formats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum TtsServerMessage {
    Text {
        text: String,
        start_s: f64,
        stop_s: f64,
    },
    Audio {
        pcm: Vec<f32>,
    },
    OggOpus {
        data: Bytes,
    },
    Error {
        message: String,
    },
    Ready,
}

impl TtsServerMessage {
    /// The message as sent: a MessagePack map with named fields.
    pub fn to_bytes(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("plain fields always serialize")
    }

    /// Reads a server message (for clients and tests).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TtsProtocolError> {
        rmp_serde::from_slice(bytes).map_err(|e| TtsProtocolError::Malformed(e.to_string()))
    }
}

/// The output formats of moshi-server's `StreamingOutput`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub enum TtsFormat {
    /// Ogg/Opus pages as binary messages (moshi-server's default).
    #[default]
    OggOpus,
    /// Ogg/Opus pages inside `OggOpus {data}` messages, with `Ready`, `Text` and `Error`.
    OggOpusMessagePack,
    /// Little-endian f32 samples as binary messages.
    Pcm,
    /// `Audio {pcm}` messages, with `Ready`, `Text` and `Error`.
    PcmMessagePack,
}

impl TtsFormat {
    /// Whether the format carries the MessagePack messages (`Ready`, `Text`, `Error`).
    pub fn has_messages(self) -> bool {
        matches!(self, Self::OggOpusMessagePack | Self::PcmMessagePack)
    }

    /// Whether the audio is Ogg/Opus.
    pub fn is_ogg_opus(self) -> bool {
        matches!(self, Self::OggOpus | Self::OggOpusMessagePack)
    }

    /// The names the query accepts.
    pub const NAMES: &'static str = "OggOpus, OggOpusMessagePack, Pcm, PcmMessagePack";

    /// The format a query names.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "OggOpus" => Self::OggOpus,
            "OggOpusMessagePack" => Self::OggOpusMessagePack,
            "Pcm" => Self::Pcm,
            "PcmMessagePack" => Self::PcmMessagePack,
            _ => return None,
        })
    }
}

/// Why a client message was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TtsProtocolError {
    #[error(
        "not a message of the protocol ({0}): expected a MessagePack map with \"type\" Text, Voice or Eos"
    )]
    Malformed(String),
}

impl TtsClientMessage {
    /// Reads a binary client message: a MessagePack map, or the single byte 0 (end of text).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TtsProtocolError> {
        if bytes == [0] {
            return Ok(Self::Eos);
        }
        rmp_serde::from_slice(bytes).map_err(|e| TtsProtocolError::Malformed(e.to_string()))
    }

    /// The message as a client sends it (for clients and tests).
    pub fn to_bytes(&self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(tag = "type")]
        enum Out<'a> {
            Text {
                text: &'a str,
            },
            Voice {
                embeddings: &'a [f32],
                shape: &'a [usize],
            },
            Eos,
        }
        let out = match self {
            Self::Text { text } => Out::Text { text },
            Self::Voice { embeddings, shape } => Out::Voice { embeddings, shape },
            Self::Eos => Out::Eos,
        };
        rmp_serde::to_vec_named(&out).expect("plain fields always serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_python_end_of_stream_reads() {
        for m in [
            TtsClientMessage::Text {
                text: "Hello world".into(),
            },
            TtsClientMessage::Voice {
                embeddings: vec![0.5, -1.25],
                shape: vec![1, 2, 1],
            },
            TtsClientMessage::Eos,
        ] {
            assert_eq!(TtsClientMessage::from_bytes(&m.to_bytes()).unwrap(), m);
        }
        assert_eq!(
            TtsClientMessage::from_bytes(&[0]).unwrap(),
            TtsClientMessage::Eos
        );
        // msgpack.packb({"type": "Eos"}) from Python.
        let mut eos = vec![0x81, 0xa4];
        eos.extend(b"type");
        eos.push(0xa3);
        eos.extend(b"Eos");
        assert_eq!(
            TtsClientMessage::from_bytes(&eos).unwrap(),
            TtsClientMessage::Eos
        );
        // msgpack.packb({"type": "Voice", "embeddings": [0.5, 2], "shape": [1, 2, 1]}): Python
        // floats are doubles, integers may stand for floats.
        let mut voice = vec![0x83, 0xa4];
        voice.extend(b"type");
        voice.push(0xa5);
        voice.extend(b"Voice");
        voice.push(0xaa);
        voice.extend(b"embeddings");
        voice.extend([0x92, 0xcb]);
        voice.extend(0.5f64.to_be_bytes());
        voice.push(0x02);
        voice.push(0xa5);
        voice.extend(b"shape");
        voice.extend([0x93, 0x01, 0x02, 0x01]);
        assert_eq!(
            TtsClientMessage::from_bytes(&voice).unwrap(),
            TtsClientMessage::Voice {
                embeddings: vec![0.5, 2.0],
                shape: vec![1, 2, 1]
            }
        );
        assert!(TtsClientMessage::from_bytes(b"\x81\xa4type\xa4Nope").is_err());
        assert!(TtsClientMessage::from_bytes(b"").is_err());
        let out = TtsServerMessage::Text {
            text: "hi".into(),
            start_s: 0.08,
            stop_s: 0.4,
        };
        assert_eq!(TtsServerMessage::from_bytes(&out.to_bytes()).unwrap(), out);
        assert_eq!(
            TtsFormat::parse("PcmMessagePack"),
            Some(TtsFormat::PcmMessagePack)
        );
        assert_eq!(TtsFormat::parse("wav"), None);
    }
}
