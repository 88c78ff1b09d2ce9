//! Privileged: the devices' timestamping capabilities a run records
//! (run.json `device_timestamping`) and says once, against `ethtool -T` run
//! in the receiving host's namespace: on veth no hardware timestamps, and
//! the run says that device points carry no wire time.

use xlap_stage::Stage;
use xlap_tests::example::ExampleOptions;
use xlap_tests::privileged;
use xlap_tests::trace::trace_example;

#[test]
fn device_timestamping_is_what_ethtool_says() {
    let Some(_guard) = privileged("timestamping") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let t = trace_example(
        &stage,
        "timestamping",
        &ExampleOptions {
            count: 200,
            ..Default::default()
        },
        &[],
    );
    let host = stage.host(1);
    let dev = host.wire_ifname.clone();
    let out = host
        .command("ethtool")
        .args(["-T", &dev])
        .output()
        .expect("ethtool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let has = |cap: &str| text.lines().any(|l| l.trim().starts_with(cap));
    let devices = &t.meta.device_timestamping;
    let d = devices
        .iter()
        .find(|d| d.ifname == dev)
        .unwrap_or_else(|| panic!("{dev} not surveyed: {devices:#?}"));
    assert_eq!(d.driver, "veth");
    for (field, got, cap) in [
        ("hardware_tx", d.hardware_tx, "hardware-transmit"),
        ("hardware_rx", d.hardware_rx, "hardware-receive"),
        ("software_tx", d.software_tx, "software-transmit"),
        ("software_rx", d.software_rx, "software-receive"),
    ] {
        assert_eq!(got, has(cap), "{field} vs ethtool -T:\n{text}");
    }
    let phc = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("PTP Hardware Clock:"))
        .map(str::trim);
    assert_eq!(d.phc_index.is_none(), phc == Some("none"), "{text}");
    assert!(!d.hardware_rx_on);
    // Said once, naming the device.
    let said: Vec<&str> = t
        .stderr
        .lines()
        .filter(|l| l.contains("no hardware timestamps on"))
        .collect();
    assert_eq!(said.len(), 1, "{}", t.stderr);
    assert!(said[0].contains(&format!("{dev} (veth)")), "{}", said[0]);
}
