//! Where each canonical LM tensor lives in each checkpoint layout (PyTorch, candle, MLX).

use crate::layout::LmLayout;
use crate::lm_names::{
    canonical_lm_tensors, CanonicalTensor, TensorRole, LOW_RANK, NORM_CROSS, NORM_DEPFORMER_OUT,
};
use crate::LmConfig;

/// One canonical tensor and the stored tensor it is cut from.
#[derive(Clone, Debug)]
pub struct SourceSpec {
    pub canonical: CanonicalTensor,
    /// Tensor name in the file (for a packed MLX matrix: its `.weight` tensor).
    pub stored_name: String,
    /// Shape the stored tensor must have when it is dense (before slicing rows or squeezing).
    pub stored_shape: Vec<usize>,
    /// First row of the stored tensor that belongs to this canonical tensor (stacked PyTorch
    /// depformer projections); the canonical tensor spans `canonical.shape[0]` rows from there.
    pub row_start: usize,
}

impl SourceSpec {
    fn whole(canonical: CanonicalTensor, stored_name: String, stored_shape: Vec<usize>) -> Self {
        Self {
            canonical,
            stored_name,
            stored_shape,
            row_start: 0,
        }
    }
}

/// The sources of every canonical tensor of `cfg` in `layout`.
pub fn lm_sources(layout: LmLayout, cfg: &LmConfig) -> Vec<SourceSpec> {
    canonical_lm_tensors(cfg)
        .into_iter()
        .map(|c| source_of(layout, cfg, c))
        .collect()
}

/// `transformer.layers.{l}.x` / `depformer.{k}.layers.{l}.x` split into parts.
enum Place<'a> {
    Top(&'a str),
    Layer,
    Dep { k: usize, rest: &'a str },
    DepLayer { k: usize, l: &'a str, rest: &'a str },
}

fn place(name: &str) -> Place<'_> {
    if let Some(r) = name.strip_prefix("transformer.layers.") {
        debug_assert!(r.contains('.'), "canonical layer name");
        return Place::Layer;
    }
    if let Some(r) = name.strip_prefix("depformer.") {
        let (k, rest) = r.split_once('.').expect("canonical depformer name");
        let k: usize = k.parse().expect("canonical depformer index");
        if let Some(r) = rest.strip_prefix("layers.") {
            let (l, rest) = r.split_once('.').expect("canonical depformer layer name");
            return Place::DepLayer { k, l, rest };
        }
        return Place::Dep { k, rest };
    }
    Place::Top(name)
}

fn norm_shape(c: &CanonicalTensor) -> Vec<usize> {
    vec![1, 1, c.shape[0]]
}

/// PyTorch and candle share every name outside the depformer.
fn torch_like_name(c: &CanonicalTensor, base: &str) -> (String, Vec<usize>) {
    match c.role {
        TensorRole::Norm => (format!("{base}.alpha"), norm_shape(c)),
        _ if base.ends_with(".in_proj") => (format!("{base}_weight"), c.shape.clone()),
        _ => (format!("{base}.weight"), c.shape.clone()),
    }
}

/// Conditioner tensors have the same names in every layout (Kyutai's MLX and candle loaders
/// keep PyTorch's); `learnt_padding` is stored `[1, 1, dim]`.
fn conditioner_source(c: CanonicalTensor) -> SourceSpec {
    match c.name.strip_suffix(".learnt_padding") {
        Some(_) => {
            let (stored, shape) = (c.name.clone(), norm_shape(&c));
            SourceSpec::whole(c, stored, shape)
        }
        None => {
            let (stored, shape) = (format!("{}.weight", c.name), c.shape.clone());
            SourceSpec::whole(c, stored, shape)
        }
    }
}

/// The cross-attention's LayerNorm (`nn.LayerNorm`: `weight` and `bias`, 1-D) has the same names
/// in every layout.
fn norm_cross_source(c: CanonicalTensor) -> Option<SourceSpec> {
    let stored = if c.name.ends_with(&format!(".{NORM_CROSS}")) {
        format!("{}.weight", c.name)
    } else if c.name.ends_with(&format!(".{NORM_CROSS}.bias")) {
        c.name.clone()
    } else {
        return None;
    };
    let shape = c.shape.clone();
    Some(SourceSpec::whole(c, stored, shape))
}

/// The depformer's output LayerNorm (`weight` and `bias`, 1-D): PyTorch's
/// `depformer_norms.{k}`; in the candle and MLX layouts (which Kyutai's Rust and MLX code do not
/// define for it) beside the sub-step's other tensors, as this engine exports them.
fn depformer_norm_source(layout: LmLayout, c: CanonicalTensor) -> Option<SourceSpec> {
    let Place::Dep { k, rest } = place(&c.name) else {
        return None;
    };
    let part = match rest.strip_prefix(NORM_DEPFORMER_OUT)? {
        "" => "weight",
        ".bias" => "bias",
        _ => return None,
    };
    let stored = match layout {
        LmLayout::PyTorch => format!("depformer_norms.{k}.{part}"),
        LmLayout::Candle => format!("depformer.{k}.{NORM_DEPFORMER_OUT}.{part}"),
        LmLayout::Mlx => format!("depformer.slices.{k}.{NORM_DEPFORMER_OUT}.{part}"),
    };
    let shape = c.shape.clone();
    Some(SourceSpec::whole(c, stored, shape))
}

fn source_of(layout: LmLayout, cfg: &LmConfig, c: CanonicalTensor) -> SourceSpec {
    let name = c.name.clone();
    if c.role == TensorRole::Conditioner {
        return conditioner_source(c);
    }
    if c.role == TensorRole::Norm {
        if let Some(spec) = depformer_norm_source(layout, c.clone()) {
            return spec;
        }
    }
    if c.role == TensorRole::Norm && name.contains(NORM_CROSS) {
        if let Some(spec) = norm_cross_source(c.clone()) {
            return spec;
        }
    }
    match layout {
        LmLayout::PyTorch => pytorch_source(cfg, c, &name),
        LmLayout::Candle => {
            let base = match place(&name) {
                Place::DepLayer { k, l, rest } => {
                    format!("depformer.{k}.transformer.layers.{l}.{rest}")
                }
                _ => name.clone(),
            };
            let (stored, shape) = torch_like_name(&c, &base);
            SourceSpec::whole(c, stored, shape)
        }
        LmLayout::Mlx => {
            let base = match place(&name) {
                Place::Top(n) => match n.strip_prefix("emb.") {
                    Some(i) => format!("audio_embs.{i}"),
                    None => n.to_string(),
                },
                Place::Layer => name.clone(),
                Place::Dep { k, rest } => format!("depformer.slices.{k}.{rest}"),
                Place::DepLayer { k, l, rest } => {
                    format!("depformer.slices.{k}.transformer.layers.{l}.{rest}")
                }
            };
            let shape = c.shape.clone();
            SourceSpec::whole(c, format!("{base}.weight"), shape)
        }
    }
}

fn pytorch_source(cfg: &LmConfig, c: CanonicalTensor, name: &str) -> SourceSpec {
    let ddim = cfg.depformer_dim;
    match place(name) {
        Place::Top(_) | Place::Layer => {
            let (stored, shape) = torch_like_name(&c, name);
            SourceSpec::whole(c, stored, shape)
        }
        Place::Dep { k, rest } => {
            let emb = if k == 0 {
                "depformer_text_emb".to_string()
            } else {
                format!("depformer_emb.{}", k - 1)
            };
            let stored = match rest {
                "linear_in" => format!("depformer_in.{}.weight", cfg.depformer_weight_set(k)),
                "linear_out" => format!("linears.{k}.weight"),
                LOW_RANK => format!("{emb}.low_rank.weight"),
                // A demuxed embedding's projections (`ScaledEmbedding.out1` / `.out2`).
                _ if rest.starts_with("emb.") => format!("{emb}.{}.weight", &rest["emb.".len()..]),
                _ => format!("{emb}.weight"),
            };
            let shape = c.shape.clone();
            SourceSpec::whole(c, stored, shape)
        }
        Place::DepLayer { k, l, rest } => {
            let p = format!("depformer.layers.{l}");
            // Sub-step k reads weight set `schedule[k]` of the stacked projections.
            let (k, sets) = (cfg.depformer_weight_set(k), cfg.depformer_weight_sets());
            match rest {
                "norm1" | "norm2" => {
                    let shape = norm_shape(&c);
                    SourceSpec::whole(c, format!("{p}.{rest}.alpha"), shape)
                }
                "self_attn.in_proj" => {
                    let rows = ddim + 2 * cfg.depformer_kv_dim();
                    SourceSpec {
                        stored_name: format!("{p}.self_attn.in_proj_weight"),
                        stored_shape: vec![sets * rows, ddim],
                        row_start: k * rows,
                        canonical: c,
                    }
                }
                "self_attn.out_proj" => SourceSpec {
                    stored_name: format!("{p}.self_attn.out_proj.weight"),
                    stored_shape: vec![sets * ddim, ddim],
                    row_start: k * ddim,
                    canonical: c,
                },
                gating => {
                    let shape = c.shape.clone();
                    let lin = gating
                        .strip_prefix("gating.")
                        .expect("canonical gating name");
                    SourceSpec::whole(c, format!("{p}.gating.{k}.{lin}.weight"), shape)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::lm_names::CONDITIONER_PREFIX;
    use crate::SafetensorsFile;

    fn stored(layout: LmLayout, canonical: &str) -> (String, Vec<usize>, usize) {
        let cfg = LmConfig::moshiko_7b();
        let s = lm_sources(layout, &cfg)
            .into_iter()
            .find(|s| s.canonical.name == canonical)
            .unwrap();
        (s.stored_name, s.stored_shape, s.row_start)
    }

    #[test]
    fn moshiko_7b_pytorch_names_and_shapes_match_the_release() {
        // Shapes of kyutai/moshiko-pytorch-bf16 (moshi-facts.md 3.2).
        let cases: [(&str, &str, &[usize], usize); 10] = [
            ("text_emb", "text_emb.weight", &[32001, 4096], 0),
            ("emb.15", "emb.15.weight", &[2049, 4096], 0),
            ("out_norm", "out_norm.alpha", &[1, 1, 4096], 0),
            (
                "transformer.layers.31.self_attn.in_proj",
                "transformer.layers.31.self_attn.in_proj_weight",
                &[12288, 4096],
                0,
            ),
            (
                "transformer.layers.0.gating.linear_in",
                "transformer.layers.0.gating.linear_in.weight",
                &[22528, 4096],
                0,
            ),
            (
                "transformer.layers.0.gating.linear_out",
                "transformer.layers.0.gating.linear_out.weight",
                &[4096, 11264],
                0,
            ),
            (
                "depformer.7.layers.5.self_attn.in_proj",
                "depformer.layers.5.self_attn.in_proj_weight",
                &[24576, 1024],
                7 * 3072,
            ),
            (
                "depformer.2.layers.0.self_attn.out_proj",
                "depformer.layers.0.self_attn.out_proj.weight",
                &[8192, 1024],
                2 * 1024,
            ),
            (
                "depformer.3.layers.1.gating.linear_in",
                "depformer.layers.1.gating.3.linear_in.weight",
                &[5632, 1024],
                0,
            ),
            (
                "depformer.1.emb",
                "depformer_emb.0.weight",
                &[2049, 1024],
                0,
            ),
        ];
        for (canonical, name, shape, row) in cases {
            assert_eq!(
                stored(LmLayout::PyTorch, canonical),
                (name.to_string(), shape.to_vec(), row),
                "{canonical}"
            );
        }
        assert_eq!(
            stored(LmLayout::PyTorch, "depformer.0.emb").0,
            "depformer_text_emb.weight"
        );
        assert_eq!(
            stored(LmLayout::PyTorch, "depformer.4.linear_out").0,
            "linears.4.weight"
        );
    }

    #[test]
    fn extra_heads_have_one_name_in_every_layout() {
        // PyTorch `LMModel.extra_heads` (nn.ModuleList), moshi-core's `vb.pp("extra_heads").pp(i)`,
        // moshi_mlx's `Lm.extra_heads` list (`load_pytorch_weights` copies the keys as they are).
        let mut cfg = LmConfig::moshiko_7b();
        cfg.extra_heads_num_heads = 4;
        for layout in [LmLayout::PyTorch, LmLayout::Candle, LmLayout::Mlx] {
            let spec = lm_sources(layout, &cfg)
                .into_iter()
                .find(|s| s.canonical.name == "extra_heads.3")
                .unwrap();
            assert_eq!(spec.stored_name, "extra_heads.3.weight");
            assert_eq!(spec.stored_shape, vec![6, 4096]);
            assert_eq!(spec.canonical.role, TensorRole::Linear);
        }
    }

    /// The distinct tensors stored for `cfg` in the PyTorch layout (the depformer's weight sets
    /// stacked as the release stores them), with their shapes.
    fn pytorch_stored(cfg: &LmConfig) -> BTreeMap<String, Vec<usize>> {
        lm_sources(LmLayout::PyTorch, cfg)
            .into_iter()
            .map(|s| (s.stored_name, s.stored_shape))
            .collect()
    }

    /// The release's `config.json` values (configs/tts-1.6b-en_fr.json) give exactly the 418
    /// tensors of `kyutai/tts-1.6b-en_fr`'s checkpoint (as the official `get_moshi_lm` builds
    /// them; 8 of them `condition_provider.*`); the same mapping gives the tiny-tts fixture's
    /// stored tensors name for name and shape for shape, so the count is the layout's.
    #[test]
    fn the_tts_release_config_gives_the_releases_418_tensors() {
        let tiny_cfg =
            LmConfig::from_file(moshi_test_support::fixture("tiny-tts", "config.json")).unwrap();
        let file =
            SafetensorsFile::open(moshi_test_support::fixture("tiny-tts", "model.safetensors"))
                .unwrap();
        let in_file: BTreeMap<String, Vec<usize>> = file
            .tensors()
            .iter()
            .map(|(name, info)| (name.clone(), info.shape.clone()))
            .collect();
        assert_eq!(pytorch_stored(&tiny_cfg), in_file);

        let root = moshi_test_support::repo_root();
        let cfg = LmConfig::from_file(root.join("configs/tts-1.6b-en_fr.json")).unwrap();
        assert!(cfg.is_text_to_speech() && cfg.unknown.is_empty());
        let stored = pytorch_stored(&cfg);
        assert_eq!(stored.len(), 418);
        let conditioners = stored
            .keys()
            .filter(|n| n.starts_with(CONDITIONER_PREFIX))
            .count();
        assert_eq!(conditioners, 8);
        assert_eq!(
            stored["depformer.layers.3.self_attn.in_proj_weight"],
            [11 * 3 * 1024, 1024]
        );
        assert_eq!(
            stored["condition_provider.conditioners.speaker_wavs.output_proj.weight"],
            [2048, 512]
        );
        // The stored parameters (docs/tts.md): 3.67 GB of bf16, the conditioners f32.
        let parameters: usize = stored.values().map(|s| s.iter().product::<usize>()).sum();
        assert_eq!(parameters, 1_836_550_272);
    }

    #[test]
    fn candle_and_mlx_names_follow_kyutai_import_scripts() {
        let name = |l, c| stored(l, c).0;
        assert_eq!(
            name(LmLayout::Candle, "depformer.3.linear_in"),
            "depformer.3.linear_in.weight"
        );
        assert_eq!(
            name(LmLayout::Candle, "depformer.3.layers.1.self_attn.in_proj"),
            "depformer.3.transformer.layers.1.self_attn.in_proj_weight"
        );
        assert_eq!(
            name(LmLayout::Candle, "depformer.3.layers.1.norm1"),
            "depformer.3.transformer.layers.1.norm1.alpha"
        );
        assert_eq!(name(LmLayout::Mlx, "emb.4"), "audio_embs.4.weight");
        assert_eq!(name(LmLayout::Mlx, "out_norm"), "out_norm.weight");
        assert_eq!(stored(LmLayout::Mlx, "out_norm").1, vec![4096]);
        assert_eq!(
            name(LmLayout::Mlx, "depformer.6.layers.2.gating.linear_out"),
            "depformer.slices.6.transformer.layers.2.gating.linear_out.weight"
        );
        assert_eq!(
            name(LmLayout::Mlx, "transformer.layers.3.self_attn.in_proj"),
            "transformer.layers.3.self_attn.in_proj.weight"
        );
        assert_eq!(
            name(LmLayout::Mlx, "depformer.0.emb"),
            "depformer.slices.0.emb.weight"
        );
    }
}
