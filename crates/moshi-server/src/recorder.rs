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
//! sees a half-written recording under the final name. A recording that fails (a full disk, a
//! file too large) removes its `.part` files, and the session's `-stats.json` is still written
//! at its end, with `recording_error` saying why the recording is missing; when even that
//! cannot be written, the log says so, naming the file and the cause.
//!
//! [`RecorderThread`] does the writing on a thread of its own (`moshi_runtime::recorder`, which
//! `chat --record` shares), so a slow disk never holds up the server's async runtime: frames
//! reach it through a bounded queue, and frames that find it full are left out of the recording
//! and counted (`recording_frames_dropped` in `-stats.json`).

use moshi_runtime::recorder::{RecordWriter, RecordingError};
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
    /// Removes the `.part` files unless the recording completed.
    parts: PartFiles,
}

/// `.part` files of a recording, removed when dropped (a recording that failed or was dropped
/// unfinished) unless [`PartFiles::keep`] was called.
#[derive(Default)]
struct PartFiles(Vec<PathBuf>);

impl PartFiles {
    /// Creates `path` (truncating) and takes charge of it.
    fn create(&mut self, path: PathBuf) -> std::io::Result<File> {
        let file = File::create(&path)?;
        self.0.push(path);
        Ok(file)
    }

    /// The recording completed: its files stay.
    fn keep(&mut self) {
        self.0.clear();
    }
}

impl Drop for PartFiles {
    fn drop(&mut self) {
        for part in &self.0 {
            // Already renamed (NotFound) is fine; any other failure is worth a line.
            match std::fs::remove_file(part) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("--record: cannot remove {}: {e}", part.display()),
            }
        }
    }
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
        // Each file is in `parts`' charge as soon as it exists: a failure to create the next
        // one removes those before it.
        let mut parts = PartFiles::default();
        let wav = |parts: &mut PartFiles, p: &Path| {
            parts
                .create(part(p))
                .map_err(|e| err(p, &e))
                .and_then(|f| WavWriter::new(BufWriter::new(f), wav_spec()).map_err(|e| err(p, &e)))
        };
        let input = wav(&mut parts, &in_path)?;
        let output = wav(&mut parts, &out_path)?;
        let tokens = parts
            .create(part(&tok_path))
            .map(BufWriter::new)
            .map_err(|e| err(&tok_path, &e))?;
        let text = parts
            .create(part(&text_path))
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
            parts,
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

    /// Completes the files, writes `stats`, and gives them their final names. On an error the
    /// `.part` files are removed.
    pub fn finish(self, stats: &serde_json::Value) -> Result<(), RecordError> {
        let Self {
            input,
            output,
            mut tokens,
            mut text,
            mut renames,
            stats_paths: (stats_part, stats_path),
            mut parts,
            ..
        } = self;
        let err = |p: &Path, e: &dyn std::fmt::Display| RecordError {
            path: p.to_path_buf(),
            detail: e.to_string(),
        };
        input.finalize().map_err(|e| err(&renames[0].0, &e))?;
        output.finalize().map_err(|e| err(&renames[1].0, &e))?;
        tokens.flush().map_err(|e| err(&renames[2].0, &e))?;
        text.flush().map_err(|e| err(&renames[3].0, &e))?;
        let json = serde_json::to_string_pretty(stats).map_err(|e| err(&stats_path, &e))?;
        parts
            .create(stats_part.clone())
            .and_then(|mut f| f.write_all((json + "\n").as_bytes()))
            .map_err(|e| err(&stats_part, &e))?;
        renames.push((stats_part, stats_path));
        for (part, done) in &renames {
            std::fs::rename(part, done).map_err(|e| err(done, &e))?;
        }
        parts.keep();
        Ok(())
    }
}

/// Writes `<tag>-session-<id>-stats.json` in `dir` on its own (through a `.part` file): the
/// statistics of a session whose recording failed.
fn write_stats_alone(
    dir: &Path,
    tag: &str,
    id: u64,
    stats: &serde_json::Value,
) -> Result<PathBuf, RecordError> {
    let path = dir.join(format!("{tag}-session-{id}-stats.json"));
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let err = |p: &Path, e: &dyn std::fmt::Display| RecordError {
        path: p.to_path_buf(),
        detail: e.to_string(),
    };
    let json = serde_json::to_string_pretty(stats).map_err(|e| err(&path, &e))?;
    let mut parts = PartFiles::default();
    parts
        .create(part.clone())
        .and_then(|mut f| f.write_all((json + "\n").as_bytes()))
        .map_err(|e| err(&part, &e))?;
    std::fs::rename(&part, &path).map_err(|e| err(&path, &e))?;
    parts.keep();
    Ok(path)
}

/// A processed frame and the pages sent for it (`None`: not sent), on their way to the disk.
struct RecordedFrame {
    index: u64,
    frame: ProcessedFrame,
    pages_sent: Option<Vec<u8>>,
}

/// A session's [`SessionRecorder`] as the recording thread's writer. It logs its errors where
/// they happen, naming the session: the session stops queuing when the thread stops, and does
/// not wait for the end to hear why.
struct SessionWriter {
    id: u64,
    recorder: SessionRecorder,
}

impl RecordWriter for SessionWriter {
    type Frame = RecordedFrame;
    type End = serde_json::Value;
    type Done = ();
    type Error = RecordError;

    fn write(&mut self, f: RecordedFrame) -> Result<(), RecordError> {
        self.recorder
            .frame(f.index, &f.frame, f.pages_sent.as_deref())
            .inspect_err(|e| {
                tracing::error!(
                    session = self.id,
                    "--record: {e}; recording stopped, its partial files removed"
                );
            })
    }

    fn finish(self, stats: serde_json::Value) -> Result<(), RecordError> {
        let id = self.id;
        self.recorder.finish(&stats).inspect_err(|e| {
            tracing::error!(session = id, "--record: {e}");
        })
    }
}

/// A session's recording on its own thread behind a bounded queue
/// ([`moshi_runtime::recorder::RecorderThread`]).
pub struct RecorderThread {
    inner: moshi_runtime::recorder::RecorderThread<SessionWriter>,
    /// Where the statistics go when the recording fails.
    dir: PathBuf,
    tag: String,
    id: u64,
}

impl RecorderThread {
    /// Starts the thread that creates and writes session `id`'s files in `dir`, with room for
    /// `queue_frames` frames waiting. File errors are logged there (naming the file), and the
    /// recording stops.
    pub fn spawn(dir: &Path, tag: &str, id: u64, queue_frames: usize) -> std::io::Result<Self> {
        let (thread_dir, thread_tag) = (dir.to_path_buf(), tag.to_string());
        let inner = moshi_runtime::recorder::RecorderThread::spawn(
            format!("record-{id}"),
            queue_frames,
            move || match SessionRecorder::create(&thread_dir, &thread_tag, id) {
                Ok(recorder) => Ok(SessionWriter { id, recorder }),
                Err(e) => {
                    tracing::error!(session = id, "--record: {e}; this session is not recorded");
                    Err(e)
                }
            },
        )?;
        Ok(Self {
            inner,
            dir: dir.to_path_buf(),
            tag: tag.to_string(),
            id,
        })
    }

    /// Queues one frame; left out (counted) when the queue is full. Returns false once the
    /// recording has stopped (a file error, logged by the thread).
    pub fn frame(
        &mut self,
        index: u64,
        frame: ProcessedFrame,
        pages_sent: Option<Vec<u8>>,
    ) -> bool {
        self.inner.push(RecordedFrame {
            index,
            frame,
            pages_sent,
        })
    }

    /// Frames left out of the recording so far.
    pub fn frames_dropped(&self) -> u64 {
        self.inner.frames_dropped()
    }

    /// Writes the rest and `stats` (with `recording_frames_dropped` added), names the files,
    /// and waits for the thread without blocking the async runtime. A recording that failed
    /// left no `.part` file; its statistics are written alone, with `recording_error`.
    pub async fn finish(self, mut stats: serde_json::Value) {
        stats["recording_frames_dropped"] = serde_json::json!(self.frames_dropped());
        let Self {
            inner,
            dir,
            tag,
            id,
        } = self;
        let finished = tokio::task::spawn_blocking(move || {
            let cause = match inner.finish(stats.clone()) {
                Ok(_) => return,
                Err(RecordingError::Writer(e)) => e.to_string(),
                Err(RecordingError::Panicked) => "the recording thread panicked".to_string(),
            };
            stats["recording_error"] = serde_json::json!(cause);
            match write_stats_alone(&dir, &tag, id, &stats) {
                Ok(path) => tracing::warn!(
                    session = id,
                    "--record: the recording failed ({cause}); its statistics are in {}",
                    path.display()
                ),
                Err(e) => tracing::error!(
                    session = id,
                    "--record: the recording failed ({cause}), and its statistics could not be \
                     written either: {e}"
                ),
            }
        })
        .await;
        if finished.is_err() {
            tracing::error!(session = id, "--record: the recording thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshi_runtime::engine::FrameTokens;
    use std::io::Read;
    use std::time::{Duration, Instant};

    fn processed(i: u32) -> ProcessedFrame {
        ProcessedFrame {
            input: vec![0.0; moshi_runtime::FRAME_SAMPLES],
            pcm: vec![0.0; moshi_runtime::FRAME_SAMPLES],
            text: Some(format!("w{i} ")),
            tokens: Some(FrameTokens {
                text: i,
                audio: vec![i; 8],
                extra_heads: Vec::new(),
            }),
            compute_ms: 1.0,
            input_complete_at: Instant::now(),
        }
    }

    /// A disk that does not keep up (here: the tokens file is a FIFO nobody reads yet, so the
    /// thread is stuck opening it) never holds up the session: queuing frames returns at once,
    /// frames beyond the queue are left out and counted, and the recording still completes
    /// with what was queued. Before, the session wrote the files itself on the async runtime.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_disk_drops_and_counts_frames_without_blocking_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("t-session-1-tokens.jsonl.part");
        match std::process::Command::new("mkfifo").arg(&fifo).status() {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("SKIPPED: mkfifo is not available");
                return;
            }
        }
        let mut recorder = RecorderThread::spawn(dir.path(), "t", 1, 2).unwrap();
        let t0 = Instant::now();
        for i in 0..10 {
            assert!(recorder.frame(u64::from(i), processed(i), None));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "queuing frames blocked"
        );
        assert_eq!(recorder.frames_dropped(), 8);
        // The disk catches up: read the FIFO to its end.
        let reader = std::thread::spawn(move || {
            let mut tokens = String::new();
            File::open(&fifo)
                .unwrap()
                .read_to_string(&mut tokens)
                .unwrap();
            tokens
        });
        recorder
            .finish(serde_json::json!({ "frames_processed": 10 }))
            .await;
        let tokens = reader.join().unwrap();
        assert_eq!(tokens.lines().count(), 2, "{tokens}");
        let input = hound::WavReader::open(dir.path().join("t-session-1-in.wav")).unwrap();
        assert_eq!(input.len() as usize, 2 * moshi_runtime::FRAME_SAMPLES);
        let stats: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("t-session-1-stats.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(stats["recording_frames_dropped"], 8);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("t-session-1-text.txt")).unwrap(),
            "w0 w1 "
        );
    }

    /// Issue #41 item 11: a recording that fails on a full disk leaves no `.part` file (it
    /// left four), and the session's `-stats.json` is still written, saying why. The disk is
    /// made "full" for a child process of this test (the test binary run again): files there
    /// may not grow past 64 KiB (`RLIMIT_FSIZE`, whose EFBIG a write meets as it would ENOSPC),
    /// so the input WAV fails after a few frames while the small statistics fit.
    #[cfg(unix)]
    #[test]
    fn a_full_disk_leaves_no_part_files_and_still_writes_the_stats() {
        const CHILD_DIR: &str = "MOSHI_TEST_RECORDER_FULL_DISK_DIR";
        if let Some(dir) = std::env::var_os(CHILD_DIR) {
            let limit = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            // SAFETY: plain system calls; SIGXFSZ ignored so that the write fails with EFBIG
            // instead of ending the process.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let mut recorder = RecorderThread::spawn(Path::new(&dir), "t", 1, 1000).unwrap();
                let mut queued = 0;
                for i in 0..40u32 {
                    if !recorder.frame(u64::from(i), processed(i), None) {
                        break;
                    }
                    queued += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                assert!(queued < 40, "the recording never stopped");
                recorder
                    .finish(serde_json::json!({ "frames_processed": 40 }))
                    .await;
            });
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "recorder::tests::a_full_disk_leaves_no_part_files_and_still_writes_the_stats",
                "--nocapture",
            ])
            .env(CHILD_DIR, dir.path())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&child.stderr).into_owned()
            + &String::from_utf8_lossy(&child.stdout);
        assert!(child.status.success(), "{log}");
        assert!(log.contains("1 passed"), "the child ran no test: {log}");
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["t-session-1-stats.json"], "{log}");
        let stats: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("t-session-1-stats.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(stats["frames_processed"], 40);
        let error = stats["recording_error"].as_str().unwrap();
        assert!(
            error.contains("t-session-1-in.wav") && error.contains("File too large"),
            "{error}"
        );
    }
}
