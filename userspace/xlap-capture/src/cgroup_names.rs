//! Names of the cgroup ids the stamps carried (run.json `cgroups`): a
//! cgroup v2 id is the inode number of the cgroup's directory in the
//! cgroup2 file system, so a walk of that tree finds each id's path; what
//! the path names (container, pod) is `xlap_records::cgroups`' to parse.
//! Also the cgroups `record --cgroup`/`--container` trace whole, and their
//! members.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use xlap_records::cgroups::CgroupInfo;

/// Directories the walk visits at most (a host with many containers has a
/// few thousand cgroups): the run's end never waits on an unbounded walk.
const MAX_DIRS: usize = 200_000;
/// Depth below the root the walk descends at most.
const MAX_DEPTH: usize = 32;
/// Cgroups a rescan of a traced cgroup's members (every second) visits at
/// most: a subtree delegated to the traced user can be made as large as it
/// likes, and the recorder's idle cost must not follow it.
const MAX_RESCAN_DIRS: usize = 4096;

/// The cgroups of `ids`, sorted by id; an id no cgroup has any more (its
/// cgroup removed before the run's end) is listed without a path.
pub fn describe(ids: HashSet<u64>) -> Vec<CgroupInfo> {
    if ids.is_empty() {
        return Vec::new();
    }
    let found = crate::cgroup::cgroup2_mount()
        .map(|root| paths_of(&root, &ids))
        .unwrap_or_default();
    let mut out: Vec<CgroupInfo> = ids
        .iter()
        .map(|&id| match found.get(&id) {
            Some(path) => CgroupInfo::at(id, path),
            None => CgroupInfo {
                id,
                ..Default::default()
            },
        })
        .collect();
    out.sort_by_key(|c| c.id);
    out
}

/// The path below `root` (`/`-led) of each of `ids` found in the tree.
fn paths_of(root: &Path, ids: &HashSet<u64>) -> HashMap<u64, String> {
    let mut found = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut visited = 0;
    while let Some((dir, depth)) = stack.pop() {
        visited += 1;
        if visited > MAX_DIRS || found.len() == ids.len() {
            break;
        }
        // symlink_metadata: a cgroup tree has no links; one is not followed.
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue; // removed while walking
        };
        if !meta.is_dir() {
            continue;
        }
        if ids.contains(&meta.ino()) {
            let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
            found.insert(meta.ino(), format!("/{}", rel.to_string_lossy()));
        }
        if depth >= MAX_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// The cgroup v2 id of process `pid` now (its cgroup directory's inode),
/// from `/proc/PID/cgroup`; `None` when it is gone or has no v2 cgroup.
pub fn cgroup_id_of(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = xlap_records::cgroups::unified_path(&text)?;
    let root = crate::cgroup::cgroup2_mount()?;
    let dir = root.join(path.trim_start_matches('/'));
    std::fs::symlink_metadata(dir).ok().map(|m| m.ino())
}

/// A cgroup traced whole (`record --cgroup`/`--container`): the processes
/// in it or below it when the run starts, and those that enter later (the
/// kernel side adopts them at their next socket, fork or exec; the
/// recorder's rescans of `cgroup.procs` catch the rest).
#[derive(Clone, Debug, PartialEq)]
pub struct TracedCgroup {
    /// Its directory in the cgroup2 mount.
    pub dir: PathBuf,
    /// Its cgroup v2 id (the directory's inode number).
    pub id: u64,
    /// Its depth below the cgroup2 root (the root is 0).
    pub level: u32,
}

impl TracedCgroup {
    /// The cgroup at `rel` below `root`, a directory `root` holds.
    fn at(root: &Path, rel: &Path) -> std::io::Result<TracedCgroup> {
        let dir = root.join(rel);
        let id = std::fs::symlink_metadata(&dir)?.ino();
        let level = rel
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .count() as u32;
        Ok(TracedCgroup { dir, id, level })
    }

    /// The processes in it and below it now.
    pub fn members(&self) -> Vec<u32> {
        members_below(&self.dir, MAX_DIRS)
    }

    /// The same during the run: bounded tighter, being repeated (the
    /// kernel side adopts members beyond the bound at their next socket,
    /// fork or exec).
    pub fn rescan_members(&self) -> Vec<u32> {
        members_below(&self.dir, MAX_RESCAN_DIRS)
    }
}

/// The cgroup of `record --cgroup PATH`. PATH is below the cgroup2 root
/// (`/a/b` or `a/b`), or the cgroup's directory under the root's mount.
pub fn cgroup_at(path: &str) -> anyhow::Result<TracedCgroup> {
    let root = crate::cgroup::cgroup2_mount().ok_or_else(|| {
        anyhow::anyhow!(
            "--cgroup {path}: no cgroup2 hierarchy is mounted here (see /proc/self/mountinfo)"
        )
    })?;
    let given = Path::new(path);
    if given
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        anyhow::bail!(
            "--cgroup {path}: a cgroup path has no `..`; give it below the cgroup2 root ({})",
            root.display()
        );
    }
    let rel = match given.strip_prefix(&root) {
        Ok(rel) => rel.to_path_buf(),
        Err(_) => PathBuf::from(path.trim_start_matches('/')),
    };
    let dir = root.join(&rel);
    if !dir.join("cgroup.procs").is_file() {
        anyhow::bail!(
            "--cgroup {path}: {} is no cgroup (no cgroup.procs there); give a path below the cgroup2 root {}, as /proc/PID/cgroup writes it after `0::`",
            dir.display(),
            root.display()
        );
    }
    TracedCgroup::at(&root, &rel)
        .map_err(|e| anyhow::anyhow!("--cgroup {path}: cannot read {}: {e}", dir.display()))
}

/// The cgroups of `record --container ID`: the outermost cgroups whose
/// paths name a container whose id starts with ID (at least 4 hex
/// digits), all of one container; and the first one's path.
pub fn container_cgroups(id: &str) -> anyhow::Result<(String, Vec<TracedCgroup>)> {
    if id.len() < 4 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!("--container {id}: a container id is hex digits (at least 4 of them), as `docker ps` or `podman ps` shows it");
    }
    let id = id.to_ascii_lowercase();
    let root = crate::cgroup::cgroup2_mount()
        .ok_or_else(|| anyhow::anyhow!("--container {id}: no cgroup2 hierarchy is mounted here"))?;
    // The outermost cgroup of each container (its sub-cgroups name it too).
    let mut found: Vec<(String, String)> = Vec::new();
    walk(&root, |rel| {
        let Some(c) = xlap_records::cgroups::container_of(rel) else {
            return true;
        };
        if !c.id.starts_with(&id) {
            return true;
        }
        found.push((rel.to_string(), c.id));
        false // its sub-cgroups are its own
    });
    let ids: std::collections::BTreeSet<&String> = found.iter().map(|(_, c)| c).collect();
    match (ids.len(), found.first()) {
        (0, _) | (_, None) => anyhow::bail!(
            "--container {id}: no cgroup below {} names a container whose id starts so (is it running, and under this cgroup2 hierarchy?)",
            root.display()
        ),
        (1, Some((first, _))) => {
            let cgroups = found
                .iter()
                .filter_map(|(rel, _)| {
                    TracedCgroup::at(&root, Path::new(rel.trim_start_matches('/'))).ok()
                })
                .collect();
            Ok((first.clone(), cgroups))
        }
        _ => anyhow::bail!(
            "--container {id}: {} containers have ids that start so ({}); give more of the id",
            ids.len(),
            ids.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The pids in `cgroup.procs` of `dir` and of the cgroups below it.
fn members_below(dir: &Path, max_dirs: usize) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut visited = 0;
    while let Some((d, depth)) = stack.pop() {
        visited += 1;
        if visited > max_dirs {
            break;
        }
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if depth < MAX_DEPTH {
            push_subdirs(&d, depth, &mut stack);
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Walks the cgroups below `root` (bounded as `paths_of`), calling `f` with
/// each one's path below the root; `f` returning false skips what is below.
fn walk(root: &Path, mut f: impl FnMut(&str) -> bool) {
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    let mut visited = 0;
    while let Some((dir, depth)) = stack.pop() {
        visited += 1;
        if visited > MAX_DIRS {
            break;
        }
        let rel = dir.strip_prefix(root).unwrap_or(Path::new(""));
        if !f(&format!("/{}", rel.to_string_lossy())) {
            continue;
        }
        if depth < MAX_DEPTH {
            push_subdirs(&dir, depth, &mut stack);
        }
    }
}

fn push_subdirs(dir: &Path, depth: usize, stack: &mut Vec<(std::path::PathBuf, usize)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        // file_type() does not follow links: a cgroup tree has none.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            stack.push((e.path(), depth + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder's own cgroup is found under its own path (where a
    /// cgroup2 tree is mounted).
    #[test]
    fn finds_this_process_cgroup() {
        let Some(id) = cgroup_id_of(std::process::id()) else {
            eprintln!("skipped: no cgroup v2 here");
            return;
        };
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = xlap_records::cgroups::unified_path(&text).unwrap();
        let got = describe(HashSet::from([id, u64::MAX]));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].id, id);
        assert_eq!(got[0].path.as_deref(), Some(path));
        assert_eq!(got[1].path, None);
    }
}
