//! The RIFF/WAVE container, read as the RIFF specification (Microsoft/IBM, 1991) and the WAVE
//! format notes define it, not only as the files we write look:
//!
//! - a file is `RIFF <size> WAVE` and chunks, each `<id> <size>` and `size` bytes, followed by
//!   one pad byte when `size` is odd (the pad is not counted in the size);
//! - chunks other than `fmt ` and `data` (`LIST`/`INFO` metadata, `fact`, `bext`, `JUNK`, `cue `
//!   ...) are skipped wherever they are, pad byte included; chunks after `data` are not read;
//! - `fmt ` must come before `data` (a `data` chunk first, or a second `fmt `, is an error);
//!   its format is PCM integer (8-bit unsigned, 16/24/32-bit signed), IEEE float (32 or
//!   64-bit) or `WAVE_FORMAT_EXTENSIBLE` of either (its valid bits are the container's most
//!   significant ones, so samples scale by the container's width); a `fmt ` chunk longer than
//!   the structure (a `cbSize` extension) is skipped to its end;
//! - a chunk announcing more bytes than the file holds is an error naming it; a `data` chunk
//!   whose size is the largest a WAV can hold is a streaming writer's placeholder (ffmpeg or
//!   moshi-rs writing to a pipe did not know the length) and means "to the end of the file";
//! - the RIFF size is not trusted (streaming writers put a placeholder there too): the chunk
//!   sizes are.

use std::io::{self, Read};

/// How samples are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleEncoding {
    /// Integers in `bytes`-byte containers (1: unsigned with 128 as zero, else signed
    /// little-endian), valid bits at the top.
    Int { bytes: usize },
    /// IEEE float, 4 or 8 bytes little-endian.
    Float { bytes: usize },
}

impl SampleEncoding {
    /// Bytes of one sample of one channel.
    pub fn bytes(self) -> usize {
        match self {
            Self::Int { bytes } | Self::Float { bytes } => bytes,
        }
    }
}

/// What the chunks before the samples say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveHeader {
    pub encoding: SampleEncoding,
    pub channels: u16,
    pub sample_rate_hz: u32,
    /// Bytes of the `data` chunk to read (whole sample frames of it are samples).
    pub data_bytes: u64,
}

impl WaveHeader {
    /// Bytes of one sample frame (all channels).
    pub fn frame_bytes(&self) -> usize {
        self.encoding.bytes() * self.channels as usize
    }

    /// Whole sample frames in the `data` chunk.
    pub fn frames(&self) -> u64 {
        self.data_bytes / self.frame_bytes() as u64
    }
}

/// Why a header was refused.
#[derive(Debug)]
pub enum HeaderError {
    /// Not a WAV, or a malformed one.
    Malformed(String),
    /// A valid WAV of a format this reader does not decode.
    Unsupported(String),
    /// Reading failed.
    Io(io::Error),
}

impl From<io::Error> for HeaderError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// A `data` size at or above this is a streaming writer's "unknown length".
const STREAMING_DATA_BYTES: u64 = u32::MAX as u64 - (1 << 16);

/// Most bytes of a `fmt ` chunk kept: `WAVE_FORMAT_EXTENSIBLE`'s 40 (the rest is skipped).
const FMT_BYTES_READ: usize = 40;

/// `KSDATAFORMAT_SUBTYPE_*` GUIDs after their first 4 bytes (which hold the format tag).
const SUBFORMAT_GUID_TAIL: [u8; 12] = [
    0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
];

const WAVE_FORMAT_PCM: u16 = 0x0001;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 0x0003;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;

/// A chunk id as text for messages (`LIST`, or its bytes escaped).
fn shown_id(id: &[u8; 4]) -> String {
    id.iter()
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect()
}

/// Reads `buf.len()` bytes, or fewer at the end of the stream; returns how many.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Skips `n` bytes; returns how many there were.
fn skip(r: &mut impl Read, n: u64) -> io::Result<u64> {
    io::copy(&mut r.take(n), &mut io::sink())
}

/// Reads the header of a RIFF/WAVE stream up to the first byte of its samples. `stream_len`,
/// when known (a regular file), tells a streaming placeholder `data` size from a truncated file.
pub fn read_wave_header(
    r: &mut impl Read,
    stream_len: Option<u64>,
) -> Result<WaveHeader, HeaderError> {
    let mut riff = [0u8; 12];
    let got = read_up_to(r, &mut riff)?;
    let malformed = |m: String| Err(HeaderError::Malformed(m));
    match (&riff[..4], &riff[8..]) {
        _ if got < 12 => return malformed(format!("{got} bytes, less than a RIFF header's 12")),
        (b"RIFF", b"WAVE") => {}
        (b"RF64" | b"BW64", _) => {
            return Err(HeaderError::Unsupported(
                "RF64/BW64 (a WAV over 4 GiB) is not supported".into(),
            ))
        }
        (b"RIFF", form) => {
            return malformed(format!(
                "a RIFF file of form `{}`, not WAVE",
                shown_id(form.try_into().expect("4 bytes"))
            ))
        }
        _ => return malformed("no RIFF header".into()),
    }
    let mut offset = 12u64;
    let mut format: Option<(SampleEncoding, u16, u32)> = None;
    loop {
        let mut head = [0u8; 8];
        match read_up_to(r, &mut head)? {
            0 => {
                return malformed(match format {
                    Some(_) => "no `data` chunk after the `fmt ` chunk".into(),
                    None => "no `fmt ` chunk and no `data` chunk".into(),
                })
            }
            8 => {}
            n => {
                return malformed(format!(
                    "cut inside the chunk header at offset {offset} ({n} of 8 bytes)"
                ))
            }
        }
        let id: [u8; 4] = head[..4].try_into().expect("4 bytes");
        let size = u64::from(u32::from_le_bytes(head[4..].try_into().expect("4 bytes")));
        let body = offset + 8;
        let past_the_end = || {
            HeaderError::Malformed(format!(
                "chunk `{}` at offset {offset} announces {size} bytes, past the end of the file",
                shown_id(&id)
            ))
        };
        match &id {
            b"data" => {
                let Some((encoding, channels, sample_rate_hz)) = format else {
                    return malformed(format!(
                        "the `data` chunk at offset {offset} comes before the `fmt ` chunk (RIFF WAVE requires `fmt ` first)"
                    ));
                };
                let data_bytes = match stream_len {
                    Some(len) if body + size > len && size >= STREAMING_DATA_BYTES => {
                        len.saturating_sub(body)
                    }
                    _ => size,
                };
                return Ok(WaveHeader {
                    encoding,
                    channels,
                    sample_rate_hz,
                    data_bytes,
                });
            }
            b"fmt " => {
                if format.is_some() {
                    return malformed(format!("a second `fmt ` chunk at offset {offset}"));
                }
                let mut fmt = [0u8; FMT_BYTES_READ];
                let kept = (size as usize).min(FMT_BYTES_READ);
                if read_up_to(r, &mut fmt[..kept])? < kept {
                    return Err(past_the_end());
                }
                format = Some(parse_fmt(&fmt[..kept])?);
                let rest = size - kept as u64 + (size & 1);
                if skip(r, rest)? < size - kept as u64 {
                    return Err(past_the_end());
                }
            }
            _ => {
                // Unknown chunks (LIST, fact, JUNK ...) and their pad byte. A missing pad
                // byte at the very end only means there is no `data` chunk.
                if skip(r, size + (size & 1))? < size {
                    return Err(past_the_end());
                }
            }
        }
        offset = body + size + (size & 1);
    }
}

/// `fmt `'s WAVEFORMAT / WAVEFORMATEX / WAVEFORMATEXTENSIBLE: encoding, channels and rate.
fn parse_fmt(b: &[u8]) -> Result<(SampleEncoding, u16, u32), HeaderError> {
    let malformed = |m: String| Err(HeaderError::Malformed(m));
    let unsupported = |m: String| Err(HeaderError::Unsupported(m));
    if b.len() < 16 {
        return malformed(format!(
            "a `fmt ` chunk of {} bytes, less than the 16 of a WAVE format",
            b.len()
        ));
    }
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let mut tag = u16_at(0);
    let channels = u16_at(2);
    let sample_rate_hz = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let block_align = u16_at(12) as usize;
    let bits = u16_at(14) as usize;
    if channels == 0 {
        return unsupported("0 channels".into());
    }
    if tag == WAVE_FORMAT_EXTENSIBLE {
        if b.len() < 40 || u16_at(16) < 22 {
            return malformed(format!(
                "a WAVE_FORMAT_EXTENSIBLE `fmt ` chunk of {} bytes, expected 40 (cbSize 22)",
                b.len()
            ));
        }
        let valid_bits = u16_at(18) as usize;
        if valid_bits > bits {
            return malformed(format!(
                "{valid_bits} valid bits per sample in {bits}-bit samples"
            ));
        }
        if b[28..40] != SUBFORMAT_GUID_TAIL || b[26..28] != [0, 0] {
            return unsupported(
                "a WAVE_FORMAT_EXTENSIBLE sub-format that is not PCM or IEEE float".into(),
            );
        }
        tag = u16_at(24);
    }
    if block_align == 0 || !block_align.is_multiple_of(channels as usize) {
        return malformed(format!(
            "block align {block_align} is not a whole number of bytes for each of the {channels} channels"
        ));
    }
    let container = block_align / channels as usize;
    if bits == 0 || bits > container * 8 {
        return malformed(format!(
            "{bits} bits per sample in {container}-byte samples (block align {block_align}, {channels} channels)"
        ));
    }
    let supported = "supported: 8/16/24/32-bit integer, 32/64-bit float";
    match tag {
        WAVE_FORMAT_PCM if (1..=4).contains(&container) => Ok((
            SampleEncoding::Int { bytes: container },
            channels,
            sample_rate_hz,
        )),
        WAVE_FORMAT_IEEE_FLOAT if container == 4 || container == 8 => Ok((
            SampleEncoding::Float { bytes: container },
            channels,
            sample_rate_hz,
        )),
        WAVE_FORMAT_PCM => unsupported(format!("{bits}-bit integer samples; {supported}")),
        WAVE_FORMAT_IEEE_FLOAT => unsupported(format!("{bits}-bit float samples; {supported}")),
        other => unsupported(format!(
            "format tag 0x{other:04x} ({}); {supported}",
            match other {
                0x0002 => "ADPCM",
                0x0006 => "A-law",
                0x0007 => "µ-law",
                0x0011 => "IMA ADPCM",
                0x0055 => "MP3",
                _ => "compressed or unknown",
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk: id, size, body and (odd size) the pad byte.
    fn chunk(id: &[u8; 4], body: &[u8]) -> Vec<u8> {
        let mut c = id.to_vec();
        c.extend_from_slice(&(body.len() as u32).to_le_bytes());
        c.extend_from_slice(body);
        if body.len() % 2 == 1 {
            c.push(0);
        }
        c
    }

    fn fmt_body(tag: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
        let block = channels * bits / 8;
        let mut b = Vec::new();
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&channels.to_le_bytes());
        b.extend_from_slice(&rate.to_le_bytes());
        b.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        b.extend_from_slice(&block.to_le_bytes());
        b.extend_from_slice(&bits.to_le_bytes());
        b
    }

    fn riff(chunks: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = chunks.concat();
        let mut f = b"RIFF".to_vec();
        f.extend_from_slice(&(4 + body.len() as u32).to_le_bytes());
        f.extend_from_slice(b"WAVE");
        f.extend_from_slice(&body);
        f
    }

    fn header(bytes: &[u8]) -> Result<WaveHeader, HeaderError> {
        read_wave_header(&mut &bytes[..], Some(bytes.len() as u64))
    }

    fn malformed(bytes: &[u8]) -> String {
        match header(bytes) {
            Err(HeaderError::Malformed(m)) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn odd_sized_chunks_are_padded_wherever_they_are() {
        let data = chunk(b"data", &[1, 0, 2, 0]);
        let f = riff(&[
            chunk(b"LIST", b"INFOINAM\x05\0\0\0odd!\0"),
            chunk(b"fmt ", &fmt_body(1, 1, 16_000, 16)),
            chunk(b"JUNK", &[0; 3]),
            data,
        ]);
        let h = header(&f).unwrap();
        assert_eq!(h.encoding, SampleEncoding::Int { bytes: 2 });
        assert_eq!((h.channels, h.sample_rate_hz, h.data_bytes), (1, 16_000, 4));
    }

    #[test]
    fn data_before_fmt_and_two_fmt_chunks_are_malformed() {
        let fmt = chunk(b"fmt ", &fmt_body(1, 1, 16_000, 16));
        let m = malformed(&riff(&[chunk(b"data", &[0; 4]), fmt.clone()]));
        assert!(m.contains("comes before the `fmt ` chunk"), "{m}");
        let m = malformed(&riff(&[fmt.clone(), fmt.clone(), chunk(b"data", &[0; 4])]));
        assert!(m.contains("a second `fmt `"), "{m}");
        let m = malformed(&riff(&[fmt, chunk(b"LIST", &[0; 4])]));
        assert!(m.contains("no `data` chunk"), "{m}");
    }

    #[test]
    fn a_chunk_past_the_end_is_named() {
        let mut f = riff(&[
            chunk(b"fmt ", &fmt_body(1, 1, 16_000, 16)),
            chunk(b"L\x1bST", &[0; 10]),
        ]);
        f[36 + 4..36 + 8].copy_from_slice(&1000u32.to_le_bytes());
        let m = malformed(&f);
        assert!(
            m.contains("chunk `L\\x1bST` at offset 36 announces 1000 bytes, past the end"),
            "{m}"
        );
    }

    #[test]
    fn a_streaming_placeholder_size_reads_to_the_end_and_a_short_file_keeps_its_size() {
        let mut f = riff(&[
            chunk(b"fmt ", &fmt_body(1, 1, 16_000, 16)),
            chunk(b"data", &[0; 8]),
        ]);
        let at = f.len() - 8 - 4;
        f[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(header(&f).unwrap().data_bytes, 8);
        f[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(header(&f).unwrap().data_bytes, 1000);
    }

    #[test]
    fn extensible_float_and_24_in_32_are_read() {
        let mut ext = fmt_body(WAVE_FORMAT_EXTENSIBLE, 2, 48_000, 32);
        ext.extend_from_slice(&22u16.to_le_bytes());
        ext.extend_from_slice(&24u16.to_le_bytes()); // valid bits
        ext.extend_from_slice(&3u32.to_le_bytes()); // channel mask
        ext.extend_from_slice(&1u32.to_le_bytes()); // KSDATAFORMAT_SUBTYPE_PCM
        ext.extend_from_slice(&SUBFORMAT_GUID_TAIL);
        let h = header(&riff(&[chunk(b"fmt ", &ext), chunk(b"data", &[0; 16])])).unwrap();
        assert_eq!(h.encoding, SampleEncoding::Int { bytes: 4 });
        assert_eq!(h.frames(), 2);
        ext[24] = 3; // KSDATAFORMAT_SUBTYPE_IEEE_FLOAT
        let h = header(&riff(&[chunk(b"fmt ", &ext), chunk(b"data", &[0; 16])])).unwrap();
        assert_eq!(h.encoding, SampleEncoding::Float { bytes: 4 });
        ext[30] = 0x55; // not a KSDATAFORMAT GUID
        assert!(matches!(
            header(&riff(&[chunk(b"fmt ", &ext), chunk(b"data", &[0; 16])])),
            Err(HeaderError::Unsupported(_))
        ));
        // A WAVEFORMATEX with cbSize extra bytes: skipped to the chunk's end.
        let mut ex = fmt_body(WAVE_FORMAT_IEEE_FLOAT, 1, 24_000, 64);
        ex.extend_from_slice(&[2, 0, 9, 9]);
        let h = header(&riff(&[chunk(b"fmt ", &ex), chunk(b"data", &[0; 8])])).unwrap();
        assert_eq!(h.encoding, SampleEncoding::Float { bytes: 8 });
        assert_eq!(h.data_bytes, 8);
    }

    #[test]
    fn compressed_formats_and_rf64_are_unsupported_not_malformed() {
        for (tag, name) in [(0x55u16, "MP3"), (0x06, "A-law"), (0x1234, "unknown")] {
            let f = riff(&[
                chunk(b"fmt ", &fmt_body(tag, 1, 8_000, 8)),
                chunk(b"data", &[0; 4]),
            ]);
            match header(&f) {
                Err(HeaderError::Unsupported(m)) => assert!(m.contains(name), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        let mut f = riff(&[]);
        f[..4].copy_from_slice(b"RF64");
        assert!(matches!(header(&f), Err(HeaderError::Unsupported(_))));
        assert!(malformed(b"RIFF\x04\0\0\0AVI ").contains("form `AVI `"));
    }
}
