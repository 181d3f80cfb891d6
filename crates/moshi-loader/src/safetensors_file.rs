//! Memory-mapped safetensors files: the header is parsed and validated first, tensors are
//! read on demand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::escape::escape_controls;
use crate::input_file::{check_input_file, InputKind};
use crate::safetensors_header::{self, MAX_METADATA_ENTRIES, MAX_RANK, MAX_TENSORS};
use crate::{DType, LoaderError, Result, Tensor, TensorData};

/// Largest header accepted (the format's own limit is 100 MB).
const MAX_HEADER_BYTES: usize = 100 * 1024 * 1024;

/// Where one tensor lives in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Byte range inside the data section.
    pub data_start: usize,
    pub data_end: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An open, validated safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    data_offset: usize,
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
}

fn parse_dtype(s: &str) -> Option<DType> {
    Some(match s {
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "U32" => DType::U32,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "U8" => DType::U8,
        "I8" => DType::I8,
        _ => return None,
    })
}

/// What the header of a safetensors file says, validated against the file's size.
struct ParsedHeader {
    data_offset: usize,
    tensors: BTreeMap<String, TensorInfo>,
    metadata: BTreeMap<String, String>,
}

/// Parses and validates the header of the safetensors file `bytes` (the whole file): header
/// length, JSON, dtypes, every tensor's bytes inside the data section, matching its shape and
/// overlapping no other tensor's.
fn parse_header(bytes: &[u8], path: &Path) -> Result<ParsedHeader> {
    let bad = |reason: String| LoaderError::BadSafetensors {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.starts_with(crate::gguf_file::GGUF_MAGIC) {
        return Err(bad(
            "this is a GGUF file (such as kyutai/moshiko-candle-q8's model.q8.gguf), which moshi-rs reads as an LM \
             checkpoint only"
                .into(),
        ));
    }
    if bytes.len() < 8 {
        return Err(bad(format!(
            "file has {} bytes, less than the 8-byte header length",
            bytes.len()
        )));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if header_len > MAX_HEADER_BYTES as u64 {
        return Err(bad(format!(
            "header length {header_len} is implausible (limit {MAX_HEADER_BYTES})"
        )));
    }
    let header_len = header_len as usize;
    if 8 + header_len > bytes.len() {
        return Err(bad(format!(
            "the 8-byte prefix announces a {header_len}-byte JSON header, the file holds only {} bytes after it \
             (truncated, or not a safetensors file)",
            bytes.len() - 8
        )));
    }
    let raw = read_header_json(&bytes[8..8 + header_len], &bad)?;
    let data_offset = 8 + header_len;
    let data_len = bytes.len() - data_offset;
    let mut tensors = BTreeMap::new();
    let mut needed = 0usize;
    for (name, entry) in raw.entries {
        let entry_err = |what: &str| LoaderError::BadTensor {
            path: path.to_path_buf(),
            name: name.clone(),
            reason: format!("header entry {what}"),
        };
        let dtype_str = entry.dtype.ok_or_else(|| entry_err("has no dtype"))?;
        let dtype = parse_dtype(&dtype_str).ok_or_else(|| {
            entry_err(&format!(
                "has unsupported dtype {}",
                escape_controls(&dtype_str)
            ))
        })?;
        let shape = entry.shape.ok_or_else(|| entry_err("has no shape"))?;
        if shape.len > MAX_RANK {
            return Err(entry_err(&format!(
                "has a shape of {} dimensions, more than the {MAX_RANK} this reader accepts",
                shape.len
            )));
        }
        let shape: Vec<usize> = shape
            .kept
            .iter()
            .map(|d| d.and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| entry_err("has a non-integer dimension"))?;
        let offsets = entry
            .data_offsets
            .filter(|o| o.len == 2)
            .ok_or_else(|| entry_err("has no data_offsets pair"))?;
        let offset = |i: usize, what: &str| {
            offsets.kept[i]
                .and_then(|o| usize::try_from(o).ok())
                .ok_or_else(|| entry_err(what))
        };
        let start = offset(0, "has a bad start offset")?;
        let end = offset(1, "has a bad end offset")?;
        let nbytes = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| entry_err(&format!("has shape {shape:?}, too large to address")))?;
        if end < start || end - start != nbytes {
            return Err(LoaderError::BadTensor {
                path: path.to_path_buf(),
                name: name.clone(),
                reason: format!(
                    "shape {shape:?} of {dtype} needs {nbytes} bytes, data_offsets give {}",
                    end.saturating_sub(start)
                ),
            });
        }
        needed = needed.max(end);
        tensors.insert(
            name.clone(),
            TensorInfo {
                dtype,
                shape,
                data_start: start,
                data_end: end,
            },
        );
    }
    if needed > data_len {
        return Err(LoaderError::Truncated {
            path: path.to_path_buf(),
            expected: needed,
            got: data_len,
        });
    }
    check_no_overlap(
        tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.data_start, t.data_end)),
        "data_offsets",
        path,
    )?;
    Ok(ParsedHeader {
        data_offset,
        tensors,
        metadata: raw.metadata,
    })
}

/// Reads the JSON header into typed entries ([`safetensors_header`]), refusing one that is not
/// JSON, not an object, or lists more tensors or metadata pairs than the caps.
fn read_header_json(
    json: &[u8],
    bad: &dyn Fn(String) -> LoaderError,
) -> Result<safetensors_header::RawHeader> {
    let not_json = |e: serde_json::Error| bad(format!("header is not valid JSON: {e}"));
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        serde_json::from_slice::<serde::de::IgnoredAny>(json).map_err(not_json)?;
        return Err(bad("header is not a JSON object".into()));
    }
    let raw = safetensors_header::parse(json).map_err(not_json)?;
    if raw.tensors_listed > MAX_TENSORS {
        return Err(bad(format!(
            "the header lists {} tensors, more than the {MAX_TENSORS} this reader accepts \
             (Kyutai's checkpoints hold a few thousand)",
            raw.tensors_listed
        )));
    }
    if raw.metadata_listed > MAX_METADATA_ENTRIES {
        return Err(bad(format!(
            "the header's __metadata__ lists {} entries, more than the {MAX_METADATA_ENTRIES} \
             this reader accepts",
            raw.metadata_listed
        )));
    }
    Ok(raw)
}

/// Fails when two tensors' byte ranges `(name, start, end)` overlap (a tensor read would then
/// see another's bytes); `what` names the ranges in the error (`data_offsets`).
pub(crate) fn check_no_overlap<'a>(
    tensors: impl Iterator<Item = (&'a str, usize, usize)>,
    what: &str,
    path: &Path,
) -> Result<()> {
    let mut ranges: Vec<(&str, usize, usize)> = tensors.filter(|(_, s, e)| e > s).collect();
    ranges.sort_by_key(|&(_, s, e)| (s, e));
    for pair in ranges.windows(2) {
        let ((a, a_start, a_end), (b, b_start, b_end)) = (pair[0], pair[1]);
        if b_start < a_end {
            return Err(LoaderError::BadTensor {
                path: path.to_path_buf(),
                name: b.to_string(),
                reason: format!(
                    "its {what} [{b_start}, {b_end}) overlap those of `{a}` [{a_start}, {a_end})"
                ),
            });
        }
    }
    Ok(())
}

impl SafetensorsFile {
    /// Opens and validates `path` (a regular file): header length, JSON, dtypes, and that every
    /// tensor's bytes lie inside the file, match its shape and overlap no other tensor's.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        check_input_file(&path, InputKind::RegularFile)?;
        let file = std::fs::File::open(&path).map_err(|e| LoaderError::io(&path, e))?;
        // SAFETY: the file is opened read-only; like every mmap-based loader we assume it is not
        // modified while mapped.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LoaderError::io(&path, e))?;
        let ParsedHeader {
            data_offset,
            tensors,
            metadata,
        } = parse_header(&mmap, &path)?;
        Ok(Self {
            path,
            mmap,
            data_offset,
            tensors,
            metadata,
        })
    }

    /// Validates a whole safetensors file held in memory exactly as [`SafetensorsFile::open`]
    /// does, returning its tensor count (fuzzing, tests); `origin` names it in errors.
    pub fn validate_bytes(bytes: &[u8], origin: &Path) -> Result<usize> {
        Ok(parse_header(bytes, origin)?.tensors.len())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All tensors, sorted by name.
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    /// The optional `__metadata__` map.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| LoaderError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Raw bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.info(name)?;
        Ok(&self.mmap[self.data_offset + info.data_start..self.data_offset + info.data_end])
    }

    /// Reads a tensor into owned memory.
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let info = self.info(name)?.clone();
        let b = self.bytes(name)?;
        // Weights are read where they are kept (the row kernels' codes) or copied from: on 2 MiB
        // pages where Linux gives them.
        fn le<const N: usize, T>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
            let mut out = Vec::with_capacity(b.len() / N);
            moshi_kernels::huge_pages::advise(&mut out);
            out.extend(b.chunks_exact(N).map(|c| f(c.try_into().expect("chunk"))));
            out
        }
        let data = match info.dtype {
            DType::F32 => TensorData::F32(le(b, f32::from_le_bytes)),
            DType::BF16 => TensorData::BF16(le(b, u16::from_le_bytes)),
            DType::F16 => TensorData::F16(le(b, u16::from_le_bytes)),
            DType::U32 => TensorData::U32(le(b, u32::from_le_bytes)),
            DType::I64 => TensorData::I64(le(b, i64::from_le_bytes)),
            DType::I32 => TensorData::I32(le(b, i32::from_le_bytes)),
            DType::U8 => TensorData::U8(b.to_vec()),
            DType::I8 => TensorData::I8(b.iter().map(|&x| x as i8).collect()),
        };
        Ok(Tensor {
            shape: info.shape,
            data,
        })
    }

    /// Reads a float tensor as f32, checking its shape.
    pub fn read_f32(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.read(name)?;
        if t.shape != expected_shape {
            return Err(LoaderError::ShapeMismatch {
                path: self.path.clone(),
                name: name.to_string(),
                expected: expected_shape.to_vec(),
                got: t.shape,
            });
        }
        let dtype = t.dtype();
        t.to_f32().ok_or_else(|| LoaderError::DTypeMismatch {
            path: self.path.clone(),
            name: name.to_string(),
            expected: "a float type (F32, BF16, F16)".into(),
            got: dtype.to_string(),
        })
    }
}
