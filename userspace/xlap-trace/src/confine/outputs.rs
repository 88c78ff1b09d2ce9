//! Both sides of a confined analysis command: the privileged parent that
//! makes the outputs and runs the child, and the child that confines
//! itself to its inputs and outputs.

use super::{Access, Output};
use anyhow::{anyhow, Context, Result};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;

/// The staged paths of the child, and the paths the user gave for them.
static SHOWN: OnceLock<Vec<(PathBuf, PathBuf)>> = OnceLock::new();

pub fn shown(path: &Path) -> PathBuf {
    SHOWN
        .get()
        .and_then(|s| s.iter().find(|(staged, _)| staged == path))
        .map_or_else(|| path.to_path_buf(), |(_, given)| given.clone())
}

/// The variable that hands the child the user to run as ("uid:gid"),
/// where Landlock is missing.
const USER_VAR: &str = "XLAP_CONFINED_USER";

/// The directories an analysis works in: each input directory, and the
/// directory of each input file.
fn input_dirs(inputs: &[PathBuf]) -> Vec<&Path> {
    inputs
        .iter()
        .map(|i| {
            if i.is_dir() {
                i.as_path()
            } else {
                parent_of(i)
            }
        })
        .collect()
}

/// The user the child runs as: where Landlock is missing, the one
/// non-root owner of the runs it reads (xlap_sandbox::user_for); None
/// where Landlock confines it to its files.
fn child_user(inputs: &[PathBuf]) -> Option<(u32, u32)> {
    xlap_sandbox::landlock_abi().err()?;
    xlap_sandbox::user_for(&input_dirs(inputs))
}

/// Gives what the parent made for the child to its user.
fn give(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .with_context(|| format!("cannot give {} to uid {uid}", path.display()))?;
    }
    Ok(())
}

/// The variable that hands output `i`'s staged path to the child.
fn staged_var(i: usize) -> String {
    format!("XLAP_CONFINED_OUTPUT_{i}")
}

/// The child: no capabilities, no_new_privs, and Landlock rules for its
/// inputs, its outputs and its temporary directory (made by the parent).
pub fn confine_child(access: Access, child: &str) -> Result<()> {
    let mut policy = xlap_sandbox::Policy::new();
    for input in &access.inputs {
        policy = if input.is_dir() {
            policy.write(input)
        } else {
            // A packets file is read with the runs of its directory (their
            // run.json, their stamps): the directory is read, not written.
            let dir = parent_of(input);
            policy.read(if dir.is_dir() { dir } else { input.as_path() })
        };
    }
    let mut shown = Vec::new();
    for (i, output) in access.outputs.into_iter().enumerate() {
        match output {
            Output::File(path) => policy = policy.write(path.clone()),
            Output::Directory(dir) => policy = policy.write(dir),
            Output::Staged(path, _) => {
                let staged = PathBuf::from(std::env::var_os(staged_var(i)).ok_or_else(|| {
                    anyhow!(
                        "{child} is set but {} is not: both are set by xlap-trace for its confined child, not by hand",
                        staged_var(i)
                    )
                })?);
                let stage = staged.parent().unwrap_or(Path::new("."));
                policy = policy.write(stage);
                shown.push((staged.clone(), path.clone()));
                *path = staged;
            }
        }
    }
    if let Some(tmp) = std::env::var_os("TMPDIR") {
        policy = policy.write(tmp);
    }
    if let Some(user) = std::env::var_os(USER_VAR) {
        let parsed = user
            .to_str()
            .and_then(|u| u.split_once(':'))
            .and_then(|(uid, gid)| Some((uid.parse().ok()?, gid.parse().ok()?)));
        let (uid, gid) = parsed.ok_or_else(|| {
            anyhow!("{USER_VAR} is not uid:gid: it is set by xlap-trace for its confined child, not by hand")
        })?;
        policy = policy.as_user(uid, gid);
    }
    let confined = policy
        .apply()
        .map_err(|e| anyhow!("cannot confine the analysis: {e}"))?;
    if let Some(shortfall) = confined.shortfall() {
        eprintln!("xlap-trace: note: {shortfall}");
    }
    let _ = SHOWN.set(shown);
    Ok(())
}

/// The privileged parent: makes what the child may write, runs it (this
/// very binary, same arguments), moves its staged outputs into place and
/// exits as it did.
pub fn run_child(access: Access, child: &str) -> Result<ExitCode> {
    let tmp = PrivateDir::new(&std::env::temp_dir(), "xlap-confined")?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.args(std::env::args_os().skip(1))
        .env(child, "1")
        .env("TMPDIR", tmp.path());
    let user = child_user(&access.inputs);
    if let Some((uid, gid)) = user {
        cmd.env(USER_VAR, format!("{uid}:{gid}"));
    }
    give(tmp.path(), user)?;
    let mut made = Vec::new();
    let mut stages = Vec::new();
    for (i, output) in access.outputs.iter().enumerate() {
        match output {
            Output::File(path) => {
                if let Some(file) = make_file(path)? {
                    give(&file, user)?;
                    made.push(file);
                }
            }
            Output::Directory(dir) => {
                if !dir.exists() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("cannot make {}", dir.display()))?;
                    give(dir, user)?;
                }
            }
            Output::Staged(path, files) => {
                let name = path
                    .file_name()
                    .ok_or_else(|| anyhow!("{}: not a file name", path.display()))?;
                let stage = PrivateDir::new(parent_of(path), ".xlap-output")?;
                give(stage.path(), user)?;
                cmd.env(staged_var(i), stage.path().join(name));
                stages.push((stage, files));
            }
        }
    }
    // A dead recorder's marker rings go with root's help (by their names
    // alone); the child, without it, recovers the run itself.
    xlap_capture::recover::sweep_dead_recorders_rings();
    let status = wait_forwarding_signals(cmd)?;
    for (stage, files) in &stages {
        move_into_place(stage.path(), files)?;
    }
    if !status.success() {
        // Files made for a child that wrote nothing into them go again.
        for path in made {
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() == 0) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or(status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(code as u8))
}

/// The directory a file goes in.
fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Makes `path` empty for the child to write, unless something is there
/// already (the command replaces a file; a link there is the command's to
/// refuse or follow, as without confinement). Some(path) when made here.
fn make_file(path: &Path) -> Result<Option<PathBuf>> {
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    match made {
        Ok(_) => Ok(Some(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(anyhow!("cannot write {}: {e}", path.display())),
    }
}

/// Moves the staged files into place (each `files` names its destination;
/// its name is the staged one): regular files only, by rename (a link at
/// the destination is replaced, never written through).
fn move_into_place(stage: &Path, files: &[PathBuf]) -> Result<()> {
    for dest in files {
        let Some(name) = dest.file_name() else {
            continue;
        };
        let staged = stage.join(name);
        if !std::fs::symlink_metadata(&staged).is_ok_and(|m| m.is_file()) {
            continue;
        }
        std::fs::rename(&staged, dest)
            .with_context(|| format!("cannot move {} to {}", staged.display(), dest.display()))?;
    }
    Ok(())
}

/// Runs the child to its end. Ctrl-C reaches it from the terminal; a
/// SIGTERM or SIGHUP sent to this process alone is passed on, so that the
/// staging directories are still removed.
fn wait_forwarding_signals(mut cmd: std::process::Command) -> Result<std::process::ExitStatus> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot watch for signals")?;
    let mut child = cmd
        .spawn()
        .context("cannot start the confined analysis (/proc/self/exe)")?;
    let pid = child.id() as libc::pid_t;
    let handle = signals.handle();
    let forward = std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig != SIGINT {
                // SAFETY: a signal to our own child, still unreaped.
                unsafe { libc::kill(pid, sig) };
            }
        }
    });
    let status = child.wait().context("waiting for the confined analysis");
    handle.close();
    let _ = forward.join();
    status
}

/// A directory of this process's own (mode 0700, a fresh name), removed
/// with what it holds when dropped.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn new(parent: &Path, prefix: &str) -> Result<PrivateDir> {
        let pid = std::process::id();
        let mut last = None;
        for attempt in 0..100u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = parent.join(format!("{prefix}-{pid}-{nanos:x}{attempt}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(PrivateDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(anyhow!(
                        "cannot make a directory in {}: {e}",
                        parent.display()
                    ))
                }
            }
        }
        Err(anyhow!(
            "cannot make a directory in {}: {}",
            parent.display(),
            last.map_or_else(String::new, |e| e.to_string())
        ))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
