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
pub mod transcribe;
pub mod transcript;

/// Tells the kernels how many activation rows this process's products will have (sessions
/// stepped together, times 2 with guidance), before the first product, so that the default
/// kernel is the fastest for that (`moshi_kernels::Workload`), and logs the kernel chosen.
pub fn declare_workload(rows_per_product: usize) {
    use moshi_kernels::{Kernel, Workload};
    let workload = Workload::of_rows(rows_per_product);
    if let Err(chosen) = Kernel::set_workload(workload) {
        tracing::warn!(
            "the {} kernel was chosen before the workload ({workload:?}) was declared",
            chosen.name()
        );
    }
    tracing::info!(
        "kernels: {} ({rows_per_product} activation row(s) per product)",
        Kernel::detect().name()
    );
}
