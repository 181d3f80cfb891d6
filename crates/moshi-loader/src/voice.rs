//! A voice of Kyutai's TTS (`kyutai/tts-voices`: `<voice>.wav.<sig>@<epoch>.safetensors`): the
//! tensor `speaker_wavs` `[1, dim, frames]`, a Mimi latent of the speaker (10 s, 125 frames, in
//! the releases), read here as `[frames, dim]` rows; the names Kyutai's clients give voices, and where they
//! are found (a folder or a Hub repo).

use std::path::{Path, PathBuf};

use crate::hub::{HubRepo, HubSettings};
use crate::source::is_repo_id;
use crate::{LoaderError, Result, SafetensorsFile};

/// The tensor a voice file holds.
pub const VOICE_TENSOR: &str = "speaker_wavs";
/// The longest voice read, in frames (Kyutai's are 125: 10 s at 12.5 Hz).
pub const MAX_VOICE_FRAMES: usize = 12_500;

/// A speaker embedding, `[frames, dim]` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Voice {
    pub path: PathBuf,
    pub values: Vec<f32>,
    pub frames: usize,
    pub dim: usize,
}

/// Reads the voice at `path`, whose width must be `dim` (the model's `speaker_wavs` width).
pub fn load_voice(path: &Path, dim: usize) -> Result<Voice> {
    let file = SafetensorsFile::open(path)?;
    let info = file.info(VOICE_TENSOR)?;
    let shape = info.shape.clone();
    check_voice_shape(path, &shape, dim)?;
    let channels_first = file.read_f32(VOICE_TENSOR, &shape)?;
    Voice::from_channels_first(path, &shape, &channels_first, dim)
}

/// The frames of a `[1, dim, frames]` voice shape, or why it is not one the model takes.
fn check_voice_shape(origin: &Path, shape: &[usize], dim: usize) -> Result<usize> {
    let bad = |reason: String| LoaderError::BadTensor {
        path: origin.to_path_buf(),
        name: VOICE_TENSOR.to_string(),
        reason,
    };
    let [1, d, frames] = shape[..] else {
        return Err(bad(format!(
            "shape {shape:?}, expected [1, {dim}, frames] (a kyutai/tts-voices embedding)"
        )));
    };
    if d != dim {
        return Err(bad(format!(
            "width {d}, the model's speaker_wavs conditioner takes {dim}: a voice made for another model?"
        )));
    }
    if !(1..=MAX_VOICE_FRAMES).contains(&frames) {
        return Err(bad(format!(
            "{frames} frames, expected 1 to {MAX_VOICE_FRAMES}"
        )));
    }
    Ok(frames)
}

impl Voice {
    /// A voice from its `speaker_wavs` values as stored (`[1, dim, frames]`, channels first),
    /// checked as a voice file is; `origin` names where it came from in errors (a file, or a
    /// client's message).
    pub fn from_channels_first(
        origin: &Path,
        shape: &[usize],
        channels_first: &[f32],
        dim: usize,
    ) -> Result<Self> {
        let frames = check_voice_shape(origin, shape, dim)?;
        let bad = |reason: String| LoaderError::BadTensor {
            path: origin.to_path_buf(),
            name: VOICE_TENSOR.to_string(),
            reason,
        };
        if channels_first.len() != frames * dim {
            return Err(bad(format!(
                "{} values for shape {shape:?} ({} expected)",
                channels_first.len(),
                frames * dim
            )));
        }
        if let Some(v) = channels_first.iter().find(|v| !v.is_finite()) {
            return Err(bad(format!("holds a non-finite value ({v})")));
        }
        let mut values = vec![0f32; frames * dim];
        for (c, row) in channels_first.chunks_exact(frames).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                values[t * dim + c] = v;
            }
        }
        Ok(Self {
            path: origin.to_path_buf(),
            values,
            frames,
            dim,
        })
    }
}

/// Where the voice `name` lives in a voices folder, as Kyutai's clients name voices: the path in
/// the voices repo without the model's suffix (`expresso/ex03-ex01_happy_001_channel1_334s.wav`
/// is `<folder>/expresso/ex03-ex01_happy_001_channel1_334s.wav<suffix>`), or a `.safetensors`
/// file named in full. `None` for a name that would leave the folder.
pub fn voice_path(folder: &Path, name: &str, suffix: &str) -> Option<PathBuf> {
    let relative = Path::new(name);
    let escapes = relative
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)));
    if name.is_empty() || escapes {
        return None;
    }
    if name.ends_with(".safetensors") {
        return Some(folder.join(relative));
    }
    Some(folder.join(format!("{name}{suffix}")))
}

/// Kyutai's voices repo (`tts_pytorch.py --voice-repo`): where voices are looked up by name
/// when the model folder has no `voices/`.
pub const DEFAULT_VOICE_REPO: &str = "kyutai/tts-voices";
/// How moshi-server's TTS config names a voices repo on the Hub (`hf-snapshot://owner/name`).
const HF_SNAPSHOT_PREFIX: &str = "hf-snapshot://";

/// Where voices are looked up by name: a folder laid out as `kyutai/tts-voices`, or such a repo
/// on the Hugging Face Hub (each voice downloaded into the HF cache when first named, or read
/// from the cache when offline).
#[derive(Clone, Debug)]
pub enum VoiceSource {
    Folder(PathBuf),
    Hub { repo: String, settings: HubSettings },
}

impl VoiceSource {
    /// `spec`: an existing folder, else a Hub repo id (`kyutai/tts-voices`, or moshi-server's
    /// `hf-snapshot://kyutai/tts-voices`); Hub access as `settings` says.
    pub fn parse(spec: &str, settings: impl FnOnce() -> HubSettings) -> Result<Self> {
        let path = Path::new(spec);
        if path.is_dir() {
            return Ok(Self::Folder(path.to_path_buf()));
        }
        let repo = spec.strip_prefix(HF_SNAPSHOT_PREFIX).unwrap_or(spec);
        if is_repo_id(repo) {
            return Ok(Self::Hub {
                repo: repo.to_string(),
                settings: settings(),
            });
        }
        Err(LoaderError::NotFound {
            what: spec.to_string(),
            reason: "the voices: no such folder, and not a Hugging Face repo id of the form `owner/name` \
                     (e.g. kyutai/tts-voices)"
                .into(),
        })
    }

    /// The file of the voice `name` (a path in the voices repo, without the model's `suffix`),
    /// downloaded first for a Hub repo; an error for a name that would leave the folder or repo.
    pub fn locate(&self, name: &str, suffix: &str) -> Result<PathBuf> {
        let outside = || LoaderError::NotFound {
            what: crate::escape::escape_controls(name).into_owned(),
            reason: format!(
                "a voice name is a path inside the voices {}",
                self.describe()
            ),
        };
        match self {
            Self::Folder(folder) => voice_path(folder, name, suffix).ok_or_else(outside),
            Self::Hub { repo, settings } => {
                let relative = voice_path(Path::new(""), name, suffix).ok_or_else(outside)?;
                let hub = HubRepo::new(repo, settings);
                if settings.offline {
                    let path = hub.cached_snapshot()?.join(&relative);
                    return match path.is_file() {
                        true => Ok(path),
                        false => Err(LoaderError::NotFound {
                            what: path.display().to_string(),
                            reason: format!(
                                "HF_HUB_OFFLINE is set and the cached `{repo}` has no such voice"
                            ),
                        }),
                    };
                }
                let file: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                hub.download(&file.join("/"))
            }
        }
    }

    /// The folder's path, or the repo's id, for messages ("folder DIR", "repo `ID` ...").
    pub fn describe(&self) -> String {
        match self {
            Self::Folder(f) => format!("folder {}", f.display()),
            Self::Hub { repo, .. } => format!("repo `{repo}` (Hugging Face)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_inside_the_folder_only() {
        let folder = Path::new("/voices");
        assert_eq!(
            voice_path(folder, "expresso/a.wav", ".1e68beda@240.safetensors").unwrap(),
            Path::new("/voices/expresso/a.wav.1e68beda@240.safetensors")
        );
        assert_eq!(
            voice_path(folder, "x/b.safetensors", ".s@1.safetensors").unwrap(),
            Path::new("/voices/x/b.safetensors")
        );
        for bad in ["", "../etc/passwd", "/abs.wav", "a/../../b"] {
            assert!(
                voice_path(folder, bad, ".s@1.safetensors").is_none(),
                "{bad}"
            );
        }
    }

    fn offline_settings(cache_dir: &Path) -> HubSettings {
        HubSettings {
            cache_dir: cache_dir.to_path_buf(),
            endpoint: "http://127.0.0.1:1".into(),
            token: None,
            offline: true,
            progress: false,
        }
    }

    #[test]
    fn voice_sources_are_folders_or_hub_repos() {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().to_str().unwrap();
        let settings = || offline_settings(Path::new("/nowhere"));
        assert!(
            matches!(VoiceSource::parse(spec, settings).unwrap(), VoiceSource::Folder(f) if f == dir.path())
        );
        for spec in ["kyutai/tts-voices", "hf-snapshot://kyutai/tts-voices"] {
            match VoiceSource::parse(spec, settings).unwrap() {
                VoiceSource::Hub { repo, .. } => assert_eq!(repo, "kyutai/tts-voices"),
                other => panic!("{spec}: {other:?}"),
            }
        }
        let e = VoiceSource::parse("no/such/folder", settings)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no/such/folder") && e.contains("owner/name"),
            "{e}"
        );
    }

    /// Offline, a Hub voice is read from the HF cache's snapshot of the repo; a name leaving
    /// the repo and a voice the cache lacks are refused, naming them.
    #[test]
    fn hub_voices_come_from_the_cache_offline() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--kyutai--tts-voices");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        let voice = repo.join("snapshots/abc123/expresso/a.wav.s@1.safetensors");
        std::fs::create_dir_all(voice.parent().unwrap()).unwrap();
        std::fs::write(&voice, b"x").unwrap();
        let source =
            VoiceSource::parse("kyutai/tts-voices", || offline_settings(cache.path())).unwrap();
        assert_eq!(
            source.locate("expresso/a.wav", ".s@1.safetensors").unwrap(),
            voice
        );
        let e = source
            .locate("expresso/b.wav", ".s@1.safetensors")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expresso/b.wav") && e.contains("HF_HUB_OFFLINE"),
            "{e}"
        );
        let e = source
            .locate("../x.wav", ".s@1.safetensors")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("inside the voices") && e.contains("kyutai/tts-voices"),
            "{e}"
        );
    }
}
