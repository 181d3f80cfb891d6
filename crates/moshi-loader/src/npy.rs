//! Minimal `.npy` (NumPy format v1/v2) reader and writer for codes, PCM and logits.

use std::io::Write;
use std::path::Path;

use crate::{LoaderError, Result};

/// A dense array read from a `.npy` file, C order.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

struct Header {
    descr: String,
    fortran: bool,
    shape: Vec<usize>,
    data_start: usize,
}

fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header> {
    let bad = |reason: &str| LoaderError::BadNpy {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("missing the \\x93NUMPY magic"));
    }
    let major = bytes[6];
    let (len, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header"));
            }
            (
                u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
                12,
            )
        }
        _ => return Err(bad(&format!("unsupported format version {major}"))),
    };
    if bytes.len() < start + len {
        return Err(bad("truncated header"));
    }
    let text =
        std::str::from_utf8(&bytes[start..start + len]).map_err(|_| bad("header is not UTF-8"))?;
    let field = |key: &str| -> Option<&str> {
        let k = text.find(&format!("'{key}'"))?;
        let rest = &text[k + key.len() + 2..];
        let colon = rest.find(':')?;
        Some(rest[colon + 1..].trim_start())
    };
    let descr = field("descr")
        .and_then(|s| s.strip_prefix('\''))
        .and_then(|s| s.split('\'').next())
        .ok_or_else(|| bad("no descr"))?
        .to_string();
    let fortran = field("fortran_order")
        .map(|s| s.starts_with("True"))
        .ok_or_else(|| bad("no fortran_order"))?;
    let shape_str = field("shape")
        .and_then(|s| s.strip_prefix('('))
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let shape = shape_str
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| bad(&format!("bad dimension `{s}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Header {
        descr,
        fortran,
        shape,
        data_start: start + len,
    })
}

fn read_raw(path: &Path) -> Result<(Header, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| LoaderError::io(path, e))?;
    let header = parse_header(path, &bytes)?;
    if header.fortran {
        return Err(LoaderError::BadNpy {
            path: path.to_path_buf(),
            reason: "Fortran order is not supported".into(),
        });
    }
    let numel: usize = header.shape.iter().product();
    let elem = header.descr[2..].parse::<usize>().unwrap_or(0);
    let need = numel * elem;
    if bytes.len() - header.data_start < need {
        return Err(LoaderError::BadNpy {
            path: path.to_path_buf(),
            reason: format!(
                "truncated data: need {need} bytes, have {}",
                bytes.len() - header.data_start
            ),
        });
    }
    let data = bytes[header.data_start..header.data_start + need].to_vec();
    Ok((header, data))
}

/// Reads a float array (`<f4`, `<f8`) as f32.
pub fn read_f32(path: impl AsRef<Path>) -> Result<NpyArray<f32>> {
    let path = path.as_ref();
    let (h, b) = read_raw(path)?;
    let data = match h.descr.as_str() {
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
                path: path.to_path_buf(),
                reason: format!("expected a float array, got dtype {d}"),
            })
        }
    };
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

/// Reads an integer array (`|i1`, `|u1`, `<i2`, `<i4`, `<i8`, `<u2`, `<u4`) as i64.
pub fn read_i64(path: impl AsRef<Path>) -> Result<NpyArray<i64>> {
    let path = path.as_ref();
    let (h, b) = read_raw(path)?;
    let data = match h.descr.as_str() {
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
                path: path.to_path_buf(),
                reason: format!("expected an integer array, got dtype {d}"),
            })
        }
    };
    Ok(NpyArray {
        shape: h.shape,
        data,
    })
}

fn write_with_descr(path: &Path, descr: &str, shape: &[usize], payload: &[u8]) -> Result<()> {
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
    let mut out = Vec::with_capacity(10 + header.len() + payload.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload);
    let mut f = std::fs::File::create(path).map_err(|e| LoaderError::io(path, e))?;
    f.write_all(&out).map_err(|e| LoaderError::io(path, e))
}

/// Writes a little-endian f32 array.
pub fn write_f32(path: impl AsRef<Path>, shape: &[usize], data: &[f32]) -> Result<()> {
    let payload: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_with_descr(path.as_ref(), "<f4", shape, &payload)
}

/// Writes a little-endian i64 array.
pub fn write_i64(path: impl AsRef<Path>, shape: &[usize], data: &[i64]) -> Result<()> {
    let payload: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_with_descr(path.as_ref(), "<i8", shape, &payload)
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
    fn rejects_non_npy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        std::fs::write(&p, b"hello world, not numpy").unwrap();
        let err = read_f32(&p).unwrap_err().to_string();
        assert!(err.contains("a.npy") && err.contains("magic"), "{err}");
    }
}
