//! `moshi-rs devices`: lists the audio input and output devices of the default host, with
//! their default configuration and whether they offer 24 kHz mono directly (no resampling).

use moshi_runtime::backend::cpal::list_devices;

#[derive(clap::Args, Debug)]
pub struct DevicesArgs {}

pub fn run(_args: DevicesArgs) -> anyhow::Result<()> {
    let devices = list_devices()?;
    if devices.is_empty() {
        println!("no audio devices found");
        return Ok(());
    }
    for is_input in [true, false] {
        println!(
            "{}:",
            if is_input {
                "input devices"
            } else {
                "output devices"
            }
        );
        for d in devices.iter().filter(|d| d.is_input == is_input) {
            println!(
                "  {}{}  [default config: {}; 24 kHz mono: {}]",
                d.name,
                if d.is_default { " (default)" } else { "" },
                d.default_config,
                if d.supports_24k_mono {
                    "yes"
                } else {
                    "no, resampled"
                }
            );
        }
    }
    Ok(())
}
