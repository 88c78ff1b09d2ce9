//! The stamp-point vocabulary: `layer.point` names of the kernel points
//! defined (by number) in `bpf/xlap_abi.h`.

use xlap_abi::xlap_point;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Tx,
    Rx,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Tx => "tx",
            Side::Rx => "rx",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    App,
    Sock,
    Dev,
    Qdisc,
    Sched,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::App => "app",
            Layer::Sock => "sock",
            Layer::Dev => "dev",
            Layer::Qdisc => "qdisc",
            Layer::Sched => "sched",
        }
    }
}

/// What a point's stamps carry in `xlap_stamp.scope`: where the point ran,
/// for container attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The cgroup v2 id of the process in whose name the point ran (its
    /// system or socket call, its marker, the reader woken or switched in).
    Cgroup,
    /// The inode number of the device's network namespace.
    Netns,
    /// Nothing: a point run for no process of its own (the socket queue, in
    /// softirq or in the sender's context).
    None,
}

/// The scope of any point id: app points (markers) run in the process's
/// own context.
pub fn scope_of(id: u16) -> Scope {
    if id as u32 >= xlap_point::XLAP_POINT_APP_BASE {
        return Scope::Cgroup;
    }
    kernel_point(id as u32).map_or(Scope::None, |p| p.scope)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointInfo {
    pub id: u16,
    pub name: &'static str,
    pub layer: Layer,
    pub side: Side,
    /// Its stamps carry `skb->priority` (the qdisc's class input): the
    /// transmit points that read the skb before the driver has it
    /// (dev.xmit does not read the skb: the driver may have freed it).
    pub carries_priority: bool,
    /// What its stamps' `scope` holds (the BPF side sets it to match).
    pub scope: Scope,
}

/// Name, layer and side of a kernel point id (`enum xlap_point` of the C
/// header); `None` for ids that name no kernel point. A test checks that
/// every id the header defines has a name here.
pub const fn kernel_point(id: u32) -> Option<PointInfo> {
    use xlap_point::*;
    use Layer::*;
    use Side::*;
    let (name, layer, side) = match id {
        XLAP_POINT_SOCK_SEND_ENTER => ("sock.send_enter", Sock, Tx),
        XLAP_POINT_SOCK_SEND_EXIT => ("sock.send_exit", Sock, Tx),
        XLAP_POINT_DEV_QUEUE => ("dev.queue", Dev, Tx),
        XLAP_POINT_QDISC_ENQUEUE => ("qdisc.enqueue", Qdisc, Tx),
        XLAP_POINT_QDISC_DEQUEUE => ("qdisc.dequeue", Qdisc, Tx),
        XLAP_POINT_DEV_START_XMIT => ("dev.start_xmit", Dev, Tx),
        XLAP_POINT_DEV_XMIT => ("dev.xmit", Dev, Tx),
        XLAP_POINT_DEV_NETIF_RX => ("dev.netif_rx", Dev, Rx),
        XLAP_POINT_DEV_GRO_RECEIVE => ("dev.gro_receive", Dev, Rx),
        XLAP_POINT_DEV_RECEIVE_SKB => ("dev.receive_skb", Dev, Rx),
        XLAP_POINT_SOCK_QUEUE => ("sock.queue", Sock, Rx),
        XLAP_POINT_SCHED_WAKEUP => ("sched.wakeup", Sched, Rx),
        XLAP_POINT_SCHED_SWITCH_IN => ("sched.switch_in", Sched, Rx),
        XLAP_POINT_SOCK_RECV_EXIT => ("sock.recv_exit", Sock, Rx),
        _ => return None,
    };
    let carries_priority = matches!(
        id,
        XLAP_POINT_DEV_QUEUE
            | XLAP_POINT_QDISC_ENQUEUE
            | XLAP_POINT_QDISC_DEQUEUE
            | XLAP_POINT_DEV_START_XMIT
    );
    let scope = match layer {
        Dev | Qdisc => Scope::Netns,
        _ if id == XLAP_POINT_SOCK_QUEUE => Scope::None,
        _ => Scope::Cgroup,
    };
    Some(PointInfo {
        id: id as u16,
        name,
        layer,
        side,
        carries_priority,
        scope,
    })
}

/// The device and qdisc points of the sending side, in id order: they fire
/// once per device a datagram passes (a stacked or tunnel device: twice).
/// Checked against the table above by a test.
pub const TX_DEVICE_POINTS: &[&str] = &[
    "dev.queue",
    "qdisc.enqueue",
    "qdisc.dequeue",
    "dev.start_xmit",
    "dev.xmit",
];
/// The device points of the receiving side, in id order; they stamp by
/// port, before any socket is known.
pub const RX_DEVICE_POINTS: &[&str] = &["dev.netif_rx", "dev.gro_receive", "dev.receive_skb"];

/// Where a packet leaves the sender, best first (the driver's entry, its
/// return, the queue), as packets-table column stems (`<stem>_ns`).
pub const TX_WIRE: &[&str] = &["dev_start_xmit", "dev_xmit", "dev_queue"];
/// Where a packet reaches the receiver, best first: the first receive
/// device point there is.
pub const RX_WIRE: &[&str] = &["dev_netif_rx", "dev_gro_receive", "dev_receive_skb"];

/// A point's column stem in the packets table (`dev.xmit` -> `dev_xmit`;
/// the column is `<stem>_ns`).
pub fn column_stem(point: &str) -> String {
    point.replace('.', "_")
}

/// The point of a packets-table column (`dev_xmit_ns` -> `dev.xmit`,
/// `app_send_start_ns` -> `app.send_start`): the layer's underscore is the
/// first one.
pub fn point_of_column(column: &str) -> String {
    column.trim_end_matches("_ns").replacen('_', ".", 1)
}

/// Every kernel point, in id order.
pub fn kernel_points() -> impl Iterator<Item = PointInfo> {
    (1..xlap_point::XLAP_POINT_KERNEL_COUNT).filter_map(kernel_point)
}

/// The name, layer and side (kernel points only) of any point id: kernel
/// points by the table above, app points (USDT markers) by the names the
/// loader assigned, `app_names[id - APP_BASE]`.
pub fn point_info(id: u16, app_names: &[String]) -> Option<(String, Layer, Option<Side>)> {
    let app_base = xlap_point::XLAP_POINT_APP_BASE as u16;
    if id >= app_base {
        return app_names
            .get((id - app_base) as usize)
            .map(|n| (format!("app.{n}"), Layer::App, None));
    }
    let info = kernel_point(id as u32)?;
    Some((info.name.to_string(), info.layer, Some(info.side)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_point_has_a_unique_layered_name() {
        let points: Vec<_> = kernel_points().collect();
        // Every id the C header defines below KERNEL_COUNT is named but 14,
        // the foreign-socket marker (consumed by the recorder, never
        // written).
        assert_eq!(
            points.len(),
            xlap_point::XLAP_POINT_KERNEL_COUNT as usize - 2
        );
        assert!(kernel_point(xlap_point::XLAP_POINT_SOCK_FOREIGN).is_none());
        let mut names: Vec<_> = points.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), points.len());
        for p in points {
            assert!(
                p.name.starts_with(&format!("{}.", p.layer.as_str())),
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn device_and_wire_lists_follow_the_point_table() {
        let names = |side: Side| -> Vec<&str> {
            kernel_points()
                .filter(|p| p.side == side && matches!(p.layer, Layer::Dev | Layer::Qdisc))
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(TX_DEVICE_POINTS, names(Side::Tx));
        assert_eq!(RX_DEVICE_POINTS, names(Side::Rx));
        let stems =
            |points: &[&str]| -> Vec<String> { points.iter().map(|p| column_stem(p)).collect() };
        assert_eq!(RX_WIRE, stems(RX_DEVICE_POINTS));
        for p in kernel_points() {
            assert_eq!(
                point_of_column(&format!("{}_ns", column_stem(p.name))),
                p.name
            );
        }
        let tx = stems(TX_DEVICE_POINTS);
        assert!(
            TX_WIRE.iter().all(|w| tx.iter().any(|t| t == w)),
            "{TX_WIRE:?}"
        );
        assert!(
            !TX_WIRE.iter().any(|w| w.starts_with("qdisc")),
            "a qdisc is not the wire"
        );
    }

    #[test]
    fn app_points_take_their_marker_names() {
        let names = vec!["send_start".to_string()];
        let base = xlap_point::XLAP_POINT_APP_BASE as u16;
        assert_eq!(point_info(base, &names).unwrap().0, "app.send_start");
        assert!(point_info(base + 1, &names).is_none());
        assert_eq!(point_info(7, &names).unwrap().0, "dev.xmit");
    }
}
