//! `serve --record DIR`: per session, what the model processed and what the client was sent.
//!
//! - `<tag>-session-<id>-in.wav`: the 24 kHz input frames the model processed (32-bit float,
//!   exactly what the pipeline saw; frames dropped for real time are not in it), so
//!   `moshi-rs file` on it reproduces the session's tokens;
//! - `<tag>-session-<id>-out.wav`: the audio stream sent to the client, decoded (32-bit float:
//!   what a client plays, Opus included, sample-aligned with the stream);
//! - `<tag>-session-<id>-tokens.jsonl`: one `{"frame", "text", "audio"}` object per processed
//!   frame, as `moshi-rs file --tokens-out` writes;
//! - `<tag>-session-<id>-text.txt`: the words sent (the text messages, concatenated);
//! - `<tag>-session-<id>-stats.json`: the session's counters when it ended (as the metadata's
//!   `moshi_rs_stats`, with `end` and `duration_s`).
//!
//! Files are written under a `.part` name and renamed when the session ends, so a reader never
//! sees a half-written recording under the final name.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::ogg_opus::{OggOpusReader, PreSkip};
use crate::session_engine::ProcessedFrame;

type WavWriter = hound::WavWriter<BufWriter<File>>;

/// Most samples the mirror decoder may produce from one frame's pages.
const MAX_MIRROR_SAMPLES: usize = 24_000;

/// The recording of one session.
pub struct SessionRecorder {
    input: WavWriter,
    output: WavWriter,
    tokens: BufWriter<File>,
    text: BufWriter<File>,
    /// Decodes the pages sent, as a client does.
    mirror: OggOpusReader,
    mirror_pcm: Vec<f32>,
    /// (.part path, final path) of each file.
    renames: Vec<(PathBuf, PathBuf)>,
    /// (.part path, final path) of the statistics, written at the end.
    stats_paths: (PathBuf, PathBuf),
}

fn wav_spec() -> hound::WavSpec {
    hound::WavSpec {
        channels: 1,
        sample_rate: moshi_runtime::SAMPLE_RATE_HZ,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    }
}

/// A recording error, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {detail}")]
pub struct RecordError {
    pub path: PathBuf,
    pub detail: String,
}

impl SessionRecorder {
    /// Opens the files of session `id` in `dir`.
    pub fn create(dir: &Path, tag: &str, id: u64) -> Result<Self, RecordError> {
        let base = format!("{tag}-session-{id}");
        let path = |suffix: &str| dir.join(format!("{base}-{suffix}"));
        let part = |p: &Path| {
            let mut s = p.as_os_str().to_owned();
            s.push(".part");
            PathBuf::from(s)
        };
        let err = |p: &Path, e: &dyn std::fmt::Display| RecordError {
            path: p.to_path_buf(),
            detail: e.to_string(),
        };
        let (in_path, out_path, tok_path, text_path) = (
            path("in.wav"),
            path("out.wav"),
            path("tokens.jsonl"),
            path("text.txt"),
        );
        let input = WavWriter::create(part(&in_path), wav_spec()).map_err(|e| err(&in_path, &e))?;
        let output =
            WavWriter::create(part(&out_path), wav_spec()).map_err(|e| err(&out_path, &e))?;
        let tokens = File::create(part(&tok_path))
            .map(BufWriter::new)
            .map_err(|e| err(&tok_path, &e))?;
        let text = File::create(part(&text_path))
            .map(BufWriter::new)
            .map_err(|e| err(&text_path, &e))?;
        let renames = [in_path, out_path, tok_path, text_path]
            .into_iter()
            .map(|p| (part(&p), p))
            .collect();
        let stats_path = path("stats.json");
        Ok(Self {
            input,
            output,
            tokens,
            text,
            mirror: OggOpusReader::new(PreSkip::Discard),
            mirror_pcm: Vec::new(),
            renames,
            stats_paths: (part(&stats_path), stats_path),
        })
    }

    /// Records one processed frame and the pages sent for it (`None`: not sent).
    pub fn frame(
        &mut self,
        index: u64,
        frame: &ProcessedFrame,
        pages_sent: Option<&[u8]>,
    ) -> Result<(), RecordError> {
        let path = |i: usize| self.renames[i].0.clone();
        for &s in &frame.input {
            self.input.write_sample(s).map_err(|e| RecordError {
                path: path(0),
                detail: e.to_string(),
            })?;
        }
        if let Some(pages) = pages_sent {
            self.mirror_pcm.clear();
            self.mirror
                .push(pages, &mut self.mirror_pcm, MAX_MIRROR_SAMPLES)
                .map_err(|e| RecordError {
                    path: path(1),
                    detail: format!("decoding the audio sent: {e}"),
                })?;
            for &s in &self.mirror_pcm {
                self.output.write_sample(s).map_err(|e| RecordError {
                    path: path(1),
                    detail: e.to_string(),
                })?;
            }
        }
        if let Some(words) = &frame.text {
            self.text
                .write_all(words.as_bytes())
                .map_err(|e| RecordError {
                    path: path(3),
                    detail: e.to_string(),
                })?;
        }
        if let Some(t) = &frame.tokens {
            let line = serde_json::json!({ "frame": index, "text": t.text, "audio": t.audio });
            writeln!(self.tokens, "{line}").map_err(|e| RecordError {
                path: path(2),
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Completes the files, writes `stats`, and gives them their final names.
    pub fn finish(mut self, stats: &serde_json::Value) -> Result<(), RecordError> {
        let err = |p: &Path, e: &dyn std::fmt::Display| RecordError {
            path: p.to_path_buf(),
            detail: e.to_string(),
        };
        self.input
            .finalize()
            .map_err(|e| err(&self.renames[0].0, &e))?;
        self.output
            .finalize()
            .map_err(|e| err(&self.renames[1].0, &e))?;
        self.tokens
            .flush()
            .map_err(|e| err(&self.renames[2].0, &e))?;
        self.text.flush().map_err(|e| err(&self.renames[3].0, &e))?;
        let (stats_part, stats_path) = self.stats_paths.clone();
        let json = serde_json::to_string_pretty(stats).map_err(|e| err(&stats_path, &e))?;
        std::fs::write(&stats_part, json + "\n").map_err(|e| err(&stats_part, &e))?;
        self.renames.push((stats_part, stats_path));
        for (part, done) in &self.renames {
            std::fs::rename(part, done).map_err(|e| err(done, &e))?;
        }
        Ok(())
    }
}
