//! Kyutai `moshi-server`'s speech-to-text protocol at `/api/asr-streaming` (its
//! `rust/moshi-server/src/asr.rs`): binary websocket messages, each a MessagePack map whose
//! `"type"` names the message (`rmp_serde` with struct maps), what Kyutai's DSM scripts, unmute
//! and the LiveKit plugin speak.
//!
//! Client to server: `Audio {pcm: [f32]}` (24 kHz mono, any length), `OggOpus {data: bin}`,
//! `Marker {id}` (echoed back once the audio before it is transcribed), `Init` (accepted, not
//! needed). Server to client: `Ready`, `Step {step_idx, prs, buffered_pcm}` a frame, `Word {text,
//! start_time}`, `EndWord {stop_time}`, `Marker {id}`, `Error {message}`.

use serde::{Deserialize, Serialize};

/// A message from a client.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type")]
pub enum AsrClientMessage {
    Init,
    Marker { id: i64 },
    Audio { pcm: Vec<f32> },
    OggOpus { data: serde_bytes_compat::Bytes },
}

/// A message to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum AsrServerMessage {
    Word {
        text: String,
        start_time: f64,
    },
    EndWord {
        stop_time: f64,
    },
    Marker {
        id: i64,
    },
    Step {
        step_idx: u64,
        /// The first value of each extra head's softmax (the 1B's voice activity).
        prs: Vec<f32>,
        /// Samples received and not yet processed.
        buffered_pcm: u64,
    },
    Error {
        message: String,
    },
    Ready,
}

impl AsrServerMessage {
    /// The message as sent: a MessagePack map with named fields.
    pub fn to_bytes(&self) -> Vec<u8> {
        rmp_serde::to_vec_named(self).expect("plain fields always serialize")
    }

    /// Reads a server message (for clients and tests).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AsrProtocolError> {
        rmp_serde::from_slice(bytes).map_err(|e| AsrProtocolError::Malformed(e.to_string()))
    }
}

/// Why a client message was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AsrProtocolError {
    #[error(
        "not a message of the protocol ({0}): expected a MessagePack map with \"type\" Audio, \
         OggOpus, Marker or Init"
    )]
    Malformed(String),
    #[error("audio sample {index} is {value}: expected finite samples (24 kHz, -1 to 1)")]
    NotFinite { index: usize, value: f32 },
}

impl AsrClientMessage {
    /// Reads a client message; non-finite audio samples are refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AsrProtocolError> {
        let message: Self =
            rmp_serde::from_slice(bytes).map_err(|e| AsrProtocolError::Malformed(e.to_string()))?;
        if let Self::Audio { pcm } = &message {
            if let Some((index, &value)) = pcm.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(AsrProtocolError::NotFinite { index, value });
            }
        }
        Ok(message)
    }

    /// The message as a client sends it (for clients and tests).
    pub fn to_bytes(&self) -> Vec<u8> {
        #[derive(Serialize)]
        #[serde(tag = "type")]
        enum Out<'a> {
            Init,
            Marker { id: i64 },
            Audio { pcm: &'a [f32] },
            OggOpus { data: &'a serde_bytes_compat::Bytes },
        }
        let out = match self {
            Self::Init => Out::Init,
            Self::Marker { id } => Out::Marker { id: *id },
            Self::Audio { pcm } => Out::Audio { pcm },
            Self::OggOpus { data } => Out::OggOpus { data },
        };
        rmp_serde::to_vec_named(&out).expect("plain fields always serialize")
    }
}

/// Bytes read from a MessagePack `bin` (as moshi-server's `Vec<u8>` reads them) or an array of
/// small integers, and written as `bin`.
pub mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    pub struct Bytes(pub Vec<u8>);

    impl Serialize for Bytes {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    impl<'de> Deserialize<'de> for Bytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visitor;
            impl<'de> serde::de::Visitor<'de> for Visitor {
                type Value = Bytes;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes (Ogg/Opus pages)")
                }
                fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
                    Ok(Bytes(v.to_vec()))
                }
                fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                    Ok(Bytes(v))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut a: A,
                ) -> Result<Bytes, A::Error> {
                    let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
                    while let Some(b) = a.next_element::<u8>()? {
                        out.push(b);
                    }
                    Ok(Bytes(out))
                }
            }
            d.deserialize_any(Visitor)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_named_maps() {
        let m = AsrServerMessage::Word {
            text: "hello".into(),
            start_time: 1.25,
        };
        let bytes = m.to_bytes();
        // A map of 2 named fields plus "type", as rmp_serde's struct maps write it.
        assert_eq!(bytes[0], 0x83);
        assert!(bytes.windows(4).any(|w| w == b"type"));
        assert_eq!(AsrServerMessage::from_bytes(&bytes).unwrap(), m);
        for m in [
            AsrClientMessage::Audio {
                pcm: vec![0.0, 0.5, -0.25],
            },
            AsrClientMessage::Marker { id: -3 },
            AsrClientMessage::Init,
            AsrClientMessage::OggOpus {
                data: serde_bytes_compat::Bytes(vec![1, 2, 3]),
            },
        ] {
            assert_eq!(AsrClientMessage::from_bytes(&m.to_bytes()).unwrap(), m);
        }
    }

    /// What Python's `msgpack.packb({"type": "Audio", "pcm": [...]})` writes without
    /// `use_single_float` (f64) or with integer zeros, and what it refuses.
    #[test]
    fn audio_as_python_packs_it_and_bad_messages() {
        // {"type": "Audio", "pcm": [0.5 as f64, 0 as int]}
        let mut b = vec![0x82, 0xa4];
        b.extend(b"type");
        b.push(0xa5);
        b.extend(b"Audio");
        b.push(0xa3);
        b.extend(b"pcm");
        b.extend([0x92, 0xcb]);
        b.extend(0.5f64.to_be_bytes());
        b.push(0x00);
        assert_eq!(
            AsrClientMessage::from_bytes(&b).unwrap(),
            AsrClientMessage::Audio {
                pcm: vec![0.5, 0.0]
            }
        );
        let nan = AsrClientMessage::Audio {
            pcm: vec![0.0, f32::NAN],
        };
        let e = AsrClientMessage::from_bytes(&nan.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("sample 1 is NaN"), "{e}");
        for bad in [
            &b"\x81\xa4type\xa5Hello"[..],
            b"",
            b"\xc1",
            b"\x93\x01\x02\x03",
        ] {
            let e = AsrClientMessage::from_bytes(bad).unwrap_err().to_string();
            assert!(e.contains("expected a MessagePack map"), "{e}");
        }
    }
}
