//! The YAML tree read in place, without a `serde_json::Value` copy: a `jsonschema`
//! representation ([`YamlJson`]) for schema validation, and a serde `Deserializer` for `&Node`
//! that deserializes typed specs.
//!
//! Both see exactly what [`Node::to_json`] would produce: integers as integers (non-negative ones
//! as unsigned), finite floats as floats, non-finite floats as `null`, mappings with their keys;
//! except that for a schema's `type: integer`, a float is not an integer unless it is past the
//! range of `i64` (YAML's `64.0` is a float, which an integer field's deserialization refuses).
//! Deserialization errors read as `serde_json::from_value`'s do, and know where they happened.

use std::borrow::Cow;
use std::fmt;

use jsonschema::JsonType;
use jsonschema::json::{Array, Json, JsonNumber, Node as JNode, NodeIdentity, Object};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Unexpected, Visitor};
use serde_json::Value as J;

use crate::path::{FieldPath, Seg};
use crate::source::{FileId, Span};
use crate::yaml::{Entry, Node, Style, Value};

/// The `jsonschema` representation of the YAML tree.
#[derive(Debug)]
pub struct YamlJson;

impl Json for YamlJson {
    type Node<'a> = &'a Node;
    type PreparedKey = Box<str>;
    type StringBuffer = Option<Node>;

    fn prepare_key(key: &str) -> Box<str> {
        key.into()
    }

    fn with_string_node<T>(
        buffer: &mut Option<Node>,
        string: &str,
        f: impl FnOnce(&Node) -> T,
    ) -> T {
        let node = buffer.insert(Node {
            value: Value::Str(string.into()),
            span: Span::new(FileId(0), 0, 0),
            style: Style::Quoted,
        });
        f(node)
    }
}

/// A number of the tree: an integer, or a finite float.
#[derive(Clone, Copy, Debug)]
pub enum Number {
    /// An integer.
    Int(i64),
    /// A finite float.
    Float(f64),
}

impl Number {
    fn json(self) -> serde_json::Number {
        match self {
            Number::Int(i) => serde_json::Number::from(i),
            Number::Float(f) => {
                serde_json::Number::from_f64(f).unwrap_or_else(|| serde_json::Number::from(0))
            }
        }
    }
}

impl JsonNumber for Number {
    fn as_u64(&self) -> Option<u64> {
        match *self {
            Number::Int(i) => u64::try_from(i).ok(),
            Number::Float(_) => None,
        }
    }
    fn as_i64(&self) -> Option<i64> {
        match *self {
            Number::Int(i) => Some(i),
            Number::Float(_) => None,
        }
    }
    fn as_f64(&self) -> Option<f64> {
        match *self {
            Number::Int(i) => Some(i as f64),
            Number::Float(f) => Some(f),
        }
    }
    fn as_str(&self) -> Cow<'_, str> {
        Cow::Owned(self.json().to_string())
    }
    fn to_number(&self) -> Cow<'_, serde_json::Number> {
        Cow::Owned(self.json())
    }
    fn is_written_as_integer(&self) -> bool {
        matches!(self, Number::Int(_))
    }
    /// YAML's integers (`64`, not `64.0` or `1e2`, which the typed deserialization of an
    /// integer field refuses), and integers too large for `i64`: every float that large is
    /// a whole number, and the range checks of integer fields then report it.
    fn is_integer(&self) -> bool {
        match *self {
            Number::Int(_) => true,
            Number::Float(f) => f.abs() >= TWO_POW_63,
        }
    }
}

/// 2^63: the floats at or above it in magnitude are past `i64`.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

fn number(node: &Node) -> Option<Number> {
    match node.value {
        Value::Int(i) => Some(Number::Int(i)),
        Value::Float(f) if f.is_finite() => Some(Number::Float(f)),
        _ => None,
    }
}

/// Whether the node reads as JSON `null` (`null`, or a float JSON cannot hold).
fn is_null(node: &Node) -> bool {
    match node.value {
        Value::Null => true,
        Value::Float(f) => !f.is_finite(),
        _ => false,
    }
}

impl<'a> JNode<'a, YamlJson> for &'a Node {
    type Object = &'a [Entry];
    type Array = &'a [Node];
    type Number = Number;

    fn as_object(&self) -> Option<&'a [Entry]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }
    fn as_array(&self) -> Option<&'a [Node]> {
        match &self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }
    fn as_string(&self) -> Option<Cow<'a, str>> {
        match &self.value {
            Value::Str(s) => Some(Cow::Borrowed(s)),
            _ => None,
        }
    }
    fn as_number(&self) -> Option<Number> {
        number(self)
    }
    fn as_boolean(&self) -> Option<bool> {
        match self.value {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    fn is_null(&self) -> bool {
        is_null(self)
    }
    fn json_type(&self) -> JsonType {
        match &self.value {
            Value::Null => JsonType::Null,
            Value::Bool(_) => JsonType::Boolean,
            Value::Int(_) => JsonType::Number,
            Value::Float(f) if f.is_finite() => JsonType::Number,
            Value::Float(_) => JsonType::Null,
            Value::Str(_) => JsonType::String,
            Value::Seq(_) => JsonType::Array,
            Value::Map(_) => JsonType::Object,
        }
    }
    fn equals_value(&self, expected: &J) -> bool {
        // `enum` and `const` are checked on every enum field: no copy for strings.
        match (&self.value, expected) {
            (Value::Str(s), J::String(e)) => s == e,
            (Value::Str(_), _) | (_, J::String(_)) => false,
            _ => jsonschema::json::cmp::equal(&self.to_json(), expected),
        }
    }
    fn to_value(&self) -> Cow<'a, J> {
        Cow::Owned(self.to_json())
    }
    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::new(std::ptr::from_ref::<Node>(*self) as usize))
    }
}

impl<'a> Object<'a, YamlJson> for &'a [Entry] {
    type Node = &'a Node;
    type MemberName = &'a str;
    type MembersIter = Members<'a>;

    fn len(&self) -> usize {
        <[Entry]>::len(self)
    }
    fn get(&self, key: &Box<str>) -> Option<&'a Node> {
        self.iter().find(|e| *e.key == **key).map(|e| &e.value)
    }
    fn members(&self) -> Members<'a> {
        Members(self.iter())
    }
}

/// The members of a mapping.
#[derive(Debug)]
pub struct Members<'a>(std::slice::Iter<'a, Entry>);

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a Node);
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|e| (e.key.as_str(), &e.value))
    }
}

impl<'a> Array<'a, YamlJson> for &'a [Node] {
    type Node = &'a Node;
    type ElementsIter = std::slice::Iter<'a, Node>;

    fn len(&self) -> usize {
        <[Node]>::len(self)
    }
    fn elements(&self) -> std::slice::Iter<'a, Node> {
        self.iter()
    }
}

/// A deserialization error, displayed as `serde_json`'s, with where it happened: the node
/// that failed (or the nearest one that holds it), and its path from the node deserialized.
#[derive(Debug)]
pub struct Error {
    msg: String,
    span: Option<Span>,
    /// The path, innermost step first (built while the error travels up).
    rev_path: Vec<Seg>,
}

impl Error {
    /// The span of the node that failed, when known.
    pub fn span(&self) -> Option<Span> {
        self.span
    }

    /// The path of that node from the node deserialized (`rules[0].priority`).
    pub fn path(&self) -> FieldPath {
        FieldPath(self.rev_path.iter().rev().cloned().collect())
    }

    /// The message, as `serde_json` writes it.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// Locates an error of `node` (or of something in it) that does not know its node yet.
    fn at(self, node: &Node) -> Self {
        self.at_span(node.span)
    }

    fn at_span(mut self, span: Span) -> Self {
        if self.span.is_none() {
            self.span = Some(span);
        }
        self
    }

    /// The error of a child reached by `seg` (written at `span`), seen from its parent.
    fn within(mut self, seg: Seg, span: Span) -> Self {
        self = self.at_span(span);
        self.rev_path.push(seg);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error {
            msg: msg.to_string(),
            span: None,
            rev_path: Vec::new(),
        }
    }
}

/// Deserializes `T` from a node, as `serde_json::from_value(node.to_json())` would.
pub fn from_node<'de, T: de::Deserialize<'de>>(node: &'de Node) -> Result<T, Error> {
    T::deserialize(node).map_err(|e| e.at(node))
}

fn unexpected(node: &Node) -> Unexpected<'_> {
    match &node.value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Int(i) if *i >= 0 => Unexpected::Unsigned(*i as u64),
        Value::Int(i) => Unexpected::Signed(*i),
        Value::Float(f) if f.is_finite() => Unexpected::Float(*f),
        Value::Float(_) => Unexpected::Unit,
        Value::Str(s) => Unexpected::Str(s),
        Value::Seq(_) => Unexpected::Seq,
        Value::Map(_) => Unexpected::Map,
    }
}

fn invalid_type(node: &Node, exp: &dyn de::Expected) -> Error {
    <Error as de::Error>::invalid_type(unexpected(node), exp).at(node)
}

fn visit_seq<'de, V: Visitor<'de>>(items: &'de [Node], visitor: V) -> Result<V::Value, Error> {
    let len = items.len();
    let mut seq = Seq(items.iter().enumerate());
    let out = visitor.visit_seq(&mut seq)?;
    if seq.0.len() == 0 {
        Ok(out)
    } else {
        Err(de::Error::invalid_length(len, &"fewer elements in array"))
    }
}

fn visit_map<'de, V: Visitor<'de>>(entries: &'de [Entry], visitor: V) -> Result<V::Value, Error> {
    let len = entries.len();
    let mut map = Map {
        iter: entries.iter(),
        value: None,
    };
    let out = visitor.visit_map(&mut map)?;
    if map.iter.len() == 0 {
        Ok(out)
    } else {
        Err(de::Error::invalid_length(len, &"fewer elements in map"))
    }
}

macro_rules! deserialize_number {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            match self.value {
                Value::Int(i) if i >= 0 => visitor.visit_u64(i as u64),
                Value::Int(i) => visitor.visit_i64(i),
                Value::Float(f) if f.is_finite() => visitor.visit_f64(f),
                _ => Err(invalid_type(self, &visitor)),
            }
        }
    )*};
}

impl<'de> Deserializer<'de> for &'de Node {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) if *i >= 0 => visitor.visit_u64(*i as u64),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::Float(f) if f.is_finite() => visitor.visit_f64(*f),
            Value::Float(_) => visitor.visit_unit(),
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Seq(items) => visit_seq(items, visitor),
            Value::Map(entries) => visit_map(entries, visitor),
        }
    }

    deserialize_number! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.value {
            Value::Bool(b) => visitor.visit_bool(b),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_string(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::Str(s) => visitor.visit_borrowed_str(s),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::Str(s) => visitor.visit_borrowed_str(s),
            Value::Seq(items) => visit_seq(items, visitor),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if is_null(self) {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if is_null(self) {
            visitor.visit_unit()
        } else {
            Err(invalid_type(self, &visitor))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::Seq(items) => visit_seq(items, visitor),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match &self.value {
            Value::Map(entries) => visit_map(entries, visitor),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.value {
            Value::Seq(items) => visit_seq(items, visitor),
            Value::Map(entries) => visit_map(entries, visitor),
            _ => Err(invalid_type(self, &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match &self.value {
            Value::Str(s) => visitor.visit_enum(EnumAccess {
                variant: s,
                value: None,
            }),
            Value::Map(entries) => {
                let mut it = entries.iter();
                let (Some(e), None) = (it.next(), it.next()) else {
                    return Err(de::Error::invalid_value(
                        Unexpected::Map,
                        &"map with a single key",
                    ));
                };
                visitor.visit_enum(EnumAccess {
                    variant: &e.key,
                    value: Some(&e.value),
                })
            }
            _ => Err(de::Error::invalid_type(unexpected(self), &"string or map")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct Seq<'de>(std::iter::Enumerate<std::slice::Iter<'de, Node>>);

impl<'de> de::SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.0.next() {
            Some((i, n)) => seed
                .deserialize(n)
                .map(Some)
                .map_err(|e| e.within(Seg::Index(i), n.span)),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Map<'de> {
    iter: std::slice::Iter<'de, Entry>,
    value: Option<&'de Entry>,
}

impl<'de> de::MapAccess<'de> for Map<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.iter.next() {
            Some(e) => {
                self.value = Some(e);
                seed.deserialize(BorrowedStr(&e.key))
                    .map(Some)
                    .map_err(|err| err.within(Seg::Key(e.key.to_string().into()), e.key_span))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, Error> {
        match self.value.take() {
            Some(e) => seed
                .deserialize(&e.value)
                .map_err(|err| err.within(Seg::Key(e.key.to_string().into()), e.value.span)),
            None => Err(de::Error::custom("value is missing")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// A map key: a borrowed string.
struct BorrowedStr<'de>(&'de str);

impl<'de> Deserializer<'de> for BorrowedStr<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_borrowed_str(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_enum(self.0.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

struct EnumAccess<'de> {
    variant: &'de str,
    value: Option<&'de Node>,
}

impl<'de> de::EnumAccess<'de> for EnumAccess<'de> {
    type Error = Error;
    type Variant = VariantAccess<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, VariantAccess<'de>), Error> {
        let v = seed.deserialize(BorrowedStr(self.variant))?;
        Ok((v, VariantAccess(self.value)))
    }
}

struct VariantAccess<'de>(Option<&'de Node>);

impl<'de> de::VariantAccess<'de> for VariantAccess<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            None => Ok(()),
            Some(n) if is_null(n) => Ok(()),
            Some(n) => Err(de::Error::invalid_type(unexpected(n), &"unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        match self.0 {
            Some(n) => seed.deserialize(n),
            None => Err(de::Error::invalid_type(
                Unexpected::UnitVariant,
                &"newtype variant",
            )),
        }
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.0.map(|n| &n.value) {
            Some(Value::Seq(items)) => {
                if items.is_empty() {
                    visitor.visit_unit()
                } else {
                    visit_seq(items, visitor)
                }
            }
            Some(_) => Err(de::Error::invalid_type(
                self.0.map_or(Unexpected::UnitVariant, unexpected),
                &"tuple variant",
            )),
            None => Err(de::Error::invalid_type(
                Unexpected::UnitVariant,
                &"tuple variant",
            )),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0.map(|n| &n.value) {
            Some(Value::Map(entries)) => visit_map(entries, visitor),
            Some(_) => Err(de::Error::invalid_type(
                self.0.map_or(Unexpected::UnitVariant, unexpected),
                &"struct variant",
            )),
            None => Err(de::Error::invalid_type(
                Unexpected::UnitVariant,
                &"struct variant",
            )),
        }
    }
}
