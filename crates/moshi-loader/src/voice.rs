//! A voice of Kyutai's TTS (`kyutai/tts-voices`: `<voice>.wav.<sig>@<epoch>.safetensors`): the
//! tensor `speaker_wavs` `[1, dim, frames]`, a Mimi latent of the speaker (10 s, 125 frames, in
//! the releases), read here as `[frames, dim]` rows; and the names Kyutai's clients give voices.

use std::path::{Path, PathBuf};

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
    let bad = |reason: String| LoaderError::BadTensor {
        path: path.to_path_buf(),
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
    let channels_first = file.read_f32(VOICE_TENSOR, &shape)?;
    if let Some(v) = channels_first.iter().find(|v| !v.is_finite()) {
        return Err(bad(format!("holds a non-finite value ({v})")));
    }
    let mut values = vec![0f32; frames * dim];
    for (c, row) in channels_first.chunks_exact(frames).enumerate() {
        for (t, &v) in row.iter().enumerate() {
            values[t * dim + c] = v;
        }
    }
    Ok(Voice {
        path: path.to_path_buf(),
        values,
        frames,
        dim,
    })
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
}
