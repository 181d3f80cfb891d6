//! One module per `moshi-rs` subcommand.

pub mod bench;
pub mod chat;
pub mod codec;
pub mod devices;
pub mod file;
pub mod flag_values;
pub mod inspect;
pub mod model_args;
pub mod quantize;
pub mod serve;
pub mod transcript;
