//! Ogg/Opus streams both ways (RFC 7845), 24 kHz: [`OggOpusReader`] turns a client's pages into
//! mono PCM, [`OggOpusWriter`] turns PCM into pages (OpusHead, OpusTags, then audio). Pages with
//! the `ogg` crate, Opus with libopus (the `opus` binding).

mod reader;
mod writer;

pub use reader::{OggOpusReader, PreSkip};
pub use writer::{OggOpusWriter, OpusPacketing};

/// Sample rate of every Opus stream here: Moshi's own, so nothing is resampled.
pub const OPUS_RATE_HZ: u32 = moshi_runtime::SAMPLE_RATE_HZ;

/// Ogg granule positions and the OpusHead pre-skip count samples at 48 kHz.
pub const GRANULE_RATE_HZ: u32 = 48_000;

/// Largest Ogg page: header, 255 lacing values, 255 segments of 255 bytes.
pub const MAX_PAGE_BYTES: usize = 27 + 255 + 255 * 255;

/// Largest packet accepted, also when it spans pages (an Opus packet is at most 120 ms of 1275-byte
/// frames, about 61 kB).
pub const MAX_PACKET_BYTES: usize = 64 * 1024;

/// What can be wrong with an Ogg/Opus stream.
#[derive(Debug, thiserror::Error)]
pub enum OggOpusError {
    #[error("not an Ogg page: expected the capture pattern \"OggS\", got {found:02x?}")]
    NotOgg { found: Vec<u8> },
    #[error("malformed Ogg page {sequence}: {detail}")]
    BadPage { sequence: u32, detail: String },
    #[error("Ogg page of a second logical stream (serial {got:#010x}, the stream is {expected:#010x}): one Opus stream per connection")]
    SecondStream { expected: u32, got: u32 },
    #[error("the first Ogg page must begin a stream (beginning-of-stream flag)")]
    NoStreamStart,
    #[error("Ogg packet of {bytes} bytes: at most {max} accepted")]
    PacketTooLarge { bytes: usize, max: usize },
    #[error("the stream must start with an OpusHead packet, got {found:?}")]
    NotOpus { found: String },
    #[error("the second packet must be OpusTags, got {found:?}")]
    NoOpusTags { found: String },
    #[error("bad OpusHead: {0}")]
    BadOpusHead(String),
    #[error("Opus packet {packet} cannot be decoded: {source}")]
    Decode {
        packet: u64,
        #[source]
        source: opus::Error,
    },
    #[error("Opus packets of {packet_samples} samples, {packets_per_page} per page: an Opus frame size (120, 240, 480, 960, 1440, 1920, 2400 or 2880 samples at 24 kHz) and at least one packet per page expected")]
    BadPacketing {
        packet_samples: usize,
        packets_per_page: usize,
    },
    #[error("more than {max_samples} samples (24 kHz) of audio in one message")]
    TooMuchAudio { max_samples: usize },
    #[error("Opus encoder: {0}")]
    Encode(#[source] opus::Error),
    #[error("Ogg writer: {0}")]
    Write(#[source] std::io::Error),
}

/// First bytes of a packet, printable, for error messages.
fn packet_start(data: &[u8]) -> String {
    String::from_utf8_lossy(&data[..data.len().min(8)]).into_owned()
}
