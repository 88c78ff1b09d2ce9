//! `schema`: the Arrow schemas of what xlap-trace writes, written or
//! checked against the committed files.

use crate::cli;
use anyhow::Result;
use xlap_exit::{failure, Code};

pub fn schema(a: cli::SchemaArgs) -> Result<()> {
    use xlap_records::schema::{all, to_json};
    match (a.write, a.check) {
        (Some(dir), _) => {
            std::fs::create_dir_all(&dir)?;
            for (name, s) in all() {
                let path = dir.join(format!("{name}.schema.json"));
                std::fs::write(&path, to_json(&s))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        (None, Some(dir)) => {
            let mut stale = Vec::new();
            for (name, s) in all() {
                let path = dir.join(format!("{name}.schema.json"));
                if std::fs::read_to_string(&path).ok().as_deref() != Some(to_json(&s).as_str()) {
                    stale.push(path.display().to_string());
                }
            }
            if stale.is_empty() {
                println!("schemas are up to date");
                Ok(())
            } else {
                Err(failure(
                    Code::Runtime,
                    format!(
                        "stale schema files: {} (run `xlap-trace schema --write {}`)",
                        stale.join(", "),
                        dir.display()
                    ),
                ))
            }
        }
        (None, None) => {
            for (name, s) in all() {
                println!("# {name}\n{}", to_json(&s));
            }
            Ok(())
        }
    }
}
