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
}

/// How the end of a stream's input is fed to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndOfInput {
    /// The stream never ends (a conversation).
    Never,
    /// One frame whose user codes are all `card` (`run_inference.py` for Hibiki), then silence
    /// until the model's text returns the tokenizer's EOS.
    AllUserCodesCardThenSilenceUntilEos,
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
}

const CONVERSATION: Conventions = Conventions {
    name: "moshi (conversation)",
    conditions: &[],
    negative_conditions: &[],
    first_frame_lm_steps: 2,
    end_of_input: EndOfInput::Never,
    text_input_alias: None,
};

const TRANSLATION: Conventions = Conventions {
    name: "hibiki (speech translation)",
    conditions: &[("description", "very_good")],
    negative_conditions: &[("description", "very_bad")],
    first_frame_lm_steps: 2,
    end_of_input: EndOfInput::AllUserCodesCardThenSilenceUntilEos,
    text_input_alias: Some((2, 3)),
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
    /// The kind of a config: `model_type` `hibiki` translates; anything else converses (a
    /// conditioned config that is not Hibiki is refused by [`LmConfig::validate`]).
    pub fn of(cfg: &LmConfig) -> Self {
        if cfg.is_translation() {
            ModelKind::Translation
        } else {
            ModelKind::Conversation
        }
    }

    /// This kind's conventions.
    pub fn conventions(self) -> &'static Conventions {
        match self {
            ModelKind::Conversation => &CONVERSATION,
            ModelKind::Translation => &TRANSLATION,
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
        assert_eq!(ModelKind::of(&cfg), ModelKind::Translation);
        let t = ModelKind::Translation.conventions();
        assert_eq!(t.text_input_alias, Some((2, 3)));
        assert_eq!(
            ModelKind::Conversation.conventions().end_of_input,
            EndOfInput::Never
        );
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
