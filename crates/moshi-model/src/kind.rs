//! Model types and their conventions: what differs between the members of the Moshi family is
//! data here (conditions, end of input, how the first frame is fed, text aliases), so that a
//! new model type adds one variant and its [`Conventions`], and the generator and the pipeline
//! read them instead of testing the type.

use moshi_loader::LmConfig;

use crate::generator::Conditioning;

/// Which member of the Moshi family a config describes (its `model_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Moshi: full-duplex conversation, the user's audio in, text and Moshi's audio out, no end.
    Conversation,
    /// Hibiki: speech translation, conditioned and guided; its input ends with an end-of-stream
    /// frame and its output with EOS.
    Translation,
    /// Hibiki-Zero (`model_type` `hibiki` without conditioners, Kyutai's `hibiki-zero`):
    /// speech translation fed as `hibiki_zero.run.generate` feeds it (warm-up frames, the
    /// end-of-input frame in place of a frame, a fixed generation length), no guidance.
    TranslationZero,
    /// Kyutai's speech-to-text (`model_type` `stt`, `dep_q` 0): the user's audio in, a text
    /// delayed by `stt_config.audio_delay_seconds` out, no audio; extra heads (voice activity)
    /// read at every step.
    SpeechToText,
    /// Kyutai's text-to-speech (`model_type` `tts`): text in through the TTS state machine
    /// ([`crate::tts`]), conditioned on a voice, every codebook generated, no user audio.
    TextToSpeech,
}

/// What is fed before the input's first frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeadingSilence {
    /// Nothing.
    None,
    /// `ceil(stt_config.audio_silence_prefix_seconds x 12.5)` frames of silence, each through
    /// Mimi's encoder (`stt_from_file_pytorch.py`).
    SttSilencePrefix,
    /// `max_delay` warm-up frames: the codes of `max_delay` frames of silence encoded by a Mimi
    /// encoder of their own (`hibiki_zero.inference.encode_inputs`), so the input's encoder
    /// starts fresh. Fed by `moshi_runtime::translate::translate_window` (a file only: Kyutai's
    /// live server feeds none).
    MaxDelaySilenceOwnEncoder,
}

/// What becomes of the samples after the input's last whole frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialLastFrame {
    /// Dropped (`run_inference.py`: T = len / 1920 frames).
    Drop,
    /// Zero-padded into a whole frame (`stt_from_file_pytorch.py`).
    ZeroPad,
}

/// How the end of a stream's input is fed to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndOfInput {
    /// The stream never ends (a conversation).
    Never,
    /// One frame whose user codes are all `card` (`run_inference.py` for Hibiki), then silence
    /// until the model's text returns the tokenizer's EOS.
    AllUserCodesCardThenSilenceUntilEos,
    /// Hibiki-Zero (`hibiki_zero.inference.add_input_eos`): the input zero-padded to the
    /// generation length is encoded whole, and the frame at `ceil(duration x 12.5)` has its user
    /// codes replaced by `card`: Mimi's encoder still consumes that frame's samples (silence).
    /// Then silence until the generation length; the output ends at the first EOS.
    AllUserCodesCardInPlaceOfAFrame,
    /// `ceil(stt_config.audio_delay_seconds x 12.5)` frames of silence through Mimi's encoder,
    /// so that the text of the input's last words comes out (`stt_from_file_pytorch.py`).
    SilenceForTextDelay,
}

/// The conventions of one model type, from Kyutai's sources.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Conventions {
    /// A short name for messages and `inspect`.
    pub name: &'static str,
    /// `(conditioner, value)` pairs a session is conditioned on (`run_inference.py`).
    pub conditions: &'static [(&'static str, &'static str)],
    /// The negative row of classifier-free guidance.
    pub negative_conditions: &'static [(&'static str, &'static str)],
    /// LM steps the first frame takes: `run_inference.py` feeds the first frame twice (the
    /// first step only fills the acoustic delays), so that T frames in give T frames out.
    pub first_frame_lm_steps: usize,
    /// How the input ends.
    pub end_of_input: EndOfInput,
    /// A text input read with another token's embedding row, `(read, as)`: Kyutai's loader
    /// gives a Hibiki model's EOS (2) PAD's row (3), so an EOS sampled before the end of the
    /// input acts as a pause (`loaders.get_moshi`).
    pub text_input_alias: Option<(u32, u32)>,
    /// What is fed before the first frame.
    pub leading_silence: LeadingSilence,
    /// What becomes of a file's samples after its last whole frame.
    pub partial_last_frame: PartialLastFrame,
    /// Whether the model generates audio (a depformer and Mimi's decoder); `false`: text only.
    pub generates_audio: bool,
    /// Whether Mimi's encoder restarts after a stream's first audio frame (whose codes are still
    /// fed): `hibiki_zero.inference.ServerState.recv_loop`'s `skip_frames`, so the second frame
    /// is encoded as a first (with the encoder's left padding again).
    pub reset_encoder_after_first_frame: bool,
}

const CONVERSATION: Conventions = Conventions {
    name: "moshi (conversation)",
    conditions: &[],
    negative_conditions: &[],
    first_frame_lm_steps: 2,
    end_of_input: EndOfInput::Never,
    text_input_alias: None,
    leading_silence: LeadingSilence::None,
    partial_last_frame: PartialLastFrame::Drop,
    generates_audio: true,
    reset_encoder_after_first_frame: false,
};

const TRANSLATION: Conventions = Conventions {
    name: "hibiki (speech translation)",
    conditions: &[("description", "very_good")],
    negative_conditions: &[("description", "very_bad")],
    first_frame_lm_steps: 2,
    end_of_input: EndOfInput::AllUserCodesCardThenSilenceUntilEos,
    text_input_alias: Some((2, 3)),
    leading_silence: LeadingSilence::None,
    partial_last_frame: PartialLastFrame::Drop,
    generates_audio: true,
    reset_encoder_after_first_frame: false,
};

/// Kyutai's `hibiki-zero` 0.0.4: no conditioner, each frame fed once (the first too), a Hibiki
/// model, so EOS is read with PAD's row (`loaders.get_moshi`). A file (`run.generate`,
/// `inference.encode_inputs`, `add_input_eos`; `moshi_runtime::translate::translate_window`):
/// warm-up frames, the last partial frame zero-padded, the end-of-input frame in place of a
/// frame. A live stream (`inference.ServerState`): no warm-up, no end, Mimi's encoder restarted
/// after the first frame.
const TRANSLATION_ZERO: Conventions = Conventions {
    name: "hibiki-zero (speech translation)",
    conditions: &[],
    negative_conditions: &[],
    first_frame_lm_steps: 1,
    end_of_input: EndOfInput::AllUserCodesCardInPlaceOfAFrame,
    text_input_alias: Some((2, 3)),
    leading_silence: LeadingSilence::MaxDelaySilenceOwnEncoder,
    partial_last_frame: PartialLastFrame::ZeroPad,
    generates_audio: true,
    reset_encoder_after_first_frame: true,
};

/// Kyutai's `delayed-streams-modeling` `stt_from_file_pytorch.py` (and moshi-server's ASR): each
/// chunk fed once (the first frame too: the text has no acoustic delay to fill), silence before
/// and after the audio, the audio zero-padded to whole frames.
const SPEECH_TO_TEXT: Conventions = Conventions {
    name: "stt (speech to text)",
    conditions: &[],
    negative_conditions: &[],
    first_frame_lm_steps: 1,
    end_of_input: EndOfInput::SilenceForTextDelay,
    text_input_alias: None,
    leading_silence: LeadingSilence::SttSilencePrefix,
    partial_last_frame: PartialLastFrame::ZeroPad,
    generates_audio: false,
    reset_encoder_after_first_frame: false,
};

/// Kyutai's `tts_pytorch.py` / `TTSModel`: conditioned on `control` = `ok` (the guidance
/// strength, `cfg`, is chosen per session); no input audio, so the pipeline's audio conventions
/// do not apply.
const TEXT_TO_SPEECH: Conventions = Conventions {
    name: "tts (text to speech)",
    conditions: &[("control", "ok")],
    negative_conditions: &[],
    first_frame_lm_steps: 1,
    end_of_input: EndOfInput::Never,
    text_input_alias: None,
    leading_silence: LeadingSilence::None,
    partial_last_frame: PartialLastFrame::Drop,
    generates_audio: true,
    reset_encoder_after_first_frame: false,
};

impl Conventions {
    /// What a session of a model of this type with `cfg` is conditioned on, guided with
    /// `cfg_coef`: the type's conditions where the model has conditioners (a model without any
    /// takes none: guidance is then refused when the session is made).
    pub fn conditioning(&self, cfg: &LmConfig, cfg_coef: f32) -> Conditioning {
        if cfg.is_conditioned() {
            Conditioning::new(self.conditions, self.negative_conditions, cfg_coef)
        } else {
            Conditioning {
                cfg_coef,
                ..Conditioning::none()
            }
        }
    }
}

impl ModelKind {
    /// The kind of a config: `model_type` `hibiki` translates (Hibiki-Zero when it has no
    /// conditioner), `stt` transcribes; anything
    /// else converses (a conditioned config that is not Hibiki, and a config without a
    /// depformer that is not STT, are refused by [`LmConfig::validate`]).
    pub fn of(cfg: &LmConfig) -> Self {
        if cfg.is_hibiki_zero() {
            ModelKind::TranslationZero
        } else if cfg.is_translation() {
            ModelKind::Translation
        } else if cfg.is_speech_to_text() {
            ModelKind::SpeechToText
        } else if cfg.is_text_to_speech() {
            ModelKind::TextToSpeech
        } else {
            ModelKind::Conversation
        }
    }

    /// This kind's conventions.
    pub fn conventions(self) -> &'static Conventions {
        match self {
            ModelKind::Conversation => &CONVERSATION,
            ModelKind::Translation => &TRANSLATION,
            ModelKind::TranslationZero => &TRANSLATION_ZERO,
            ModelKind::SpeechToText => &SPEECH_TO_TEXT,
            ModelKind::TextToSpeech => &TEXT_TO_SPEECH,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_follows_model_type() {
        let mut cfg = LmConfig::moshiko_7b();
        assert_eq!(ModelKind::of(&cfg), ModelKind::Conversation);
        cfg.model_type = Some("hibiki".into());
        // Without conditioners: Hibiki-Zero; with the description conditioner: Hibiki.
        assert_eq!(ModelKind::of(&cfg), ModelKind::TranslationZero);
        cfg.conditioners.insert(
            "description".into(),
            serde_json::from_str(r#"{"type": "lut", "lut": {"n_bins": 2, "dim": 4, "tokenizer": "noop", "possible_values": ["very_good", "very_bad"]}}"#).unwrap(),
        );
        assert_eq!(ModelKind::of(&cfg), ModelKind::Translation);
        let t = ModelKind::Translation.conventions();
        assert_eq!(t.text_input_alias, Some((2, 3)));
        assert_eq!(
            ModelKind::Conversation.conventions().end_of_input,
            EndOfInput::Never
        );
    }

    #[test]
    fn a_hibiki_config_without_conditioners_is_hibiki_zero() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tiny-hibiki-zero/config.json"
        ))
        .unwrap();
        let cfg = LmConfig::from_json_str(&text, std::path::Path::new("config.json")).unwrap();
        assert_eq!(ModelKind::of(&cfg), ModelKind::TranslationZero);
        let c = ModelKind::TranslationZero.conventions();
        assert_eq!(c.first_frame_lm_steps, 1);
        assert_eq!(c.end_of_input, EndOfInput::AllUserCodesCardInPlaceOfAFrame);
        assert_eq!(c.leading_silence, LeadingSilence::MaxDelaySilenceOwnEncoder);
        assert_eq!(c.partial_last_frame, PartialLastFrame::ZeroPad);
        assert_eq!(c.text_input_alias, Some((2, 3)));
        assert!(c.conditioning(&cfg, 1.0).values.is_empty());
    }

    #[test]
    fn an_stt_config_is_speech_to_text_fed_once_without_audio_out() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tiny-stt/config.json"
        ))
        .unwrap();
        let cfg = LmConfig::from_json_str(&text, std::path::Path::new("config.json")).unwrap();
        assert_eq!(ModelKind::of(&cfg), ModelKind::SpeechToText);
        let c = ModelKind::SpeechToText.conventions();
        assert_eq!(c.first_frame_lm_steps, 1);
        assert_eq!(c.end_of_input, EndOfInput::SilenceForTextDelay);
        assert_eq!(c.leading_silence, LeadingSilence::SttSilencePrefix);
        assert_eq!(c.partial_last_frame, PartialLastFrame::ZeroPad);
        assert!(!c.generates_audio);
    }

    #[test]
    fn only_a_model_with_conditioners_is_conditioned() {
        let mut cfg = LmConfig::moshiko_7b();
        cfg.model_type = Some("hibiki".into());
        let t = ModelKind::Translation.conventions();
        let none = t.conditioning(&cfg, 1.0);
        assert!(none.values.is_empty() && none.negative.is_empty());
        cfg.conditioners.insert(
            "description".into(),
            serde_json::from_str(r#"{"type": "lut", "lut": {"n_bins": 2, "dim": 4, "tokenizer": "noop", "possible_values": ["very_good", "very_bad"]}}"#).unwrap(),
        );
        let guided = t.conditioning(&cfg, 3.0);
        assert_eq!(
            guided.values,
            [("description".to_string(), "very_good".to_string())]
        );
        assert_eq!(guided.negative[0].1, "very_bad");
        assert!(guided.is_guided());
    }
}
