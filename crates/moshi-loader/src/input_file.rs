//! Says precisely why a path given as an input cannot be read: missing, a symlink loop, a
//! directory, no permission, or a device or pipe where a regular file is needed (a checkpoint is
//! memory-mapped; a config or WAV may come through a pipe).

use std::io::{ErrorKind, Read};
use std::path::Path;

use crate::{LoaderError, Result};

/// What an input must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// A regular file (checkpoints: memory-mapped, sized from their header).
    RegularFile,
    /// Anything readable but a directory (configs, WAVs, codes: a pipe such as `<(...)` works).
    Readable,
}

/// Checks that `path` can be opened as `kind`; the error names the path and says what it is.
pub fn check_input_file(path: &Path, kind: InputKind) -> Result<()> {
    let io = |kind: ErrorKind, what: String| LoaderError::io(path, std::io::Error::new(kind, what));
    // `metadata` follows symlinks: a dangling link is NotFound, a loop reports ELOOP.
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => io(ErrorKind::NotFound, "no such file".into()),
        _ => LoaderError::io(path, e),
    })?;
    let file_type = meta.file_type();
    if file_type.is_dir() {
        return Err(io(
            ErrorKind::IsADirectory,
            "is a directory, expected a file".into(),
        ));
    }
    if kind == InputKind::RegularFile && !file_type.is_file() {
        return Err(io(
            ErrorKind::InvalidInput,
            format!("is {}, expected a regular file", describe_special(&meta)),
        ));
    }
    // Opening catches a missing read permission (and a FIFO without a writer would block, so
    // only regular files are opened here).
    if file_type.is_file() {
        std::fs::File::open(path).map_err(|e| LoaderError::io(path, e))?;
    }
    Ok(())
}

/// Reads all of `path`, refusing (without reading on) more than `max_bytes`: a device such as
/// `/dev/zero` or a huge file given by mistake is an error naming `what` was expected.
pub fn read_capped(path: &Path, max_bytes: u64, what: &'static str) -> Result<Vec<u8>> {
    check_input_file(path, InputKind::Readable)?;
    let file = std::fs::File::open(path).map_err(|e| LoaderError::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| LoaderError::io(path, e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(LoaderError::InputTooLarge {
            path: path.to_path_buf(),
            what,
            limit_bytes: max_bytes,
        });
    }
    Ok(bytes)
}

/// `a character device`, `a pipe`, ... for a file that is not regular.
fn describe_special(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    let _ = meta;
    "not a regular file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_wrong_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.safetensors");
        let e = check_input_file(&missing, InputKind::RegularFile)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope.safetensors") && e.contains("no such file"),
            "{e}"
        );

        let e = check_input_file(dir.path(), InputKind::Readable)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a directory"), "{e}");

        #[cfg(unix)]
        {
            let a = dir.path().join("a");
            let b = dir.path().join("b");
            std::os::unix::fs::symlink(&b, &a).unwrap();
            std::os::unix::fs::symlink(&a, &b).unwrap();
            let e = check_input_file(&a, InputKind::RegularFile)
                .unwrap_err()
                .to_string();
            assert!(e.to_lowercase().contains("symbolic links"), "{e}");
            assert!(!e.contains("no such file"), "{e}");

            let e = check_input_file(Path::new("/dev/zero"), InputKind::RegularFile)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("/dev/zero") && e.contains("a character device"),
                "{e}"
            );
            assert!(check_input_file(Path::new("/dev/zero"), InputKind::Readable).is_ok());
        }
        let file = dir.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        assert!(check_input_file(&file, InputKind::RegularFile).is_ok());
    }
}
