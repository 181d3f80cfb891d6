//! The matrix shapes of Moshi 7B's per-token products (moshiko: dim 4096, FFN 11264, text
//! vocabulary 32000; depformer dim 1024, FFN 2816, audio vocabulary 2048), as the benchmarks
//! use them: `(name, in_features, out_features)`; and the speech-to-text 1B's (dim 2048).

/// The temporal transformer's products and text head first ([`LARGE_SHAPES`] of them), then the
/// depformer's.
pub const MOSHI_7B_MATVEC_SHAPES: [(&str, usize, usize); 11] = [
    ("attn in_proj", 4096, 12288),
    ("attn out_proj", 4096, 4096),
    ("gating in", 4096, 22528),
    ("gating out", 11264, 4096),
    ("text head", 4096, 32000),
    ("dep in_proj", 1024, 3072),
    ("dep out_proj", 1024, 1024),
    ("dep gating in", 1024, 5632),
    ("dep gating out", 2816, 1024),
    ("dep linear_in", 4096, 1024),
    ("dep emb/head", 1024, 2048),
];

/// How many of [`MOSHI_7B_MATVEC_SHAPES`] belong to the temporal transformer (the large ones).
pub const LARGE_SHAPES: usize = 5;

/// The speech-to-text 1B's temporal-transformer products (dim 2048, FFN 5632): attention in and
/// out, gating in and out, `(name, in_features, out_features)`.
pub const STT_1B_MATVEC_SHAPES: [(&str, usize, usize); 4] = [
    ("stt attn in_proj", 2048, 6144),
    ("stt attn out_proj", 2048, 2048),
    ("stt gating in", 2048, 11264),
    ("stt gating out", 5632, 2048),
];
