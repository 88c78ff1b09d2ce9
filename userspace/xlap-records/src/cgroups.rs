//! The cgroups of a run's stamps, as run.json lists them: a cgroup v2 id
//! (the inode number of the cgroup's directory, what the kernel gives BPF
//! as `bpf_get_current_cgroup_id()`), its path below the cgroup2 root, and
//! what the path names: the container (docker, containerd/CRI, CRI-O,
//! podman, systemd scopes of those) and the Kubernetes pod.
//!
//! The path is the kernel's, but the names in it are chosen by whoever
//! made the cgroup (any user with a delegated subtree): a container id is
//! taken only in the forms the runtimes write (hex of 12 to 64 digits) and
//! a pod UID only as 32 hex digits in the 8-4-4-4-12 form, so a path can
//! never put another string where a container id is read.

use serde::{Deserialize, Serialize};

/// One cgroup of a run (run.json `cgroups`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupInfo {
    /// The cgroup v2 id (the stamps' `cgroup_id`).
    pub id: u64,
    /// Below the cgroup2 root, with a leading `/` (`/` is the root); `None`
    /// when the cgroup was gone before the recorder could name it.
    pub path: Option<String>,
    /// The container the path names, and the runtime whose form it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
    /// The Kubernetes pod UID the path names (`-` separated, as the API
    /// server gives it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// `docker`, `containerd`, `crio` or `podman`.
    pub runtime: String,
    /// The runtime's id of the container (lower-case hex).
    pub id: String,
}

impl CgroupInfo {
    /// The info of cgroup `id` at `path` (below the root), what the path
    /// names parsed from it.
    pub fn at(id: u64, path: &str) -> CgroupInfo {
        CgroupInfo {
            id,
            path: Some(path.to_string()),
            container: container_of(path),
            pod_uid: pod_uid_of(path),
        }
    }
}

/// The container a cgroup path names: its innermost component of a
/// runtime's form (a container's own sub-cgroups, as systemd inside a
/// container makes, keep their container).
pub fn container_of(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate().rev() {
        let part = part.strip_suffix(".scope").unwrap_or(part);
        let found = [
            ("docker-", "docker"),
            ("cri-containerd-", "containerd"),
            ("crio-", "crio"),
            ("libpod-", "podman"),
        ]
        .iter()
        .find_map(|(prefix, runtime)| {
            let id = part.strip_prefix(prefix)?;
            is_container_id(id).then(|| (runtime.to_string(), id.to_string()))
        })
        // cgroupfs drivers: /docker/<id>, /kubepods/.../<id>, /libpod_parent/libpod-<id>
        .or_else(|| {
            let parent = if i > 0 { parts[i - 1] } else { "" };
            let runtime = match parent {
                "docker" => "docker",
                _ if parent.starts_with("pod") && parts[..i].contains(&"kubepods") => "containerd",
                _ => return None,
            };
            is_container_id(part).then(|| (runtime.to_string(), part.to_string()))
        });
        if let Some((runtime, id)) = found {
            return Some(Container { runtime, id });
        }
    }
    None
}

/// The pod UID a cgroup path names: `kubepods[-qos]-pod<uid>.slice` (the
/// systemd driver, `_` for `-`) or `pod<uid>` below `kubepods` (cgroupfs).
pub fn pod_uid_of(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if !parts.iter().any(|p| p.starts_with("kubepods")) {
        return None;
    }
    parts.iter().rev().find_map(|part| {
        let stem = part.strip_suffix(".slice").unwrap_or(part);
        let uid = match stem.rfind("-pod") {
            Some(at) if part.ends_with(".slice") => &stem[at + 4..],
            _ => stem.strip_prefix("pod")?,
        };
        let uid = uid.replace('_', "-");
        is_uid(&uid).then_some(uid)
    })
}

/// A runtime's container id: 12 to 64 lower-case hex digits.
fn is_container_id(s: &str) -> bool {
    (12..=64).contains(&s.len()) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A UID in its 8-4-4-4-12 hex form.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
}

/// The cgroup v2 path of a process, from its `/proc/PID/cgroup` text: the
/// `0::PATH` line (the unified hierarchy).
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4c01db0b339c8f8fce4d0a1fc2b4dfd8bc9ad2bc8f7e2e1f5ab5a0b2c7e3f001";

    fn c(path: &str) -> Option<(String, String)> {
        container_of(path).map(|c| (c.runtime, c.id))
    }

    #[test]
    fn runtimes_paths_name_their_containers() {
        let want = |rt: &str| Some((rt.to_string(), ID.to_string()));
        assert_eq!(
            c(&format!("/system.slice/docker-{ID}.scope")),
            want("docker")
        );
        assert_eq!(c(&format!("/docker/{ID}")), want("docker"));
        assert_eq!(
            c(&format!("/machine.slice/libpod-{ID}.scope/container")),
            want("podman")
        );
        assert_eq!(
            c(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
            )),
            want("podman")
        );
        let pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_1111_2222_333344445555.slice";
        assert_eq!(
            c(&format!("/{pod}/cri-containerd-{ID}.scope")),
            want("containerd")
        );
        assert_eq!(c(&format!("/{pod}/crio-{ID}.scope")), want("crio"));
        assert_eq!(
            c(&format!(
                "/kubepods/besteffort/pod1a2b3c4d-0000-1111-2222-333344445555/{ID}"
            )),
            want("containerd")
        );
    }

    #[test]
    fn other_paths_name_no_container() {
        assert_eq!(c("/"), None);
        assert_eq!(c("/user.slice/user-1000.slice/session-3.scope"), None);
        assert_eq!(c("/system.slice/docker.service"), None);
        // Not a runtime's id: too short, upper case, not hex, a name.
        assert_eq!(c("/system.slice/docker-abc.scope"), None);
        assert_eq!(
            c(&format!("/system.slice/docker-{}.scope", ID.to_uppercase())),
            None
        );
        assert_eq!(c("/docker/../../etc/passwd"), None);
        assert_eq!(c("/system.slice/libpod-zzzzzzzzzzzzzzzz.scope"), None);
    }

    #[test]
    fn pod_uids_from_either_driver() {
        let uid = "1a2b3c4d-0000-1111-2222-333344445555".to_string();
        assert_eq!(
            pod_uid_of(&format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_0000_1111_2222_333344445555.slice/cri-containerd-{ID}.scope")),
            Some(uid.clone())
        );
        assert_eq!(
            pod_uid_of("/kubepods.slice/kubepods-pod1a2b3c4d_0000_1111_2222_333344445555.slice"),
            Some(uid.clone())
        );
        assert_eq!(
            pod_uid_of(&format!("/kubepods/burstable/pod{uid}/{ID}")),
            Some(uid)
        );
        assert_eq!(
            pod_uid_of("/kubepods.slice/kubepods-besteffort.slice"),
            None
        );
        // Outside kubepods nothing is a pod.
        assert_eq!(
            pod_uid_of("/x/pod1a2b3c4d-0000-1111-2222-333344445555"),
            None
        );
    }

    #[test]
    fn the_unified_line_of_proc_cgroup() {
        assert_eq!(unified_path("0::/a/b\n"), Some("/a/b"));
        assert_eq!(unified_path("12:cpu:/x\n0::/\n"), Some("/"));
        assert_eq!(unified_path("12:cpu:/x\n"), None);
    }
}
