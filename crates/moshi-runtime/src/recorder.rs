//! Recordings written as they happen, in flat memory whatever their length: a thread per
//! recording takes frames from a bounded queue and writes them; frames that find the queue full
//! (the disk behind) are left out and counted, and the thread finalizes the files at the end.
//! `serve --record` ([`RecorderThread`] with its session writer), `chat --record`
//! ([`ConversationWav`], and `chat --record-raw-mic`: [`RawMicWav`]) and `transcribe --mic
//! --record-input` ([`FedInputWav`]) share it.
//!
//! Nothing that queues a frame ever waits for the disk: the engine thread and the server's
//! async runtime stay real-time.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::engine::FrameRecorder;
use crate::wav::WavWriter;
use crate::{Result, RuntimeError, SAMPLE_RATE_HZ};

/// What a recording thread does with its frames.
pub trait RecordWriter: Send + 'static {
    /// One queued frame.
    type Frame: Send + 'static;
    /// What [`RecorderThread::finish`] hands over for the end (statistics, or nothing).
    type End: Send + 'static;
    /// What a completed recording returns.
    type Done: Send + 'static;
    type Error: std::error::Error + Send + 'static;

    /// Writes one frame; an error ends the recording (nothing more is written).
    fn write(&mut self, frame: Self::Frame) -> std::result::Result<(), Self::Error>;
    /// Completes the files once every frame is written.
    fn finish(self, end: Self::End) -> std::result::Result<Self::Done, Self::Error>;
}

/// Why a recording did not complete.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Writer(E),
    #[error("the recording thread panicked")]
    Panicked,
}

/// The sending end of a recording's queue; clones share the queue and the count of frames
/// left out.
pub struct FrameQueue<F> {
    frames: mpsc::SyncSender<F>,
    dropped: Arc<AtomicU64>,
}

impl<F> Clone for FrameQueue<F> {
    fn clone(&self) -> Self {
        Self {
            frames: self.frames.clone(),
            dropped: self.dropped.clone(),
        }
    }
}

impl<F> FrameQueue<F> {
    /// Queues `frame` without waiting; one that finds the queue full is left out and counted.
    /// Returns false once the writer has stopped (its error comes with the finish).
    pub fn push(&self, frame: F) -> bool {
        match self.frames.try_send(frame) {
            Ok(()) => true,
            Err(mpsc::TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(mpsc::TrySendError::Disconnected(_)) => false,
        }
    }

    /// Frames left out so far because the queue was full.
    pub fn frames_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// How a recording ended: what its writer returned, and the frames the full queue left out.
#[derive(Debug)]
pub struct Finished<D> {
    pub done: D,
    pub frames_dropped: u64,
}

/// A [`RecordWriter`] on its own thread behind a bounded queue.
pub struct RecorderThread<W: RecordWriter> {
    queue: FrameQueue<W::Frame>,
    end: mpsc::Sender<W::End>,
    /// `None` when the end never came (the recording was dropped unfinished).
    thread: JoinHandle<Option<std::result::Result<W::Done, W::Error>>>,
}

impl<W: RecordWriter> RecorderThread<W> {
    /// Starts a thread named `name` that creates its writer with `create` (so that a slow
    /// disk holds up that thread only) and writes what is queued, with room for `queue_frames`
    /// frames waiting. Dropped unfinished, the writer is dropped without its `finish`.
    pub fn spawn(
        name: String,
        queue_frames: usize,
        create: impl FnOnce() -> std::result::Result<W, W::Error> + Send + 'static,
    ) -> std::io::Result<Self> {
        let (frames_tx, frames_rx) = mpsc::sync_channel::<W::Frame>(queue_frames.max(1));
        let (end_tx, end_rx) = mpsc::channel::<W::End>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let mut writer = match create() {
                Ok(w) => w,
                Err(e) => return Some(Err(e)),
            };
            // Until every queue end is dropped.
            for frame in frames_rx {
                if let Err(e) = writer.write(frame) {
                    return Some(Err(e));
                }
            }
            let end = end_rx.recv().ok()?;
            Some(writer.finish(end))
        })?;
        Ok(Self {
            queue: FrameQueue {
                frames: frames_tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            end: end_tx,
            thread,
        })
    }

    /// Another end of the queue (for the engine thread, say).
    pub fn queue(&self) -> FrameQueue<W::Frame> {
        self.queue.clone()
    }

    /// Queues one frame (see [`FrameQueue::push`]).
    pub fn push(&self, frame: W::Frame) -> bool {
        self.queue.push(frame)
    }

    /// Frames left out so far because the queue was full.
    pub fn frames_dropped(&self) -> u64 {
        self.queue.frames_dropped()
    }

    /// Lets the writer write what is queued and `end`, and waits for it. Every other end of
    /// the queue ([`Self::queue`]) must be dropped first: the writer waits for them.
    pub fn finish(
        self,
        end: W::End,
    ) -> std::result::Result<Finished<W::Done>, RecordingError<W::Error>> {
        let frames_dropped = self.queue.frames_dropped();
        // A send error: the writer already stopped on an error, which the join returns.
        let _ = self.end.send(end);
        drop(self.queue);
        match self.thread.join() {
            Ok(Some(Ok(done))) => Ok(Finished {
                done,
                frames_dropped,
            }),
            Ok(Some(Err(e))) => Err(RecordingError::Writer(e)),
            // The end was sent above, so only a panic leaves the thread without a result.
            Ok(None) | Err(_) => Err(RecordingError::Panicked),
        }
    }
}

/// One frame of a conversation: what the user said (24 kHz) and Moshi's answer to it.
pub struct StereoFrame {
    pub left: Box<[f32]>,
    pub right: Box<[f32]>,
}

/// The engine hands its frames to a recording thread through the queue; a full queue leaves
/// a frame out of both channels, so they stay aligned.
impl FrameRecorder for FrameQueue<StereoFrame> {
    fn record(&mut self, input: &[f32], output: &[f32]) {
        // A stopped writer: its error comes with the recording's finish.
        let _ = self.push(StereoFrame {
            left: input.into(),
            right: output.into(),
        });
    }
}

/// `chat --record`: the conversation as a 16-bit stereo WAV at 24 kHz, the user on the left
/// and Moshi on the right, written as it goes (open-ended, see [`WavWriter`]) and committed
/// under its name at the end only.
pub struct ConversationWav(WavRecording);

/// What a completed recording holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordingSummary {
    /// Sample frames written (24 kHz).
    pub samples: u64,
    /// Frames left out once the WAV was as long as a WAV can be.
    pub frames_beyond_limit: u64,
}

/// A WAV recording written frame by frame: past what a WAV can hold (many hours), frames are
/// counted and left out rather than the whole recording lost.
struct WavRecording {
    wav: WavWriter,
    frames_beyond_limit: u64,
}

impl WavRecording {
    fn new(wav: WavWriter) -> Self {
        Self {
            wav,
            frames_beyond_limit: 0,
        }
    }

    /// Writes a frame of `samples` sample frames with `write`, if it fits.
    fn frame(
        &mut self,
        samples: usize,
        write: impl FnOnce(&mut WavWriter) -> Result<()>,
    ) -> Result<()> {
        if !self.wav.fits(samples as u64) {
            self.frames_beyond_limit += 1;
            return Ok(());
        }
        write(&mut self.wav)
    }

    fn finish(self) -> Result<RecordingSummary> {
        let summary = RecordingSummary {
            samples: self.wav.written_frames(),
            frames_beyond_limit: self.frames_beyond_limit,
        };
        self.wav.finish()?;
        Ok(summary)
    }
}

/// Starts `writer` on its own thread `name` (its file, at `path`, already created).
fn spawn_wav_writer<W: RecordWriter>(
    name: &str,
    path: &Path,
    queue_frames: usize,
    writer: W,
) -> Result<RecorderThread<W>> {
    RecorderThread::spawn(name.into(), queue_frames, move || Ok(writer)).map_err(|cause| {
        RuntimeError::Write {
            path: path.to_path_buf(),
            cause,
        }
    })
}

impl ConversationWav {
    /// Room for this many frames waiting for the disk: seconds of a stalled disk, a few MB.
    pub const QUEUE_FRAMES: usize = 250;

    pub fn create(path: &Path) -> Result<Self> {
        let wav = WavWriter::create_open_ended(path, 2, SAMPLE_RATE_HZ)?;
        Ok(Self(WavRecording::new(wav)))
    }

    /// Starts the recording of a conversation at `path` on its own thread. The file is
    /// created here, so that an unwritable path is an error before the conversation starts.
    pub fn spawn(path: &Path, queue_frames: usize) -> Result<RecorderThread<Self>> {
        spawn_wav_writer("moshi-record", path, queue_frames, Self::create(path)?)
    }
}

impl RecordWriter for ConversationWav {
    type Frame = StereoFrame;
    type End = ();
    type Done = RecordingSummary;
    type Error = RuntimeError;

    fn write(&mut self, frame: StereoFrame) -> Result<()> {
        let samples = frame.left.len().max(frame.right.len());
        self.0
            .frame(samples, |wav| wav.write_stereo(&frame.left, &frame.right))
    }

    fn finish(self, (): ()) -> Result<RecordingSummary> {
        self.0.finish()
    }
}

/// One 24 kHz input frame exactly as the model was fed it.
pub struct FedFrame(pub Box<[f32]>);

/// The engine hands the frames it processes to a recording thread; a frame it dropped was
/// never fed, so it is not recorded.
impl FrameRecorder for FrameQueue<FedFrame> {
    fn record(&mut self, input: &[f32], _output: &[f32]) {
        // A stopped writer: its error comes with the recording's finish.
        let _ = self.push(FedFrame(input.into()));
    }

    fn dropped(&mut self, _input: &[f32]) {}
}

/// `transcribe --mic --record-input`: the frames a model was fed (after the device's channels
/// were mixed and its rate converted), as a mono 32-bit float WAV at 24 kHz that reads back bit
/// for bit, so that the file transcribed offline gives what the live run gave. Written as it
/// goes, committed under its name at the end only.
pub struct FedInputWav(WavRecording);

impl FedInputWav {
    /// Room for this many frames waiting for the disk (as [`ConversationWav::QUEUE_FRAMES`]).
    pub const QUEUE_FRAMES: usize = 250;

    pub fn create(path: &Path) -> Result<Self> {
        let wav = WavWriter::create_open_ended_f32(path, 1, SAMPLE_RATE_HZ)?;
        Ok(Self(WavRecording::new(wav)))
    }

    /// Starts the recording at `path` on its own thread; the file is created here, so that an
    /// unwritable path is an error before listening starts.
    pub fn spawn(path: &Path, queue_frames: usize) -> Result<RecorderThread<Self>> {
        spawn_wav_writer(
            "moshi-record-input",
            path,
            queue_frames,
            Self::create(path)?,
        )
    }
}

impl RecordWriter for FedInputWav {
    type Frame = FedFrame;
    type End = ();
    type Done = RecordingSummary;
    type Error = RuntimeError;

    fn write(&mut self, frame: FedFrame) -> Result<()> {
        self.0.frame(frame.0.len(), |wav| wav.write_mono(&frame.0))
    }

    fn finish(self, (): ()) -> Result<RecordingSummary> {
        self.0.finish()
    }
}

/// One 24 kHz input frame as captured, before echo cancellation.
pub struct MicFrame(pub Box<[f32]>);

/// Every input frame the engine took, processed or dropped (as `--record`'s left channel, so
/// the two files line up sample for sample).
impl FrameRecorder for FrameQueue<MicFrame> {
    fn record(&mut self, input: &[f32], _output: &[f32]) {
        // A stopped writer: its error comes with the recording's finish.
        let _ = self.push(MicFrame(input.into()));
    }
}

/// `chat --record-raw-mic`: the microphone before echo cancellation, as a 16-bit mono WAV at
/// 24 kHz (the format of `--record`, whose left channel is what the model heard after it).
/// Written as it goes, committed under its name at the end only.
pub struct RawMicWav(WavRecording);

impl RawMicWav {
    /// Room for this many frames waiting for the disk (as [`ConversationWav::QUEUE_FRAMES`]).
    pub const QUEUE_FRAMES: usize = 250;

    pub fn create(path: &Path) -> Result<Self> {
        let wav = WavWriter::create_open_ended(path, 1, SAMPLE_RATE_HZ)?;
        Ok(Self(WavRecording::new(wav)))
    }

    /// Starts the recording at `path` on its own thread; the file is created here, so that an
    /// unwritable path is an error before the conversation starts.
    pub fn spawn(path: &Path, queue_frames: usize) -> Result<RecorderThread<Self>> {
        spawn_wav_writer(
            "moshi-record-raw-mic",
            path,
            queue_frames,
            Self::create(path)?,
        )
    }
}

impl RecordWriter for RawMicWav {
    type Frame = MicFrame;
    type End = ();
    type Done = RecordingSummary;
    type Error = RuntimeError;

    fn write(&mut self, frame: MicFrame) -> Result<()> {
        self.0.frame(frame.0.len(), |wav| wav.write_mono(&frame.0))
    }

    fn finish(self, (): ()) -> Result<RecordingSummary> {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FRAME_SAMPLES;
    use moshi_test_support::names_in;

    fn frame(i: usize) -> StereoFrame {
        let left: Vec<f32> = (0..FRAME_SAMPLES)
            .map(|j| ((i * 7 + j) % 100) as f32 / 200.0)
            .collect();
        let right: Vec<f32> = left.iter().map(|x| -x).collect();
        StereoFrame {
            left: left.into(),
            right: right.into(),
        }
    }

    /// A disk that does not keep up (the writer is held before it starts): queuing never
    /// waits, the queue holds its bound and no more, the rest is counted, and the WAV holds the
    /// frames that were queued, in order, as `wav::write_stereo_i16` writes them.
    #[test]
    fn a_stalled_writer_bounds_the_queue_and_counts_what_it_leaves_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("talk.wav");
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let created = path.clone();
        let thread = RecorderThread::spawn("t".into(), 3, move || {
            go_rx.recv().unwrap();
            ConversationWav::create(&created)
        })
        .unwrap();
        let mut queue = thread.queue();
        let t0 = std::time::Instant::now();
        for i in 0..10 {
            let f = frame(i);
            queue.record(&f.left, &f.right);
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(thread.frames_dropped(), 7);
        assert!(
            !path.exists(),
            "nothing under the final name before the end"
        );
        drop(queue);
        go_tx.send(()).unwrap();
        let finished = thread.finish(()).unwrap();
        assert_eq!(finished.frames_dropped, 7);
        assert_eq!(
            finished.done,
            RecordingSummary {
                samples: 3 * FRAME_SAMPLES as u64,
                frames_beyond_limit: 0
            }
        );
        let (left, right): (Vec<f32>, Vec<f32>) = (0..3)
            .map(frame)
            .map(|f| (f.left.to_vec(), f.right.to_vec()))
            .fold((Vec::new(), Vec::new()), |(mut l, mut r), (fl, fr)| {
                l.extend(fl);
                r.extend(fr);
                (l, r)
            });
        let reference = dir.path().join("reference.wav");
        crate::wav::write_stereo_i16(&reference, &left, &right, SAMPLE_RATE_HZ).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            std::fs::read(&reference).unwrap()
        );
        assert_eq!(names_in(dir.path()), ["reference.wav", "talk.wav"]);
    }

    /// The fed-input recording keeps the processed frames bit for bit and leaves the dropped
    /// ones out.
    #[test]
    fn the_fed_input_holds_the_processed_frames_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fed.wav");
        let thread = FedInputWav::spawn(&path, 16).unwrap();
        let mut queue = thread.queue();
        let frames: Vec<StereoFrame> = (0..3).map(frame).collect();
        queue.record(&frames[0].left, &frames[0].right);
        queue.dropped(&frames[1].left);
        queue.record(&frames[2].left, &frames[2].right);
        drop(queue);
        let finished = thread.finish(()).unwrap();
        assert_eq!(finished.done.samples, 2 * FRAME_SAMPLES as u64);
        let back = crate::wav::read_mono(&path).unwrap().samples;
        let want: Vec<f32> = [&frames[0].left, &frames[2].left]
            .iter()
            .flat_map(|f| f.iter().copied())
            .collect();
        assert_eq!(back, want);
    }

    /// A recording dropped without its finish (the conversation failed) leaves nothing behind:
    /// no WAV under the name, no temporary file.
    #[test]
    fn an_unfinished_recording_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("talk.wav");
        let thread = ConversationWav::spawn(&path, 4).unwrap();
        let mut queue = thread.queue();
        let f = frame(0);
        queue.record(&f.left, &f.right);
        drop(queue);
        drop(thread);
        // The thread ends once it sees the queue closed and no end coming.
        let t0 = std::time::Instant::now();
        while !names_in(dir.path()).is_empty() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "{:?}",
                names_in(dir.path())
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!path.exists());
    }

    /// A writer error stops the recording: queuing says so, and the finish returns the error.
    #[test]
    fn a_writer_error_comes_with_the_finish() {
        struct Failing;
        impl RecordWriter for Failing {
            type Frame = u32;
            type End = ();
            type Done = ();
            type Error = std::io::Error;
            fn write(&mut self, _: u32) -> std::io::Result<()> {
                Err(std::io::Error::other("disk full"))
            }
            fn finish(self, (): ()) -> std::io::Result<()> {
                Ok(())
            }
        }
        let thread = RecorderThread::spawn("t".into(), 1, || Ok(Failing)).unwrap();
        assert!(thread.push(1));
        let t0 = std::time::Instant::now();
        while thread.push(2) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let e = thread.finish(()).unwrap_err();
        assert!(matches!(e, RecordingError::Writer(_)), "{e:?}");
        assert_eq!(e.to_string(), "disk full");
    }
}
