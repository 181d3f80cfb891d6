//! Writes a q8_0 GGUF of a PyTorch-layout Moshi LM checkpoint the way Kyutai's candle release
//! (`kyutai/moshiko-candle-q8`, `model.q8.gguf`) is made: the tensors renamed to the candle
//! layout as Kyutai's `scripts/import_rust.py` does, then quantized with candle's `QTensor` and
//! written with candle's `gguf_file::write`. Which tensors become q8_0 follows candle's
//! `tensor-tools quantize`: matrices whose rows are whole 32-value blocks; everything else (the
//! `[1, 1, D]` norm gains) stays f32.
//!
//! Besides `model.q8.gguf` it writes `dequant.safetensors`: candle's own f32 dequantization of a
//! few q8_0 tensors, the ground truth for the reader's unpacking.
//!
//! Usage: `gguf-candle IN_FOLDER OUT_FOLDER` (IN_FOLDER holds `model.safetensors` and
//! `config.json`: `dep_q`, `depformer_num_layers`, `depformer_dim`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Result, Tensor};

/// Tensors whose candle dequantization is kept as ground truth (small, and one of each kind).
const DEQUANT_REFERENCE: [&str; 3] = [
    "depformer.0.linear_out.weight",
    "depformer.1.transformer.layers.0.self_attn.in_proj_weight",
    "emb.0.weight",
];

fn config_usize(config: &str, key: &str) -> usize {
    let at = config
        .find(&format!("\"{key}\""))
        .unwrap_or_else(|| panic!("config.json has no `{key}`"));
    let rest = &config[at + key.len() + 2..];
    let digits: String = rest
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().expect("an integer")
}

/// The candle layout of a PyTorch-layout checkpoint (Kyutai's `import_rust.py`).
fn to_candle_layout(
    pt: &HashMap<String, Tensor>,
    dep_q: usize,
    dep_layers: usize,
) -> Result<Vec<(String, Tensor)>> {
    let mut out: Vec<(String, Tensor)> = pt
        .iter()
        .filter(|(n, _)| !n.starts_with("depformer") && !n.starts_with("linears."))
        .map(|(n, t)| (n.clone(), t.clone()))
        .collect();
    let get = |n: &str| pt.get(n).unwrap_or_else(|| panic!("missing `{n}`")).clone();
    for k in 0..dep_q {
        let base = format!("depformer.{k}");
        out.push((
            format!("{base}.linear_in.weight"),
            get(&format!("depformer_in.{k}.weight")),
        ));
        out.push((
            format!("{base}.linear_out.weight"),
            get(&format!("linears.{k}.weight")),
        ));
        let emb = match k {
            0 => "depformer_text_emb.weight".to_string(),
            _ => format!("depformer_emb.{}.weight", k - 1),
        };
        out.push((format!("{base}.emb.weight"), get(&emb)));
        for l in 0..dep_layers {
            let (src, dst) = (
                format!("depformer.layers.{l}"),
                format!("{base}.transformer.layers.{l}"),
            );
            for norm in ["norm1", "norm2"] {
                out.push((
                    format!("{dst}.{norm}.alpha"),
                    get(&format!("{src}.{norm}.alpha")),
                ));
            }
            for (from, to) in [
                ("self_attn.in_proj_weight", "self_attn.in_proj_weight"),
                ("self_attn.out_proj.weight", "self_attn.out_proj.weight"),
            ] {
                let stacked = get(&format!("{src}.{from}"));
                out.push((
                    format!("{dst}.{to}"),
                    stacked.chunk(dep_q, 0)?[k].contiguous()?,
                ));
            }
            for lin in ["linear_in", "linear_out"] {
                out.push((
                    format!("{dst}.gating.{lin}.weight"),
                    get(&format!("{src}.gating.{k}.{lin}.weight")),
                ));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, output] = args.as_slice() else {
        panic!("usage: gguf-candle IN_FOLDER OUT_FOLDER");
    };
    let (input, output) = (Path::new(input), Path::new(output));
    let config = std::fs::read_to_string(input.join("config.json"))?;
    let dep_q = config_usize(&config, "dep_q");
    let dep_layers = config_usize(&config, "depformer_num_layers");
    let pt = candle_core::safetensors::load(input.join("model.safetensors"), &Device::Cpu)?;
    let mut quantized = Vec::new();
    for (name, tensor) in to_candle_layout(&pt, dep_q, dep_layers)? {
        let q8 = tensor.rank() == 2 && tensor.dim(1)? % GgmlDType::Q8_0.block_size() == 0;
        let dtype = if q8 { GgmlDType::Q8_0 } else { GgmlDType::F32 };
        quantized.push((name, QTensor::quantize(&tensor, dtype)?));
    }
    std::fs::create_dir_all(output)?;
    let mut file = std::fs::File::create(output.join("model.q8.gguf"))?;
    let tensors: Vec<(&str, &QTensor)> = quantized.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut file, &[], &tensors)?;
    let mut reference = HashMap::new();
    for name in DEQUANT_REFERENCE {
        let (_, q) = quantized
            .iter()
            .find(|(n, _)| n == name)
            .expect("a q8_0 tensor");
        assert_eq!(q.dtype(), GgmlDType::Q8_0, "{name}");
        reference.insert(name.to_string(), q.dequantize(&Device::Cpu)?);
    }
    candle_core::safetensors::save(&reference, output.join("dequant.safetensors"))?;
    println!(
        "wrote {} tensors ({} q8_0)",
        quantized.len(),
        quantized
            .iter()
            .filter(|(_, t)| t.dtype() == GgmlDType::Q8_0)
            .count()
    );
    Ok(())
}
