//! The building blocks both the LM and Mimi are made of: one linear layer over dense or packed
//! weights, RoPE, the ring KV cache, multi-head self- and cross-attention, norms. The products themselves run in
//! `moshi-kernels`.

pub mod attention;
pub mod cross_attention;
pub mod kv_cache;
pub mod linear;
pub mod norm;
pub mod rope;

pub use attention::{Attention, AttentionScratch};
pub use cross_attention::{CrossAttention, CrossAttentionScratch, CrossKeysValues};
pub use kv_cache::{KvCache, KvPrecision};
pub use linear::{Linear, LinearWeights, ReducedPrecision};
pub use rope::{Rope, RopeRotation};
