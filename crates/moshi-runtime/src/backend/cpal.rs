//! Real audio devices through cpal: the ONLY file in the repository that names cpal.
//!
//! Device selection by name (substring, case-insensitive; default devices otherwise). The
//! stream asks for 24 kHz mono f32 when the device offers it; otherwise it takes the device's
//! default rate/channels (and f32 or i16) and the engine converts with rubato, off the audio
//! thread. The buffer is fixed (`BufferSize::Fixed`, `buffer_ms`, clamped to the device range):
//! a default buffer can be seconds long on some hosts.
//!
//! The data callbacks only call [`capture_callback`] / [`playback_callback`] (ring copy + relaxed
//! atomics; scratch for integer formats is allocated before the closure). The error callback
//! only bumps a counter (and a flag when the device is gone): ALSA can report thousands of
//! errors per xrun, so nothing is logged there; the console reports the counts, rate-limited.
//!
//! The streams are built, played and dropped on their own thread (`StreamOwner`): dropping a
//! stream on a lost device can block forever, and [`CpalBackend::stop`] waits a bounded time.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};

use super::AudioBackend;
use crate::continuity::{StreamContinuity, StreamSide};
use crate::engine::StreamFormat;
use crate::ring::{
    capture_callback, capture_callback_converting, playback_callback, playback_callback_converting,
    AudioCounters, SampleConsumer, SampleProducer,
};
use crate::{Result, RuntimeError, SAMPLE_RATE_HZ};

/// Which devices to open and how.
#[derive(Debug, Clone)]
pub struct CpalOptions {
    /// Substring of the input device name; `None`: the host's default input.
    pub input_device: Option<String>,
    /// Substring of the output device name; `None`: the host's default output.
    pub output_device: Option<String>,
    /// Device buffer per callback, milliseconds.
    pub buffer_ms: u32,
    /// Whether to open an output device at all; `false`: capture only (live speech to text),
    /// `output_device` unused.
    pub playback: bool,
    /// Whether to open an input device at all; `false`: playback only (`speak --play`),
    /// `input_device` unused.
    pub capture: bool,
}

/// Default device buffer: 40 ms (960 frames at 24 kHz, 4 periods of 10 ms). With 20 ms
/// (5 ms periods) the host's buffer ran dry on a loaded 2-core machine in 2 of 10 conversations
/// (10-50 ms of silence inserted below the callbacks); with 40 ms in none of 20 (docs/audio.md).
pub const DEFAULT_BUFFER_MS: u32 = 40;

/// One device as listed by `moshi-rs devices`.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub is_input: bool,
    pub is_default: bool,
    /// Default config, e.g. "2 ch, 48000 Hz, f32".
    pub default_config: String,
    /// Whether mono 24 kHz is offered directly (no resampling needed).
    pub supports_24k_mono: bool,
}

fn device_error(what: &str, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Device(format!("{what}: {e}"))
}

/// The error of a device whose configs cannot be listed. cpal says "no longer available ...
/// unplugged" also for a device that never opened (the ALSA `default` of a machine with no sound
/// card or sound server): say that no usable device was found, and where to look.
fn configs_error(kind: &str, name: &str, e: cpal::SupportedStreamConfigsError) -> RuntimeError {
    match e {
        cpal::SupportedStreamConfigsError::DeviceNotAvailable => RuntimeError::Device(format!(
            "no usable {kind} device: `{}` cannot be opened (no sound card or sound server?); \
             `moshi-rs devices` lists the devices, --{kind}-device picks one",
            name.escape_debug()
        )),
        other => device_error(
            &format!("{kind} configs of `{}`", name.escape_debug()),
            other,
        ),
    }
}

/// Every input and output device of the default host.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let _quiet = QuietAlsa::new();
    let host = cpal::default_host();
    let default_in = host.default_input_device().and_then(|d| d.name().ok());
    let default_out = host.default_output_device().and_then(|d| d.name().ok());
    let mut out = Vec::new();
    for (is_input, devices) in [
        (
            true,
            host.input_devices()
                .map_err(|e| device_error("listing input devices", e))?
                .collect::<Vec<_>>(),
        ),
        (
            false,
            host.output_devices()
                .map_err(|e| device_error("listing output devices", e))?
                .collect::<Vec<_>>(),
        ),
    ] {
        for d in devices {
            let name = d.name().unwrap_or_else(|_| "<unnamed>".into());
            let (default_config, supports_24k_mono) = if is_input {
                (
                    d.default_input_config()
                        .map(|c| describe_config(&c))
                        .unwrap_or_else(|e| format!("unavailable ({e})")),
                    d.supported_input_configs()
                        .map(|mut it| it.any(|r| offers_24k_mono(&r)))
                        .unwrap_or(false),
                )
            } else {
                (
                    d.default_output_config()
                        .map(|c| describe_config(&c))
                        .unwrap_or_else(|e| format!("unavailable ({e})")),
                    d.supported_output_configs()
                        .map(|mut it| it.any(|r| offers_24k_mono(&r)))
                        .unwrap_or(false),
                )
            };
            let is_default = if is_input {
                default_in.as_ref() == Some(&name)
            } else {
                default_out.as_ref() == Some(&name)
            };
            out.push(DeviceInfo {
                name,
                is_input,
                is_default,
                default_config,
                supports_24k_mono,
            });
        }
    }
    Ok(out)
}

fn describe_config(c: &cpal::SupportedStreamConfig) -> String {
    format!(
        "{} ch, {} Hz, {}",
        c.channels(),
        c.sample_rate().0,
        c.sample_format()
    )
}

fn offers_24k_mono(r: &cpal::SupportedStreamConfigRange) -> bool {
    r.channels() == 1
        && r.min_sample_rate().0 <= SAMPLE_RATE_HZ
        && r.max_sample_rate().0 >= SAMPLE_RATE_HZ
        && matches!(
            r.sample_format(),
            cpal::SampleFormat::F32 | cpal::SampleFormat::I16
        )
}

fn find_device(host: &cpal::Host, wanted: Option<&str>, input: bool) -> Result<cpal::Device> {
    let kind = if input { "input" } else { "output" };
    match wanted {
        None => {
            let d = if input {
                host.default_input_device()
            } else {
                host.default_output_device()
            };
            d.ok_or_else(|| {
                RuntimeError::Device(format!("no default {kind} device (run `moshi-rs devices`)"))
            })
        }
        Some(name) => {
            let needle = name.to_lowercase();
            let devices: Vec<cpal::Device> = if input {
                host.input_devices()
                    .map_err(|e| device_error("listing input devices", e))?
                    .collect()
            } else {
                host.output_devices()
                    .map_err(|e| device_error("listing output devices", e))?
                    .collect()
            };
            let mut names = Vec::new();
            for d in devices {
                let n = d.name().unwrap_or_default();
                if n == name || n.to_lowercase().contains(&needle) {
                    return Ok(d);
                }
                names.push(n);
            }
            Err(RuntimeError::Device(format!(
                "no {kind} device matching {name:?}; available: {names:?}"
            )))
        }
    }
}

/// The stream config used for one side and the sample format.
#[derive(Debug, Clone)]
struct ChosenConfig {
    config: cpal::StreamConfig,
    sample_format: cpal::SampleFormat,
}

fn choose_config(device: &cpal::Device, input: bool, buffer_ms: u32) -> Result<ChosenConfig> {
    let kind = if input { "input" } else { "output" };
    let name = device.name().unwrap_or_default();
    let configs_error = |e| configs_error(kind, &name, e);
    let ranges: Vec<cpal::SupportedStreamConfigRange> = if input {
        device
            .supported_input_configs()
            .map_err(configs_error)?
            .collect()
    } else {
        device
            .supported_output_configs()
            .map_err(configs_error)?
            .collect()
    };
    // Prefer 24 kHz mono f32, then 24 kHz mono i16, then the device default.
    let preferred = [cpal::SampleFormat::F32, cpal::SampleFormat::I16]
        .iter()
        .find_map(|fmt| {
            ranges
                .iter()
                .find(|r| offers_24k_mono(r) && r.sample_format() == *fmt)
                .map(|r| r.with_sample_rate(cpal::SampleRate(SAMPLE_RATE_HZ)))
        });
    let supported = match preferred {
        Some(s) => s,
        None => {
            let d = if input {
                device.default_input_config()
            } else {
                device.default_output_config()
            };
            let d = d.map_err(|e| device_error(&format!("default {kind} config"), e))?;
            if !matches!(
                d.sample_format(),
                cpal::SampleFormat::F32 | cpal::SampleFormat::I16
            ) {
                return Err(RuntimeError::Device(format!(
                    "{kind} device offers neither 24 kHz mono nor an f32/i16 default (default: {})",
                    describe_config(&d)
                )));
            }
            d
        }
    };
    let rate = supported.sample_rate().0;
    let mut frames = (rate as u64 * buffer_ms as u64 / 1000).max(16) as u32;
    if let cpal::SupportedBufferSize::Range { min, max } = supported.buffer_size() {
        frames = frames.clamp(*min, *max);
    }
    let mut config = supported.config();
    config.buffer_size = cpal::BufferSize::Fixed(frames);
    Ok(ChosenConfig {
        config,
        sample_format: supported.sample_format(),
    })
}

/// Microseconds between two stream instants (no allocation).
fn micros_between(later: &cpal::StreamInstant, earlier: &cpal::StreamInstant) -> Option<u64> {
    later.duration_since(earlier).map(|d| d.as_micros() as u64)
}

/// Stream-clock watch of one side: nanoseconds of each callback's first frame since the
/// stream's first callback, checked by a [`StreamContinuity`] (no allocation).
struct ClockWatch {
    origin: Option<cpal::StreamInstant>,
    continuity: StreamContinuity,
}

impl ClockWatch {
    fn new(side: StreamSide, c: &ChosenConfig) -> Self {
        let rate = c.config.sample_rate.0;
        let buffer_frames = match c.config.buffer_size {
            cpal::BufferSize::Fixed(n) => Some(n),
            cpal::BufferSize::Default => None,
        };
        Self {
            origin: None,
            continuity: StreamContinuity::new(
                side,
                rate,
                StreamContinuity::TIMESTAMP_TOLERANCE_MS,
                buffer_frames,
            ),
        }
    }

    fn observe(
        &mut self,
        first_frame: cpal::StreamInstant,
        samples: usize,
        channels: u16,
        counters: &AudioCounters,
    ) {
        let origin = *self.origin.get_or_insert(first_frame);
        if let Some(d) = first_frame.duration_since(&origin) {
            let frames = samples / usize::from(channels.max(1));
            self.continuity
                .observe(d.as_nanos() as u64, frames, counters);
        }
    }
}

/// While alive, ALSA's own error lines (several per missing card or plugin, printed on stderr
/// as cpal probes devices, before the error moshi-rs reports) are dropped; dropping the guard
/// restores ALSA's default handler. Only device discovery and opening run under it, on the
/// calling thread, never an audio callback.
struct QuietAlsa;

impl QuietAlsa {
    fn new() -> Self {
        #[cfg(target_os = "linux")]
        quiet_alsa::set(true);
        QuietAlsa
    }
}

impl Drop for QuietAlsa {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        quiet_alsa::set(false);
    }
}

#[cfg(target_os = "linux")]
mod quiet_alsa {
    use std::os::raw::{c_char, c_int};

    /// ALSA's error handler type: `(file, line, function, err, fmt, ...)`.
    type Handler =
        unsafe extern "C" fn(*const c_char, c_int, *const c_char, c_int, *const c_char, ...);

    /// Takes the fixed arguments and ignores the printf ones.
    unsafe extern "C" fn drop_message(
        _file: *const c_char,
        _line: c_int,
        _function: *const c_char,
        _err: c_int,
        _fmt: *const c_char,
    ) {
    }

    /// Installs the dropping handler (`true`) or ALSA's default one (`false`).
    pub(super) fn set(quiet: bool) {
        let handler: Option<Handler> = quiet.then(|| {
            let f: unsafe extern "C" fn(*const c_char, c_int, *const c_char, c_int, *const c_char) =
                drop_message;
            // SAFETY: on the C ABIs of Linux (x86-64 SysV, AArch64 AAPCS64) a variadic call
            // passes the fixed arguments exactly as a non-variadic one does, and a callee that
            // never reads the variadic part may ignore it; the pointer types have one size.
            unsafe { std::mem::transmute::<_, Handler>(f) }
        });
        // SAFETY: sets a process-wide function pointer in alsa-lib; `None` restores its default.
        unsafe {
            alsa_sys::snd_lib_error_set_handler(handler);
        }
    }
}

/// A device and its config (input or output).
#[derive(Clone)]
struct DeviceSide {
    device: cpal::Device,
    config: ChosenConfig,
}

impl DeviceSide {
    fn open(host: &cpal::Host, wanted: Option<&str>, input: bool, buffer_ms: u32) -> Result<Self> {
        let device = find_device(host, wanted, input)?;
        let config = choose_config(&device, input, buffer_ms)?;
        Ok(Self { device, config })
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "{} ({} ch, {} Hz, {}, buffer {:?})",
            self.device.name().unwrap_or_default(),
            c.config.channels,
            c.config.sample_rate.0,
            c.sample_format,
            c.config.buffer_size
        )
    }

    fn format(&self) -> StreamFormat {
        StreamFormat {
            sample_rate_hz: self.config.config.sample_rate.0,
            channels: self.config.config.channels,
        }
    }
}

/// Capture and playback (or one of them) on real devices.
pub struct CpalBackend {
    /// `None`: playback only.
    input: Option<DeviceSide>,
    /// `None`: capture only.
    output: Option<DeviceSide>,
    /// The running streams (on their own thread), once started.
    streams: Option<StreamOwner>,
    description: String,
}

impl CpalBackend {
    /// The output device's name as the host gives it (`None`: capture only).
    pub fn output_device_name(&self) -> Option<String> {
        self.output
            .as_ref()
            .map(|o| o.device.name().unwrap_or_default())
    }

    /// Finds the devices and picks their configs (nothing is started yet).
    pub fn open(options: &CpalOptions) -> Result<Self> {
        let _quiet = QuietAlsa::new();
        let host = cpal::default_host();
        let side = |wanted: &Option<String>, input: bool, wanted_side: bool| {
            wanted_side
                .then(|| DeviceSide::open(&host, wanted.as_deref(), input, options.buffer_ms))
                .transpose()
        };
        let input = side(&options.input_device, true, options.capture)?;
        let output = side(&options.output_device, false, options.playback)?;
        let description = format!(
            "{} host; in: {}; out: {}",
            host.id().name(),
            input
                .as_ref()
                .map_or("none (playback only)".into(), DeviceSide::describe),
            output
                .as_ref()
                .map_or("none (capture only)".into(), DeviceSide::describe)
        );
        Ok(Self {
            input,
            output,
            streams: None,
            description,
        })
    }
}

fn error_callback(counters: Arc<AudioCounters>) -> impl FnMut(cpal::StreamError) + Send + 'static {
    move |e| {
        counters.device_errors.fetch_add(1, Ordering::Relaxed);
        if matches!(e, cpal::StreamError::DeviceNotAvailable) {
            counters.device_lost.store(true, Ordering::Relaxed);
        }
    }
}

fn scratch_len(c: &ChosenConfig) -> usize {
    match c.config.buffer_size {
        cpal::BufferSize::Fixed(n) => (n as usize * c.config.channels as usize).max(1024),
        cpal::BufferSize::Default => 8192,
    }
}

/// Builds the streams and starts them (output first, so that no captured sample waits for it);
/// without an output side, capture only (the speaker ring's consumer is dropped); without an
/// input side, playback only (the mic ring's producer is dropped).
fn build_streams(
    input: Option<&DeviceSide>,
    output: Option<&DeviceSide>,
    mic: SampleProducer,
    speaker: SampleConsumer,
    counters: Arc<AudioCounters>,
) -> Result<Vec<cpal::Stream>> {
    let input_stream = input
        .map(|input| build_input_stream(&input.device, &input.config, mic, counters.clone()))
        .transpose()?;
    let output_stream = output
        .map(|output| build_output_stream(output, speaker, counters))
        .transpose()?;
    if let Some(output_stream) = &output_stream {
        output_stream
            .play()
            .map_err(|e| device_error("starting playback", e))?;
    }
    if let Some(input_stream) = &input_stream {
        input_stream
            .play()
            .map_err(|e| device_error("starting capture", e))?;
    }
    Ok(input_stream.into_iter().chain(output_stream).collect())
}

fn build_input_stream(
    input_device: &cpal::Device,
    input: &ChosenConfig,
    mut mic: SampleProducer,
    counters: Arc<AudioCounters>,
) -> Result<cpal::Stream> {
    let in_counters = counters.clone();
    let in_channels = input.config.channels;
    match input.sample_format {
        cpal::SampleFormat::I16 => {
            let mut scratch = vec![0f32; scratch_len(input)];
            let mut watch = ClockWatch::new(StreamSide::Capture, input);
            input_device.build_input_stream(
                &input.config,
                move |data: &[i16], info: &cpal::InputCallbackInfo| {
                    let ts = info.timestamp();
                    watch.observe(ts.capture, data.len(), in_channels, &in_counters);
                    let lat = micros_between(&ts.callback, &ts.capture);
                    capture_callback_converting(data, &mut scratch, &mut mic, &in_counters, lat);
                },
                error_callback(counters.clone()),
                None,
            )
        }
        _ => {
            let mut watch = ClockWatch::new(StreamSide::Capture, input);
            input_device.build_input_stream(
                &input.config,
                move |data: &[f32], info: &cpal::InputCallbackInfo| {
                    let ts = info.timestamp();
                    watch.observe(ts.capture, data.len(), in_channels, &in_counters);
                    let lat = micros_between(&ts.callback, &ts.capture);
                    capture_callback(data, &mut mic, &in_counters, lat);
                },
                error_callback(counters.clone()),
                None,
            )
        }
    }
    .map_err(|e| device_error("opening the input stream", e))
}

fn build_output_stream(
    DeviceSide {
        device: output_device,
        config: output,
    }: &DeviceSide,
    mut speaker: SampleConsumer,
    counters: Arc<AudioCounters>,
) -> Result<cpal::Stream> {
    let out_counters = counters.clone();
    let out_channels = output.config.channels;
    match output.sample_format {
        cpal::SampleFormat::I16 => {
            let mut scratch = vec![0f32; scratch_len(output)];
            let mut watch = ClockWatch::new(StreamSide::Playback, output);
            output_device.build_output_stream(
                &output.config,
                move |data: &mut [i16], info: &cpal::OutputCallbackInfo| {
                    let ts = info.timestamp();
                    watch.observe(ts.playback, data.len(), out_channels, &out_counters);
                    let lat = micros_between(&ts.playback, &ts.callback);
                    playback_callback_converting(
                        data,
                        &mut scratch,
                        &mut speaker,
                        &out_counters,
                        lat,
                    );
                },
                error_callback(counters.clone()),
                None,
            )
        }
        _ => {
            let mut watch = ClockWatch::new(StreamSide::Playback, output);
            output_device.build_output_stream(
                &output.config,
                move |data: &mut [f32], info: &cpal::OutputCallbackInfo| {
                    let ts = info.timestamp();
                    watch.observe(ts.playback, data.len(), out_channels, &out_counters);
                    let lat = micros_between(&ts.playback, &ts.callback);
                    playback_callback(data, &mut speaker, &out_counters, lat);
                },
                error_callback(counters.clone()),
                None,
            )
        }
    }
    .map_err(|e| device_error("opening the output stream", e))
}

/// The streams; dropping them pauses them first.
struct PlayingStreams(Vec<cpal::Stream>);

impl Drop for PlayingStreams {
    fn drop(&mut self) {
        for stream in &self.0 {
            let _ = stream.pause();
        }
    }
}

/// How long [`CpalBackend::start`] waits for the host to open and start the streams.
pub const STREAM_START_TIMEOUT_MS: u64 = 5000;
/// How long [`CpalBackend::stop`] waits for the streams to be dropped before leaving them behind.
pub const STREAM_STOP_TIMEOUT_MS: u64 = 2000;

/// The thread that builds, plays and finally drops the two streams (`cpal::Stream` cannot move
/// between threads). Dropping a stream joins the host's worker thread, and on a lost device that
/// worker can spin forever (cpal's ALSA host joins it with `join().unwrap()`): only this thread
/// ever waits for that, the caller waits at most [`STREAM_STOP_TIMEOUT_MS`].
struct StreamOwner {
    /// A message (or dropping the sender) stops and drops the streams.
    stop_request: mpsc::Sender<()>,
    /// Receives once the streams are dropped.
    stopped: mpsc::Receiver<()>,
}

impl StreamOwner {
    /// Runs `build` on a new thread, which keeps what it built until [`Self::stop_within`] (or
    /// until the owner is dropped) and then drops it there.
    fn spawn<S: 'static>(build: impl FnOnce() -> Result<S> + Send + 'static) -> Result<Self> {
        let (started_tx, started_rx) = mpsc::channel::<Result<()>>();
        let (stop_request, stop_rx) = mpsc::channel::<()>();
        let (stopped_tx, stopped) = mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("moshi-audio-streams".into())
            .spawn(move || {
                let streams = match build() {
                    Ok(streams) => streams,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                // A send error: the caller gave up waiting; the streams are dropped below.
                if started_tx.send(Ok(())).is_ok() {
                    // A stop request, or the owner was dropped.
                    let _ = stop_rx.recv();
                }
                drop(streams);
                let _ = stopped_tx.send(());
            })
            .map_err(|e| device_error("starting the audio stream thread", e))?;
        match started_rx.recv_timeout(Duration::from_millis(STREAM_START_TIMEOUT_MS)) {
            Ok(Ok(())) => Ok(Self {
                stop_request,
                stopped,
            }),
            Ok(Err(e)) => Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(RuntimeError::Device(format!(
                "opening the audio streams: no answer from the host within {STREAM_START_TIMEOUT_MS} ms"
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(RuntimeError::Device(
                "opening the audio streams: the stream thread panicked".into(),
            )),
        }
    }

    /// Stops and drops the streams, waiting at most `timeout`; past it they are left to their
    /// thread (a process exit ends it) and the error says so.
    fn stop_within(self, timeout: Duration) -> Result<()> {
        let _ = self.stop_request.send(());
        match self.stopped.recv_timeout(timeout) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(RuntimeError::Device(format!(
                "the audio streams did not stop within {} ms (the device is probably gone); \
                 left to a background thread",
                timeout.as_millis()
            ))),
        }
    }

    fn stop(self) -> Result<()> {
        self.stop_within(Duration::from_millis(STREAM_STOP_TIMEOUT_MS))
    }
}

impl AudioBackend for CpalBackend {
    fn describe(&self) -> String {
        self.description.clone()
    }
    /// Playback only: 24 kHz mono, so that the engine converts nothing from the microphone it
    /// never hears.
    fn input_format(&self) -> StreamFormat {
        self.input
            .as_ref()
            .map_or(StreamFormat::MOSHI, DeviceSide::format)
    }
    /// Capture only: 24 kHz mono, so that the engine converts nothing for the speaker it
    /// never feeds.
    fn output_format(&self) -> StreamFormat {
        self.output
            .as_ref()
            .map_or(StreamFormat::MOSHI, DeviceSide::format)
    }
    fn plays_output(&self) -> bool {
        self.output.is_some()
    }
    fn start(
        &mut self,
        mic: SampleProducer,
        speaker: SampleConsumer,
        counters: Arc<AudioCounters>,
    ) -> Result<()> {
        if let Some(old) = self.streams.take() {
            // Bounded: a stuck old stream stays behind on its own thread.
            let _ = old.stop();
        }
        let (input, output) = (self.input.clone(), self.output.clone());
        self.streams = Some(StreamOwner::spawn(move || {
            build_streams(input.as_ref(), output.as_ref(), mic, speaker, counters)
                .map(PlayingStreams)
        })?);
        Ok(())
    }
    fn input_finished(&self) -> bool {
        false
    }
    fn finished(&self) -> bool {
        false
    }
    /// Stops the streams, waiting at most [`STREAM_STOP_TIMEOUT_MS`]: past it (a lost device
    /// whose host thread never ends) the streams are left to a background thread and the error
    /// says so; the backend can be dropped or restarted either way.
    fn stop(&mut self) -> Result<Vec<f32>> {
        if let Some(owner) = self.streams.take() {
            owner.stop()?;
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_device_that_never_opened_is_no_usable_device() {
        let e = super::configs_error(
            "input",
            "default",
            cpal::SupportedStreamConfigsError::DeviceNotAvailable,
        )
        .to_string();
        assert!(
            e.contains("no usable input device")
                && e.contains("`default`")
                && e.contains("--input-device")
                && !e.contains("unplugged"),
            "{e}"
        );
    }

    use super::*;
    use std::time::Instant;

    /// Blocks its dropping thread forever, like a stream whose host worker never ends.
    struct StuckOnDrop(mpsc::Receiver<()>);

    impl Drop for StuckOnDrop {
        fn drop(&mut self) {
            let _ = self.0.recv();
        }
    }

    #[test]
    fn stopping_streams_whose_drop_never_returns_gives_up_after_the_timeout() {
        // The sender is kept alive (never sends), so the drop never returns.
        let (keep_stuck, never) = mpsc::channel::<()>();
        let owner = StreamOwner::spawn(move || Ok(StuckOnDrop(never))).unwrap();
        let t = Instant::now();
        let err = owner
            .stop_within(Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(err.contains("did not stop within 200 ms"), "{err}");
        drop(keep_stuck);
    }

    #[test]
    fn stopping_streams_drops_them_on_their_thread() {
        let (dropped_tx, dropped_rx) = mpsc::channel::<()>();
        struct SignalsDrop(mpsc::Sender<()>);
        impl Drop for SignalsDrop {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let owner = StreamOwner::spawn(move || Ok(SignalsDrop(dropped_tx))).unwrap();
        assert!(dropped_rx.try_recv().is_err(), "dropped before the stop");
        owner.stop_within(Duration::from_secs(10)).unwrap();
        dropped_rx.try_recv().expect("dropped by the stop");
    }

    #[test]
    fn a_build_error_is_returned_by_spawn() {
        let err = StreamOwner::spawn(|| -> Result<()> {
            Err(RuntimeError::Device(
                "opening the input stream: gone".into(),
            ))
        })
        .err()
        .expect("an error")
        .to_string();
        assert!(err.contains("opening the input stream: gone"), "{err}");
    }
}
