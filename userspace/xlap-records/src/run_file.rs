//! Opening the files of a run directory that may come from elsewhere (a CI
//! artifact, the run a pull request recorded): never through a symbolic
//! link, only regular files (a FIFO would block a reader forever, a device
//! such as `/dev/zero` never ends), and never more bytes read than a cap.
//! Every reader of `run.json`, `summary.json`, `segments.json`,
//! `stamps.arrows` and `packets.parquet` opens through here, and
//! `summary.json` is written through here (docs/threat-model.md, "a run
//! directory from elsewhere").

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The most bytes of a run's JSON file read: what xlap-trace writes is
/// about 100 KB (a pooled baseline of ten runs, some hundreds); 160 times
/// that is an edited or foreign file.
pub const JSON_CAP: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RunFileError {
    #[error("cannot open it: {0}")]
    Io(#[from] std::io::Error),
    #[error("is a symbolic link: the files of a run are never followed out of its directory (copy the file itself there)")]
    Link,
    #[error("is a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("is {size} bytes, more than xlap-trace reads of it ({cap} bytes): not a file xlap-trace wrote")]
    TooLarge { size: u64, cap: u64 },
}

impl From<RunFileError> for std::io::Error {
    fn from(e: RunFileError) -> std::io::Error {
        match e {
            RunFileError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}

/// Opens `path` as `options` say, never through a link at its last
/// component, and without blocking (a FIFO is refused after, not waited on).
fn no_follow(options: &mut OpenOptions, path: &Path) -> Result<File, RunFileError> {
    options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => RunFileError::Link,
            _ => RunFileError::Io(e),
        })
}

/// Opens `path` for reading: a regular file, not through a link at its
/// last component. The open itself never blocks (a FIFO is refused after
/// it, not waited on).
pub fn open(path: &Path) -> Result<File, RunFileError> {
    let file = no_follow(OpenOptions::new().read(true), path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(RunFileError::NotRegular(if kind.is_fifo() {
            "FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else if kind.is_dir() {
            "directory"
        } else if kind.is_socket() {
            "socket"
        } else {
            "special file"
        }));
    }
    Ok(file)
}

/// The bytes of `path`, refused above `cap` (checked before reading, and
/// while reading: a file that grows meanwhile is cut at `cap` + 1 and
/// refused).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, RunFileError> {
    let file = open(path)?;
    let size = file.metadata()?.len();
    if size > cap {
        return Err(RunFileError::TooLarge { size, cap });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(RunFileError::TooLarge {
            size: bytes.len() as u64,
            cap,
        });
    }
    Ok(bytes)
}

/// A run's JSON file as text ([`JSON_CAP`]).
pub fn read_json_text(path: &Path) -> Result<String, RunFileError> {
    let bytes = read_capped(path, JSON_CAP)?;
    String::from_utf8(bytes).map_err(|e| {
        RunFileError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })
}

/// Creates (or truncates) `path` for writing, never through a link: a
/// link left where the file goes (dangling or not) is refused, not
/// followed to create or overwrite the file it names.
pub fn create(path: &Path) -> Result<File, RunFileError> {
    let file = no_follow(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644),
        path,
    )?;
    if !file.metadata()?.file_type().is_file() {
        return Err(RunFileError::NotRegular("FIFO or device"));
    }
    Ok(file)
}

/// Writes `bytes` to `path` whole or not at all: a temporary file beside
/// it (`path` + `.tmp`), made anew and never through a link (a link left
/// there by a run directory from elsewhere is removed, not followed),
/// then renamed over `path` (which replaces a link there, never writes
/// through it).
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = engine_target(path)?;
    let write = || -> std::io::Result<()> {
        let mut file = create(&tmp).map_err(std::io::Error::from)?;
        std::io::Write::write_all(&mut file, bytes)?;
        std::fs::rename(&tmp, path)
    };
    write()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display())))
}

/// The temporary file beside `path` (`path` + `.tmp`) cleared of whatever a
/// run directory from elsewhere left there (a link to another file among
/// them: removed, not followed), for a writer that opens it by name (the
/// SQL engine's COPY) and renames it over `path` when complete.
pub fn engine_target(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    let tmp = std::path::PathBuf::from(name);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(std::io::Error::new(
            e.kind(),
            format!("cannot remove {}: {e}", tmp.display()),
        )),
        _ => Ok(tmp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("xlap-run-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn links_fifos_devices_and_oversized_files_are_refused_and_nothing_is_written_through_a_link() {
        let dir = scratch("refused");
        let outside = dir.join("outside");
        std::fs::write(&outside, "SECRET").unwrap();
        let link = dir.join("run.json");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        assert!(matches!(read_json_text(&link), Err(RunFileError::Link)));
        // Writing through a link to a file, or a dangling one, creates and
        // changes nothing.
        assert!(matches!(create(&link), Err(RunFileError::Link)));
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "SECRET");
        let dangling = dir.join("summary.json");
        let target = dir.join("created-through-the-link");
        std::os::unix::fs::symlink(&target, &dangling).unwrap();
        assert!(matches!(create(&dangling), Err(RunFileError::Link)));
        assert!(!target.exists());
        // A FIFO: refused at once, not waited on.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_json_text(&fifo),
            Err(RunFileError::NotRegular("FIFO"))
        ));
        assert!(matches!(
            read_json_text(Path::new("/dev/zero")),
            Err(RunFileError::NotRegular("device"))
        ));
        assert!(matches!(
            read_json_text(&dir),
            Err(RunFileError::NotRegular("directory"))
        ));
        let big = dir.join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(JSON_CAP + 1)
            .unwrap();
        assert!(matches!(
            read_json_text(&big),
            Err(RunFileError::TooLarge { size, .. }) if size == JSON_CAP + 1
        ));
        // A genuine file reads whole.
        let ok = dir.join("ok.json");
        std::fs::write(&ok, "{}").unwrap();
        assert_eq!(read_json_text(&ok).unwrap(), "{}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
