//! The JSON header of a safetensors file, read into typed entries in memory proportional to a
//! small multiple of the header's bytes, whatever it holds: at most [`MAX_TENSORS`] entries
//! and [`MAX_METADATA_ENTRIES`] metadata pairs are kept (the rest is counted, so the error can
//! say how many), at most [`MAX_RANK`] + 1 dimensions of a shape and 3 data offsets. Read as a
//! `serde_json::Value`, a header of the format's 100 MB listing 1.67 million empty tensors
//! took gigabytes. What an entry's fields hold is judged afterwards
//! (`safetensors_file::parse_header`), so each problem keeps its own message.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Most tensors a header may list. Kyutai's largest checkpoints hold a few thousand (an MLX q4
/// LM: weights, scales and biases of every matrix); each listed tensor costs a few hundred
/// bytes of memory, so a header of the format's 100 MB listing millions of empty tensors
/// would take gigabytes.
pub const MAX_TENSORS: usize = 100_000;
/// Most `__metadata__` pairs kept (Kyutai's files carry a handful).
pub const MAX_METADATA_ENTRIES: usize = 10_000;
/// Most dimensions of a tensor's shape (the models' tensors have at most 4).
pub const MAX_RANK: usize = 8;

/// The header as found.
#[derive(Default)]
pub struct RawHeader {
    /// The first [`MAX_TENSORS`] tensor entries, in the file's order.
    pub entries: Vec<(String, RawEntry)>,
    /// Tensor entries the header lists (all of them, also past the cap).
    pub tensors_listed: usize,
    /// The first [`MAX_METADATA_ENTRIES`] string pairs of `__metadata__` (a value that is not
    /// a string is kept as "").
    pub metadata: BTreeMap<String, String>,
    /// Pairs `__metadata__` lists.
    pub metadata_listed: usize,
}

/// One tensor entry's fields as found (`None`: absent or not of the right JSON type).
#[derive(Default)]
pub struct RawEntry {
    pub dtype: Option<String>,
    pub shape: Option<NumberList>,
    pub data_offsets: Option<NumberList>,
}

/// A JSON array, its first elements kept: non-negative integers as `Some`, anything else as
/// `None`.
#[derive(Default)]
pub struct NumberList {
    pub kept: Vec<Option<u64>>,
    /// Elements the array holds.
    pub len: usize,
}

/// Parses `json` (the header's bytes, whose first non-blank byte is `{`).
pub fn parse(json: &[u8]) -> serde_json::Result<RawHeader> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let header = de.deserialize_map(HeaderVisitor)?;
    de.end()?;
    Ok(header)
}

/// The methods of a visitor that takes every JSON value other than a map (and a string,
/// written by each) as its type's default; an array's elements are skipped.
macro_rules! other_values_are_default {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// Skips the rest of a map.
fn drain_map<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

struct HeaderVisitor;

impl<'de> Visitor<'de> for HeaderVisitor {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let mut header = RawHeader::default();
        while let Some(name) = map.next_key::<String>()? {
            if name == "__metadata__" {
                let Metadata { pairs, listed } = map.next_value()?;
                header.metadata = pairs;
                header.metadata_listed = listed;
                continue;
            }
            header.tensors_listed += 1;
            if header.entries.len() < MAX_TENSORS {
                header.entries.push((name, map.next_value()?));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(header)
    }
}

#[derive(Default)]
struct Metadata {
    pairs: BTreeMap<String, String>,
    listed: usize,
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Metadata, E> {
                Ok(Metadata::default())
            }
            other_values_are_default!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let mut m = Metadata::default();
                while let Some(key) = map.next_key::<String>()? {
                    m.listed += 1;
                    if m.pairs.len() < MAX_METADATA_ENTRIES {
                        let JsonString(value) = map.next_value()?;
                        m.pairs.insert(key, value.unwrap_or_default());
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON string, or `None` for any other value.
#[derive(Default)]
struct JsonString(Option<String>);

impl<'de> Deserialize<'de> for JsonString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<JsonString, E> {
                Ok(JsonString(Some(s.to_string())))
            }
            other_values_are_default!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonString, A::Error> {
                drain_map(&mut map)?;
                Ok(JsonString(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A non-negative integer, or `None` for any other value.
struct MaybeU64(Option<u64>);

impl<'de> Deserialize<'de> for MaybeU64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<u64>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
                Ok(Some(v))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<u64>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(None)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
                drain_map(&mut map)?;
                Ok(None)
            }
        }
        d.deserialize_any(V).map(MaybeU64)
    }
}

/// An array keeping its first `keep` elements; `None` when the value is not an array.
fn number_list<'de, D: Deserializer<'de>>(
    d: D,
    keep: usize,
) -> Result<Option<NumberList>, D::Error> {
    struct V(usize);
    impl<'de> Visitor<'de> for V {
        type Value = Option<NumberList>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an array of integers")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            drain_map(&mut map)?;
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut list = NumberList::default();
            while list.kept.len() < self.0 {
                match seq.next_element::<MaybeU64>()? {
                    Some(MaybeU64(v)) => {
                        list.kept.push(v);
                        list.len += 1;
                    }
                    None => return Ok(Some(list)),
                }
            }
            while seq.next_element::<IgnoredAny>()?.is_some() {
                list.len += 1;
            }
            Ok(Some(list))
        }
    }
    d.deserialize_any(V(keep))
}

struct Shape(Option<NumberList>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_list(d, MAX_RANK + 1).map(Shape)
    }
}

struct Offsets(Option<NumberList>);

impl<'de> Deserialize<'de> for Offsets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        number_list(d, 3).map(Offsets)
    }
}

impl<'de> Deserialize<'de> for RawEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tensor entry")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<RawEntry, E> {
                Ok(RawEntry::default())
            }
            other_values_are_default!();
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEntry, A::Error> {
                let mut entry = RawEntry::default();
                while let Some(key) = map.next_key::<FieldName>()? {
                    match key {
                        FieldName::Dtype => entry.dtype = map.next_value::<JsonString>()?.0,
                        FieldName::Shape => entry.shape = map.next_value::<Shape>()?.0,
                        FieldName::DataOffsets => {
                            entry.data_offsets = map.next_value::<Offsets>()?.0
                        }
                        FieldName::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(entry)
            }
        }
        d.deserialize_any(V)
    }
}

/// A key of a tensor entry (others are skipped without being kept).
enum FieldName {
    Dtype,
    Shape,
    DataOffsets,
    Other,
}

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FieldName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<FieldName, E> {
                Ok(match s {
                    "dtype" => FieldName::Dtype,
                    "shape" => FieldName::Shape,
                    "data_offsets" => FieldName::DataOffsets,
                    _ => FieldName::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_fields_and_metadata_are_read_as_found() {
        let h = parse(
            br#"{"__metadata__": {"format": "pt", "n": 3},
                 "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24], "x": {"y": []}},
                 "b": {"dtype": 7, "shape": [1.5, -1, "x"], "data_offsets": [0]},
                 "c": [1, 2], "d": "s"}"#,
        )
        .unwrap();
        assert_eq!(h.tensors_listed, 4);
        assert_eq!(h.metadata_listed, 2);
        assert_eq!(h.metadata["format"], "pt");
        assert_eq!(h.metadata["n"], "");
        let (name, a) = &h.entries[0];
        assert_eq!(name, "a");
        assert_eq!(a.dtype.as_deref(), Some("F32"));
        assert_eq!(a.shape.as_ref().unwrap().kept, [Some(2), Some(3)]);
        assert_eq!(a.data_offsets.as_ref().unwrap().kept, [Some(0), Some(24)]);
        let b = &h.entries[1].1;
        assert_eq!(b.dtype, None);
        assert_eq!(b.shape.as_ref().unwrap().kept, [None, None, None]);
        assert_eq!(b.data_offsets.as_ref().unwrap().len, 1);
        assert!(h.entries[2].1.dtype.is_none() && h.entries[3].1.shape.is_none());
    }

    #[test]
    fn past_the_caps_entries_and_dimensions_are_counted_not_kept() {
        let mut json = String::from("{");
        for i in 0..MAX_TENSORS + 5 {
            json +=
                &format!(r#""t{i}": {{"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}},"#);
        }
        json += r#""long": {"shape": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}}"#;
        let h = parse(json.as_bytes()).unwrap();
        assert_eq!(h.tensors_listed, MAX_TENSORS + 6);
        assert_eq!(h.entries.len(), MAX_TENSORS);
        let h = parse(br#"{"long": {"shape": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}}"#).unwrap();
        let shape = h.entries[0].1.shape.as_ref().unwrap();
        assert_eq!((shape.kept.len(), shape.len), (MAX_RANK + 1, 12));
    }
}
