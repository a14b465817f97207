//! Types shared by several resources.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a candidate endpoint runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BackendType {
    /// A vLLM pod of an `InferenceWorkerSet` in the cluster.
    Local,
    /// An off-cluster `InferenceProvider`.
    Provider,
}

impl BackendType {
    /// Every backend type.
    pub const ALL: [BackendType; 2] = [BackendType::Local, BackendType::Provider];

    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendType::Local => "Local",
            BackendType::Provider => "Provider",
        }
    }
}

/// A model served by a worker set: its served name and the aliases clients may use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServedModel {
    /// The name vLLM serves the model under (`--served-model-name`); sent upstream.
    pub name: String,
    /// Other names clients may request. Several worker sets may share an alias.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

/// Prices used for per-tenant cost attribution, per million tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cost {
    /// ISO 4217 currency code of the prices. Default `USD`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    /// Price per million prompt tokens that had to be computed (not served from cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub uncached_prompt_per_million: Option<f64>,
    /// Price per million prompt tokens served from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cached_prompt_per_million: Option<f64>,
    /// Price per million generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub output_per_million: Option<f64>,
}

/// A reference to a key of a Kubernetes Secret in the resource's namespace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key inside the Secret. Default depends on the referring field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A threshold on a number: `{greaterThan: 2}`, `{lessThan: 0.5}` or both (an open interval).
///
/// Values are numbers, or strings in the quantity language (`70%`, `2s`) where the measured
/// field allows them.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Threshold {
    /// Holds when the measured value is strictly greater than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greater_than: Option<Quantity>,
    /// Holds when the measured value is strictly less than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub less_than: Option<Quantity>,
}

/// A number, or a string in the quantity language (`70%`, `0.7`, `2s`, `16Ki`).
///
/// Serialized untagged; deserialized by hand with what `#[serde(untagged)]` would accept and
/// its error message, without buffering the value first (policies hold thousands of these).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Quantity {
    /// A plain number.
    Number(f64),
    /// A string such as `70%`, `30s` or `16Ki`.
    Text(String),
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // As the derived code does, the mismatch is reported after the value was read whole
        // (so a streaming deserializer adds no position to it either).
        d.deserialize_any(QuantityVisitor)?
            .ok_or_else(|| serde::de::Error::custom(NO_QUANTITY))
    }
}

/// The error of an untagged enum that no variant matches.
const NO_QUANTITY: &str = "data did not match any variant of untagged enum Quantity";

/// Reads any value; `None` when it is neither a number nor a string.
struct QuantityVisitor;

type Read<E> = Result<Option<Quantity>, E>;

impl<'de> serde::de::Visitor<'de> for QuantityVisitor {
    type Value = Option<Quantity>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a number or a string")
    }

    // `f64` accepts every integer and float; `String` every string, character and UTF-8 bytes.
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Read<E> {
        Ok(Some(Quantity::Number(v as f64)))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Read<E> {
        Ok(Some(Quantity::Number(v as f64)))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Read<E> {
        Ok(Some(Quantity::Number(v)))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Read<E> {
        Ok(Some(Quantity::Text(v.to_owned())))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Read<E> {
        Ok(Some(Quantity::Text(v)))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Read<E> {
        Ok(std::str::from_utf8(v)
            .ok()
            .map(|s| Quantity::Text(s.to_owned())))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Read<E> {
        Ok(None)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Read<E> {
        Ok(None)
    }
    fn visit_none<E: serde::de::Error>(self) -> Read<E> {
        Ok(None)
    }
    // Values that match no variant are still read to their end, as buffering them would.
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Read<D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(None)
    }
    fn visit_newtype_struct<D: serde::Deserializer<'de>>(self, d: D) -> Read<D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(None)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Read<A::Error> {
        while a.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Read<A::Error> {
        while a
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(None)
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, a: A) -> Read<A::Error> {
        use serde::de::VariantAccess;
        let (serde::de::IgnoredAny, v) = a.variant()?;
        v.newtype_variant::<serde::de::IgnoredAny>()?;
        Ok(None)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A number, or a string such as `70%`, `30s` or `16Ki`.",
            "x-kubernetes-preserve-unknown-fields": true,
            "anyOf": [{ "type": "number" }, { "type": "string" }]
        })
    }
}

/// A duration in the quantity language: `30s`, `500ms`, `1m30s`.
pub type DurationString = String;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::Quantity;

    mod reference {
        /// What the hand-written `Deserialize` replaces (the same name: it is in the message).
        #[derive(Debug, PartialEq, serde::Deserialize)]
        #[serde(untagged)]
        pub enum Quantity {
            Number(f64),
            Text(String),
        }
    }
    use reference::Quantity as Untagged;

    fn same(q: Result<Quantity, serde_json::Error>, u: Result<Untagged, serde_json::Error>) {
        match (q, u) {
            (Ok(Quantity::Number(a)), Ok(Untagged::Number(b))) => {
                assert_eq!(a.to_bits(), b.to_bits());
            }
            (Ok(Quantity::Text(a)), Ok(Untagged::Text(b))) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (q, u) => panic!("{q:?} vs {u:?}"),
        }
    }

    #[test]
    fn quantity_deserializes_as_untagged_would() {
        let cases = [
            "0",
            "4",
            "-3",
            "18446744073709551615",
            "-9223372036854775808",
            "0.7",
            "-0.0",
            "1e300",
            "\"70%\"",
            "\"\"",
            "\"16Ki\"",
            "\"2s\"",
            "true",
            "null",
            "[]",
            "[1]",
            "{}",
            "{\"a\": 1}",
            "[[1, 2], {\"b\": [3]}]",
            "{\"a\": {\"b\": null}, \"c\": \"d\"}",
        ];
        for text in cases {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            same(
                serde_json::from_value(v.clone()),
                serde_json::from_value(v.clone()),
            );
            // Nested in a struct field, as in thresholds.
            let wrapped = serde_json::json!({ "q": v });
            let q: Result<std::collections::BTreeMap<String, Quantity>, _> =
                serde_json::from_value(wrapped.clone());
            let u: Result<std::collections::BTreeMap<String, Untagged>, _> =
                serde_json::from_value(wrapped);
            match (q, u) {
                (Ok(a), Ok(b)) => same(Ok(a["q"].clone()), Ok(b.into_values().next().unwrap())),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                (a, b) => panic!("{a:?} vs {b:?}"),
            }
            same(serde_json::from_str(text), serde_json::from_str(text));
        }
    }
}
