//! `.npy` (NumPy format v1/v2/v3) reader and writer for codes, PCM and logits. Reading parses
//! the header first and checks what it claims (header size, dtype, element count, bytes present)
//! before reading the data, so a device or a lying header is refused without reading on.
//! Writing goes through [`OutputFile`]: whole, or streamed with [`NpyWriter`].

use std::io::Read;
use std::path::Path;

use crate::input_file::{check_input_file, InputKind};
use crate::output_file::OutputFile;
use crate::{LoaderError, Result};

/// A dense array read from a `.npy` file, C order.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// The largest header read (NumPy writes a few hundred bytes; v1 allows 65535).
pub const MAX_HEADER_BYTES: usize = 1 << 16;
/// The most data a header may claim: 4 GiB (an hour of 24 kHz f32 PCM is 346 MB; codes are far
/// smaller).
pub const MAX_DATA_BYTES: u64 = 4 << 30;

/// Element types read (NumPy `descr` strings), with their sizes.
pub const DTYPES: [(&str, usize); 9] = [
    ("|i1", 1),
    ("|u1", 1),
    ("<i2", 2),
    ("<u2", 2),
    ("<i4", 4),
    ("<u4", 4),
    ("<i8", 8),
    ("<f4", 4),
    ("<f8", 8),
];

struct Header {
    descr: String,
    shape: Vec<usize>,
    data_bytes: usize,
}

/// Parses the header text (the Python dict literal).
fn parse_header_text(text: &str, bad: &dyn Fn(String) -> LoaderError) -> Result<Header> {
    let field = |key: &str| -> Option<&str> {
        let k = text.find(&format!("'{key}'"))?;
        let rest = &text[k + key.len() + 2..];
        let colon = rest.find(':')?;
        Some(rest[colon + 1..].trim_start())
    };
    let descr = field("descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| bad("no descr".into()))?
        .to_string();
    let fortran = field("fortran_order")
        .map(|s| s.starts_with("True"))
        .ok_or_else(|| bad("no fortran_order".into()))?;
    if fortran {
        return Err(bad("Fortran order is not supported".into()));
    }
    let shape_str = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape".into()))?;
    let shape = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| bad(format!("bad dimension `{s}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let elem_bytes = DTYPES
        .iter()
        .find(|(d, _)| *d == descr)
        .map(|&(_, size)| size)
        .ok_or_else(|| {
            bad(format!(
                "unsupported dtype `{}` (supported: {})",
                crate::escape::escape_controls(&descr),
                DTYPES.map(|(d, _)| d).join(", ")
            ))
        })?;
    let data_bytes = shape
        .iter()
        .try_fold(elem_bytes as u64, |acc, &d| acc.checked_mul(d as u64))
        .filter(|&b| b <= MAX_DATA_BYTES)
        .ok_or_else(|| {
            bad(format!(
                "the header claims shape {shape:?} of {descr}, more than the {} GiB this reader accepts",
                MAX_DATA_BYTES >> 30
            ))
        })? as usize;
    Ok(Header {
        descr,
        shape,
        data_bytes,
    })
}

/// Reads a `.npy` stream: the header, checked, then exactly the data it claims. `available`
/// is the stream's total size when known (a regular file): a header claiming more is refused
/// before the data is read. `origin` names the file in errors.
fn read_npy(
    mut reader: impl Read,
    available: Option<u64>,
    origin: &Path,
) -> Result<(Header, Vec<u8>)> {
    let bad = |reason: String| LoaderError::BadNpy {
        path: origin.to_path_buf(),
        reason,
    };
    let io = |e: std::io::Error| LoaderError::io(origin, e);
    let mut fixed = [0u8; 10];
    read_exactly(&mut reader, &mut fixed).map_err(|e| match e {
        Some(e) => io(e),
        None => bad("missing the \\x93NUMPY magic (shorter than 10 bytes)".into()),
    })?;
    if &fixed[..6] != b"\x93NUMPY" {
        return Err(bad("missing the \\x93NUMPY magic".into()));
    }
    let major = fixed[6];
    let (header_len, prefix_len) = match major {
        1 => (u16::from_le_bytes([fixed[8], fixed[9]]) as usize, 10),
        2 | 3 => {
            let mut more = [0u8; 2];
            read_exactly(&mut reader, &mut more).map_err(|e| match e {
                Some(e) => io(e),
                None => bad("truncated header".into()),
            })?;
            (
                u32::from_le_bytes([fixed[8], fixed[9], more[0], more[1]]) as usize,
                12,
            )
        }
        _ => return Err(bad(format!("unsupported format version {major}"))),
    };
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "the header claims {header_len} bytes, more than the {MAX_HEADER_BYTES} this reader accepts"
        )));
    }
    let mut text = vec![0u8; header_len];
    read_exactly(&mut reader, &mut text).map_err(|e| match e {
        Some(e) => io(e),
        None => bad("truncated header".into()),
    })?;
    let text = std::str::from_utf8(&text).map_err(|_| bad("header is not UTF-8".into()))?;
    let header = parse_header_text(text, &bad)?;
    let data_start = (prefix_len + header_len) as u64;
    if let Some(total) = available {
        let have = total.saturating_sub(data_start);
        if have < header.data_bytes as u64 {
            return Err(bad(format!(
                "truncated data: need {} bytes, have {have}",
                header.data_bytes
            )));
        }
    }
    // Grows with the bytes actually read, not with what the header claims.
    let mut data = Vec::new();
    reader
        .take(header.data_bytes as u64)
        .read_to_end(&mut data)
        .map_err(io)?;
    if data.len() < header.data_bytes {
        return Err(bad(format!(
            "truncated data: need {} bytes, have {}",
            header.data_bytes,
            data.len()
        )));
    }
    Ok((header, data))
}

/// `read_exact` telling a clean end of stream (`None`) from an I/O error.
fn read_exactly(
    reader: &mut impl Read,
    buf: &mut [u8],
) -> std::result::Result<(), Option<std::io::Error>> {
    reader.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => None,
        _ => Some(e),
    })
}

fn read_raw(path: &Path) -> Result<(Header, Vec<u8>)> {
    check_input_file(path, InputKind::Readable)?;
    let file = std::fs::File::open(path).map_err(|e| LoaderError::io(path, e))?;
    let meta = file.metadata().map_err(|e| LoaderError::io(path, e))?;
    let available = meta.is_file().then_some(meta.len());
    read_npy(std::io::BufReader::new(file), available, path)
}

fn decode_f32(h: &Header, b: &[u8], origin: &Path) -> Result<Vec<f32>> {
    Ok(match h.descr.as_str() {
        "<f4" => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
            .collect(),
        "<f8" => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")) as f32)
            .collect(),
        d => {
            return Err(LoaderError::BadNpy {
                path: origin.to_path_buf(),
                reason: format!("expected a float array, got dtype {d}"),
            })
        }
    })
}

fn decode_i64(h: &Header, b: &[u8], origin: &Path) -> Result<Vec<i64>> {
    Ok(match h.descr.as_str() {
        "|i1" => b.iter().map(|&x| x as i8 as i64).collect(),
        "|u1" => b.iter().map(|&x| x as i64).collect(),
        "<i2" => b
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
            .collect(),
        "<u2" => b
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
            .collect(),
        "<i4" => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4")) as i64)
            .collect(),
        "<u4" => b
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4")) as i64)
            .collect(),
        "<i8" => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8")))
            .collect(),
        d => {
            return Err(LoaderError::BadNpy {
                path: origin.to_path_buf(),
                reason: format!("expected an integer array, got dtype {d}"),
            })
        }
    })
}

/// Reads a float array (`<f4`, `<f8`) as f32.
pub fn read_f32(path: impl AsRef<Path>) -> Result<NpyArray<f32>> {
    let path = path.as_ref();
    let (h, b) = read_raw(path)?;
    let data = decode_f32(&h, &b, path)?;
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

/// Reads an integer array (`|i1`, `|u1`, `<i2`, `<i4`, `<i8`, `<u2`, `<u4`) as i64.
pub fn read_i64(path: impl AsRef<Path>) -> Result<NpyArray<i64>> {
    let path = path.as_ref();
    let (h, b) = read_raw(path)?;
    let data = decode_i64(&h, &b, path)?;
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

/// Parses a whole `.npy` file held in memory as an integer array (fuzzing, tests); `origin`
/// names it in errors.
pub fn parse_i64(bytes: &[u8], origin: &Path) -> Result<NpyArray<i64>> {
    let (h, b) = read_npy(bytes, Some(bytes.len() as u64), origin)?;
    let data = decode_i64(&h, &b, origin)?;
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

/// Parses a whole `.npy` file held in memory as a float array; `origin` names it in errors.
pub fn parse_f32(bytes: &[u8], origin: &Path) -> Result<NpyArray<f32>> {
    let (h, b) = read_npy(bytes, Some(bytes.len() as u64), origin)?;
    let data = decode_f32(&h, &b, origin)?;
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

/// The v1 header of a C-order array of `descr` with `shape`, padded to 64 bytes.
fn header_bytes(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape_str = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_str}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out
}

/// A `.npy` output written as it is produced: the header (with the final shape, known up
/// front) first, then the elements; [`NpyWriter::finish`] checks that exactly the announced
/// count was written before the output is committed.
pub struct NpyWriter {
    out: OutputFile,
    elem_bytes: usize,
    expected: usize,
    written: usize,
}

impl NpyWriter {
    /// Starts a little-endian f32 array of `shape`.
    pub fn create_f32(path: &Path, shape: &[usize]) -> Result<Self> {
        Self::create(path, "<f4", 4, shape)
    }

    /// Starts a little-endian i64 array of `shape`.
    pub fn create_i64(path: &Path, shape: &[usize]) -> Result<Self> {
        Self::create(path, "<i8", 8, shape)
    }

    fn create(path: &Path, descr: &str, elem_bytes: usize, shape: &[usize]) -> Result<Self> {
        let mut out = OutputFile::create(path)?;
        out.write_bytes(&header_bytes(descr, shape))?;
        Ok(Self {
            out,
            elem_bytes,
            expected: shape.iter().product(),
            written: 0,
        })
    }

    fn push_bytes(&mut self, count: usize, bytes: impl Iterator<Item = u8>) -> Result<()> {
        if self.written + count > self.expected {
            return Err(LoaderError::BadNpy {
                path: self.out.path().to_path_buf(),
                reason: format!(
                    "writing {} elements into an array of {}",
                    self.written + count,
                    self.expected
                ),
            });
        }
        let mut buf = Vec::with_capacity(count * self.elem_bytes);
        buf.extend(bytes);
        self.out.write_bytes(&buf)?;
        self.written += count;
        Ok(())
    }

    /// Appends f32 elements (an array created by [`NpyWriter::create_f32`]).
    pub fn write_f32(&mut self, values: &[f32]) -> Result<()> {
        debug_assert_eq!(self.elem_bytes, 4);
        self.push_bytes(values.len(), values.iter().flat_map(|v| v.to_le_bytes()))
    }

    /// Appends i64 elements (an array created by [`NpyWriter::create_i64`]).
    pub fn write_i64(&mut self, values: &[i64]) -> Result<()> {
        debug_assert_eq!(self.elem_bytes, 8);
        self.push_bytes(values.len(), values.iter().flat_map(|v| v.to_le_bytes()))
    }

    /// Checks the element count and commits the output.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expected {
            return Err(LoaderError::BadNpy {
                path: self.out.path().to_path_buf(),
                reason: format!(
                    "{} elements written, the header announced {}",
                    self.written, self.expected
                ),
            });
        }
        self.out.commit()
    }
}

/// Writes a little-endian f32 array.
pub fn write_f32(path: impl AsRef<Path>, shape: &[usize], data: &[f32]) -> Result<()> {
    let mut w = NpyWriter::create_f32(path.as_ref(), shape)?;
    w.write_f32(data)?;
    w.finish()
}

/// Writes a little-endian i64 array.
pub fn write_i64(path: impl AsRef<Path>, shape: &[usize], data: &[i64]) -> Result<()> {
    let mut w = NpyWriter::create_i64(path.as_ref(), shape)?;
    w.write_i64(data)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_f32_and_i64() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        write_f32(&p, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.5, -6.0]).unwrap();
        let a = read_f32(&p).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, vec![1.0, 2.0, 3.0, 4.0, 5.5, -6.0]);
        write_i64(&p, &[4], &[1, -2, 3, 40000]).unwrap();
        let b = read_i64(&p).unwrap();
        assert_eq!(b.shape, vec![4]);
        assert_eq!(b.data, vec![1, -2, 3, 40000]);
    }

    #[test]
    fn lying_headers_are_refused_before_reading_the_data() {
        let o = Path::new("x.npy");
        let mut bytes = header_bytes("<i8", &[1_000_000_000, 1_000_000_000]);
        bytes.extend_from_slice(&[0; 16]);
        let e = parse_i64(&bytes, o).unwrap_err().to_string();
        assert!(e.contains("more than the 4 GiB"), "{e}");
        let mut bytes = header_bytes("<i8", &[4, 1000]);
        bytes.extend_from_slice(&[0; 16]);
        let e = parse_i64(&bytes, o).unwrap_err().to_string();
        assert!(e.contains("need 32000 bytes, have 16"), "{e}");
        let bytes = header_bytes("<c16", &[1]);
        let e = parse_i64(&bytes, o).unwrap_err().to_string();
        assert!(e.contains("unsupported dtype `<c16`"), "{e}");
        // A control character in the dtype is shown, not swallowed by the terminal.
        let bytes = header_bytes("<i8\0", &[1]);
        let e = parse_i64(&bytes, o).unwrap_err().to_string();
        assert!(e.contains("unsupported dtype `<i8\\0`"), "{e}");
        // A huge header length in a v2 file.
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        v2.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = parse_i64(&v2, o).unwrap_err().to_string();
        assert!(e.contains("header claims 4294967295 bytes"), "{e}");
        // Short descr, odd dims: errors, never a panic.
        for text in [
            "{'descr': '', 'fortran_order': False, 'shape': (1,), }",
            "{'descr':",
            "{'shape': (1,,-2)",
        ] {
            let mut b = b"\x93NUMPY\x01\x00".to_vec();
            b.extend_from_slice(&(text.len() as u16).to_le_bytes());
            b.extend_from_slice(text.as_bytes());
            assert!(parse_i64(&b, o).is_err(), "{text}");
        }
    }

    #[test]
    fn devices_are_refused_without_reading_on() {
        let e = read_i64("/dev/zero").unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("magic"), "{e}");
    }

    #[test]
    fn streamed_writes_check_the_announced_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pcm.npy");
        let mut w = NpyWriter::create_f32(&p, &[4]).unwrap();
        w.write_f32(&[1.0, 2.0]).unwrap();
        w.write_f32(&[3.0, 4.0]).unwrap();
        assert!(w.write_f32(&[5.0]).is_err());
        w.finish().unwrap();
        assert_eq!(read_f32(&p).unwrap().data, vec![1.0, 2.0, 3.0, 4.0]);
        let mut w = NpyWriter::create_f32(&p, &[3]).unwrap();
        w.write_f32(&[9.0]).unwrap();
        let e = w.finish().unwrap_err().to_string();
        assert!(
            e.contains("1 elements written, the header announced 3"),
            "{e}"
        );
        // The earlier complete file is untouched, and no partial file is left.
        assert_eq!(read_f32(&p).unwrap().data, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn rejects_non_npy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        std::fs::write(&p, b"hello world, not numpy").unwrap();
        let err = read_f32(&p).unwrap_err().to_string();
        assert!(err.contains("a.npy") && err.contains("magic"), "{err}");
    }
}
