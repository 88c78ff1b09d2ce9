//! Go programs of the repository (`tests/go/`) built for a test with the
//! system's Go (Debian's `golang-go`, installed by `./run.sh setup`):
//! standard library only, no network, the build cache under the target
//! directory.

use crate::target_dir;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Go toolchain: Debian's (`/usr/bin/go`, what `./run.sh setup`
/// installs) where it is, else the first `go` on `PATH`.
pub fn go() -> PathBuf {
    let debian = Path::new("/usr/bin/go");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("go")
    }
}

/// Builds `tests/go/NAME/main.go` to `exe`; the error says why (no Go, a
/// compile error).
pub fn build(name: &str, exe: &Path) -> Result<PathBuf, String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("go")
        .join(name)
        .join("main.go");
    let cache = target_dir().join("go-cache");
    let gopath = exe.with_extension("gopath");
    let out = Command::new(go())
        .arg("build")
        .arg("-o")
        .arg(exe)
        .arg(&source)
        .env("GOCACHE", cache.join("build"))
        .env("GOPATH", &gopath)
        .env("GOMODCACHE", gopath.join("mod"))
        // Nothing from the network: the standard library only, this
        // toolchain.
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        .env("GO111MODULE", "")
        .env("CGO_ENABLED", "0")
        .output()
        .map_err(|e| {
            format!(
                "{}: {e} (./run.sh setup installs Debian's golang-go)",
                go().display()
            )
        })?;
    let _ = std::fs::remove_dir_all(&gopath);
    if !out.status.success() {
        return Err(format!(
            "go build {}: {}",
            source.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(exe.to_path_buf())
}
