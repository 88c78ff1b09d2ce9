//! Names of the cgroup ids the stamps carried (run.json `cgroups`): a
//! cgroup v2 id is the inode number of the cgroup's directory in the
//! cgroup2 file system, so a walk of that tree finds each id's path; what
//! the path names (container, pod) is `xlap_records::cgroups`' to parse.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use xlap_records::cgroups::CgroupInfo;

/// Directories the walk visits at most (a host with many containers has a
/// few thousand cgroups): the run's end never waits on an unbounded walk.
const MAX_DIRS: usize = 200_000;
/// Depth below the root the walk descends at most.
const MAX_DEPTH: usize = 32;

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
