//! Model errors.

/// Errors raised while building or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Loader(#[from] moshi_loader::LoaderError),
    #[error(transparent)]
    Quant(#[from] moshi_kernels::QuantError),
    #[error("bad config: {0}")]
    Config(String),
    #[error("bad input: {0}")]
    Input(String),
    #[error("{0}")]
    Other(String),
}
