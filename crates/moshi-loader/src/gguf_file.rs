//! Memory-mapped GGUF files (versions 2 and 3), as candle's `gguf_file::write` makes Kyutai's
//! `model.q8.gguf`: the header (metadata and tensor infos) is parsed and validated first, every
//! count, length and offset checked against the bytes the file holds before anything is kept;
//! tensor data is read on demand.
//!
//! Layout (little-endian): `GGUF`, version `u32`, tensor count `u64`, metadata count `u64`; the
//! metadata pairs (key string, value type `u32`, value); per tensor its name, rank `u32`, the
//! dimensions `u64` innermost first (ggml's `ne`, the reverse of a row-major shape), ggml type
//! `u32` and data offset `u64`; then the data, from the header's end rounded up to
//! `general.alignment` (32 when absent). Strings are a `u64` length and UTF-8 bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use moshi_kernels::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};

use crate::escape::escape_controls;
use crate::input_file::{check_input_file, InputKind};
use crate::safetensors_file::check_no_overlap;
use crate::safetensors_header::{MAX_METADATA_ENTRIES, MAX_RANK, MAX_TENSORS};
use crate::{LoaderError, Result};

/// The file's first four bytes.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section when `general.alignment` is absent (the format's default).
const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest `general.alignment` accepted (writers use 32; larger only wastes padding).
const MAX_ALIGNMENT: u64 = 1 << 20;
/// Longest key or tensor name accepted.
const MAX_NAME_BYTES: u64 = 64 * 1024;
/// Deepest nesting of array values accepted (the format allows arrays of arrays).
const MAX_ARRAY_DEPTH: usize = 4;
/// Metadata strings longer than this are summarised, not kept.
const KEPT_STRING_BYTES: usize = 256;

/// The element types moshi-rs reads (ggml type ids 0, 1, 30 and 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    /// Blocks of 32 values: an f16 scale, then 32 `i8` codes (`w = d · q`).
    Q8_0,
}

impl GgmlType {
    fn from_id(id: u32) -> std::result::Result<Self, String> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            other => {
                let name = match other {
                    2 => "Q4_0",
                    3 => "Q4_1",
                    6 => "Q5_0",
                    7 => "Q5_1",
                    9 => "Q8_1",
                    10 => "Q2_K",
                    11 => "Q3_K",
                    12 => "Q4_K",
                    13 => "Q5_K",
                    14 => "Q6_K",
                    15 => "Q8_K",
                    _ => "unknown",
                };
                return Err(format!(
                    "has ggml type {other} ({name}); moshi-rs reads F32, F16, BF16 and Q8_0 \
                     (what Kyutai's candle releases hold)"
                ));
            }
        })
    }

    /// Values per block and bytes per block.
    pub(crate) fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (Q8_0_BLOCK, Q8_0_BLOCK_BYTES),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q8_0 => "Q8_0",
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub ggml_type: GgmlType,
    /// Row-major shape (the file's dimensions reversed).
    pub shape: Vec<usize>,
    /// Byte range inside the file.
    pub data_start: usize,
    pub data_end: usize,
}

impl GgufTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// An open, validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    version: u32,
    tensors: BTreeMap<String, GgufTensor>,
    metadata: BTreeMap<String, String>,
}

/// What a GGUF header says, validated against the file's size.
struct ParsedHeader {
    version: u32,
    tensors: BTreeMap<String, GgufTensor>,
    metadata: BTreeMap<String, String>,
}

/// A cursor over the header bytes whose every read is checked against what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> std::result::Result<&'a [u8], String> {
        let left = self.bytes.len() - self.at;
        if n > left as u64 {
            return Err(format!(
                "truncated: {what} at byte {} needs {n} bytes, the file holds {left} more",
                self.at
            ));
        }
        let out = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4"),
        ))
    }

    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8"),
        ))
    }

    /// A string of at most `max` bytes (NUL padding at its end dropped, as candle does).
    fn string(&mut self, max: u64, what: &str) -> std::result::Result<&'a [u8], String> {
        let len = self.u64(&format!("the length of {what}"))?;
        if len > max {
            return Err(format!(
                "{what} at byte {} is {len} bytes long, more than the {max} this reader accepts",
                self.at - 8
            ));
        }
        let raw = self.take(len, what)?;
        let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        Ok(&raw[..end])
    }

    fn name(&mut self, what: &str) -> std::result::Result<String, String> {
        let raw = self.string(MAX_NAME_BYTES, what)?;
        std::str::from_utf8(raw)
            .map(str::to_string)
            .map_err(|_| format!("{what} at byte {} is not UTF-8", self.at - raw.len()))
    }

    /// Reads one value of metadata type `ty`, returning a short rendering of it (arrays and long
    /// strings summarised) and, for integers, its value.
    fn value(
        &mut self,
        ty: u32,
        depth: usize,
        key: &str,
    ) -> std::result::Result<(String, Option<i128>), String> {
        let what = format!("metadata `{}`", escape_controls(key));
        let fixed = |r: &mut Self, n: u64| r.take(n, &what).map(|b| b.to_vec());
        let int = |b: Vec<u8>, signed: bool| -> i128 {
            let mut wide = [0u8; 16];
            wide[..b.len()].copy_from_slice(&b);
            if signed && b.last().is_some_and(|&h| h & 0x80 != 0) {
                wide[b.len()..].fill(0xff);
            }
            i128::from_le_bytes(wide)
        };
        Ok(match ty {
            0..=5 | 10 | 11 => {
                let size = match ty {
                    0 | 1 => 1,
                    2 | 3 => 2,
                    4 | 5 => 4,
                    _ => 8,
                };
                let v = int(fixed(self, size)?, matches!(ty, 1 | 3 | 5 | 11));
                (v.to_string(), Some(v))
            }
            6 => {
                let b = fixed(self, 4)?;
                (
                    f32::from_le_bytes(b.try_into().expect("4")).to_string(),
                    None,
                )
            }
            12 => {
                let b = fixed(self, 8)?;
                (
                    f64::from_le_bytes(b.try_into().expect("8")).to_string(),
                    None,
                )
            }
            7 => match fixed(self, 1)?[0] {
                b @ (0 | 1) => ((b == 1).to_string(), None),
                b => return Err(format!("{what} is a bool of byte {b}, expected 0 or 1")),
            },
            8 => {
                let raw = self.string(u64::MAX, &what)?;
                let text = String::from_utf8_lossy(&raw[..raw.len().min(KEPT_STRING_BYTES)]);
                let more = if raw.len() > KEPT_STRING_BYTES {
                    "..."
                } else {
                    ""
                };
                (format!("{:?}{more}", escape_controls(&text)), None)
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "{what} nests arrays more than {MAX_ARRAY_DEPTH} deep"
                    ));
                }
                let elem = self.u32(&what)?;
                let len = self.u64(&what)?;
                // Every element takes at least one byte: a longer array cannot fit in the file.
                if len > (self.bytes.len() - self.at) as u64 {
                    return Err(format!(
                        "{what} announces {len} array elements, more than the {} bytes left",
                        self.bytes.len() - self.at
                    ));
                }
                match fixed_size(elem) {
                    // Fixed-size elements are skipped at once (a huge array costs nothing).
                    Some(size) => {
                        self.take(len.saturating_mul(size), &what)?;
                    }
                    None => {
                        for _ in 0..len {
                            self.value(elem, depth + 1, key)?;
                        }
                    }
                }
                (format!("[{len} values of type {elem}]"), None)
            }
            other => return Err(format!("{what} has value type {other}, expected 0 to 12")),
        })
    }
}

/// Bytes of one value of metadata type `ty`, for the fixed-size types.
fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// Parses and validates the GGUF header of `bytes` (the whole file): magic, version, counts,
/// every string and array inside the file, known tensor types, ranks, and each tensor's bytes
/// inside the data section, matching its shape and overlapping no other tensor's.
fn parse_header(bytes: &[u8], path: &Path) -> Result<ParsedHeader> {
    let bad = |reason: String| LoaderError::BadGguf {
        path: path.to_path_buf(),
        reason,
    };
    if !bytes.starts_with(GGUF_MAGIC) {
        return Err(bad("the file does not start with `GGUF`".into()));
    }
    let mut r = Reader { bytes, at: 4 };
    let version = r.u32("the version").map_err(bad)?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!(
            "version {version}, expected 2 or 3 (what candle and llama.cpp write)"
        )));
    }
    let tensor_count = r.u64("the tensor count").map_err(bad)?;
    let metadata_count = r.u64("the metadata count").map_err(bad)?;
    if tensor_count > MAX_TENSORS as u64 {
        return Err(bad(format!(
            "the header lists {tensor_count} tensors, more than the {MAX_TENSORS} this reader accepts"
        )));
    }
    if metadata_count > MAX_METADATA_ENTRIES as u64 {
        return Err(bad(format!(
            "the header lists {metadata_count} metadata pairs, more than the {MAX_METADATA_ENTRIES} this reader accepts"
        )));
    }
    let (metadata, alignment) = read_metadata(&mut r, metadata_count).map_err(bad)?;
    let infos = read_tensor_infos(&mut r, tensor_count, path)?;
    let data_offset = (r.at as u64).div_ceil(alignment) * alignment;
    let mut tensors = BTreeMap::new();
    for (name, ggml_type, shape, offset) in infos {
        let tensor =
            place_tensor(bytes.len(), data_offset, ggml_type, shape, offset).map_err(|reason| {
                LoaderError::BadTensor {
                    path: path.to_path_buf(),
                    name: name.clone(),
                    reason,
                }
            })?;
        if tensors.insert(name.clone(), tensor).is_some() {
            return Err(bad(format!(
                "tensor `{}` is listed twice",
                escape_controls(&name)
            )));
        }
    }
    check_no_overlap(
        tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.data_start, t.data_end)),
        "data",
        path,
    )?;
    Ok(ParsedHeader {
        version,
        tensors,
        metadata,
    })
}

/// The metadata pairs (rendered) and the data alignment they set.
fn read_metadata(
    r: &mut Reader<'_>,
    count: u64,
) -> std::result::Result<(BTreeMap<String, String>, u64), String> {
    let mut metadata = BTreeMap::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..count {
        let key = r.name("a metadata key")?;
        let ty = r.u32(&format!("the type of metadata `{}`", escape_controls(&key)))?;
        let (text, int) = r.value(ty, 0, &key)?;
        if key == "general.alignment" {
            alignment = match int.and_then(|v| u64::try_from(v).ok()) {
                Some(a) if (1..=MAX_ALIGNMENT).contains(&a) => a,
                _ => {
                    return Err(format!(
                        "general.alignment is {text}, expected an integer from 1 to {MAX_ALIGNMENT}"
                    ))
                }
            };
        }
        metadata.insert(key, text);
    }
    Ok((metadata, alignment))
}

/// One tensor info: name, type, row-major shape, offset in the data section.
type RawInfo = (String, GgmlType, Vec<usize>, u64);

fn read_tensor_infos(r: &mut Reader<'_>, count: u64, path: &Path) -> Result<Vec<RawInfo>> {
    let bad = |reason: String| LoaderError::BadGguf {
        path: path.to_path_buf(),
        reason,
    };
    let mut infos = Vec::new();
    for index in 0..count {
        let name = r
            .name(&format!("the name of tensor {index}"))
            .map_err(bad)?;
        let tensor_err = |reason: String| LoaderError::BadTensor {
            path: path.to_path_buf(),
            name: escape_controls(&name).into_owned(),
            reason,
        };
        let rank = r.u32("a tensor rank").map_err(bad)?;
        if rank as usize > MAX_RANK {
            return Err(tensor_err(format!(
                "has {rank} dimensions, more than the {MAX_RANK} this reader accepts"
            )));
        }
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let dim = r.u64("a tensor dimension").map_err(bad)?;
            shape.push(
                usize::try_from(dim).map_err(|_| {
                    tensor_err(format!("has dimension {dim}, too large to address"))
                })?,
            );
        }
        shape.reverse();
        let ggml_type =
            GgmlType::from_id(r.u32("a tensor type").map_err(bad)?).map_err(tensor_err)?;
        let offset = r.u64("a tensor offset").map_err(bad)?;
        infos.push((name, ggml_type, shape, offset));
    }
    Ok(infos)
}

/// Where a tensor's bytes lie in a file of `file_len` bytes, checked: rows of whole blocks, a
/// size that can be addressed, inside the file.
fn place_tensor(
    file_len: usize,
    data_offset: u64,
    ggml_type: GgmlType,
    shape: Vec<usize>,
    offset: u64,
) -> std::result::Result<GgufTensor, String> {
    let (block, block_bytes) = ggml_type.block();
    let row = shape.last().copied().unwrap_or(1);
    if row % block != 0 {
        return Err(format!(
            "is {} of shape {shape:?}: rows of {row} values, expected a multiple of the {block}-value block",
            ggml_type.as_str()
        ));
    }
    let nbytes = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .map(|n| n / block)
        .and_then(|blocks| blocks.checked_mul(block_bytes))
        .ok_or_else(|| format!("has shape {shape:?}, too large to address"))?;
    let start = data_offset.checked_add(offset);
    let end = start.and_then(|s| s.checked_add(nbytes as u64));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len as u64 => Ok(GgufTensor {
            ggml_type,
            shape,
            data_start: start as usize,
            data_end: end as usize,
        }),
        _ => Err(format!(
            "{} of shape {shape:?} needs {nbytes} bytes from offset {offset} of the data section \
             (file byte {data_offset} on), the file holds {file_len} bytes",
            ggml_type.as_str()
        )),
    }
}

impl GgufFile {
    /// Opens and validates `path` (a regular file): magic, version, counts, every string and
    /// array inside the file, known tensor types, ranks, and each tensor's bytes inside the data
    /// section, matching its shape and overlapping no other tensor's.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        check_input_file(&path, InputKind::RegularFile)?;
        let file = std::fs::File::open(&path).map_err(|e| LoaderError::io(&path, e))?;
        // SAFETY: the file is opened read-only; like every mmap-based loader we assume it is not
        // modified while mapped.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| LoaderError::io(&path, e))?;
        let ParsedHeader {
            version,
            tensors,
            metadata,
        } = parse_header(&mmap, &path)?;
        Ok(Self {
            path,
            mmap,
            version,
            tensors,
            metadata,
        })
    }

    /// Validates a whole GGUF file held in memory exactly as [`GgufFile::open`] does, returning
    /// its tensor count (fuzzing, tests); `origin` names it in errors.
    pub fn validate_bytes(bytes: &[u8], origin: &Path) -> Result<usize> {
        Ok(parse_header(bytes, origin)?.tensors.len())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All tensors, sorted by name.
    pub fn tensors(&self) -> &BTreeMap<String, GgufTensor> {
        &self.tensors
    }

    /// The metadata pairs, values rendered as text (arrays and long strings summarised).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn info(&self, name: &str) -> Result<&GgufTensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| LoaderError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }

    /// Raw bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.info(name)?;
        Ok(&self.mmap[info.data_start..info.data_end])
    }
}

/// Whether the file at `path` starts with the GGUF magic (false when it cannot be read).
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == GGUF_MAGIC)
}
