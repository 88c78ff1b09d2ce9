//! `points`: the stamp points and the protocol presets.

use xlap_capture::proto;

pub fn points() {
    println!("kernel stamp points:");
    for p in xlap_records::points::kernel_points() {
        println!("  {:<18} {}", p.name, p.side.as_str());
    }
    println!("app points: app.<marker> for every USDT marker xlap:<marker>");
    println!("protocol presets (--proto):");
    for (name, layout, what) in proto::PRESETS {
        println!("  {name:<14} {what}");
        if !layout.kind_names.is_empty() {
            let kinds: Vec<String> = layout
                .kind_names
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            println!("  {:<14} kinds: {}", "", kinds.join(", "));
        }
    }
}
