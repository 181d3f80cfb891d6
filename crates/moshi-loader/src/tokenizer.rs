//! The text tokenizer: a SentencePiece `.model` file parsed by hand and turned into a
//! `tokenizers::Tokenizer` (Unigram with byte fallback, precompiled-charsmap normalizer,
//! Metaspace), plus SentencePiece-exact decoding and an incremental decoder for token streams.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip as DecoderStrip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::unigram::Unigram;
use tokenizers::normalizers::{NormalizerWrapper, Precompiled, Replace, Sequence, Strip};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::Tokenizer;

use crate::input_file::read_capped;
use crate::sentencepiece_proto::{ModelType, SentencePieceModel};
pub use crate::text_decode::{IncrementalDecoder, PieceTable};
use crate::{LoaderError, Result};

/// The largest tokenizer file read (Kyutai's 32k-piece model is 553 KB; the largest
/// SentencePiece models are a few MB).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// Kyutai's text tokenizer.
#[derive(Clone)]
pub struct TextTokenizer {
    path: PathBuf,
    model: Arc<SentencePieceModel>,
    table: Arc<PieceTable>,
    /// `None` for non-unigram models: those can decode but not encode.
    hf: Option<Tokenizer>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl TextTokenizer {
    /// Reads a SentencePiece `.model` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = read_capped(path, MAX_TOKENIZER_BYTES, "a SentencePiece model")?;
        Self::from_bytes(&bytes, path)
    }

    /// Parses the bytes of a `.model` file; `path` names it in errors.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let model = SentencePieceModel::parse(bytes, path)?;
        let hf = if model.trainer.model_type == ModelType::Unigram {
            Some(build_hf_tokenizer(&model, path)?)
        } else {
            tracing::warn!(
                "{}: SentencePiece model type {:?}: decoding works, encoding text is not supported",
                path.display(),
                model.trainer.model_type
            );
            None
        };
        let table = Arc::new(PieceTable::new(&model));
        Ok(Self {
            path: path.to_path_buf(),
            model: Arc::new(model),
            table,
            hf,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed SentencePiece model.
    pub fn model(&self) -> &SentencePieceModel {
        &self.model
    }

    /// The equivalent `tokenizers::Tokenizer` (unigram models only).
    pub fn hf_tokenizer(&self) -> Option<&Tokenizer> {
        self.hf.as_ref()
    }

    pub fn vocab_size(&self) -> usize {
        self.model.pieces.len()
    }

    /// Encodes text like `SentencePieceProcessor::encode` (no BOS/EOS added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let hf = self.hf.as_ref().ok_or_else(|| LoaderError::BadTokenizer {
            path: self.path.clone(),
            reason: format!(
                "encoding needs a UNIGRAM model, this one is {:?}",
                self.model.trainer.model_type
            ),
        })?;
        let enc = hf
            .encode(text, false)
            .map_err(|e| LoaderError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids like `SentencePieceProcessor::decode`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let n = self.vocab_size();
        let ids: Vec<usize> = ids
            .iter()
            .map(|&id| {
                (id as usize).lt(&n).then_some(id as usize).ok_or_else(|| {
                    LoaderError::Tokenizer(format!(
                        "id {id} is outside the vocabulary of {n} pieces ({})",
                        self.path.display()
                    ))
                })
            })
            .collect::<Result<_>>()?;
        Ok(self.table.decode(&ids))
    }

    /// The end-of-sequence id (`</s>`, SentencePiece's `eos_id`), if the model has one: Hibiki
    /// ends its translation with it.
    pub fn eos_id(&self) -> Option<u32> {
        u32::try_from(self.model.trainer.eos_id)
            .ok()
            .filter(|&id| (id as usize) < self.model.pieces.len())
    }

    /// The padding id (SentencePiece's `pad_id`), if the model has one: Hibiki-Zero's
    /// `decode_outputs` cuts a translation without EOS before its last non-PAD text token.
    pub fn pad_id(&self) -> Option<u32> {
        u32::try_from(self.model.trainer.pad_id)
            .ok()
            .filter(|&id| (id as usize) < self.model.pieces.len())
    }

    /// The piece string of `id` (e.g. `▁hello`, `<0x41>`, `<pad>`).
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.model.pieces.get(id as usize).map(|p| p.piece.clone())
    }

    /// An incremental decoder that skips ids 0 (EPAD) and 3 (PAD) and out-of-vocabulary ids.
    pub fn incremental_decoder(&self) -> IncrementalDecoder {
        IncrementalDecoder::new(self.table.clone())
    }
}

fn hf_err(
    path: &Path,
    what: &str,
) -> impl Fn(Box<dyn std::error::Error + Send + Sync>) -> LoaderError {
    let (path, what) = (path.to_path_buf(), what.to_string());
    move |e| LoaderError::BadTokenizer {
        path: path.clone(),
        reason: format!("{what}: {e}"),
    }
}

/// Builds the `tokenizers` pipeline equivalent to the SentencePiece model (as HF's converter does).
fn build_hf_tokenizer(model: &SentencePieceModel, path: &Path) -> Result<Tokenizer> {
    let vocab: Vec<(String, f64)> = model
        .pieces
        .iter()
        .map(|p| (p.piece.clone(), f64::from(p.score)))
        .collect();
    let unk = usize::try_from(model.trainer.unk_id).ok();
    let unigram = Unigram::from(vocab, unk, model.trainer.byte_fallback)
        .map_err(hf_err(path, "unigram model"))?;
    let mut tokenizer = Tokenizer::new(unigram);

    let spec = &model.normalizer;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if !spec.precompiled_charsmap.is_empty() {
        let charsmap = Precompiled::from(&spec.precompiled_charsmap).map_err(|e| {
            LoaderError::BadTokenizer {
                path: path.to_path_buf(),
                reason: format!(
                    "normalizer `{}`: bad precompiled_charsmap ({} bytes): {e}",
                    spec.name,
                    spec.precompiled_charsmap.len()
                ),
            }
        })?;
        normalizers.push(charsmap.into());
    }
    if spec.remove_extra_whitespaces {
        normalizers.push(Strip::new(true, true).into());
        let collapse = Replace::new(
            tokenizers::normalizers::replace::ReplacePattern::Regex(" {2,}".into()),
            " ",
        )
        .map_err(hf_err(path, "whitespace normalizer"))?;
        normalizers.push(collapse.into());
    }
    tokenizer.with_normalizer(Some(Sequence::new(normalizers)));

    let prepend = if spec.add_dummy_prefix {
        PrependScheme::Always
    } else {
        PrependScheme::Never
    };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('\u{2581}', prepend, true)));

    let space = Replace::new("\u{2581}", " ").map_err(hf_err(path, "decoder"))?;
    let strip_first = usize::from(spec.add_dummy_prefix);
    let decoders: Vec<DecoderWrapper> = vec![
        space.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
        DecoderStrip::new(' ', strip_first, 0).into(),
    ];
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}
