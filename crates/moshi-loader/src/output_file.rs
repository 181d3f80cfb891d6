//! The one way moshi-rs writes an output file. A regular file (or a new path) is written to a
//! short-named hidden temporary file in the same folder, synced ([`OutputFile::finish`]) and
//! renamed over the destination only when complete, together with the run's other outputs
//! ([`commit_all`]), so an error (a full disk, a bad input found half way) leaves every
//! destination as it was and no partial file behind. Temporary files are registered, so that a
//! process ending on a signal removes them ([`remove_partials_for_exit`]). A device, pipe or
//! socket (`/dev/null`, a FIFO) or an open descriptor (`/dev/stdout`, `/proc/self/fd/1`) is
//! written directly, never replaced by a regular file, and its write errors are reported
//! (`/dev/full`). A symbolic link is written through (its target created if need be). A path
//! that is one of the command's inputs is refused before anything is written, and so is an
//! existing file whose permissions say it is read-only. New files get mode 0666 minus the umask,
//! as `File::create` gives; a replaced file keeps its permissions.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::{LoaderError, Result};

/// How an [`OutputFile`] reaches its destination.
#[derive(Debug)]
enum Target {
    /// A temporary file renamed over `dest` by [`OutputFile::commit`].
    Replace { temp: PathBuf, dest: PathBuf },
    /// Written in place (a device, pipe or socket).
    Direct,
}

/// An output being written; see the module docs. Dropping it without [`OutputFile::commit`]
/// removes the temporary file and leaves the destination untouched.
#[derive(Debug)]
pub struct OutputFile {
    /// The path as given (for messages).
    path: PathBuf,
    target: Target,
    writer: Option<BufWriter<File>>,
}

/// Distinguishes temporary files of one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The temporary files of this process not yet renamed or removed, so that a process ended by a
/// signal can remove them ([`remove_partials_for_exit`]); `closing` once it has, so that no new
/// one is made and none is renamed into place after.
struct Partials {
    paths: Vec<PathBuf>,
    closing: bool,
}

static PARTIALS: Mutex<Partials> = Mutex::new(Partials {
    paths: Vec::new(),
    closing: false,
});

/// The registry; a panic while it was held leaves it usable (it only lists paths).
fn partials() -> MutexGuard<'static, Partials> {
    PARTIALS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The error of an output started or committed after [`remove_partials_for_exit`].
fn exiting() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Interrupted,
        "the process is exiting on a signal",
    )
}

/// Removes every temporary file of this process and makes sure no new one appears and none is
/// renamed into place: for a process about to exit on a signal (SIGINT, SIGTERM, SIGHUP), so
/// that no hidden partial output is left and every destination stays as it was. Not for a
/// signal handler (it takes a lock and removes files): call it from a thread the signal woke.
pub fn remove_partials_for_exit() {
    let mut p = partials();
    p.closing = true;
    for path in p.paths.drain(..) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes temporary file `temp` and forgets it.
fn discard_temp(temp: &Path) {
    let mut p = partials();
    let _ = std::fs::remove_file(temp);
    p.paths.retain(|t| t != temp);
}

/// Fails when `output` names the same file as one of `inputs` (also through links or another
/// spelling of the path): writing it would destroy the input.
pub fn ensure_not_an_input(output: &Path, inputs: &[&Path]) -> Result<()> {
    let Ok(out_meta) = std::fs::metadata(output) else {
        return Ok(()); // a new file cannot be an existing input
    };
    for input in inputs {
        let Ok(in_meta) = std::fs::metadata(input) else {
            continue;
        };
        if same_file(&out_meta, &in_meta) && out_meta.file_type().is_file() {
            return Err(LoaderError::OutputIsInput {
                output: output.to_path_buf(),
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Fails when two of `outputs` (each named by what it is, e.g. a flag) are the same file (same
/// canonical path, or the same device and inode, e.g. a hard link), existing or not: one would
/// silently replace the other. So is one pipe named twice (`/dev/stdout` and `/proc/self/fd/1`):
/// the two outputs would be interleaved in it. Character devices (`/dev/null`, a terminal) may
/// be shared.
pub fn ensure_distinct_outputs(outputs: &[(&str, &Path)]) -> Result<()> {
    for (i, (second_what, second)) in outputs.iter().enumerate() {
        for (first_what, first) in &outputs[..i] {
            if same_output(first, second) {
                return Err(LoaderError::OutputsCollide {
                    first_what: first_what.to_string(),
                    first: first.to_path_buf(),
                    second_what: second_what.to_string(),
                    second: second.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

/// Whether outputs `a` and `b` would write the same regular file.
fn same_output(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => same_file(&ma, &mb) && !is_char_device(&ma),
        (Err(_), Err(_)) => {
            // Neither exists yet: the same name in the same folder (through any spelling).
            let canonical = |p: &Path| {
                let folder = match p.parent() {
                    Some(f) if !f.as_os_str().is_empty() => f,
                    _ => Path::new("."),
                };
                Some((
                    std::fs::canonicalize(folder).ok()?,
                    p.file_name()?.to_owned(),
                ))
            };
            matches!((canonical(a), canonical(b)), (Some(x), Some(y)) if x == y)
        }
        _ => false,
    }
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// A character device (`/dev/null`, `/dev/full`, a terminal): a sink several outputs may share.
#[cfg(unix)]
fn is_char_device(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_char_device()
}

#[cfg(not(unix))]
fn is_char_device(_m: &std::fs::Metadata) -> bool {
    false
}

#[cfg(not(unix))]
fn same_file(_a: &std::fs::Metadata, _b: &std::fs::Metadata) -> bool {
    false
}

impl OutputFile {
    /// Starts writing `path` (see the module docs). Fails, naming the path, when its folder
    /// does not exist or cannot be written, or when it is a directory.
    pub fn create(path: &Path) -> Result<Self> {
        let err = |cause: std::io::Error| LoaderError::Write {
            path: path.to_path_buf(),
            cause,
        };
        match destination(path).map_err(err)? {
            Destination::InPlace => {
                // Devices, pipes, sockets, open descriptors: written in place, never truncated or
                // replaced.
                let file = open_in_place(path).map_err(err)?;
                Ok(Self {
                    path: path.to_path_buf(),
                    target: Target::Direct,
                    writer: Some(BufWriter::new(file)),
                })
            }
            Destination::Replace { dest, existing } => {
                if let Some(m) = &existing {
                    refuse_read_only(m).map_err(err)?;
                }
                let (temp, file) = create_temp_beside(&dest).map_err(err)?;
                if let Some(m) = &existing {
                    // The replacement keeps the destination's permissions.
                    if let Err(e) = file.set_permissions(m.permissions()) {
                        drop(file);
                        discard_temp(&temp);
                        return Err(err(e));
                    }
                }
                Ok(Self {
                    path: path.to_path_buf(),
                    target: Target::Replace { temp, dest },
                    writer: Some(BufWriter::new(file)),
                })
            }
        }
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the destination is a device, pipe or socket (written in place, not seekable).
    pub fn is_direct(&self) -> bool {
        matches!(self.target, Target::Direct)
    }

    fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("present until commit")
    }

    /// Seeks the underlying file (a regular output only; a pipe cannot seek).
    pub fn seek_to(&mut self, offset: u64) -> Result<()> {
        let path = self.path.clone();
        self.writer()
            .seek(SeekFrom::Start(offset))
            .map(|_| ())
            .map_err(|cause| LoaderError::Write { path, cause })
    }

    /// Writes all of `bytes`; the error names the output.
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let path = self.path.clone();
        self.writer()
            .write_all(bytes)
            .map_err(|cause| LoaderError::Write { path, cause })
    }

    /// Completes the output without putting it in place: flushes it and syncs a regular file to
    /// disk (so that a full disk is an error here, not lost data later). A device or pipe has
    /// then received everything. [`commit_all`] puts the outputs of a run in place together.
    pub fn finish(mut self) -> Result<FinishedOutput> {
        let writer = self.writer.take().expect("present until finished");
        let file = writer.into_inner().map_err(|e| LoaderError::Write {
            path: self.path.clone(),
            cause: e.into_error(),
        })?;
        if matches!(self.target, Target::Replace { .. }) {
            file.sync_all().map_err(|cause| LoaderError::Write {
                path: self.path.clone(),
                cause,
            })?;
        }
        // fsync is meaningless (and refused) on most devices and pipes.
        drop(file);
        Ok(FinishedOutput {
            path: self.path.clone(),
            target: std::mem::replace(&mut self.target, Target::Direct),
        })
    }

    /// Finishes the output and puts it in place (an output written alone).
    pub fn commit(self) -> Result<()> {
        self.finish()?.commit()
    }
}

/// An output complete on disk but not yet in place (see [`OutputFile::finish`]). Dropping it
/// removes the temporary file and leaves the destination untouched.
#[derive(Debug)]
pub struct FinishedOutput {
    path: PathBuf,
    target: Target,
}

impl FinishedOutput {
    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts this output in place (an output written alone).
    pub fn commit(self) -> Result<()> {
        commit_all(vec![self])
    }
}

/// Puts every output of a run in place, once each of them was completed ([`OutputFile::finish`]
/// succeeded for all), so that a run that fails replaces none of its outputs: a new answer never
/// sits beside an old transcript. The renames come last and cannot fail for want of space; a
/// rename failing for another reason (the folder removed meanwhile) stops at that output.
/// Devices and pipes received their bytes as they were written: they are outside this.
pub fn commit_all(mut outputs: Vec<FinishedOutput>) -> Result<()> {
    let result = {
        // Under the registry's lock: a signal's cleanup comes before every rename or after all.
        let mut p = partials();
        let mut result = Ok(());
        for out in &mut outputs {
            let Target::Replace { temp, dest } = &out.target else {
                continue;
            };
            let renamed = if p.closing {
                Err(exiting())
            } else {
                std::fs::rename(temp, dest)
            };
            if let Err(cause) = renamed {
                result = Err(LoaderError::Write {
                    path: out.path.clone(),
                    cause,
                });
                break;
            }
            p.paths.retain(|t| t != temp);
            out.target = Target::Direct; // in place: nothing left to clean up
        }
        result
    };
    // The lock is released first: dropping an output not put in place removes its temporary
    // file, which takes the lock again.
    drop(outputs);
    result
}

impl Drop for FinishedOutput {
    fn drop(&mut self) {
        if let Target::Replace { temp, .. } = &self.target {
            discard_temp(temp);
        }
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer().flush()
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let Target::Replace { temp, .. } = &self.target {
            drop(self.writer.take());
            discard_temp(temp);
        }
    }
}

/// Refuses an existing destination whose permissions say it may not be written (a read-only
/// file would otherwise be silently replaced by the rename, whoever runs the command).
fn refuse_read_only(existing: &std::fs::Metadata) -> std::io::Result<()> {
    if existing.permissions().readonly() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the existing file is read-only (no write permission); refusing to replace it",
        ));
    }
    Ok(())
}

/// Creates a new, hidden temporary file in `dest`'s folder (mode 0666 minus the umask), and
/// registers it.
fn create_temp_beside(dest: &Path) -> std::io::Result<(PathBuf, File)> {
    let folder = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("folder {} does not exist", folder.display()),
        ));
    }
    // Created and registered under the lock: a signal's cleanup sees every temporary file.
    let mut p = partials();
    if p.closing {
        return Err(exiting());
    }
    loop {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        // A short name whatever the destination's (one of 255 bytes, the most a folder entry
        // holds, must still get a temporary name), in the same folder so that the rename is
        // atomic.
        let temp = folder.join(format!(".moshi-rs-{}-{n}.partial", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => {
                p.paths.push(temp.clone());
                return Ok((temp, file));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Checks, before any work, that `path` can be written as an output: its folder exists and takes
/// a new file, and it is not a directory. Nothing is created or opened at `path` itself (a pipe
/// is only opened when its output is written).
pub fn check_output_path(path: &Path) -> Result<()> {
    let err = |cause: std::io::Error| LoaderError::Write {
        path: path.to_path_buf(),
        cause,
    };
    match destination(path).map_err(err)? {
        Destination::InPlace => Ok(()),
        Destination::Replace { dest, existing } => {
            if let Some(m) = &existing {
                refuse_read_only(m).map_err(err)?;
            }
            let (temp, file) = create_temp_beside(&dest).map_err(err)?;
            drop(file);
            discard_temp(&temp);
            Ok(())
        }
    }
}

/// Where an output's bytes go.
enum Destination {
    /// Written in place: a device, pipe or socket, or an open descriptor (`/dev/stdout`,
    /// `/proc/self/fd/N`), which may be a regular file the shell opened (`> out.wav`).
    InPlace,
    /// A regular file (`existing`) or a new one, written beside `dest` (a symlink's target) and
    /// renamed over it.
    Replace {
        dest: PathBuf,
        existing: Option<std::fs::Metadata>,
    },
}

/// How `path` is written (see [`Destination`]); a directory, or a symbolic link whose target's
/// folder does not exist, is an error saying so.
fn destination(path: &Path) -> std::io::Result<Destination> {
    if is_open_descriptor(path) {
        // Renaming a file over `/proc/self/fd/1` is impossible (a pipe has no name) or wrong
        // (it would unlink the file the shell opened): the bytes are streamed to it.
        return Ok(Destination::InPlace);
    }
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") && !path.is_dir() {
        // `out/` names a folder: as a new file it would be written beside, as `out`, and the
        // final rename onto `out/` would fail after all the work.
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "ends in `/`, which names a folder; an output is a file",
        ));
    }
    let existing = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory",
            ))
        }
        Ok(m) if !m.is_file() => return Ok(Destination::InPlace),
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    // A symlink is written through: its target is the destination (created when it does not
    // exist yet, as a shell's `>` does).
    let dest = link_target(path)?;
    if dest != path && !parent_of(&dest).is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "is a symbolic link to {}, whose folder {} does not exist",
                dest.display(),
                parent_of(&dest).display()
            ),
        ));
    }
    Ok(Destination::Replace { dest, existing })
}

/// The folder of `path` (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// `path` with its symbolic links followed one by one (the last target need not exist).
fn link_target(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    // The kernel's own limit on links followed in one lookup.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)?;
                p = parent_of(&p).join(target);
            }
            _ => return Ok(p),
        }
    }
    Err(std::io::Error::other("too many levels of symbolic links"))
}

/// Whether `path` names an open file descriptor (`/dev/stdout`, `/dev/fd/1`, `/proc/self/fd/1`):
/// a link, or a chain of links, into a `/proc/<pid>/fd` folder.
fn is_open_descriptor(path: &Path) -> bool {
    open_descriptor(path).is_some()
}

/// Whether `path` is this process's stdout named as a path (`/dev/stdout`, `/proc/self/fd/1`):
/// a command then prints nothing else there.
pub fn names_stdout(path: &Path) -> bool {
    open_descriptor(path).is_some_and(|(folder, entry)| {
        entry == "1" && std::fs::canonicalize("/proc/self/fd").is_ok_and(|f| f == folder)
    })
}

/// The `/proc/<pid>/fd` folder and the entry in it that `path` leads to, if it does.
fn open_descriptor(path: &Path) -> Option<(PathBuf, std::ffi::OsString)> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        if let Ok(folder) = std::fs::canonicalize(parent_of(&p)) {
            if folder.starts_with("/proc") && folder.file_name().is_some_and(|n| n == "fd") {
                return Some((folder, p.file_name()?.to_owned()));
            }
        }
        let target = std::fs::read_link(&p).ok()?;
        p = parent_of(&p).join(target);
    }
    None
}

/// Opens an output written in place. This process's stdout and stderr named as a path
/// (`/dev/stdout`) are its own descriptors, duplicated: reopening them through `/proc` would
/// write a regular file from its beginning, over what the shell appended (`>>`) or wrote before.
fn open_in_place(path: &Path) -> std::io::Result<File> {
    #[cfg(unix)]
    if let Some((folder, entry)) = open_descriptor(path) {
        use std::os::fd::AsFd;
        let own = std::fs::canonicalize("/proc/self/fd").is_ok_and(|f| f == folder);
        match (own, entry.to_str()) {
            (true, Some("1")) => return Ok(std::io::stdout().as_fd().try_clone_to_owned()?.into()),
            (true, Some("2")) => return Ok(std::io::stderr().as_fd().try_clone_to_owned()?.into()),
            _ => {}
        }
    }
    OpenOptions::new().write(true).open(path)
}

/// Writes `bytes` to `path` as one output (see the module docs).
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut out = OutputFile::create(path)?;
    out.write_bytes(bytes)?;
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An existing destination keeps its permissions when replaced; a read-only one is refused
    /// (checked by the permission bits, as root may write anything) and left as it was.
    #[cfg(unix)]
    #[test]
    fn replaced_files_keep_their_mode_and_read_only_ones_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.txt");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_output(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        for e in [
            check_output_path(&path).unwrap_err(),
            write_output(&path, b"newer").unwrap_err(),
        ] {
            let e = e.to_string();
            assert!(e.contains("out.txt") && e.contains("read-only"), "{e}");
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(names_in(dir.path()), vec!["out.txt".to_string()]);
    }

    #[test]
    fn outputs_naming_one_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("out.txt");
        let new_other_spelling = dir.path().join(".").join("out.txt");
        let existing = dir.path().join("old.txt");
        std::fs::write(&existing, b"keep").unwrap();
        let hard_link = dir.path().join("link.txt");
        std::fs::hard_link(&existing, &hard_link).unwrap();
        let other = dir.path().join("other.txt");
        for (a, b) in [
            (&new, &new_other_spelling),
            (&existing, &existing),
            (&existing, &hard_link),
        ] {
            let e = ensure_distinct_outputs(&[
                ("output", other.as_path()),
                ("output", a),
                ("--tokens-out", b),
            ])
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("--tokens-out") && e.contains("output") && e.contains("same file"),
                "{e}"
            );
        }
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
        ensure_distinct_outputs(&[
            ("output", &new),
            ("--transcript", &existing),
            ("--profile", &other),
        ])
        .unwrap();
        // Devices may take several outputs.
        let null = Path::new("/dev/null");
        if null.exists() {
            ensure_distinct_outputs(&[("--tokens-out", null), ("--profile", null)]).unwrap();
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_a_regular_file_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        std::fs::write(&path, b"old").unwrap();
        let mut out = OutputFile::create(&path).unwrap();
        out.write_bytes(b"new content").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        drop(out); // an error half way: the old file stays, no temp file is left
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(names_in(dir.path()), ["out.bin"]);

        write_output(&path, b"new content").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new content");
        assert_eq!(names_in(dir.path()), ["out.bin"]);
    }

    #[test]
    fn refuses_directories_and_missing_folders() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_output_path(dir.path()).is_err());
        assert!(check_output_path(&dir.path().join("nope/out.wav")).is_err());
        check_output_path(&dir.path().join("new.wav")).unwrap();
        check_output_path(Path::new("/dev/null")).unwrap();
        assert_eq!(names_in(dir.path()), Vec::<String>::new());
        let e = OutputFile::create(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = OutputFile::create(&dir.path().join("nope/out.wav"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope/out.wav") && e.contains("cannot write"),
            "{e}"
        );
    }

    /// The temporary name does not grow with the destination's: a 255-byte name is written.
    #[test]
    fn names_of_255_bytes_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n".repeat(255));
        check_output_path(&path).unwrap();
        write_output(&path, b"x").unwrap();
        assert_eq!(names_in(dir.path()), ["n".repeat(255)]);
    }

    /// A symbolic link to a file not there yet creates it (as a shell's `>`); one whose target's
    /// folder is missing says so, not just "No such file".
    #[test]
    fn dangling_symlinks_create_their_target_or_say_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link.wav");
        let target = dir.path().join("new.wav");
        std::os::unix::fs::symlink("new.wav", &link).unwrap();
        check_output_path(&link).unwrap();
        write_output(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());

        let lost = dir.path().join("lost.wav");
        std::os::unix::fs::symlink(dir.path().join("gone/x.wav"), &lost).unwrap();
        for e in [
            check_output_path(&lost).unwrap_err(),
            write_output(&lost, b"x").unwrap_err(),
        ] {
            let e = e.to_string();
            assert!(
                e.contains("lost.wav")
                    && e.contains("symbolic link")
                    && e.contains("gone")
                    && e.contains("does not exist"),
                "{e}"
            );
        }
        assert_eq!(names_in(dir.path()), ["link.wav", "lost.wav", "new.wav"]);
    }

    /// A rename that fails (here onto a folder made after the output was started) is an error
    /// naming the output, and the outputs not put in place are removed (this once deadlocked:
    /// they were dropped while the registry's lock was held).
    #[test]
    fn a_failed_rename_is_an_error_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("became-a-folder");
        let good = dir.path().join("good.txt");
        let outputs: Vec<FinishedOutput> = [&bad, &good]
            .into_iter()
            .map(|p| {
                let mut out = OutputFile::create(p).unwrap();
                out.write_bytes(b"x").unwrap();
                out.finish().unwrap()
            })
            .collect();
        std::fs::create_dir(&bad).unwrap();
        std::fs::write(bad.join("inside"), b"").unwrap();
        let e = commit_all(outputs).unwrap_err().to_string();
        assert!(e.contains("became-a-folder"), "{e}");
        assert_eq!(names_in(dir.path()), ["became-a-folder"]);
        // A name ending in `/` is refused up front.
        let e = check_output_path(&dir.path().join("new/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ends in `/`"), "{e}");
    }

    #[test]
    fn writes_through_a_symlink_to_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.txt");
        let link = dir.path().join("link.txt");
        std::fs::write(&target, b"old").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_output(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    }

    #[test]
    fn devices_are_written_in_place_and_their_errors_reported() {
        use std::os::unix::fs::FileTypeExt;
        write_output(Path::new("/dev/null"), b"discarded").unwrap();
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        let e = write_output(Path::new("/dev/full"), &[0u8; 1 << 16])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/full") && e.contains("No space left"),
            "{e}"
        );
    }

    #[test]
    fn an_input_is_never_an_output() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.wav");
        std::fs::write(&input, b"input").unwrap();
        let other = dir.path().join("./in.wav");
        let e = ensure_not_an_input(&other, &[Path::new("x"), &input])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in.wav") && e.contains("same file as the input"),
            "{e}"
        );
        let hard = dir.path().join("hard.wav");
        std::fs::hard_link(&input, &hard).unwrap();
        assert!(ensure_not_an_input(&hard, &[&input]).is_err());
        assert!(ensure_not_an_input(&dir.path().join("new.wav"), &[&input]).is_ok());
        assert!(ensure_not_an_input(Path::new("/dev/null"), &[Path::new("/dev/null")]).is_ok());
    }

    #[test]
    fn new_files_follow_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_output(&path, b"x").unwrap();
        // What File::create gives under the same umask.
        let reference = dir.path().join("reference.bin");
        std::fs::File::create(&reference).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), mode(&reference));
    }
}
