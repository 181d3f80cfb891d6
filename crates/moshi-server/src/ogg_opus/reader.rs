//! Ogg/Opus bytes in, 24 kHz mono PCM out, fed incrementally: a message may hold several pages,
//! one page, or part of one; packets of any Opus duration (20 and 40 ms from Kyutai's clients).
//! Every size is bounded; anything malformed is an error naming what was wrong.

use ogg::reading::{BasePacketReader, PageParser};

use super::{
    packet_start, OggOpusError, GRANULE_RATE_HZ, MAX_PACKET_BYTES, MAX_PAGE_BYTES, OPUS_RATE_HZ,
};

/// Longest Opus packet: 120 ms, in samples per channel at 24 kHz.
const MAX_PACKET_SAMPLES: usize = OPUS_RATE_HZ as usize * 120 / 1000;

const HEADER_BYTES: usize = 27;
const FLAG_CONTINUED: u8 = 0x01;
const FLAG_FIRST_PAGE: u8 = 0x02;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Head,
    Tags,
    Audio,
}

/// What to do with the encoder's delay at the start of a stream (the OpusHead pre-skip).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreSkip {
    /// Drop it, as RFC 7845 asks of players: decoded sample n is the encoder's input sample n.
    Discard,
    /// Keep it: everything comes out `pre-skip` samples later. A live server that cuts the
    /// stream into fixed frames wants this: a frame then ends on the client's packet boundary
    /// (1920 = 4 x 480) and is complete as soon as that packet arrives, instead of waiting for
    /// the next packet to cover the last pre-skip samples (20-40 ms more latency).
    Keep,
}

/// Decodes one Ogg/Opus stream.
pub struct OggOpusReader {
    /// Bytes of a page not complete yet (less than one page after each call).
    pending: Vec<u8>,
    packets: BasePacketReader,
    serial: Option<u32>,
    /// The sequence number the next page must carry (RFC 3533: one more than the last page's).
    next_sequence: u32,
    /// Bytes of the packet left open at the end of the last page (continued on the next one).
    open_packet_bytes: usize,
    stage: Stage,
    decoder: Option<opus::Decoder>,
    channels: usize,
    /// 24 kHz samples still to discard at the start (the OpusHead pre-skip).
    pre_skip_left: usize,
    decoded: Vec<f32>,
    audio_packets: u64,
    pages: u64,
    pre_skip: PreSkip,
    /// `pcm_out` may not grow beyond this in the current [`push`](Self::push).
    pcm_limit: usize,
    max_new_samples: usize,
}

impl OggOpusReader {
    pub fn new(pre_skip: PreSkip) -> Self {
        Self {
            pending: Vec::new(),
            packets: BasePacketReader::new(),
            serial: None,
            next_sequence: 0,
            open_packet_bytes: 0,
            stage: Stage::Head,
            decoder: None,
            channels: 1,
            pre_skip_left: 0,
            decoded: Vec::new(),
            audio_packets: 0,
            pages: 0,
            pre_skip,
            pcm_limit: 0,
            max_new_samples: 0,
        }
    }

    /// Audio packets decoded so far.
    pub fn audio_packets(&self) -> u64 {
        self.audio_packets
    }

    /// Ogg pages read so far.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Feeds bytes of the stream; appends the PCM of every packet they complete to `pcm_out`
    /// (24 kHz mono; a stereo stream is mixed down), at most `max_new_samples` (a few bytes of
    /// Opus can stand for seconds of audio). Bytes of an incomplete page wait for the next call.
    /// After an error the stream cannot continue.
    pub fn push(
        &mut self,
        bytes: &[u8],
        pcm_out: &mut Vec<f32>,
        max_new_samples: usize,
    ) -> Result<(), OggOpusError> {
        self.pcm_limit = pcm_out.len().saturating_add(max_new_samples);
        self.max_new_samples = max_new_samples;
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        let result = loop {
            match self.next_page(start) {
                Ok(Some(len)) => {
                    start += len;
                    if let Err(e) = self.drain_packets(pcm_out) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.pending.drain(..start);
        result
    }

    /// Parses the page at `pending[start..]` into the packet reader if it is complete. Returns its
    /// length, or `None` when more bytes are needed.
    fn next_page(&mut self, start: usize) -> Result<Option<usize>, OggOpusError> {
        let buf = &self.pending[start..];
        let have = buf.len().min(4);
        if buf[..have] != b"OggS"[..have] {
            return Err(OggOpusError::NotOgg {
                found: buf[..have].to_vec(),
            });
        }
        if buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let segments = buf[26] as usize;
        if buf.len() < HEADER_BYTES + segments {
            return Ok(None);
        }
        let lacing = &buf[HEADER_BYTES..HEADER_BYTES + segments];
        let body_len: usize = lacing.iter().map(|&l| l as usize).sum();
        let page_len = HEADER_BYTES + segments + body_len;
        debug_assert!(page_len <= MAX_PAGE_BYTES);
        if buf.len() < page_len {
            return Ok(None);
        }
        let flags = buf[5];
        let serial = u32::from_le_bytes([buf[14], buf[15], buf[16], buf[17]]);
        let sequence = u32::from_le_bytes([buf[18], buf[19], buf[20], buf[21]]);
        match self.serial {
            None if flags & FLAG_FIRST_PAGE == 0 => return Err(OggOpusError::NoStreamStart),
            None => self.serial = Some(serial),
            Some(expected) if expected != serial => {
                return Err(OggOpusError::SecondStream {
                    expected,
                    got: serial,
                })
            }
            Some(_) if flags & FLAG_FIRST_PAGE != 0 => {
                return Err(OggOpusError::BadPage {
                    sequence,
                    detail: "a second beginning-of-stream page".into(),
                })
            }
            Some(_) => {}
        }
        // RFC 3533: each page's sequence number is the last one's plus one (the first page's
        // is free). A page repeated, missing or out of order would otherwise be decoded as if
        // it belonged there (the packet reader only notices some of these).
        if self.pages > 0 && sequence != self.next_sequence {
            return Err(OggOpusError::BadPage {
                sequence,
                detail: format!(
                    "page sequence number {sequence} where {} was expected: pages repeated, missing or out of order",
                    self.next_sequence
                ),
            });
        }
        // Packet sizes, including one carried over from earlier pages, are bounded before
        // anything is buffered.
        let mut open = if flags & FLAG_CONTINUED != 0 {
            self.open_packet_bytes
        } else {
            0
        };
        for &l in lacing {
            open += l as usize;
            if open > MAX_PACKET_BYTES {
                return Err(OggOpusError::PacketTooLarge {
                    bytes: open,
                    max: MAX_PACKET_BYTES,
                });
            }
            if l < 255 {
                open = 0;
            }
        }
        self.open_packet_bytes = open;

        let bad_page = |detail: String| OggOpusError::BadPage { sequence, detail };
        let header: [u8; HEADER_BYTES] = buf[..HEADER_BYTES].try_into().expect("27 bytes");
        let (mut parser, _) = PageParser::new(header).map_err(|e| bad_page(e.to_string()))?;
        parser.parse_segments(lacing.to_vec());
        let page = parser
            .parse_packet_data(buf[HEADER_BYTES + segments..page_len].to_vec())
            .map_err(|e| bad_page(e.to_string()))?;
        self.packets
            .push_page(page)
            .map_err(|e| bad_page(format!("{e} (pages out of order or a packet cut short?)")))?;
        self.pages += 1;
        self.next_sequence = sequence.wrapping_add(1);
        Ok(Some(page_len))
    }

    fn drain_packets(&mut self, pcm_out: &mut Vec<f32>) -> Result<(), OggOpusError> {
        while let Some(packet) = self.packets.read_packet() {
            self.packet(&packet.data, pcm_out)?;
        }
        Ok(())
    }

    fn packet(&mut self, data: &[u8], pcm_out: &mut Vec<f32>) -> Result<(), OggOpusError> {
        match self.stage {
            Stage::Head => {
                self.opus_head(data)?;
                self.stage = Stage::Tags;
            }
            Stage::Tags => {
                if !data.starts_with(b"OpusTags") {
                    return Err(OggOpusError::NoOpusTags {
                        found: packet_start(data),
                    });
                }
                self.stage = Stage::Audio;
            }
            Stage::Audio => self.audio(data, pcm_out)?,
        }
        Ok(())
    }

    /// RFC 7845 section 5.1: magic, version, channel count, pre-skip, input rate, gain, mapping.
    fn opus_head(&mut self, data: &[u8]) -> Result<(), OggOpusError> {
        if !data.starts_with(b"OpusHead") {
            return Err(OggOpusError::NotOpus {
                found: packet_start(data),
            });
        }
        if data.len() < 19 {
            return Err(OggOpusError::BadOpusHead(format!(
                "{} bytes, at least 19 expected",
                data.len()
            )));
        }
        let version = data[8];
        if version >> 4 != 0 {
            return Err(OggOpusError::BadOpusHead(format!(
                "version {version}: only major version 0 (versions 1 to 15) exists"
            )));
        }
        let channels = data[9] as usize;
        let mapping_family = data[18];
        if !(1..=2).contains(&channels) || mapping_family != 0 {
            return Err(OggOpusError::BadOpusHead(format!(
                "{channels} channels with channel mapping family {mapping_family}: mono or stereo (family 0) expected"
            )));
        }
        let pre_skip_48k = u16::from_le_bytes([data[10], data[11]]) as usize;
        let gain_q8_db = i16::from_le_bytes([data[16], data[17]]);
        let layout = if channels == 1 {
            opus::Channels::Mono
        } else {
            opus::Channels::Stereo
        };
        let mut decoder = opus::Decoder::new(OPUS_RATE_HZ, layout)
            .map_err(|e| OggOpusError::BadOpusHead(format!("decoder: {e}")))?;
        if gain_q8_db != 0 {
            decoder
                .set_gain(gain_q8_db as i32)
                .map_err(|e| OggOpusError::BadOpusHead(format!("output gain {gain_q8_db}: {e}")))?;
        }
        self.decoder = Some(decoder);
        self.channels = channels;
        self.pre_skip_left = match self.pre_skip {
            PreSkip::Discard => {
                (pre_skip_48k * OPUS_RATE_HZ as usize).div_ceil(GRANULE_RATE_HZ as usize)
            }
            PreSkip::Keep => 0,
        };
        self.decoded = vec![0.0; MAX_PACKET_SAMPLES * channels];
        Ok(())
    }

    fn audio(&mut self, data: &[u8], pcm_out: &mut Vec<f32>) -> Result<(), OggOpusError> {
        let packet = self.audio_packets;
        self.audio_packets += 1;
        if data.is_empty() {
            // A zero-length packet carries no audio (RFC 7845 allows it); nothing to play.
            return Ok(());
        }
        let decoder = self.decoder.as_mut().expect("OpusHead read before audio");
        let samples_in_packet = decoder
            .get_nb_samples(data)
            .map_err(|source| OggOpusError::Decode { packet, source })?;
        if pcm_out.len() + samples_in_packet > self.pcm_limit {
            return Err(OggOpusError::TooMuchAudio {
                max_samples: self.max_new_samples,
            });
        }
        let samples = decoder
            .decode_float(data, &mut self.decoded, false)
            .map_err(|source| OggOpusError::Decode { packet, source })?;
        let frames = &self.decoded[..samples * self.channels];
        let skip = self.pre_skip_left.min(samples);
        self.pre_skip_left -= skip;
        if self.channels == 1 {
            pcm_out.extend_from_slice(&frames[skip..]);
        } else {
            pcm_out.extend(
                frames
                    .chunks_exact(self.channels)
                    .skip(skip)
                    .map(|f| f.iter().sum::<f32>() / self.channels as f32),
            );
        }
        Ok(())
    }
}
