//! The canonical LM weight names and their logical shapes, derived from an `LmConfig`.

use crate::LmConfig;

/// What a canonical tensor is used as (decides how it is converted on load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// RMSNorm gain, 1-D, always handed over as f32.
    Norm,
    /// Embedding table `[vocab, width]`.
    Embedding,
    /// Linear layer weight `[out, in]`.
    Linear,
    /// Part of a conditioner (`condition_provider.*`: LUT table, projection, learnt padding):
    /// evaluated once at load, always handed over as f32 and never quantized (Kyutai keeps
    /// the condition provider in float32).
    Conditioner,
}

/// One tensor the LM expects, under its canonical name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

fn t(name: String, shape: Vec<usize>, role: TensorRole) -> CanonicalTensor {
    CanonicalTensor { name, shape, role }
}

/// Every canonical LM tensor for `cfg`, in a stable order (see COMMON.md for the names); the
/// extra heads (STT) and then the conditioners' tensors (Hibiki) come last.
pub fn canonical_lm_tensors(cfg: &LmConfig) -> Vec<CanonicalTensor> {
    use TensorRole::*;
    let (dim, ddim) = (cfg.dim, cfg.depformer_dim);
    let (hidden, dhidden) = (cfg.hidden_dim(), cfg.depformer_hidden_dim());
    let mut out = vec![
        t("text_emb".into(), vec![cfg.text_card + 1, dim], Embedding),
        t("text_linear".into(), vec![cfg.text_card, dim], Linear),
        t("out_norm".into(), vec![dim], Norm),
    ];
    if cfg.demux_second_stream {
        out.extend(demux_projections("text_emb", dim, dim));
    }
    for i in 0..cfg.n_q {
        out.push(t(format!("emb.{i}"), vec![cfg.card + 1, dim], Embedding));
    }
    for l in 0..cfg.num_layers {
        let p = format!("transformer.layers.{l}");
        out.push(t(format!("{p}.norm1"), vec![dim], Norm));
        out.push(t(format!("{p}.norm2"), vec![dim], Norm));
        out.push(t(
            format!("{p}.self_attn.in_proj"),
            vec![dim + 2 * cfg.kv_dim(), dim],
            Linear,
        ));
        out.push(t(format!("{p}.self_attn.out_proj"), vec![dim, dim], Linear));
        out.push(t(
            format!("{p}.gating.linear_in"),
            vec![2 * hidden, dim],
            Linear,
        ));
        out.push(t(
            format!("{p}.gating.linear_out"),
            vec![dim, hidden],
            Linear,
        ));
        if cfg.cross_attention {
            out.push(t(format!("{p}.{NORM_CROSS}"), vec![dim], Norm));
            out.push(t(format!("{p}.{NORM_CROSS}.bias"), vec![dim], Norm));
            out.push(t(
                format!("{p}.cross_attention.in_proj"),
                vec![3 * dim, dim],
                Linear,
            ));
            out.push(t(
                format!("{p}.cross_attention.out_proj"),
                vec![dim, dim],
                Linear,
            ));
        }
    }
    for k in 0..cfg.dep_q {
        let p = format!("depformer.{k}");
        out.push(t(format!("{p}.linear_in"), vec![ddim, dim], Linear));
        let vocab = if k == 0 {
            cfg.text_card + 1
        } else {
            cfg.card + 1
        };
        out.push(t(
            format!("{p}.emb"),
            vec![vocab, cfg.depformer_emb_width()],
            Embedding,
        ));
        if let Some(r) = cfg.depformer_low_rank_embeddings {
            out.push(t(format!("{p}.{LOW_RANK}"), vec![ddim, r], Linear));
        }
        if k == 0 && cfg.demux_second_stream {
            out.extend(demux_projections(
                &format!("{p}.emb"),
                ddim,
                cfg.depformer_emb_width(),
            ));
        }
        out.push(t(format!("{p}.linear_out"), vec![cfg.card, ddim], Linear));
        if cfg.depformer_norm.is_some() {
            out.push(t(format!("{p}.{NORM_DEPFORMER_OUT}"), vec![ddim], Norm));
            out.push(t(
                format!("{p}.{NORM_DEPFORMER_OUT}.bias"),
                vec![ddim],
                Norm,
            ));
        }
        for l in 0..cfg.depformer_num_layers {
            let q = format!("{p}.layers.{l}");
            out.push(t(format!("{q}.norm1"), vec![ddim], Norm));
            out.push(t(format!("{q}.norm2"), vec![ddim], Norm));
            out.push(t(
                format!("{q}.self_attn.in_proj"),
                vec![ddim + 2 * cfg.depformer_kv_dim(), ddim],
                Linear,
            ));
            out.push(t(
                format!("{q}.self_attn.out_proj"),
                vec![ddim, ddim],
                Linear,
            ));
            out.push(t(
                format!("{q}.gating.linear_in"),
                vec![2 * dhidden, ddim],
                Linear,
            ));
            out.push(t(
                format!("{q}.gating.linear_out"),
                vec![ddim, dhidden],
                Linear,
            ));
        }
    }
    // Extra heads (Kyutai's STT voice activity): `extra_heads.{i}.weight` in the PyTorch,
    // candle and MLX layouts alike (`LMModel.extra_heads`, moshi-core's `vb.pp("extra_heads")`,
    // moshi_mlx's `Lm.extra_heads`).
    for i in 0..cfg.extra_heads_num_heads {
        out.push(t(
            format!("{EXTRA_HEADS_PREFIX}{i}"),
            vec![cfg.extra_heads_dim, dim],
            Linear,
        ));
    }
    for (name, c) in &cfg.conditioners {
        let p = format!("{CONDITIONER_PREFIX}{name}");
        let input_dim = if let Some(lut) = c.lut() {
            out.push(t(
                format!("{p}.embed"),
                vec![lut.rows(), lut.dim],
                Conditioner,
            ));
            lut.dim
        } else if let Some(tensor) = c.tensor() {
            tensor.dim
        } else {
            continue;
        };
        out.push(t(
            format!("{p}.output_proj"),
            vec![dim, input_dim],
            Conditioner,
        ));
        out.push(t(format!("{p}.learnt_padding"), vec![dim], Conditioner));
    }
    out
}

/// The two projections of a demuxed embedding `{table}` (`out1` for the main stream, `out2`
/// for the second), `[width, table width]` each.
fn demux_projections(table: &str, width: usize, table_width: usize) -> [CanonicalTensor; 2] {
    [DEMUX_MAIN, DEMUX_SECOND].map(|o| {
        t(
            format!("{table}.{o}"),
            vec![width, table_width],
            TensorRole::Linear,
        )
    })
}

/// The projection of a demuxed embedding's main stream (`{table}.out1`).
pub const DEMUX_MAIN: &str = "out1";
/// The projection of a demuxed embedding's second stream (`{table}.out2`).
pub const DEMUX_SECOND: &str = "out2";
/// The LayerNorm before a temporal layer's cross-attention (`{layer}.norm_cross`, its gain; the
/// bias is `{layer}.norm_cross.bias`).
pub const NORM_CROSS: &str = "norm_cross";

/// The LayerNorm on sub-step `k`'s depformer output before its linear (`depformer_norm`,
/// Kyutai's `depformer_norms.{k}`): canonical `depformer.{k}.out_norm` (gain) and
/// `depformer.{k}.out_norm.bias`.
pub const NORM_DEPFORMER_OUT: &str = "out_norm";

/// The projection of a low-rank embedding (`depformer.{k}.emb.low_rank`, after its table).
pub const LOW_RANK: &str = "emb.low_rank";

/// Prefix of the extra heads' tensors (`extra_heads.{i}`, the same in every layout).
pub const EXTRA_HEADS_PREFIX: &str = "extra_heads.";

/// Prefix of the conditioner tensors (the same in the PyTorch, candle and MLX layouts).
pub const CONDITIONER_PREFIX: &str = "condition_provider.conditioners.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_b_parameter_count_matches_the_published_total() {
        let cfg = LmConfig::moshiko_7b();
        let total: usize = canonical_lm_tensors(&cfg)
            .iter()
            .filter(|t| {
                // PyTorch shares depformer norms across steps: count them once.
                !(t.role == TensorRole::Norm
                    && t.name.starts_with("depformer.")
                    && !t.name.starts_with("depformer.0."))
            })
            .map(|t| t.shape.iter().product::<usize>())
            .sum();
        assert_eq!(total, 7_687_729_152);
    }
}
