//! `chat --echo-cancel on|off|auto` and the processing that comes with it (`--noise-suppression`,
//! `--gain-control`): whether the microphone is cleaned of what the speaker plays
//! (`moshi_runtime::echo_cancel`), and how `auto` decides.

use moshi_runtime::echo_cancel::EchoCancelConfig;

/// `--echo-cancel`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoCancelMode {
    On,
    Off,
    /// On, unless the output device's name says it is headphones.
    Auto,
}

#[derive(clap::Args, Debug)]
pub struct EchoArgs {
    /// Cancel the speaker's echo in the microphone (WebRTC AEC3), so that Moshi does not hear
    /// itself on laptop speakers. `auto`: on unless the output device's name names headphones
    /// (headphone, headset, earphone, earbud, airpods); the system default device is taken as
    /// speakers.
    #[arg(long, value_enum, default_value_t = EchoCancelMode::Auto, value_name = "MODE")]
    pub echo_cancel: EchoCancelMode,
    /// WebRTC's noise suppressor on the microphone after echo cancellation (off by default:
    /// Moshi was trained on raw microphone audio).
    #[arg(long)]
    pub noise_suppression: bool,
    /// WebRTC's adaptive digital gain (AGC2) on the microphone after echo cancellation (off by
    /// default, as `--noise-suppression`).
    #[arg(long)]
    pub gain_control: bool,
}

/// Words in an output device's name that mean headphones (compared in lower case).
const HEADPHONE_WORDS: [&str; 6] = [
    "headphone",
    "headset",
    "earphone",
    "earbud",
    "airpods",
    "casque",
];

/// Whether the output device's name says it is headphones.
pub fn is_headphones(output_device_name: &str) -> bool {
    let name = output_device_name.to_lowercase();
    HEADPHONE_WORDS.iter().any(|w| name.contains(w))
}

impl EchoArgs {
    /// The echo canceller to run for the output device `output_device_name` (`None`: none), and
    /// why, for the console. `--noise-suppression` or `--gain-control` with the canceller
    /// turned off is an error (they run inside it).
    pub fn resolve(
        &self,
        output_device_name: Option<&str>,
    ) -> anyhow::Result<(Option<EchoCancelConfig>, String)> {
        let config = EchoCancelConfig {
            noise_suppression: self.noise_suppression,
            gain_control: self.gain_control,
        };
        let name = output_device_name.unwrap_or("");
        let (on, why) = match self.echo_cancel {
            EchoCancelMode::On => (true, "--echo-cancel on".to_string()),
            EchoCancelMode::Off => (false, "--echo-cancel off".to_string()),
            EchoCancelMode::Auto if is_headphones(name) => {
                (false, format!("auto: output device {name:?} is headphones"))
            }
            EchoCancelMode::Auto => (
                true,
                format!("auto: output device {name:?} taken as speakers"),
            ),
        };
        if !on && (self.noise_suppression || self.gain_control) {
            anyhow::bail!(
                "--noise-suppression and --gain-control run inside the echo canceller, which is off ({why}); \
                 add --echo-cancel on"
            );
        }
        Ok((on.then_some(config), why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: EchoCancelMode, ns: bool) -> EchoArgs {
        EchoArgs {
            echo_cancel: mode,
            noise_suppression: ns,
            gain_control: false,
        }
    }

    #[test]
    fn auto_is_on_for_speakers_and_off_for_headphones() {
        let auto = args(EchoCancelMode::Auto, false);
        for speakers in ["default", "pulse", "Built-in Audio Analog Stereo", ""] {
            assert!(
                auto.resolve(Some(speakers)).unwrap().0.is_some(),
                "{speakers}"
            );
        }
        assert!(auto.resolve(None).unwrap().0.is_some());
        for phones in ["USB Headset Mono", "Jabra EVOLVE HEADPHONES", "AirPods Pro"] {
            let (config, why) = auto.resolve(Some(phones)).unwrap();
            assert!(config.is_none(), "{phones}");
            assert!(why.contains("headphones"), "{why}");
        }
    }

    #[test]
    fn on_and_off_are_obeyed_whatever_the_device() {
        assert!(args(EchoCancelMode::On, false)
            .resolve(Some("headset"))
            .unwrap()
            .0
            .is_some());
        assert!(args(EchoCancelMode::Off, false)
            .resolve(Some("speakers"))
            .unwrap()
            .0
            .is_none());
    }

    #[test]
    fn noise_suppression_without_the_canceller_is_refused() {
        let e = args(EchoCancelMode::Off, true)
            .resolve(Some("default"))
            .unwrap_err();
        assert!(e.to_string().contains("--noise-suppression"), "{e}");
        let (config, _) = args(EchoCancelMode::On, true).resolve(None).unwrap();
        assert!(config.unwrap().noise_suppression);
    }
}
