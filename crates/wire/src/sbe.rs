//! What both schemas share: the SBE message header, bounds checking of a whole message before
//! a generated decoder touches it, and a trait that lets one function start any generated
//! encoder.
//!
//! The generated codecs index slices directly and panic when a buffer is too short; they trust
//! their input. This module is the wall in front of them: `measure_message` walks the header,
//! the root block and every repeating group with checked arithmetic, and only a message that
//! fits entirely in its buffer is ever wrapped by a generated decoder.

use crate::Error;

/// Size of the SBE standard message header: blockLength, templateId, schemaId, version.
pub const MESSAGE_HEADER_BYTES: usize = 8;

/// The SBE standard message header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageHeader {
    pub block_length: u16,
    pub template_id: u16,
    pub schema_id: u16,
    pub version: u16,
}

impl MessageHeader {
    /// Reads the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self, Error> {
        let bytes: &[u8; MESSAGE_HEADER_BYTES] = buf
            .get(..MESSAGE_HEADER_BYTES)
            .and_then(|b| b.try_into().ok())
            .ok_or(Error::Truncated {
                needed_bytes: MESSAGE_HEADER_BYTES,
                available_bytes: buf.len(),
            })?;
        Ok(Self {
            block_length: u16::from_le_bytes([bytes[0], bytes[1]]),
            template_id: u16::from_le_bytes([bytes[2], bytes[3]]),
            schema_id: u16::from_le_bytes([bytes[4], bytes[5]]),
            version: u16::from_le_bytes([bytes[6], bytes[7]]),
        })
    }

    /// Writes the header at the start of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<(), Error> {
        let available_bytes = buf.len();
        let out = buf
            .get_mut(..MESSAGE_HEADER_BYTES)
            .ok_or(Error::BufferTooSmall {
                needed_bytes: MESSAGE_HEADER_BYTES,
                available_bytes,
            })?;
        out[0..2].copy_from_slice(&self.block_length.to_le_bytes());
        out[2..4].copy_from_slice(&self.template_id.to_le_bytes());
        out[4..6].copy_from_slice(&self.schema_id.to_le_bytes());
        out[6..8].copy_from_slice(&self.version.to_le_bytes());
        Ok(())
    }
}

/// Shape of a repeating group, for bounds checking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupLayout {
    /// Size of the group's dimension header: 3 for (u16 blockLength, u8 numInGroup),
    /// 4 for (u16 blockLength, u16 numInGroup).
    pub header_bytes: usize,
    /// The group's fields end here; a shorter block length on the wire is malformed.
    pub block_length_min: u16,
    /// Largest numInGroup accepted.
    pub count_max: u16,
}

/// Shape of a message, for bounds checking. Groups are listed in schema order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessageLayout {
    pub block_length_min: u16,
    pub groups: &'static [GroupLayout],
    /// The largest length accepted for each variable-length data field after the groups, in
    /// schema order; each field is a u16 length and then that many bytes.
    pub var_data_max: &'static [u16],
}

/// Checks the SBE header at the start of `buf` against a schema: the schema id must match and
/// the version must not be newer than the one this build was generated from.
pub(crate) fn check_header(
    buf: &[u8],
    schema_id: u16,
    schema_version: u16,
) -> Result<MessageHeader, Error> {
    let header = MessageHeader::parse(buf)?;
    if header.schema_id != schema_id {
        return Err(Error::WrongSchemaId {
            schema_id: header.schema_id,
            expected: schema_id,
        });
    }
    if header.version > schema_version {
        return Err(Error::VersionFromFuture {
            version: header.version,
            supported: schema_version,
        });
    }
    Ok(header)
}

/// Returns the total size of the message at the start of `buf` (header, root block and all
/// groups) after checking that all of it lies inside `buf` and that every block length and
/// group count is within the layout's limits.
pub(crate) fn measure_message(
    buf: &[u8],
    header: &MessageHeader,
    layout: &MessageLayout,
) -> Result<usize, Error> {
    if header.block_length < layout.block_length_min {
        return Err(Error::BlockLengthTooShort {
            template_id: header.template_id,
            block_length: header.block_length,
            block_length_min: layout.block_length_min,
        });
    }
    // usize is at least 32 bits on every supported target and every term below is at most
    // 16 bits times 16 bits, so the sums cannot overflow; checked_add documents that anyway.
    let mut end = MESSAGE_HEADER_BYTES + usize::from(header.block_length);
    ensure_available(buf, end)?;
    for group in layout.groups {
        let group_header_end = end + group.header_bytes;
        let dimensions = buf.get(end..group_header_end).ok_or(Error::Truncated {
            needed_bytes: group_header_end,
            available_bytes: buf.len(),
        })?;
        let block_length = u16::from_le_bytes([dimensions[0], dimensions[1]]);
        let count = if group.header_bytes == 3 {
            u16::from(dimensions[2])
        } else {
            u16::from_le_bytes([dimensions[2], dimensions[3]])
        };
        if block_length < group.block_length_min {
            return Err(Error::GroupBlockLengthTooShort {
                template_id: header.template_id,
                block_length,
                block_length_min: group.block_length_min,
            });
        }
        if count > group.count_max {
            return Err(Error::GroupCountTooLarge {
                template_id: header.template_id,
                count,
                count_max: group.count_max,
            });
        }
        let entries_bytes = usize::from(block_length) * usize::from(count);
        end = group_header_end
            .checked_add(entries_bytes)
            .ok_or(Error::Truncated {
                needed_bytes: usize::MAX,
                available_bytes: buf.len(),
            })?;
        ensure_available(buf, end)?;
    }
    for &length_max in layout.var_data_max {
        let length_end = end + VAR_DATA_LENGTH_BYTES;
        let length = buf.get(end..length_end).ok_or(Error::Truncated {
            needed_bytes: length_end,
            available_bytes: buf.len(),
        })?;
        let length = u16::from_le_bytes([length[0], length[1]]);
        if length > length_max {
            return Err(Error::VarDataTooLong {
                template_id: header.template_id,
                length,
                length_max,
            });
        }
        end = length_end + usize::from(length);
        ensure_available(buf, end)?;
    }
    Ok(end)
}

/// Size of the length that precedes each variable-length data field.
pub(crate) const VAR_DATA_LENGTH_BYTES: usize = 2;

fn ensure_available(buf: &[u8], needed_bytes: usize) -> Result<(), Error> {
    if buf.len() < needed_bytes {
        return Err(Error::Truncated {
            needed_bytes,
            available_bytes: buf.len(),
        });
    }
    Ok(())
}

/// A generated message encoder that can be started on a raw byte buffer.
///
/// Implemented (by a macro in each schema module) for every generated `*Encoder` of a message,
/// so that one generic function can write the SBE header and hand the encoder to the caller.
pub trait MessageEncoder<'a>: Sized {
    const SCHEMA_ID: u16;
    const SCHEMA_VERSION: u16;
    const TEMPLATE_ID: u16;
    /// Size of the root block.
    const BLOCK_LENGTH: u16;

    /// Wraps `buf`, which starts with the SBE header, with the root block right after it.
    fn wrap_after_header(buf: &'a mut [u8]) -> Self;

    /// Bytes written so far, SBE header included; after the caller has written every group this
    /// is the size of the whole message.
    fn message_bytes(&self) -> usize;
}

/// Writes the SBE header for `E` at the start of `buf`, zeroes the root block, lets `fill` set
/// the fields, and returns the size of the message.
///
/// The root block is zeroed first so that a field the caller forgets reads as zero rather than
/// as whatever the buffer held before; encoding the same values twice gives the same bytes.
///
/// # Panics
///
/// Never for messages without repeating groups: the fixed part is checked against `buf`
/// first. The generated group encoders index `buf` directly, so a caller that writes more
/// group entries than fit in `buf` panics; size the buffer for the largest packet.
pub fn encode_message<'a, E, F>(buf: &'a mut [u8], fill: F) -> Result<usize, Error>
where
    E: MessageEncoder<'a>,
    F: FnOnce(E) -> E,
{
    let needed_bytes = MESSAGE_HEADER_BYTES + usize::from(E::BLOCK_LENGTH);
    let available_bytes = buf.len();
    let fixed = buf.get_mut(..needed_bytes).ok_or(Error::BufferTooSmall {
        needed_bytes,
        available_bytes,
    })?;
    fixed.fill(0);
    MessageHeader {
        block_length: E::BLOCK_LENGTH,
        template_id: E::TEMPLATE_ID,
        schema_id: E::SCHEMA_ID,
        version: E::SCHEMA_VERSION,
    }
    .write(fixed)?;
    let encoder = fill(E::wrap_after_header(buf));
    Ok(encoder.message_bytes())
}

/// A schema's `decode_message`: the message at the start of the bytes and its size.
pub(crate) type DecodeMessage<'a, M> = fn(&'a [u8]) -> Result<(M, usize), Error>;

/// Checks that a frame holds exactly one SBE message of a schema and decodes it with that
/// schema's `decode_message`: the frame's encoding must be an SBE message and no byte may
/// follow the message.
pub(crate) fn message_from_frame<'a, M>(
    frame: &crate::frame::RawFrame<'a>,
    decode_message: DecodeMessage<'a, M>,
) -> Result<M, Error> {
    use crate::frame::Encoding;
    if frame.encoding != Encoding::SbeMessage {
        return Err(Error::UnexpectedEncoding {
            encoding: frame.encoding as u16,
            expected: Encoding::SbeMessage as u16,
        });
    }
    let (message, message_bytes) = decode_message(frame.payload)?;
    if message_bytes != frame.payload.len() {
        return Err(Error::TrailingBytes {
            trailing_bytes: frame.payload.len() - message_bytes,
        });
    }
    Ok(message)
}

/// The `older_block_length` of a schema none of whose messages grew since version 1.
pub(crate) fn no_older_block_length<T>(_template: T, _version: u16) -> Option<u16> {
    None
}

/// Declares a schema's message list once and derives from it: the `Message` enum of typed
/// decoders, the `TemplateId` enum, `decode_message`, and `MessageEncoder` for every encoder.
///
/// Each entry is `Variant => codec_module::Decoder / Encoder [groups...]`, optionally followed by
/// `data [max lengths...]` for the variable-length data fields after the groups.
/// `older_block_length` names a `fn(TemplateId, version: u16) -> Option<u16>` giving a
/// template's root block length in an older schema version whose block was shorter (fields
/// appended since), so that a message of that version is read by its own `blockLength`.
macro_rules! schema_messages {
    (
        sbe = $sbe:ident;
        older_block_length = $older:path;
        $( $variant:ident => $codec:ident :: $dec:ident / $enc:ident [ $($group:expr),* ]
            $( data [ $($var_max:expr),* ] )? ),+ $(,)?
    ) => {
        /// Every message of the schema, by template id.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum TemplateId {
            $( $variant = $sbe::$codec::SBE_TEMPLATE_ID, )+
        }

        impl TemplateId {
            /// All templates, in schema order.
            pub const ALL: &'static [TemplateId] = &[ $( TemplateId::$variant, )+ ];

            /// The template with this id, if the schema defines one.
            pub fn from_u16(template_id: u16) -> Option<Self> {
                match template_id {
                    $( $sbe::$codec::SBE_TEMPLATE_ID => Some(TemplateId::$variant), )+
                    _ => None,
                }
            }

            /// Size of the template's root block in this schema version.
            pub fn block_length(self) -> u16 {
                match self {
                    $( TemplateId::$variant => $sbe::$codec::SBE_BLOCK_LENGTH, )+
                }
            }

            pub(crate) fn layout(self) -> $crate::sbe::MessageLayout {
                match self {
                    $( TemplateId::$variant => $crate::sbe::MessageLayout {
                        block_length_min: $sbe::$codec::SBE_BLOCK_LENGTH,
                        groups: {
                            // A named constant, because group layouts call const fns and
                            // only a constant item makes the slice 'static.
                            const GROUPS: &[$crate::sbe::GroupLayout] = &[ $( $group, )* ];
                            GROUPS
                        },
                        var_data_max: &[ $( $( $var_max, )* )? ],
                    }, )+
                }
            }
        }

        /// A validated message: the generated decoder for its template, wrapped around a slice
        /// that is known to hold the whole message.
        #[derive(Debug, Clone, Copy)]
        pub enum Message<'a> {
            $( $variant($sbe::$codec::$dec<'a>), )+
        }

        impl<'a> Message<'a> {
            /// Template of this message.
            pub fn template_id(&self) -> TemplateId {
                match self {
                    $( Message::$variant(_) => TemplateId::$variant, )+
                }
            }
        }

        /// Decodes the SBE message at the start of `buf` and returns it with its size in bytes.
        /// Bytes after the message are left alone (a packet holds several messages).
        pub fn decode_message(buf: &[u8]) -> Result<(Message<'_>, usize), $crate::Error> {
            let header = $crate::sbe::check_header(buf, SCHEMA_ID, SCHEMA_VERSION)?;
            let template = TemplateId::from_u16(header.template_id).ok_or(
                $crate::Error::UnknownTemplate { template_id: header.template_id },
            )?;
            let mut layout = template.layout();
            if let Some(older) = $older(template, header.version) {
                layout.block_length_min = older;
            }
            let message_bytes = $crate::sbe::measure_message(buf, &header, &layout)?;
            let message_buf = buf.get(..message_bytes).ok_or($crate::Error::Truncated {
                needed_bytes: message_bytes,
                available_bytes: buf.len(),
            })?;
            let read_buf = $sbe::ReadBuf::new(message_buf);
            let offset = $crate::sbe::MESSAGE_HEADER_BYTES;
            let message = match template {
                $( TemplateId::$variant => Message::$variant(
                    $sbe::$codec::$dec::default().wrap(
                        read_buf,
                        offset,
                        header.block_length,
                        header.version,
                    ),
                ), )+
            };
            Ok((message, message_bytes))
        }

        $(
            impl<'a> $crate::sbe::MessageEncoder<'a> for $sbe::$codec::$enc<'a> {
                const SCHEMA_ID: u16 = $sbe::SBE_SCHEMA_ID;
                const SCHEMA_VERSION: u16 = $sbe::SBE_SCHEMA_VERSION;
                const TEMPLATE_ID: u16 = $sbe::$codec::SBE_TEMPLATE_ID;
                const BLOCK_LENGTH: u16 = $sbe::$codec::SBE_BLOCK_LENGTH;

                fn wrap_after_header(buf: &'a mut [u8]) -> Self {
                    $sbe::$codec::$enc::default().wrap(
                        $sbe::WriteBuf::new(buf),
                        $crate::sbe::MESSAGE_HEADER_BYTES,
                    )
                }

                fn message_bytes(&self) -> usize {
                    $crate::sbe::MESSAGE_HEADER_BYTES + self.encoded_length()
                }
            }
        )+
    };
}

pub(crate) use schema_messages;
