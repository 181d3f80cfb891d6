//! One module per `moshi-rs` subcommand.

pub mod bench;
pub mod chat;
pub mod codec;
pub mod devices;
pub mod echo_args;
pub mod file;
pub mod flag_values;
pub mod inspect;
pub mod live;
pub mod model_args;
pub mod outputs;
pub mod quantize;
pub mod serve;
pub mod signals;
pub mod speak;
pub mod stdout;
pub mod transcribe;
pub mod transcribe_mic;
pub mod transcript;

/// Fixes the kernel of this process's products from how many activation rows they will have
/// (sessions stepped together, times 2 with guidance), so that the default kernel is the fastest
/// for that (`moshi_kernels::Workload`), and logs the kernel chosen. A kernel fixed earlier (a
/// product ran first) stays, with a warning where the workload would have picked another.
pub fn declare_workload(rows_per_product: usize) {
    use moshi_kernels::{Kernel, Workload};
    let kernel = Kernel::init(Workload::of_rows(rows_per_product)).unwrap_or_else(|e| {
        tracing::warn!("{e}");
        e.chosen
    });
    tracing::info!("kernels: {kernel} ({rows_per_product} activation row(s) per product)");
}
