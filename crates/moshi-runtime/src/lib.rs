//! moshi-runtime library root.
