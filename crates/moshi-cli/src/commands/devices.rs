//! `moshi-rs devices`: lists the audio input and output devices of the default host, with
//! their default configuration and whether they offer 24 kHz mono directly (no resampling).

use moshi_runtime::backend::cpal::list_devices;

#[derive(clap::Args, Debug)]
pub struct DevicesArgs {}

pub fn run(_args: DevicesArgs) -> anyhow::Result<()> {
    let devices = list_devices()?;
    if devices.is_empty() {
        return super::stdout::print("no audio devices found\n");
    }
    let mut s = String::new();
    for is_input in [true, false] {
        s += &format!(
            "{}:\n",
            if is_input {
                "input devices"
            } else {
                "output devices"
            }
        );
        for d in devices.iter().filter(|d| d.is_input == is_input) {
            s += &format!(
                "  {}{}  [default config: {}; 24 kHz mono: {}]\n",
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
    super::stdout::print(&s)
}
