//! Model errors: one variant per thing that can go wrong, each saying what was expected and what
//! was found.

use std::path::PathBuf;

/// Errors raised while building or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Loader(#[from] moshi_loader::LoaderError),
    #[error(transparent)]
    Quant(#[from] moshi_kernels::QuantError),
    /// A buffer or a list handed to the model has the wrong length.
    #[error("{what}: expected {expected}, got {got}")]
    WrongLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A token or code outside its vocabulary.
    #[error("{what} {value}{at} is out of range (the largest allowed is {max}{note})")]
    TokenOutOfRange {
        /// The kind of token, e.g. `audio token`.
        what: &'static str,
        value: u32,
        /// Where it was found, e.g. ` of stream 3`; may be empty.
        at: String,
        max: usize,
        /// Extra context, e.g. `, the initial token`; may be empty.
        note: &'static str,
    },
    /// Codes `[codebook][frame]` whose codebooks hold different numbers of frames.
    #[error("mimi decode: codebook {codebook} has {frames} frames, codebook 0 has {first_frames}")]
    RaggedCodes {
        codebook: usize,
        frames: usize,
        first_frames: usize,
    },
    /// Mimi encode of an empty signal.
    #[error("mimi encode_batch: empty signal")]
    EmptySignal,
    /// More codebooks asked of Mimi than its quantizer has.
    #[error("mimi: {requested} codebooks requested, the quantizer has 1..={available} (n_q)")]
    CodebooksUnavailable { requested: usize, available: usize },
    /// Depformer sub-steps called out of order.
    #[error("depformer sub-step {requested} requested after {done} sub-steps of this frame (dep_q {dep_q})")]
    DepformerOrder {
        requested: usize,
        done: usize,
        dep_q: usize,
    },
    /// The model produced a NaN or an infinity.
    #[error("non-finite {what} logit at step {step} (index {index}: {value}); the weights or inputs are corrupt")]
    NonFiniteLogits {
        what: &'static str,
        step: usize,
        index: usize,
        value: f32,
    },
    /// A checkpoint with tensors the config does not use (made for another config).
    #[error("{path}: {count} tensors are not used by this config ({config}), the checkpoint was made for another config: {shown}")]
    UnusedTensors {
        path: PathBuf,
        count: usize,
        /// The config's sizes that decide which tensors exist.
        config: String,
        /// The first few unused names.
        shown: String,
    },
    /// A sampling parameter that is not a finite number >= 0.
    #[error("sampling: {what} is {value}, expected a finite number >= 0 (0 picks the most probable token)")]
    BadSampling { what: &'static str, value: f32 },
    /// A conditioner the model does not have (Hibiki's is `description`).
    #[error("the model has no conditioner `{name}` (its conditioners: {known:?})")]
    UnknownConditioner { name: String, known: Vec<String> },
    /// A model with a cross-attention conditioner (the TTS's speaker embeddings) was given no
    /// tensor for it.
    #[error("conditioner `{name}` needs a tensor (for a TTS model: a voice); none was given")]
    MissingTensorCondition { name: String },
    /// A TTS script or voice that cannot be spoken.
    #[error("text to speech: {reason}")]
    BadScript { reason: String },
    /// A value a LUT conditioner does not know.
    #[error("conditioner `{conditioner}`: value `{value}` is not one of {possible:?}")]
    UnknownConditionValue {
        conditioner: String,
        value: String,
        possible: Vec<String>,
    },
    /// A classifier-free guidance coefficient that cannot be applied.
    #[error("classifier-free guidance coefficient {cfg_coef}: {reason}")]
    BadGuidance { cfg_coef: f32, reason: &'static str },
    /// A session handed to a batched step runs over other weights than the batch's.
    #[error("a batched step takes sessions over one shared set of LM weights; this session has its own (step it alone or in a batch of its weights)")]
    BatchWeightsDiffer,
    /// Random weights of a shape the packing cannot hold.
    #[error("random weight `{name}` {shape:?}: {cause}")]
    RandomWeight {
        name: String,
        shape: Vec<usize>,
        cause: moshi_kernels::QuantError,
    },
}
