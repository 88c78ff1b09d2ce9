//! A peer's run directory on the collector: made by the collector under a
//! name it chooses (`peer-N` and the peer's host when that is 1 to 64 of
//! `[A-Za-z0-9._-]`), written as the bytes arrive and never decoded here:
//! the Arrow stream, run.json and stamps.parquet are read by the confined
//! `finish` child (docs/threat-model.md). Offsets are checked so that the
//! stream on disk is a prefix of the peer's, whatever the connection did.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use xlap_records::run_dir::{META, STAMPS, STAMPS_STREAM};

/// Where the Parquet file grows until its last byte has arrived.
const PARQUET_PART: &str = "stamps.parquet.part";

pub struct PeerFiles {
    dir: PathBuf,
    stream: File,
    parquet: Option<File>,
    /// Stream bytes on disk.
    pub held: u64,
    parquet_held: u64,
    /// Every byte written for this peer (the per-peer cap counts them).
    pub total: u64,
}

/// The host a peer gave, when it can be part of a directory name.
pub fn sane_host(host: &str) -> Option<&str> {
    let ok = (1..=64).contains(&host.len())
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        && host != "."
        && host != "..";
    ok.then_some(host)
}

fn create_new(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o644)
        .open(path)
}

impl PeerFiles {
    /// A new directory in `parent` for peer number `index`: a name taken
    /// already (a run recorded there before) moves on to the next suffix.
    pub fn create(parent: &Path, index: usize, host: Option<&str>) -> std::io::Result<PeerFiles> {
        std::fs::create_dir_all(parent)?;
        let base = match host {
            Some(h) => format!("peer-{index}-{h}"),
            None => format!("peer-{index}"),
        };
        for attempt in 0..100 {
            let name = match attempt {
                0 => base.clone(),
                n => format!("{base}.{n}"),
            };
            let dir = parent.join(&name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
            let stream = create_new(&dir.join(STAMPS_STREAM))?;
            return Ok(PeerFiles {
                dir,
                stream,
                parquet: None,
                held: 0,
                parquet_held: 0,
                total: 0,
            });
        }
        Err(std::io::Error::other(format!(
            "{base}: a hundred directories of that name exist already"
        )))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// run.json, whole or not at all (it is sent again at the end).
    pub fn write_meta(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.total += bytes.len() as u64;
        xlap_records::run_file::write_whole(&self.dir.join(META), bytes)
    }

    /// Appends stream bytes that begin at `offset` of the peer's stream:
    /// anything but the next byte would leave a hole.
    pub fn append_stream(&mut self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        if offset != self.held {
            return Err(format!(
                "stream bytes at offset {offset} when {} are held",
                self.held
            ));
        }
        self.stream.write_all(bytes).map_err(|e| {
            format!(
                "cannot write {}: {e}",
                self.dir.join(STAMPS_STREAM).display()
            )
        })?;
        self.held += bytes.len() as u64;
        self.total += bytes.len() as u64;
        Ok(())
    }

    /// The same for stamps.parquet (sent whole at the end, in chunks from
    /// offset 0 on every connection).
    pub fn append_parquet(&mut self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        let part = self.dir.join(PARQUET_PART);
        if offset == 0 {
            let _ = std::fs::remove_file(&part);
            self.parquet = Some(
                create_new(&part).map_err(|e| format!("cannot create {}: {e}", part.display()))?,
            );
            self.parquet_held = 0;
        }
        let (Some(f), true) = (self.parquet.as_mut(), offset == self.parquet_held) else {
            return Err(format!(
                "stamps.parquet bytes at offset {offset} when {} are held",
                self.parquet_held
            ));
        };
        f.write_all(bytes)
            .map_err(|e| format!("cannot write {}: {e}", part.display()))?;
        self.parquet_held += bytes.len() as u64;
        self.total += bytes.len() as u64;
        Ok(())
    }

    /// The Parquet file is in place when all `size` bytes arrived.
    pub fn end_parquet(&mut self, size: u64) -> bool {
        if size == 0 || self.parquet.take().is_none() || self.parquet_held != size {
            return false;
        }
        std::fs::rename(self.dir.join(PARQUET_PART), self.dir.join(STAMPS)).is_ok()
    }

    /// Whether run.json arrived (the directory is a run).
    pub fn has_meta(&self) -> bool {
        self.dir.join(META).is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_collector_and_offsets_are_checked() {
        let tmp = std::env::temp_dir().join(format!("xlap-peer-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        assert_eq!(sane_host("../../etc"), None);
        assert_eq!(sane_host(".."), None);
        assert_eq!(sane_host("host-a.lan"), Some("host-a.lan"));
        assert_eq!(sane_host(&"a".repeat(65)), None);
        let mut a = PeerFiles::create(&tmp, 1, Some("a")).unwrap();
        let b = PeerFiles::create(&tmp, 1, Some("a")).unwrap();
        assert_eq!(a.dir(), tmp.join("peer-1-a"));
        assert_eq!(b.dir(), tmp.join("peer-1-a.1"));
        a.append_stream(0, b"abc").unwrap();
        assert!(a.append_stream(5, b"x").is_err());
        a.append_stream(3, b"de").unwrap();
        assert_eq!(
            std::fs::read(a.dir().join(STAMPS_STREAM)).unwrap(),
            b"abcde"
        );
        a.append_parquet(0, b"PAR1").unwrap();
        assert!(!a.end_parquet(5));
        a.append_parquet(0, b"PAR1x").unwrap();
        assert!(a.end_parquet(5));
        assert!(a.dir().join(STAMPS).is_file());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
