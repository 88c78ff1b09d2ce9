//! Portability, stated and checked: the docs' minimum kernel per feature
//! against the tool's own table of what each optional program needs
//! (`hooks::HOOKS`, `preflight::MIN_KERNEL`) and `run.sh`'s
//! check; and (privileged) a run on this kernel, which must lack exactly
//! the points whose minimum is above it and say so in run.json, where the
//! other tests read which points to check.

use xlap_capture::hooks::{program_points, Without};
use xlap_capture::preflight::{release_version, MIN_KERNEL};
use xlap_records::points::kernel_point;
use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::multiset::{assert_same, logged_where, stamped, Multiset};
use xlap_tests::trace::trace_example;
use xlap_tests::{bin, privileged};

fn repo_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn point_name(id: u32) -> &'static str {
    kernel_point(id).expect("a kernel point").name
}

#[test]
fn the_readme_states_every_minimum_kernel_the_tool_holds() {
    let doc = repo_file("docs/stamp-points.md");
    let start = doc
        .find("Minimum kernel per feature:")
        .expect("docs/stamp-points.md's minimum kernel paragraph");
    let paragraph = &doc[start..];
    let paragraph =
        paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())].replace('\n', " ");
    let paragraph = paragraph.as_str();
    let (major, minor) = MIN_KERNEL;
    assert!(
        paragraph.contains(&format!("{major}.{minor} for the capture as a whole")),
        "docs/stamp-points.md does not state the capture's minimum {major}.{minor}: {paragraph}"
    );
    for pp in program_points() {
        let Some((major, minor)) = pp.min_kernel else {
            continue;
        };
        if pp.without != Without::Missing {
            // What the run loses, in the words of the hook table, and the
            // version it needs.
            let said = ["page fragments", "untraced sockets", "no flow", "io_uring"]
                .iter()
                .any(|phrase| pp.what().contains(phrase) && paragraph.contains(phrase))
                && paragraph.contains(&format!("{major}.{minor}"));
            assert!(
                said,
                "docs/stamp-points.md does not say that before Linux {major}.{minor} {}: {paragraph}",
                pp.what()
            );
            continue;
        }
        for id in pp.points {
            let name = point_name(*id);
            assert!(
                paragraph.contains(&format!("`{name}`"))
                    && paragraph.contains(&format!("{major}.{minor}")),
                "docs/stamp-points.md does not say that {name} needs Linux {major}.{minor}: {paragraph}"
            );
        }
    }
    // run.sh refuses older kernels before building anything.
    let run_sh = repo_file("run.sh");
    assert!(
        run_sh.contains(&format!("kmajor > {major}"))
            && run_sh.contains(&format!("kmajor == {major} && kminor >= {minor}")),
        "run.sh does not check Linux {major}.{minor}"
    );
}

#[test]
fn a_run_lacks_exactly_the_points_this_kernel_is_too_old_for() {
    let Some(_guard) = privileged("kernel_features") else {
        return;
    };
    let release = xlap_capture::runmeta::kernel_release();
    // The kernel this run behaves as (XLAP_KERNEL_AS when the suite runs
    // as on an older one).
    let kernel = xlap_capture::preflight::kernel_as()
        .unwrap_or_else(|| release_version(&release).expect("a kernel release"));
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "kernel-features",
        &ExampleOptions {
            count: 200,
            period_us: 200,
            ..Default::default()
        },
        &[],
    );
    let unavailable = &t.meta.unavailable_points;
    let partial = &t.meta.degraded_points;
    for pp in program_points() {
        let too_old = pp.min_kernel.is_some_and(|min| kernel < min);
        for id in pp.points {
            let name = point_name(*id);
            let said = unavailable
                .get(name)
                .or(partial.get(name))
                .filter(|why| why.contains(pp.program));
            if too_old {
                assert!(
                    said.is_some(),
                    "Linux {release} is older than {:?}, which {} needs for {name}, but the run does not say it is missing: {:#?}",
                    pp.min_kernel,
                    pp.program,
                    t.meta
                );
            } else {
                assert!(
                    said.is_none(),
                    "Linux {release} meets the docs' minimum for {name}, but {} did not attach: {said:?}",
                    pp.program
                );
            }
        }
    }
    // The stamps agree: every point the run did not call missing was
    // stamped on this path but those this path never passes (a qdisc the
    // stage does not have, GRO on veth).
    let rows = t.stamps();
    for point in [
        "sock.send_enter",
        "dev.xmit",
        "dev.receive_skb",
        "sock.queue",
        "sock.recv_exit",
    ] {
        let stamped = rows.iter().any(|r| r.point == point);
        assert_eq!(
            stamped,
            !unavailable.contains_key(point),
            "{point}: stamped {stamped}, run.json: {:?}",
            unavailable.get(point)
        );
    }
}

/// The degraded path itself, on this kernel: `XLAP_KERNEL_AS=6.1` (Debian
/// 12's stock kernel) takes the code paths a kernel without skb dynptrs
/// takes. The run says `sock.queue` is missing (at start and in run.json),
/// has no such stamp, and still has every other point for every datagram
/// the receiver logged; a version below the capture's minimum is refused
/// like the kernel would be, a malformed one as bad input.
#[test]
fn as_on_debian_12s_kernel_sock_queue_is_left_out_and_said() {
    let Some(_guard) = privileged("kernel_features_degraded") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    // The recorder inherits it; privileged tests run one at a time.
    let before = std::env::var_os("XLAP_KERNEL_AS");
    std::env::set_var("XLAP_KERNEL_AS", "6.1");
    let t = trace_example(
        &stage,
        "kernel-as-6.1",
        &ExampleOptions {
            count: 300,
            period_us: 200,
            ..Default::default()
        },
        &[],
    );
    match before {
        Some(v) => std::env::set_var("XLAP_KERNEL_AS", v),
        None => std::env::remove_var("XLAP_KERNEL_AS"),
    }
    let why = t
        .meta
        .unavailable_points
        .get("sock.queue")
        .unwrap_or_else(|| panic!("sock.queue not listed unavailable: {:#?}", t.meta));
    assert!(why.contains("XLAP_KERNEL_AS=6.1"), "{why}");
    assert!(
        t.stderr.contains("sock.queue not traced here") && t.stderr.contains("XLAP_KERNEL_AS"),
        "the run did not say so at start: {}",
        t.stderr
    );
    // The socket hook also keys the reader's wake-ups.
    let missing: Vec<&str> = t
        .meta
        .unavailable_points
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        missing,
        ["sched.switch_in", "sched.wakeup", "sock.queue"],
        "{:?}",
        t.meta.unavailable_points
    );
    let rows = t.stamps();
    for point in missing {
        assert!(
            rows.iter().all(|r| r.point != point),
            "{point} stamps in a run that says it has none"
        );
    }
    let received = logged_where(&t.received, "received", |e| e["kind"] != "feedback");
    assert!(received.len() > 250, "the path lost datagrams");
    for point in ["dev.receive_skb", "sock.recv_exit"] {
        let got: Multiset = stamped(&rows, point, t.pids.1)
            .into_iter()
            .filter(|(k, _)| received.contains_key(k))
            .collect();
        assert_same(&got, &received, point);
    }
    let sent = logged_where(&t.sent, "sent", |e| {
        e["kind"] != "feedback" && e["dropped"] == false
    });
    assert_same(
        &stamped(&rows, "sock.send_enter", t.pids.0),
        &sent,
        "sock.send_enter",
    );

    for (value, code, says) in [("5.4", 4, "5.17"), ("six", 2, "MAJOR.MINOR")] {
        let out = std::process::Command::new(bin("xlap-trace"))
            .args(["record", "--pid", &std::process::id().to_string(), "-o"])
            .arg(t.scratch.path(&format!("refused-{value}")))
            .env("XLAP_KERNEL_AS", value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(code),
            "XLAP_KERNEL_AS={value}: {stderr}"
        );
        assert!(stderr.contains(says), "XLAP_KERNEL_AS={value}: {stderr}");
    }
}
