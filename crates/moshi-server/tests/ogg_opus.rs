//! Ogg/Opus streams: the writer's output decodes sample-aligned (pre-skip honoured), 20 and
//! 40 ms packets, any split of the bytes into messages gives the same PCM, and every kind of
//! malformed stream is an error that says what was wrong.

use moshi_server::ogg_opus::{OggOpusError, OggOpusReader, OggOpusWriter, OpusPacketing, PreSkip};
use moshi_test_support::ncc;
use ogg::writing::{PacketWriteEndInfo, PacketWriter};

const RATE: f32 = 24_000.0;
const NO_LIMIT: usize = usize::MAX / 2;
/// Opus' delay is its lookahead (the pre-skip) give or take its filters' own delay: the best
/// alignment of decoded speech-band audio is 2 samples off the pre-skip with libopus 1.3.1
/// (VoIP, 24 kHz), against 156 samples without it.
const CODEC_ALIGNMENT_SAMPLES: i64 = 3;

/// A 1 s test signal: a 300 Hz tone gliding up, with a slow envelope (speech-like band).
fn signal(samples: usize) -> Vec<f32> {
    (0..samples)
        .map(|i| {
            let t = i as f32 / RATE;
            let f = 300.0 + 400.0 * t;
            0.4 * (2.0 * std::f32::consts::PI * f * t).sin() * (0.6 + 0.4 * (3.0 * t).sin())
        })
        .collect()
}

fn encode(pcm: &[f32], packeting: OpusPacketing) -> (Vec<Vec<u8>>, usize) {
    let mut w = OggOpusWriter::new(7, packeting).unwrap();
    let pre_skip = w.pre_skip_samples();
    let mut messages = Vec::new();
    for chunk in pcm.chunks(1920) {
        let pages = w.push(chunk).unwrap();
        if !pages.is_empty() {
            messages.push(pages);
        }
    }
    (messages, pre_skip)
}

fn decode_all(messages: &[Vec<u8>]) -> Vec<f32> {
    let mut r = OggOpusReader::new(PreSkip::Discard);
    let mut out = Vec::new();
    for m in messages {
        r.push(m, &mut out, NO_LIMIT).unwrap();
    }
    out
}

/// ncc of `decoded` against `input` when `decoded` is `lag` samples later.
fn ncc_at(input: &[f32], decoded: &[f32], lag: i64) -> f64 {
    if lag >= 0 {
        ncc(input, &decoded[lag as usize..])
    } else {
        ncc(&input[(-lag) as usize..], decoded)
    }
}

/// The lag (decoded later than the input when > 0) that best aligns `decoded` with `input`.
fn best_lag(input: &[f32], decoded: &[f32], max_lag: i64) -> i64 {
    (-max_lag..=max_lag)
        .max_by(|&x, &y| ncc_at(input, decoded, x).total_cmp(&ncc_at(input, decoded, y)))
        .unwrap()
}

#[test]
fn server_stream_decodes_sample_aligned_after_pre_skip() {
    let input = signal(24_000);
    let (messages, pre_skip) = encode(&input, OpusPacketing::SERVER);
    assert!(pre_skip > 0, "libopus has a lookahead");
    let decoded = decode_all(&messages);
    assert_eq!(decoded.len(), input.len() - pre_skip);
    let lag = best_lag(&input, &decoded, 300);
    assert!(
        lag.abs() <= CODEC_ALIGNMENT_SAMPLES,
        "lag {lag}: pre-skip undoes the encoder delay"
    );
    let quality = ncc_at(&input, &decoded, lag);
    assert!(quality > 0.95, "ncc {quality}");
}

#[test]
fn keeping_the_pre_skip_delays_everything_by_it() {
    let input = signal(24_000);
    let (messages, pre_skip) = encode(&input, OpusPacketing::WEB_CLIENT);
    let mut r = OggOpusReader::new(PreSkip::Keep);
    let mut decoded = Vec::new();
    for m in &messages {
        r.push(m, &mut decoded, NO_LIMIT).unwrap();
    }
    assert_eq!(decoded.len(), input.len(), "one sample out per sample in");
    let lag = best_lag(&input, &decoded, 300);
    assert!(
        (lag - pre_skip as i64).abs() <= CODEC_ALIGNMENT_SAMPLES,
        "lag {lag}, pre-skip {pre_skip}"
    );
}

#[test]
fn web_client_packets_of_20_ms_two_per_page_decode_the_same_way() {
    let input = signal(24_000);
    let (messages, pre_skip) = encode(&input, OpusPacketing::WEB_CLIENT);
    // One message per page once the headers are out: 2 x 20 ms per page.
    let decoded = decode_all(&messages);
    assert_eq!(decoded.len(), input.len() - pre_skip);
    let lag = best_lag(&input, &decoded, 300);
    assert!(lag.abs() <= CODEC_ALIGNMENT_SAMPLES, "lag {lag}");
    assert!(ncc_at(&input, &decoded, lag) > 0.95);
}

#[test]
fn any_split_of_the_bytes_gives_the_same_pcm() {
    let input = signal(12_000);
    let (messages, _) = encode(&input, OpusPacketing::SERVER);
    let whole: Vec<u8> = messages.concat();
    let reference = decode_all(&messages);
    // Several pages in one message.
    assert_eq!(decode_all(std::slice::from_ref(&whole)), reference);
    // Pages cut at odd places across messages.
    for piece in [1, 7, 26, 27, 28, 100, 333] {
        let pieces: Vec<Vec<u8>> = whole.chunks(piece).map(|c| c.to_vec()).collect();
        assert_eq!(decode_all(&pieces), reference, "pieces of {piece} bytes");
    }
}

/// Hand-made pages: (packets, end-of-page flags) through the ogg crate's writer.
fn pages(serial: u32, packets: &[(&[u8], bool)]) -> Vec<u8> {
    let mut w = PacketWriter::new(Vec::new());
    for (i, (p, end_page)) in packets.iter().enumerate() {
        let info = if *end_page {
            PacketWriteEndInfo::EndPage
        } else {
            PacketWriteEndInfo::NormalPacket
        };
        w.write_packet(p.to_vec(), serial, info, i as u64 * 960)
            .unwrap();
    }
    w.into_inner()
}

fn opus_head(channels: u8, family: u8) -> Vec<u8> {
    let mut h = b"OpusHead".to_vec();
    h.extend_from_slice(&[1, channels]);
    h.extend_from_slice(&0u16.to_le_bytes());
    h.extend_from_slice(&24_000u32.to_le_bytes());
    h.extend_from_slice(&0i16.to_le_bytes());
    h.push(family);
    h
}

fn opus_tags() -> Vec<u8> {
    let mut t = b"OpusTags".to_vec();
    t.extend_from_slice(&4u32.to_le_bytes());
    t.extend_from_slice(b"test");
    t.extend_from_slice(&0u32.to_le_bytes());
    t
}

fn read(bytes: &[u8]) -> Result<Vec<f32>, OggOpusError> {
    let mut r = OggOpusReader::new(PreSkip::Discard);
    let mut out = Vec::new();
    r.push(bytes, &mut out, NO_LIMIT)?;
    Ok(out)
}

#[test]
fn a_stereo_stream_is_mixed_to_mono() {
    let mut enc =
        opus::Encoder::new(24_000, opus::Channels::Stereo, opus::Application::Audio).unwrap();
    let mono = signal(960);
    let interleaved: Vec<f32> = mono.iter().flat_map(|&s| [s, s]).collect();
    let packet = enc.encode_vec_float(&interleaved, 4000).unwrap();
    let head = opus_head(2, 0);
    let tags = opus_tags();
    let bytes = pages(
        3,
        &[
            (&head, true),
            (&tags, true),
            (&packet, true),
            (&packet, true),
        ],
    );
    let out = read(&bytes).unwrap();
    assert_eq!(out.len(), 2 * 960);
}

fn expect_err(bytes: &[u8], want: &str) {
    match read(bytes) {
        Ok(pcm) => panic!(
            "accepted ({} samples), expected an error with {want:?}",
            pcm.len()
        ),
        Err(e) => assert!(e.to_string().contains(want), "{e} (expected {want:?})"),
    }
}

#[test]
fn malformed_streams_are_errors_that_say_what_is_wrong() {
    let head = opus_head(1, 0);
    let tags = opus_tags();
    let valid = {
        let (m, _) = encode(&signal(1920), OpusPacketing::SERVER);
        m.concat()
    };
    expect_err(b"RIFF....WAVEfmt ", "capture pattern");
    expect_err(b"OgX", "capture pattern");
    // A flipped byte in the audio page: checksum mismatch.
    let mut corrupt = valid.clone();
    let last = corrupt.len() - 3;
    corrupt[last] ^= 0x40;
    expect_err(&corrupt, "malformed Ogg page");
    // Audio before OpusHead.
    expect_err(&pages(1, &[(b"not a head packet", true)]), "OpusHead");
    // No OpusTags.
    expect_err(
        &pages(1, &[(&head, true), (&[0xfc, 0xff, 0xfe], true)]),
        "OpusTags",
    );
    // Unsupported channel layouts.
    expect_err(&pages(1, &[(&opus_head(6, 1), true)]), "6 channels");
    expect_err(
        &pages(1, &[(&opus_head(1, 255), true)]),
        "mapping family 255",
    );
    expect_err(&pages(1, &[(&head[..12], true)]), "12 bytes");
    // A page that does not start the stream.
    let mut second_page_only = Vec::new();
    let all = pages(1, &[(&head, true), (&tags, true)]);
    let first_len = 27
        + all[26] as usize
        + all[27..27 + all[26] as usize]
            .iter()
            .map(|&l| l as usize)
            .sum::<usize>();
    second_page_only.extend_from_slice(&all[first_len..]);
    expect_err(&second_page_only, "begin a stream");
    // A second logical stream.
    let mut two = pages(1, &[(&head, true), (&tags, true)]);
    two.extend(pages(2, &[(&head, true)]));
    expect_err(&two, "second logical stream");
    // Not Opus at all.
    expect_err(
        &pages(1, &[(&head, true), (&tags, true), (&[0xff; 8][..], true)]),
        "cannot be decoded",
    );
}

#[test]
fn a_packet_growing_across_pages_is_bounded() {
    let head = opus_head(1, 0);
    let tags = opus_tags();
    let mut w = PacketWriter::new(Vec::new());
    w.write_packet(head, 1, PacketWriteEndInfo::EndPage, 0)
        .unwrap();
    w.write_packet(tags, 1, PacketWriteEndInfo::EndPage, 0)
        .unwrap();
    // 200 kB in one packet: the writer spreads it over continued pages.
    w.write_packet(vec![0u8; 200_000], 1, PacketWriteEndInfo::EndPage, 960)
        .unwrap();
    let bytes = w.into_inner();
    expect_err(&bytes, "at most 65536 accepted");
}

#[test]
fn decoded_audio_per_call_is_bounded() {
    let (messages, _) = encode(&signal(24_000), OpusPacketing::SERVER);
    let whole = messages.concat();
    let mut r = OggOpusReader::new(PreSkip::Discard);
    let mut out = Vec::new();
    let e = r.push(&whole, &mut out, 4_800).unwrap_err();
    assert!(
        matches!(e, OggOpusError::TooMuchAudio { max_samples: 4_800 }),
        "{e}"
    );
    assert!(out.len() <= 4_800);
}

/// The pages of an Ogg stream, each with its bytes.
fn split_pages(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let segments = bytes[26] as usize;
        let body: usize = bytes[27..27 + segments].iter().map(|&l| l as usize).sum();
        let len = 27 + segments + body;
        out.push(bytes[..len].to_vec());
        bytes = &bytes[len..];
    }
    out
}

/// Issue #41 defect 16: pages out of order (0,1,2,3,4,3,5 or 0..4,2,5) were accepted although
/// docs/serve.md says they end the session. RFC 3533: each page's sequence number is the last
/// one's plus one; a page repeated, missing or out of order is an error naming the numbers.
#[test]
fn pages_repeated_missing_or_out_of_order_are_errors() {
    let (messages, _) = encode(&signal(8 * 1920), OpusPacketing::SERVER);
    let all = split_pages(&messages.concat());
    assert!(all.len() >= 6, "{} pages", all.len());
    let stream =
        |order: &[usize]| -> Vec<u8> { order.iter().flat_map(|&i| all[i].clone()).collect() };
    assert!(read(&stream(&[0, 1, 2, 3, 4, 5])).is_ok());
    expect_err(
        &stream(&[0, 1, 2, 3, 4, 3, 5]),
        "page sequence number 3 where 5",
    );
    expect_err(
        &stream(&[0, 1, 2, 3, 4, 2, 5]),
        "page sequence number 2 where 5",
    );
    expect_err(&stream(&[0, 1, 2, 4, 5]), "page sequence number 4 where 3");
    expect_err(&stream(&[0, 1, 3, 2]), "out of order");
}
