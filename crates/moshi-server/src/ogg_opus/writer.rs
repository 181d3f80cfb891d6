//! 24 kHz mono PCM in, Ogg/Opus pages out: OpusHead and OpusTags on pages 0 and 1 (Kyutai's web
//! client decodes from page 2 on and reads the channel count from the first page), then whole
//! Opus packets of a fixed duration, a fixed number per page.

use std::borrow::Cow;

use ogg::writing::{PacketWriteEndInfo, PacketWriter};

use super::{OggOpusError, GRANULE_RATE_HZ, OPUS_RATE_HZ};

/// Room for one encoded packet (libopus' recommended maximum).
const MAX_ENCODED_BYTES: usize = 4000;

/// Vendor string of the OpusTags header.
const VENDOR: &str = concat!("moshi-rs ", env!("CARGO_PKG_VERSION"));

/// Packet duration and pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpusPacketing {
    /// Samples per packet at 24 kHz (480 = 20 ms, 960 = 40 ms, ...: an Opus frame size).
    pub packet_samples: usize,
    /// Packets per Ogg page.
    pub packets_per_page: usize,
}

impl OpusPacketing {
    /// The server's output: 40 ms packets, one per page (as Kyutai's `sphn` writes).
    pub const SERVER: OpusPacketing = OpusPacketing {
        packet_samples: 960,
        packets_per_page: 1,
    };
    /// Kyutai's web client: 20 ms packets, two per page (opus-recorder).
    pub const WEB_CLIENT: OpusPacketing = OpusPacketing {
        packet_samples: 480,
        packets_per_page: 2,
    };
}

/// Encodes one Ogg/Opus stream.
pub struct OggOpusWriter {
    encoder: opus::Encoder,
    pages: PacketWriter<'static, Vec<u8>>,
    serial: u32,
    packeting: OpusPacketing,
    pending: Vec<f32>,
    encoded: Vec<u8>,
    /// Samples encoded so far, at 48 kHz (the granule position of the last packet).
    granule: u64,
    packets_on_page: usize,
    pre_skip_48k: u16,
}

impl OggOpusWriter {
    /// A new stream with serial number `serial`; its first [`push`](Self::push) returns the two
    /// header pages first.
    pub fn new(serial: u32, packeting: OpusPacketing) -> Result<Self, OggOpusError> {
        let valid_sizes = [120, 240, 480, 960, 1440, 1920, 2400, 2880];
        if !valid_sizes.contains(&packeting.packet_samples) || packeting.packets_per_page == 0 {
            return Err(OggOpusError::BadPacketing {
                packet_samples: packeting.packet_samples,
                packets_per_page: packeting.packets_per_page,
            });
        }
        let mut encoder =
            opus::Encoder::new(OPUS_RATE_HZ, opus::Channels::Mono, opus::Application::Voip)
                .map_err(OggOpusError::Encode)?;
        let lookahead = encoder.get_lookahead().map_err(OggOpusError::Encode)?;
        let pre_skip_48k =
            (lookahead.max(0) as u64 * GRANULE_RATE_HZ as u64 / OPUS_RATE_HZ as u64) as u16;
        let mut writer = Self {
            encoder,
            pages: PacketWriter::new(Vec::new()),
            serial,
            packeting,
            pending: Vec::with_capacity(2 * packeting.packet_samples),
            encoded: vec![0; MAX_ENCODED_BYTES],
            granule: 0,
            packets_on_page: 0,
            pre_skip_48k,
        };
        let head = writer.opus_head();
        writer.write(head, PacketWriteEndInfo::EndPage)?;
        let tags = opus_tags();
        writer.write(tags, PacketWriteEndInfo::EndPage)?;
        Ok(writer)
    }

    /// The encoder's delay (OpusHead pre-skip) in 24 kHz samples.
    pub fn pre_skip_samples(&self) -> usize {
        self.pre_skip_48k as usize * OPUS_RATE_HZ as usize / GRANULE_RATE_HZ as usize
    }

    /// Encodes every whole packet of (earlier leftovers +) `pcm` and returns the pages finished
    /// so far (empty while a page is still filling). Samples short of a packet wait for the
    /// next call.
    pub fn push(&mut self, pcm: &[f32]) -> Result<Vec<u8>, OggOpusError> {
        self.pending.extend_from_slice(pcm);
        let n = self.packeting.packet_samples;
        let mut used = 0;
        while self.pending.len() - used >= n {
            let len = self
                .encoder
                .encode_float(&self.pending[used..used + n], &mut self.encoded)
                .map_err(OggOpusError::Encode)?;
            used += n;
            self.granule += (n as u64) * GRANULE_RATE_HZ as u64 / OPUS_RATE_HZ as u64;
            self.packets_on_page += 1;
            let end = if self.packets_on_page == self.packeting.packets_per_page {
                self.packets_on_page = 0;
                PacketWriteEndInfo::EndPage
            } else {
                PacketWriteEndInfo::NormalPacket
            };
            let packet = self.encoded[..len].to_vec();
            self.write(packet, end)?;
        }
        self.pending.drain(..used);
        Ok(std::mem::take(self.pages.inner_mut()))
    }

    fn write(&mut self, packet: Vec<u8>, end: PacketWriteEndInfo) -> Result<(), OggOpusError> {
        self.pages
            .write_packet(Cow::Owned(packet), self.serial, end, self.granule)
            .map_err(OggOpusError::Write)
    }

    /// RFC 7845 section 5.1.
    fn opus_head(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(19);
        h.extend_from_slice(b"OpusHead");
        h.push(1); // version
        h.push(1); // channels
        h.extend_from_slice(&self.pre_skip_48k.to_le_bytes());
        h.extend_from_slice(&OPUS_RATE_HZ.to_le_bytes()); // input sample rate
        h.extend_from_slice(&0i16.to_le_bytes()); // output gain
        h.push(0); // channel mapping family
        h
    }
}

/// RFC 7845 section 5.2: vendor string, no comments.
fn opus_tags() -> Vec<u8> {
    let mut t = Vec::with_capacity(16 + VENDOR.len());
    t.extend_from_slice(b"OpusTags");
    t.extend_from_slice(&(VENDOR.len() as u32).to_le_bytes());
    t.extend_from_slice(VENDOR.as_bytes());
    t.extend_from_slice(&0u32.to_le_bytes());
    t
}
