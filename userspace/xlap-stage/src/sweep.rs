//! Stages left behind: listed, swept, and the leaks noted for the test
//! suite's check.

use crate::*;

/// Every namespace name on this machine.
pub fn list_namespaces() -> Result<Vec<String>, StageError> {
    let out = output("ip", &["netns", "list"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The pid encoded in a stage namespace name (`xlt<pid>n<k>-…`).
pub(crate) fn owner_pid(netns: &str) -> Option<i32> {
    let rest = netns.strip_prefix(NAME_TAG)?;
    rest.split('n').next()?.parse().ok()
}

/// Deletes stage namespaces whose creating process is gone (killed before it
/// could tear down). Returns the names removed.
pub fn sweep_orphans() -> Result<Vec<String>, StageError> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        if let Some(pid) = owner_pid(&ns) {
            // SAFETY: kill with signal 0 only checks for existence.
            let alive = unsafe { libc::kill(pid, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
            if !alive && run("ip", &["netns", "delete", &ns]).is_ok() {
                removed.push(ns);
            }
        }
    }
    Ok(removed)
}

/// Where stages note the orphans they swept: a later `sweep --check` must
/// still see a leak another stage cleaned up on its way.
fn leak_ledger() -> std::path::PathBuf {
    std::env::temp_dir().join("xlap-stage-leaks")
}

/// Sweeps orphans before a new stage, warns about them and notes them for
/// [`take_noted_leaks`].
pub(crate) fn sweep_and_note() {
    let Ok(removed) = sweep_orphans() else { return };
    if removed.is_empty() {
        return;
    }
    eprintln!(
        "xlap-stage: warning: removed {} namespaces left by exited processes: {}",
        removed.len(),
        removed.join(" ")
    );
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(leak_ledger())
    {
        let _ = writeln!(f, "{}", removed.join("\n"));
    }
}

/// The leaks stages swept since the last call (the ledger is emptied).
pub fn take_noted_leaks() -> Vec<String> {
    let path = leak_ledger();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}
