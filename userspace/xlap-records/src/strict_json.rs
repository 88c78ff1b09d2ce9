//! JSON of a file from elsewhere, parsed strictly: an object with a key
//! twice is refused (serde_json keeps the last one silently, so an edited
//! run.json could say two things and be read as one), and so are keys
//! longer than a name and strings longer than any text xlap-trace writes
//! (a 2 MB host name was copied into every row of a correlation: 912 MB).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// The longest key: keys are names (points, programs, counters).
pub const MAX_KEY_BYTES: usize = 1024;
/// The longest string value: the longest xlap-trace writes is a verifier's
/// refusal summary, a few hundred bytes.
pub const MAX_STRING_BYTES: usize = 16 * 1024;

/// `text` as a JSON value, refused with a message naming the key when an
/// object repeats it or a key or string is longer than the caps.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = StrictValue::deserialize(&mut de)?;
    de.end()?;
    Ok(v.0)
}

struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

fn long<E: de::Error>(what: &str, s: &str, cap: usize) -> E {
    let head: String = s.chars().take(40).collect();
    E::custom(format!(
        "a {what} of {} bytes ({head:?}…): at most {cap}",
        s.len()
    ))
}

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        if v.len() > MAX_STRING_BYTES {
            return Err(long("string", v, MAX_STRING_BYTES));
        }
        Ok(Value::String(v.to_owned()))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        StrictValue::deserialize(d).map(|v| v.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if key.len() > MAX_KEY_BYTES {
                return Err(long("key", &key, MAX_KEY_BYTES));
            }
            let StrictValue(v) = map.next_value()?;
            if out.insert(key.clone(), v).is_some() {
                let head: String = key.chars().take(40).collect();
                return Err(de::Error::custom(format!(
                    "the key {head:?} twice in one object: which one holds is not known"
                )));
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_serde_json_takes_silently_is_refused_and_the_rest_reads_alike() {
        let ok =
            r#"{"a": [1, -2, 3.5, null, true, "x"], "b": {"c": "d"}, "e": 18446744073709551615}"#;
        assert_eq!(
            parse(ok).unwrap(),
            serde_json::from_str::<Value>(ok).unwrap()
        );
        let dup = parse(r#"{"run_id": "a", "x": {"host": 1, "host": 2}}"#).unwrap_err();
        assert!(dup.to_string().contains("\"host\" twice"), "{dup}");
        let key = format!("{{\"{}\": 1}}", "k".repeat(MAX_KEY_BYTES + 1));
        assert!(parse(&key)
            .unwrap_err()
            .to_string()
            .contains("a key of 1025 bytes"));
        let s = format!("[\"{}\"]", "s".repeat(MAX_STRING_BYTES + 1));
        assert!(parse(&s)
            .unwrap_err()
            .to_string()
            .contains("a string of 16385 bytes"));
        assert!(parse("{} x").is_err());
    }
}
