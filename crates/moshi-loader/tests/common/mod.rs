//! Test helpers of the loader: the tiny-a and tiny-hibiki configs and writing safetensors files
//! derived from the fixtures (paths from moshi-test-support).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use moshi_loader::{DType, LmConfig, SafetensorsFile};
/// A file of `assets/tiny-a`.
pub use moshi_test_support::tiny_a as asset;

pub fn tiny_config() -> LmConfig {
    LmConfig::from_file(asset("config.json")).unwrap()
}

/// A file of the tiny-hibiki fixture (conditioned model, acoustic delay 2).
pub fn hibiki_asset(name: &str) -> PathBuf {
    moshi_test_support::fixture("tiny-hibiki", name)
}

pub fn hibiki_config() -> LmConfig {
    LmConfig::from_file(hibiki_asset("config.json")).unwrap()
}

/// The config of fixture `name` with `edit` applied, parsed (errors name `edited-config.json`).
pub fn edited_fixture_config(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> moshi_loader::Result<LmConfig> {
    let text = std::fs::read_to_string(moshi_test_support::fixture(name, "config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    LmConfig::from_json_str(&v.to_string(), Path::new("edited-config.json"))
}

/// The error of fixture `name`'s config with `edit` applied, which must name the file and
/// every one of `needles`.
pub fn refused_fixture_config(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    needles: &[&str],
) {
    let err = edited_fixture_config(name, edit).unwrap_err().to_string();
    assert!(err.contains("edited-config.json"), "{err}");
    for n in needles {
        assert!(err.contains(n), "error should name {n:?}: {err}");
    }
}

/// A tensor to write: name, dtype, shape and raw little-endian bytes.
pub struct RawTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl RawTensor {
    /// Copies `name` out of `file`, stored under `new_name`.
    pub fn copy(file: &SafetensorsFile, name: &str, new_name: &str) -> Self {
        let info = file.info(name).unwrap();
        Self {
            name: new_name.into(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            bytes: file.bytes(name).unwrap().to_vec(),
        }
    }

    /// Rows `[start, start + rows)` of the matrix `name` of `file`, stored under `new_name`.
    pub fn rows(
        file: &SafetensorsFile,
        name: &str,
        new_name: &str,
        start: usize,
        rows: usize,
    ) -> Self {
        let info = file.info(name).unwrap();
        let row_bytes = info.shape[1..].iter().product::<usize>() * info.dtype.size_bytes();
        let bytes =
            file.bytes(name).unwrap()[start * row_bytes..(start + rows) * row_bytes].to_vec();
        let mut shape = info.shape.clone();
        shape[0] = rows;
        Self {
            name: new_name.into(),
            dtype: info.dtype,
            shape,
            bytes,
        }
    }
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::U32 => safetensors::Dtype::U32,
        DType::I64 => safetensors::Dtype::I64,
        DType::I32 => safetensors::Dtype::I32,
        DType::U8 => safetensors::Dtype::U8,
        DType::I8 => safetensors::Dtype::I8,
    }
}

/// Writes `tensors` as a safetensors file with the official `safetensors` crate.
pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                safetensors::tensor::TensorView::new(st_dtype(t.dtype), t.shape.clone(), &t.bytes)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).unwrap();
}

/// Every tensor of `file`, renamed by `rename` (which may also drop a tensor by returning None).
pub fn copy_all(file: &SafetensorsFile, rename: impl Fn(&str) -> Option<String>) -> Vec<RawTensor> {
    file.tensors()
        .keys()
        .filter_map(|n| rename(n).map(|new| RawTensor::copy(file, n, &new)))
        .collect()
}
