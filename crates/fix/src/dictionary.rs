//! A FIX data dictionary in QuickFIX's XML format, loaded at run time, and
//! message validation against it.
//!
//! [`Dictionary::structure`] sorts a decoded message's fields into header,
//! body and trailer and parses repeating groups (a [`Structure`] of indices
//! into the [`RawMessage`]'s fields, so nothing is copied).
//! [`Dictionary::validate`] then applies the checks QuickFIX applies, in the
//! same order, so that the first problem found, and hence the reject sent,
//! is the one a QuickFIX peer would report.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

/// The hash of the dictionary's tables: cheap, unkeyed. The tables are filled from the
/// dictionary file only and merely looked up with what a peer sends, so a peer cannot flood
/// them; SipHash was a fifth of the cost of validating a message. The gateway's router hashes
/// its instrument tables (filled from configuration, looked up per order) with it too.
#[derive(Clone, Copy, Debug, Default)]
pub struct DictHash;

impl BuildHasher for DictHash {
    type Hasher = DictHasher;
    fn build_hasher(&self) -> DictHasher {
        DictHasher(0)
    }
}

/// See [`DictHash`]: a multiply-rotate hash (high bits well mixed, as hashbrown wants).
#[derive(Clone, Copy, Debug, Default)]
pub struct DictHasher(u64);

const DICT_HASH_K: u64 = 0x517c_c1b7_2722_0a95;

impl DictHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(DICT_HASH_K);
    }
}

impl Hasher for DictHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    #[inline]
    fn write_i32(&mut self, v: i32) {
        self.add(u64::from(v as u32));
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A set or map of the dictionary, hashed with [`DictHash`].
pub type DictSet<K> = HashSet<K, DictHash>;
pub type DictMap<K, V> = HashMap<K, V, DictHash>;
use std::path::Path;

use crate::codec::RawMessage;
use crate::tags::{SessionRejectReason, Tag};
use crate::time;

/// How deep components may nest in a dictionary before we call it cyclic.
const COMPONENT_DEPTH_MAX: usize = 32;

/// Tags at or above this are user defined.
pub const USER_DEFINED_TAG_MIN: Tag = 5000;

/// Tags below this are looked up in tables indexed by tag number (a load, no hashing): every
/// standard FIX tag and the usual user-defined range. A tag above falls back to the hash
/// tables, with the same answers.
const DENSE_TAGS: usize = 8192;

fn dense_index(tag: Tag) -> Option<usize> {
    usize::try_from(tag).ok().filter(|&t| t < DENSE_TAGS)
}

fn bit_set(bits: &mut Vec<u64>, index: usize) {
    if bits.len() <= index / 64 {
        bits.resize(index / 64 + 1, 0);
    }
    bits[index / 64] |= 1 << (index % 64);
}

fn bit_get(bits: &[u64], index: usize) -> bool {
    bits.get(index / 64)
        .is_some_and(|w| (w >> (index % 64)) & 1 != 0)
}

/// What validation asks about a tag, for the dense table: flags and the value syntax.
#[derive(Clone, Copy, Debug, Default)]
struct TagInfo {
    flags: u8,
    kind: FieldKind,
}

const TAG_KNOWN: u8 = 1;
const TAG_HEADER: u8 = 2;
const TAG_TRAILER: u8 = 4;
const TAG_DATA: u8 = 8;
const TAG_LENGTH: u8 = 16;
const TAG_ENUMERATED: u8 = 32;

/// The value syntax a field's type implies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldKind {
    #[default]
    String,
    Char,
    Int,
    Decimal,
    Boolean,
    UtcTimestamp,
    UtcDateOnly,
    UtcTimeOnly,
}

#[derive(Clone, Debug)]
pub struct FieldDef {
    pub tag: Tag,
    pub name: String,
    /// The dictionary's type name, such as `PRICE` or `NUMINGROUP`.
    pub type_name: String,
    pub kind: FieldKind,
    /// Allowed values; empty if the field is not enumerated.
    pub enums: DictSet<Vec<u8>>,
    /// Whether the value is a space-separated list of enumerated values.
    pub multiple_values: bool,
}

impl FieldDef {
    /// Whether `value` is within the field's enumeration (each of its space-separated values,
    /// for a multiple-value field). Only meaningful for an enumerated field.
    fn allows(&self, value: &[u8]) -> bool {
        if self.multiple_values {
            value.split(|&b| b == b' ').all(|v| self.enums.contains(v))
        } else {
            self.enums.contains(value)
        }
    }
}

/// The fields allowed in a message, header, trailer or group entry.
#[derive(Clone, Debug, Default)]
pub struct MapSpec {
    pub fields: DictSet<Tag>,
    /// Field order as the dictionary lists it (components flattened).
    pub order: Vec<Tag>,
    /// Required fields in ascending tag order: QuickFIX reports the lowest
    /// missing tag first.
    pub required: Vec<Tag>,
    pub groups: DictMap<Tag, MapSpec>,
    /// For a group, the tag that must open every entry; 0 otherwise.
    pub delimiter: Tag,
    /// Set by `finish`: `fields` and the keys of `groups` below [`DENSE_TAGS`] as bitsets,
    /// so that membership costs a load instead of a hash.
    dense: Option<DenseMembers>,
    /// For a message: the plan [`Dictionary::validate`] tries first (see [`FlatPlan`]); None
    /// for headers, trailers, groups and messages whose required fields the plan cannot count.
    plan: Option<FlatPlan>,
}

/// Tags a [`FlatPlan`] can track: a message with a tag at or above this goes the generic way.
/// Every field a gateway order carries is well below; the seen-set stays 128 bytes on the stack.
const PLAN_TAGS: usize = 1024;

/// What a message type needs to be accepted in one pass over its fields, built once at load:
/// the tags required in header, trailer and body together, as a bitset, and their number.
///
/// The plan only ever accepts. It applies to a message without repeating groups and without
/// fields out of order, and accepts it when every field is distinct, known, non-empty, well
/// formed, within its enumeration, allowed where it sits and every required tag is present:
/// exactly the conditions under which the generic validator finds nothing. Anything else, it
/// hands to the generic validator, which finds the first problem in QuickFIX's order and so
/// the same reject and reason as before.
#[derive(Clone, Debug)]
struct FlatPlan {
    required: [u64; PLAN_TAGS / 64],
    required_count: u32,
}

#[derive(Clone, Debug, Default)]
struct DenseMembers {
    fields: Vec<u64>,
    groups: Vec<u64>,
}

impl MapSpec {
    fn add_field(&mut self, tag: Tag, required: bool) {
        if required && !self.required.contains(&tag) {
            self.required.push(tag);
        }
        if self.fields.insert(tag) {
            self.order.push(tag);
        }
    }

    fn finish(&mut self) {
        self.required.sort_unstable();
        for group in self.groups.values_mut() {
            group.finish();
        }
        let mut dense = DenseMembers::default();
        for index in self.fields.iter().filter_map(|&t| dense_index(t)) {
            bit_set(&mut dense.fields, index);
        }
        for index in self.groups.keys().filter_map(|&t| dense_index(t)) {
            bit_set(&mut dense.groups, index);
        }
        self.dense = Some(dense);
    }

    /// Whether `tag` belongs to this map (`fields` holds it).
    pub fn has_field(&self, tag: Tag) -> bool {
        match (&self.dense, dense_index(tag)) {
            (Some(dense), Some(index)) => bit_get(&dense.fields, index),
            _ => self.fields.contains(&tag),
        }
    }

    /// The group whose count field is `tag`, if any.
    pub fn group(&self, tag: Tag) -> Option<&MapSpec> {
        if self.groups.is_empty() {
            return None;
        }
        match (&self.dense, dense_index(tag)) {
            (Some(dense), Some(index)) if !bit_get(&dense.groups, index) => None,
            _ => self.groups.get(&tag),
        }
    }
}

/// Switches matching QuickFIX's `Validate*` settings.
#[derive(Clone, Copy, Debug)]
pub struct ValidationOptions {
    pub check_fields_out_of_order: bool,
    pub check_fields_have_values: bool,
    pub check_user_defined_fields: bool,
    pub allow_unknown_message_fields: bool,
}

impl Default for ValidationOptions {
    fn default() -> Self {
        ValidationOptions {
            check_fields_out_of_order: true,
            check_fields_have_values: true,
            check_user_defined_fields: true,
            allow_unknown_message_fields: false,
        }
    }
}

/// A validation failure: the SessionRejectReason, the tag to quote in
/// RefTagID (371) if any, and the Text (58).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reject {
    pub reason: SessionRejectReason,
    pub ref_tag: Option<Tag>,
    pub text: String,
}

impl Reject {
    pub fn new(reason: SessionRejectReason, ref_tag: Option<Tag>) -> Self {
        Reject {
            reason,
            ref_tag,
            text: reason.text().to_string(),
        }
    }
}

#[derive(Debug)]
pub enum DictionaryError {
    Io(std::io::Error),
    Xml(String),
    Invalid(String),
}

impl std::fmt::Display for DictionaryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DictionaryError::Io(e) => write!(f, "cannot read data dictionary: {e}"),
            DictionaryError::Xml(e) => write!(f, "data dictionary is not well-formed XML: {e}"),
            DictionaryError::Invalid(e) => write!(f, "invalid data dictionary: {e}"),
        }
    }
}

impl std::error::Error for DictionaryError {}

impl From<DictionaryError> for std::io::Error {
    fn from(e: DictionaryError) -> Self {
        match e {
            DictionaryError::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// Field, header, trailer and message definitions of one FIX version.
#[derive(Clone, Debug)]
pub struct Dictionary {
    /// `FIX.4.4` and the like.
    pub begin_string: String,
    pub fields: DictMap<Tag, FieldDef>,
    pub fields_by_name: HashMap<String, Tag>,
    pub header: MapSpec,
    pub trailer: MapSpec,
    pub messages: DictMap<String, MapSpec>,
    pub options: ValidationOptions,
    /// Facts about every tag below [`DENSE_TAGS`], indexed by tag, built at load from the
    /// tables above (which are not to be changed afterwards).
    tag_info: Box<[TagInfo]>,
}

/// Header fields every FIX version has, whatever the dictionary says.
const BUILTIN_HEADER_TAGS: &[Tag] = &[
    8, 9, 35, 49, 56, 115, 128, 90, 91, 34, 50, 142, 57, 143, 116, 144, 129, 145, 43, 97, 52, 122,
    212, 213, 347, 369,
];
const BUILTIN_TRAILER_TAGS: &[Tag] = &[93, 89, 10];

impl Dictionary {
    pub fn from_file(path: &Path) -> Result<Self, DictionaryError> {
        let text = std::fs::read_to_string(path).map_err(DictionaryError::Io)?;
        Self::from_xml(&text)
    }

    pub fn from_xml(text: &str) -> Result<Self, DictionaryError> {
        let doc =
            roxmltree::Document::parse(text).map_err(|e| DictionaryError::Xml(e.to_string()))?;
        let root = doc.root_element();
        if root.tag_name().name() != "fix" {
            return Err(DictionaryError::Invalid(
                "root element must be <fix>".into(),
            ));
        }
        let major = root
            .attribute("major")
            .ok_or_else(|| DictionaryError::Invalid("missing major".into()))?;
        let minor = root
            .attribute("minor")
            .ok_or_else(|| DictionaryError::Invalid("missing minor".into()))?;
        let kind = root.attribute("type").unwrap_or("FIX");
        let begin_string = format!("{kind}.{major}.{minor}");

        let section = |name: &str| {
            root.children()
                .find(|n| n.is_element() && n.tag_name().name() == name)
        };

        let mut fields = DictMap::default();
        let mut fields_by_name = HashMap::new();
        if let Some(fields_node) = section("fields") {
            for node in fields_node
                .children()
                .filter(|n| n.is_element() && n.tag_name().name() == "field")
            {
                let def = parse_field_def(node)?;
                fields_by_name.insert(def.name.clone(), def.tag);
                fields.insert(def.tag, def);
            }
        }
        let mut components = HashMap::new();
        if let Some(components_node) = section("components") {
            for node in components_node.children().filter(|n| n.is_element()) {
                if let Some(name) = node.attribute("name") {
                    components.insert(name.to_string(), node);
                }
            }
        }
        let loader = Loader {
            fields_by_name: &fields_by_name,
            components: &components,
        };

        let mut header = MapSpec::default();
        if let Some(node) = section("header") {
            loader.parse_map(node, &mut header, None, 0)?;
        }
        let mut trailer = MapSpec::default();
        if let Some(node) = section("trailer") {
            loader.parse_map(node, &mut trailer, None, 0)?;
        }
        header.finish();
        trailer.finish();
        let mut messages = DictMap::default();
        if let Some(messages_node) = section("messages") {
            for node in messages_node
                .children()
                .filter(|n| n.is_element() && n.tag_name().name() == "message")
            {
                let msg_type = node
                    .attribute("msgtype")
                    .ok_or_else(|| DictionaryError::Invalid("message without msgtype".into()))?;
                let mut spec = MapSpec::default();
                loader.parse_map(node, &mut spec, None, 0)?;
                spec.finish();
                messages.insert(msg_type.to_string(), spec);
            }
        }
        if messages.is_empty() {
            return Err(DictionaryError::Invalid("no messages defined".into()));
        }
        let tag_info = tag_table(&fields, &header, &trailer);
        for spec in messages.values_mut() {
            spec.plan = flat_plan(&tag_info, &header, &trailer, spec);
        }
        Ok(Dictionary {
            begin_string,
            fields,
            fields_by_name,
            header,
            trailer,
            messages,
            options: ValidationOptions::default(),
            tag_info,
        })
    }

    /// The dense table's entry for `tag`, or None above [`DENSE_TAGS`].
    fn tag_info(&self, tag: Tag) -> Option<TagInfo> {
        dense_index(tag).map(|i| self.tag_info[i])
    }

    pub fn field(&self, tag: Tag) -> Option<&FieldDef> {
        self.fields.get(&tag)
    }

    pub fn is_data_field(&self, tag: Tag) -> bool {
        match self.tag_info(tag) {
            Some(info) => info.flags & TAG_DATA != 0,
            None => self.fields.get(&tag).is_some_and(is_data_def),
        }
    }

    pub fn is_length_field(&self, tag: Tag) -> bool {
        match self.tag_info(tag) {
            Some(info) => info.flags & TAG_LENGTH != 0,
            None => self.fields.get(&tag).is_some_and(is_length_def),
        }
    }

    pub fn is_header_field(&self, tag: Tag) -> bool {
        match self.tag_info(tag) {
            Some(info) => info.flags & TAG_HEADER != 0,
            None => is_header_tag(&self.header, tag),
        }
    }

    pub fn is_trailer_field(&self, tag: Tag) -> bool {
        match self.tag_info(tag) {
            Some(info) => info.flags & TAG_TRAILER != 0,
            None => is_trailer_tag(&self.trailer, tag),
        }
    }

    pub fn message(&self, msg_type: &[u8]) -> Option<&MapSpec> {
        std::str::from_utf8(msg_type)
            .ok()
            .and_then(|t| self.messages.get(t))
    }

    /// Sorts the fields of `raw` into header, body and trailer and parses
    /// repeating groups. A header field after the body, or a body field after
    /// the trailer, is remembered in `out_of_order_tag` (rejected by
    /// [`Dictionary::validate`]). A group entry that does not start with the
    /// group's delimiter is rejected here, as the message cannot be read on.
    pub fn structure(&self, raw: &RawMessage<'_>) -> Result<Structure, Reject> {
        let mut st = Structure::default();
        self.structure_into(raw, &mut st)?;
        Ok(st)
    }

    /// As [`Dictionary::structure`], into `st` (emptied first), whose allocations a caller
    /// keeps from one message to the next.
    pub fn structure_into(&self, raw: &RawMessage<'_>, st: &mut Structure) -> Result<(), Reject> {
        let msg_spec = self.message(raw.msg_type());
        let n = raw.fields.len();
        st.header.clear();
        st.body.clear();
        st.trailer.clear();
        st.out_of_order_tag = None;
        // Sized once for the worst case: growing them field by field cost more than the rest.
        st.header.fields.reserve(n);
        st.body.fields.reserve(n);
        st.trailer.fields.reserve(1);
        let mut expecting_header = true;
        let mut expecting_body = true;
        let mut i = 0;
        while i < n {
            let tag = raw.fields[i].tag;
            if self.is_header_field(tag) {
                if !expecting_header && st.out_of_order_tag.is_none() {
                    st.out_of_order_tag = Some(tag);
                }
                st.header.fields.push(i);
                i += 1;
                if let Some(group) = self.header.group(tag) {
                    i = parse_group(raw, i, tag, i - 1, group, &mut st.header)?;
                }
            } else if self.is_trailer_field(tag) {
                expecting_header = false;
                expecting_body = false;
                st.trailer.fields.push(i);
                i += 1;
            } else {
                if !expecting_body && st.out_of_order_tag.is_none() {
                    st.out_of_order_tag = Some(tag);
                }
                expecting_header = false;
                st.body.fields.push(i);
                i += 1;
                if let Some(group) = msg_spec.and_then(|s| s.group(tag)) {
                    i = parse_group(raw, i, tag, i - 1, group, &mut st.body)?;
                }
            }
        }
        Ok(())
    }

    /// Checks a structured message against the dictionary: field order,
    /// known MsgType, required fields, then every field's value, format,
    /// tag number, enumeration, membership and group counts.
    ///
    /// A message its type's [`FlatPlan`] accepts is accepted in one pass over its fields;
    /// every other message is checked by [`Dictionary::validate_generic`], so a reject and its
    /// reason are the same whichever way the message goes.
    pub fn validate(&self, raw: &RawMessage<'_>, st: &Structure) -> Result<(), Reject> {
        if self.plan_accepts(raw, st) {
            return Ok(());
        }
        self.validate_generic(raw, st)
    }

    /// Whether the plan of the message's type accepts it (false if there is no plan, or the
    /// plan leaves the message to the generic validator). Public for the property tests that
    /// check it accepts only what [`Dictionary::validate_generic`] accepts.
    pub fn plan_accepts(&self, raw: &RawMessage<'_>, st: &Structure) -> bool {
        let Some(spec) = self.message(raw.msg_type()) else {
            return false;
        };
        let Some(plan) = &spec.plan else {
            return false;
        };
        let flat = st.out_of_order_tag.is_none()
            && st.header.groups.is_empty()
            && st.body.groups.is_empty()
            && st.trailer.groups.is_empty();
        flat && self.plan_pass(raw, spec, plan)
    }

    /// The one pass of [`Dictionary::plan_accepts`] over a message without groups: each field
    /// is checked as it goes by, and the required tags seen are counted.
    fn plan_pass(&self, raw: &RawMessage<'_>, spec: &MapSpec, plan: &FlatPlan) -> bool {
        let mut seen = [0u64; PLAN_TAGS / 64];
        let mut required_seen = 0u32;
        for field in &raw.fields {
            let Some(index) = usize::try_from(field.tag).ok().filter(|&i| i < PLAN_TAGS) else {
                return false;
            };
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            if seen[word] & bit != 0 || !self.plan_field_ok(field, index, spec) {
                return false;
            }
            seen[word] |= bit;
            if plan.required[word] & bit != 0 {
                required_seen += 1;
            }
        }
        // Every field is distinct, so the count reaches the plan's only if all are present.
        required_seen == plan.required_count
    }

    /// One field of [`Dictionary::plan_pass`]: what the generic validator checks of it, all
    /// at once and without the options' leniencies (a field they would let pass is left to
    /// the generic validator).
    fn plan_field_ok(&self, field: &crate::codec::Field<'_>, index: usize, spec: &MapSpec) -> bool {
        let info = self.tag_info[index];
        if field.value.is_empty()
            || info.flags & TAG_KNOWN == 0
            || !value_has_valid_format(info.kind, field.value)
        {
            return false;
        }
        if info.flags & TAG_ENUMERATED != 0
            && !self
                .fields
                .get(&field.tag)
                .is_some_and(|def| def.allows(field.value))
        {
            return false;
        }
        // A header or trailer field is not checked for membership; a body field must belong
        // to the message and not open a group (a group, even empty, goes the generic way).
        info.flags & (TAG_HEADER | TAG_TRAILER) != 0
            || (spec.has_field(field.tag) && spec.group(field.tag).is_none())
    }

    /// The checks QuickFIX applies, in its order, on any message: see [`Dictionary::validate`].
    pub fn validate_generic(&self, raw: &RawMessage<'_>, st: &Structure) -> Result<(), Reject> {
        if self.options.check_fields_out_of_order {
            if let Some(tag) = st.out_of_order_tag {
                return Err(Reject::new(
                    SessionRejectReason::TagSpecifiedOutOfRequiredOrder,
                    Some(tag),
                ));
            }
        }
        let Some(spec) = self.message(raw.msg_type()) else {
            return Err(Reject::new(SessionRejectReason::InvalidMsgType, None));
        };
        check_required(raw, &st.header, &self.header)?;
        check_required(raw, &st.trailer, &self.trailer)?;
        check_required(raw, &st.body, spec)?;
        self.iterate(raw, &st.header, &self.header, Section::Header)?;
        self.iterate(raw, &st.trailer, &self.trailer, Section::Trailer)?;
        self.iterate(raw, &st.body, spec, Section::Body)?;
        Ok(())
    }

    fn iterate(
        &self,
        raw: &RawMessage<'_>,
        map: &FieldMap,
        spec: &MapSpec,
        section: Section,
    ) -> Result<(), Reject> {
        // A tag may appear once per field map; repeats are only legal as
        // separate group entries, which live in their own maps. Sorted by tag,
        // a repeat sits next to its first; the one reported is the first
        // repeated in message order, as a scan in order would find it.
        let mut on_stack = [0usize; 64];
        let mut on_heap = Vec::new();
        let sorted: &mut [usize] = if map.fields.len() <= on_stack.len() {
            let part = &mut on_stack[..map.fields.len()];
            part.copy_from_slice(&map.fields);
            part
        } else {
            on_heap.extend_from_slice(&map.fields);
            &mut on_heap
        };
        // Unstable is enough: equal tags are refused just below, before the order matters.
        sorted.sort_unstable_by_key(|&index| raw.fields[index].tag);
        if sorted
            .windows(2)
            .any(|w| raw.fields[w[0]].tag == raw.fields[w[1]].tag)
        {
            let mut seen = HashSet::with_capacity(map.fields.len());
            for &index in &map.fields {
                let tag = raw.fields[index].tag;
                if !seen.insert(tag) {
                    return Err(Reject::new(
                        SessionRejectReason::TagAppearsMoreThanOnce,
                        Some(tag),
                    ));
                }
            }
        }
        for &index in sorted.iter() {
            let field = raw.fields[index];
            let tag = field.tag;
            if self.options.check_fields_have_values && field.value.is_empty() {
                return Err(Reject::new(
                    SessionRejectReason::TagSpecifiedWithoutValue,
                    Some(tag),
                ));
            }
            // The dense table answers for nearly every tag; the definition itself is only
            // looked up for an enumerated field.
            let (known, kind, enumerated) = match self.tag_info(tag) {
                Some(info) => (
                    info.flags & TAG_KNOWN != 0,
                    info.kind,
                    info.flags & TAG_ENUMERATED != 0,
                ),
                None => match self.fields.get(&tag) {
                    Some(def) => (true, def.kind, !def.enums.is_empty()),
                    None => (false, FieldKind::String, false),
                },
            };
            if known && !value_has_valid_format(kind, field.value) {
                return Err(Reject::new(
                    SessionRejectReason::IncorrectDataFormat,
                    Some(tag),
                ));
            }
            if !self.options.check_user_defined_fields && tag >= USER_DEFINED_TAG_MIN {
                continue;
            }
            if !known {
                if self.options.allow_unknown_message_fields {
                    continue;
                }
                return Err(Reject::new(
                    SessionRejectReason::InvalidTagNumber,
                    Some(tag),
                ));
            }
            if let Some(def) = enumerated.then(|| self.fields.get(&tag)).flatten() {
                if !def.allows(field.value) {
                    return Err(Reject::new(
                        SessionRejectReason::ValueIsIncorrect,
                        Some(tag),
                    ));
                }
            }
            let check_membership = match section {
                Section::Header | Section::Trailer => false,
                Section::Body => !self.is_header_field(tag) && !self.is_trailer_field(tag),
                Section::Group => true,
            };
            if check_membership {
                if !spec.has_field(tag) && !self.options.allow_unknown_message_fields {
                    return Err(Reject::new(
                        SessionRejectReason::TagNotDefinedForMessageType,
                        Some(tag),
                    ));
                }
                if spec.group(tag).is_some() {
                    let declared = crate::codec::parse_u64(field.value);
                    let actual = map
                        .groups
                        .iter()
                        .find(|g| g.count_field == index)
                        .map_or(0, |g| g.entries.len() as u64);
                    if declared != Some(actual) {
                        return Err(Reject::new(
                            SessionRejectReason::IncorrectNumInGroupCount,
                            Some(tag),
                        ));
                    }
                }
            }
        }
        let mut groups: Vec<&GroupInstance> = map.groups.iter().collect();
        groups.sort_by_key(|g| g.count_tag);
        for group in groups {
            let Some(group_spec) = spec.groups.get(&group.count_tag) else {
                continue;
            };
            for entry in &group.entries {
                self.iterate(raw, entry, group_spec, Section::Group)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Header,
    Trailer,
    Body,
    Group,
}

fn is_data_def(def: &FieldDef) -> bool {
    def.type_name == "DATA" || def.type_name == "XMLDATA"
}

fn is_length_def(def: &FieldDef) -> bool {
    def.type_name == "LENGTH"
}

fn is_header_tag(header: &MapSpec, tag: Tag) -> bool {
    header.fields.contains(&tag) || BUILTIN_HEADER_TAGS.contains(&tag)
}

fn is_trailer_tag(trailer: &MapSpec, tag: Tag) -> bool {
    trailer.fields.contains(&tag) || BUILTIN_TRAILER_TAGS.contains(&tag)
}

/// The dense table: for every tag below [`DENSE_TAGS`], the answers the hash tables give.
fn tag_table(
    fields: &DictMap<Tag, FieldDef>,
    header: &MapSpec,
    trailer: &MapSpec,
) -> Box<[TagInfo]> {
    let mut table = vec![TagInfo::default(); DENSE_TAGS];
    for (index, info) in table.iter_mut().enumerate() {
        let tag = index as Tag;
        if is_header_tag(header, tag) {
            info.flags |= TAG_HEADER;
        }
        if is_trailer_tag(trailer, tag) {
            info.flags |= TAG_TRAILER;
        }
    }
    for (&tag, def) in fields {
        let Some(index) = dense_index(tag) else {
            continue;
        };
        let info = &mut table[index];
        info.flags |= TAG_KNOWN;
        info.kind = def.kind;
        if is_data_def(def) {
            info.flags |= TAG_DATA;
        }
        if is_length_def(def) {
            info.flags |= TAG_LENGTH;
        }
        if !def.enums.is_empty() {
            info.flags |= TAG_ENUMERATED;
        }
    }
    table.into_boxed_slice()
}

/// The [`FlatPlan`] of message `spec`, or None if its required tags cannot simply be counted:
/// one lies beyond [`PLAN_TAGS`], or sits in another section than the one requiring it (the
/// structure sorts a field by the tag table's flags, header first, then trailer, then body).
fn flat_plan(
    tag_info: &[TagInfo],
    header: &MapSpec,
    trailer: &MapSpec,
    spec: &MapSpec,
) -> Option<FlatPlan> {
    let sections = [
        (&header.required, TAG_HEADER),
        (&trailer.required, TAG_TRAILER),
        (&spec.required, 0),
    ];
    let mut plan = FlatPlan {
        required: [0; PLAN_TAGS / 64],
        required_count: 0,
    };
    for (required, section) in sections {
        for &tag in required {
            let index = usize::try_from(tag).ok().filter(|&i| i < PLAN_TAGS)?;
            let flags = tag_info[index].flags;
            let lands_in = if flags & TAG_HEADER != 0 {
                TAG_HEADER
            } else {
                flags & TAG_TRAILER
            };
            let (word, bit) = (index / 64, 1u64 << (index % 64));
            if lands_in != section || plan.required[word] & bit != 0 {
                return None;
            }
            plan.required[word] |= bit;
            plan.required_count += 1;
        }
    }
    Some(plan)
}

fn check_required(raw: &RawMessage<'_>, map: &FieldMap, spec: &MapSpec) -> Result<(), Reject> {
    for &tag in &spec.required {
        if !map.fields.iter().any(|&i| raw.fields[i].tag == tag) {
            return Err(Reject::new(
                SessionRejectReason::RequiredTagMissing,
                Some(tag),
            ));
        }
    }
    for group in &map.groups {
        if let Some(group_spec) = spec.groups.get(&group.count_tag) {
            for entry in &group.entries {
                check_required(raw, entry, group_spec)?;
            }
        }
    }
    Ok(())
}

fn parse_group(
    raw: &RawMessage<'_>,
    mut pos: usize,
    count_tag: Tag,
    count_field: usize,
    spec: &MapSpec,
    parent: &mut FieldMap,
) -> Result<usize, Reject> {
    assert!(spec.delimiter != 0, "a group spec always has a delimiter");
    let mut instance = GroupInstance {
        count_tag,
        count_field,
        entries: Vec::new(),
    };
    let mut current: Option<FieldMap> = None;
    while pos < raw.fields.len() {
        let tag = raw.fields[pos].tag;
        if tag == spec.delimiter {
            if let Some(entry) = current.take() {
                instance.entries.push(entry);
            }
            current = Some(FieldMap::default());
        } else if !spec.has_field(tag) {
            break;
        }
        let Some(entry) = current.as_mut() else {
            return Err(Reject {
                reason: SessionRejectReason::Other,
                ref_tag: Some(count_tag),
                text: format!(
                    "Group {count_tag}'s first entry does not start with delimiter {}",
                    spec.delimiter
                ),
            });
        };
        entry.fields.push(pos);
        pos += 1;
        if let Some(nested) = spec.group(tag) {
            pos = parse_group(raw, pos, tag, pos - 1, nested, entry)?;
        }
    }
    if let Some(entry) = current {
        instance.entries.push(entry);
    }
    parent.groups.push(instance);
    Ok(pos)
}

/// Whether `value` is well formed for a field of `kind`.
pub fn value_has_valid_format(kind: FieldKind, value: &[u8]) -> bool {
    match kind {
        FieldKind::String => true,
        FieldKind::Char => value.len() == 1,
        FieldKind::Int => {
            let digits = value.strip_prefix(b"-").unwrap_or(value);
            !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
        }
        FieldKind::Decimal => {
            let body = value.strip_prefix(b"-").unwrap_or(value);
            let dots = body.iter().filter(|&&b| b == b'.').count();
            let digit_count = body.iter().filter(|b| b.is_ascii_digit()).count();
            dots <= 1 && digit_count > 0 && digit_count + dots == body.len()
        }
        FieldKind::Boolean => value == b"Y" || value == b"N",
        FieldKind::UtcTimestamp => time::parse_utc_timestamp_ms(value).is_some(),
        FieldKind::UtcDateOnly => time::parse_utc_date(value).is_some(),
        FieldKind::UtcTimeOnly => time::parse_utc_time_only(value).is_some(),
    }
}

fn kind_of(type_name: &str) -> FieldKind {
    match type_name {
        "CHAR" => FieldKind::Char,
        "INT" | "LENGTH" | "NUMINGROUP" | "SEQNUM" | "DAYOFMONTH" | "TAGNUM" => FieldKind::Int,
        "FLOAT" | "QTY" | "PRICE" | "PRICEOFFSET" | "AMT" | "PERCENTAGE" => FieldKind::Decimal,
        "BOOLEAN" => FieldKind::Boolean,
        "UTCTIMESTAMP" | "TIME" => FieldKind::UtcTimestamp,
        "UTCDATEONLY" | "UTCDATE" => FieldKind::UtcDateOnly,
        "UTCTIMEONLY" => FieldKind::UtcTimeOnly,
        _ => FieldKind::String,
    }
}

fn parse_field_def(node: roxmltree::Node<'_, '_>) -> Result<FieldDef, DictionaryError> {
    let name = node
        .attribute("name")
        .ok_or_else(|| DictionaryError::Invalid("field without name".into()))?;
    let number = node
        .attribute("number")
        .and_then(|n| n.parse::<Tag>().ok())
        .ok_or_else(|| DictionaryError::Invalid(format!("field {name} has no valid number")))?;
    let type_name = node
        .attribute("type")
        .unwrap_or("STRING")
        .to_ascii_uppercase();
    let enums = node
        .children()
        .filter(|c| c.is_element() && c.tag_name().name() == "value")
        .filter_map(|c| c.attribute("enum"))
        .map(|e| e.as_bytes().to_vec())
        .collect();
    let multiple_values = matches!(
        type_name.as_str(),
        "MULTIPLEVALUESTRING" | "MULTIPLESTRINGVALUE" | "MULTIPLECHARVALUE"
    );
    Ok(FieldDef {
        tag: number,
        name: name.to_string(),
        kind: kind_of(&type_name),
        type_name,
        enums,
        multiple_values,
    })
}

struct Loader<'d, 'a, 'input> {
    fields_by_name: &'d HashMap<String, Tag>,
    components: &'d HashMap<String, roxmltree::Node<'a, 'input>>,
}

impl Loader<'_, '_, '_> {
    /// Adds the children of a message, group or component node to `spec`.
    /// As in QuickFIX, a field inside a component is required only if it is
    /// marked required and the component itself is required; a group opens
    /// a fresh scope in which its own required marks apply to each entry.
    fn parse_map(
        &self,
        node: roxmltree::Node<'_, '_>,
        spec: &mut MapSpec,
        component_required: Option<bool>,
        depth: usize,
    ) -> Result<(), DictionaryError> {
        if depth > COMPONENT_DEPTH_MAX {
            return Err(DictionaryError::Invalid(
                "components nest too deeply (cycle?)".into(),
            ));
        }
        for child in node.children().filter(|c| c.is_element()) {
            let kind = child.tag_name().name();
            let name = child
                .attribute("name")
                .ok_or_else(|| DictionaryError::Invalid(format!("<{kind}> without name")))?;
            let marked_required = child.attribute("required") == Some("Y");
            match kind {
                "field" | "group" => {
                    let tag = *self.fields_by_name.get(name).ok_or_else(|| {
                        DictionaryError::Invalid(format!("field {name} is not defined in <fields>"))
                    })?;
                    let required = marked_required && component_required.unwrap_or(true);
                    spec.add_field(tag, required);
                    if spec.delimiter == -1 {
                        // A group's first field opens every entry.
                        spec.delimiter = tag;
                    }
                    if kind == "group" {
                        let mut group = MapSpec {
                            delimiter: -1,
                            ..MapSpec::default()
                        };
                        self.parse_map(child, &mut group, None, depth + 1)?;
                        if group.delimiter <= 0 {
                            return Err(DictionaryError::Invalid(format!(
                                "group {name} has no fields"
                            )));
                        }
                        spec.groups.insert(tag, group);
                    }
                }
                "component" => {
                    let component = self.components.get(name).ok_or_else(|| {
                        DictionaryError::Invalid(format!("component {name} is not defined"))
                    })?;
                    self.parse_map(*component, spec, Some(marked_required), depth + 1)?;
                }
                other => {
                    return Err(DictionaryError::Invalid(format!(
                        "unexpected <{other}> in <{}>",
                        node.tag_name().name()
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Indices into a [`RawMessage`]'s fields making up one field map (header,
/// body, trailer or a group entry), with the groups it contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldMap {
    /// Indices of this map's own fields, group count fields included, in wire order.
    pub fields: Vec<usize>,
    pub groups: Vec<GroupInstance>,
}

impl FieldMap {
    /// Empties the map, keeping its allocations.
    pub fn clear(&mut self) {
        self.fields.clear();
        self.groups.clear();
    }
}

/// One occurrence of a repeating group: its count field and its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInstance {
    pub count_tag: Tag,
    /// Index of the NumInGroup field in the raw message.
    pub count_field: usize,
    pub entries: Vec<FieldMap>,
}

/// A message's fields sorted into header, body and trailer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Structure {
    pub header: FieldMap,
    pub body: FieldMap,
    pub trailer: FieldMap,
    /// The first header field found after the body began, or body field
    /// found after the trailer began.
    pub out_of_order_tag: Option<Tag>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"<fix major="4" minor="4">
      <header>
        <field name="BeginString" required="Y"/><field name="BodyLength" required="Y"/>
        <field name="MsgType" required="Y"/><field name="MsgSeqNum" required="Y"/>
      </header>
      <trailer><field name="CheckSum" required="Y"/></trailer>
      <messages>
        <message name="Order" msgtype="D" msgcat="app">
          <field name="ClOrdID" required="Y"/>
          <component name="Parties" required="N"/>
        </message>
      </messages>
      <components>
        <component name="Parties">
          <group name="NoPartyIDs" required="N">
            <field name="PartyID" required="Y"/><field name="PartyRole" required="N"/>
          </group>
        </component>
      </components>
      <fields>
        <field number="8" name="BeginString" type="STRING"/>
        <field number="9" name="BodyLength" type="LENGTH"/>
        <field number="35" name="MsgType" type="STRING"/>
        <field number="34" name="MsgSeqNum" type="SEQNUM"/>
        <field number="10" name="CheckSum" type="STRING"/>
        <field number="11" name="ClOrdID" type="STRING"/>
        <field number="453" name="NoPartyIDs" type="NUMINGROUP"/>
        <field number="448" name="PartyID" type="STRING"/>
        <field number="452" name="PartyRole" type="INT"><value enum="1" description="X"/></field>
      </fields>
    </fix>"#;

    #[test]
    fn loads_groups_inside_components() {
        let d = Dictionary::from_xml(SMALL).expect("loads");
        assert_eq!(d.begin_string, "FIX.4.4");
        let order = d.messages.get("D").expect("D");
        let group = order.groups.get(&453).expect("group");
        assert_eq!(group.delimiter, 448);
        assert_eq!(group.required, vec![448]);
        assert_eq!(order.required, vec![11]);
        assert_eq!(d.header.required, vec![8, 9, 34, 35]);
    }

    /// A dictionary with what the dense tables must get right: data and length fields, a
    /// user-defined tag above the dense range in a message and in a nested group, a header
    /// group and an enumerated field.
    const EDGES: &str = r#"<fix major="4" minor="4">
      <header>
        <field name="BeginString" required="Y"/><field name="BodyLength" required="Y"/>
        <field name="MsgType" required="Y"/><field name="MsgSeqNum" required="Y"/>
        <field name="HighHeader" required="N"/>
        <group name="NoHops" required="N"><field name="HopCompID" required="N"/></group>
      </header>
      <trailer><field name="SignatureLength" required="N"/><field name="Signature" required="N"/>
        <field name="CheckSum" required="Y"/></trailer>
      <messages>
        <message name="Order" msgtype="D" msgcat="app">
          <field name="ClOrdID" required="Y"/><field name="RawDataLength" required="N"/>
          <field name="RawData" required="N"/><field name="High" required="N"/>
          <field name="Side" required="N"/>
          <group name="NoPartyIDs" required="N">
            <field name="PartyID" required="Y"/>
            <group name="NoHigh" required="N"><field name="High" required="N"/></group>
          </group>
        </message>
      </messages>
      <fields>
        <field number="8" name="BeginString" type="STRING"/>
        <field number="9" name="BodyLength" type="LENGTH"/>
        <field number="35" name="MsgType" type="STRING"/>
        <field number="34" name="MsgSeqNum" type="SEQNUM"/>
        <field number="10" name="CheckSum" type="STRING"/>
        <field number="89" name="Signature" type="DATA"/>
        <field number="93" name="SignatureLength" type="LENGTH"/>
        <field number="11" name="ClOrdID" type="STRING"/>
        <field number="54" name="Side" type="CHAR"><value enum="1" description="BUY"/></field>
        <field number="95" name="RawDataLength" type="LENGTH"/>
        <field number="96" name="RawData" type="DATA"/>
        <field number="627" name="NoHops" type="NUMINGROUP"/>
        <field number="628" name="HopCompID" type="STRING"/>
        <field number="453" name="NoPartyIDs" type="NUMINGROUP"/>
        <field number="448" name="PartyID" type="STRING"/>
        <field number="8191" name="HighHeader" type="STRING"/>
        <field number="8192" name="NoHigh" type="NUMINGROUP"/>
        <field number="20000" name="High" type="INT"/>
      </fields>
    </fix>"#;

    fn assert_spec_dense_equals_hash(spec: &MapSpec, tag: Tag) {
        assert_eq!(spec.has_field(tag), spec.fields.contains(&tag), "tag {tag}");
        assert_eq!(
            spec.group(tag).map(|g| g as *const MapSpec),
            spec.groups.get(&tag).map(|g| g as *const MapSpec),
            "tag {tag}"
        );
        for group in spec.groups.values() {
            assert_spec_dense_equals_hash(group, tag);
        }
    }

    /// Every tag the dense tables answer for, and past them, gets the hash tables' answer.
    #[test]
    fn dense_tables_answer_as_the_hash_tables_for_every_tag() {
        let dictionaries = [
            Dictionary::from_xml(SMALL).expect("loads"),
            Dictionary::from_xml(EDGES).expect("loads"),
            crate::testing::small_dictionary(),
        ];
        for d in &dictionaries {
            for tag in (-20..DENSE_TAGS as Tag + 20).chain([20_000, 44_955, Tag::MAX, Tag::MIN]) {
                let def = d.fields.get(&tag);
                assert_eq!(
                    d.is_header_field(tag),
                    is_header_tag(&d.header, tag),
                    "{tag}"
                );
                assert_eq!(
                    d.is_trailer_field(tag),
                    is_trailer_tag(&d.trailer, tag),
                    "{tag}"
                );
                assert_eq!(d.is_data_field(tag), def.is_some_and(is_data_def), "{tag}");
                assert_eq!(
                    d.is_length_field(tag),
                    def.is_some_and(is_length_def),
                    "{tag}"
                );
                if let Some(info) = d.tag_info(tag) {
                    assert_eq!(info.flags & TAG_KNOWN != 0, def.is_some(), "{tag}");
                    assert_eq!(
                        info.flags & TAG_ENUMERATED != 0,
                        def.is_some_and(|f| !f.enums.is_empty()),
                        "{tag}"
                    );
                    if let Some(def) = def {
                        assert_eq!(info.kind, def.kind, "{tag}");
                    }
                }
                for spec in d.messages.values().chain([&d.header, &d.trailer]) {
                    assert_spec_dense_equals_hash(spec, tag);
                }
            }
        }
        let edges = &dictionaries[1];
        assert!(edges.is_data_field(96) && edges.is_length_field(95) && edges.is_trailer_field(89));
        assert!(edges.is_header_field(8191) && edges.messages["D"].has_field(20_000));
        assert!(edges.messages["D"].groups[&453].group(8192).is_some());
    }

    #[test]
    fn format_checks() {
        assert!(value_has_valid_format(FieldKind::Decimal, b"002000.00"));
        assert!(value_has_valid_format(FieldKind::Decimal, b"-1"));
        assert!(!value_has_valid_format(FieldKind::Decimal, b"1.2.3"));
        assert!(!value_has_valid_format(FieldKind::Decimal, b"."));
        assert!(!value_has_valid_format(FieldKind::Int, b"failboat"));
        assert!(!value_has_valid_format(FieldKind::Char, b"failboat"));
        assert!(value_has_valid_format(FieldKind::Char, b"B"));
    }
}
