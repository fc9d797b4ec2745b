//! Tag numbers and enumerated values the session layer itself needs.
//!
//! Application tags live in the data dictionary; only the ones the codec and
//! the session read or write by number are named here.

/// A FIX tag number. Signed because a peer may send `-1=...`, and a reject must
/// be able to quote that number back in RefTagID (371).
pub type Tag = i32;

pub const BEGIN_SEQ_NO: Tag = 7;
pub const BEGIN_STRING: Tag = 8;
pub const BODY_LENGTH: Tag = 9;
pub const CHECK_SUM: Tag = 10;
pub const CL_ORD_ID: Tag = 11;
pub const END_SEQ_NO: Tag = 16;
pub const MSG_SEQ_NUM: Tag = 34;
pub const MSG_TYPE: Tag = 35;
pub const NEW_SEQ_NO: Tag = 36;
pub const POSS_DUP_FLAG: Tag = 43;
pub const REF_SEQ_NUM: Tag = 45;
pub const SENDER_COMP_ID: Tag = 49;
pub const SENDER_SUB_ID: Tag = 50;
pub const SENDING_TIME: Tag = 52;
pub const TARGET_COMP_ID: Tag = 56;
pub const TARGET_SUB_ID: Tag = 57;
pub const TEXT: Tag = 58;
pub const PASSWORD: Tag = 554;
pub const NEW_PASSWORD: Tag = 925;
pub const SIGNATURE: Tag = 89;
pub const SIGNATURE_LENGTH: Tag = 93;
pub const POSS_RESEND: Tag = 97;
pub const ENCRYPT_METHOD: Tag = 98;
pub const HEART_BT_INT: Tag = 108;
pub const TEST_REQ_ID: Tag = 112;
pub const ON_BEHALF_OF_COMP_ID: Tag = 115;
pub const ON_BEHALF_OF_SUB_ID: Tag = 116;
pub const ORIG_SENDING_TIME: Tag = 122;
pub const GAP_FILL_FLAG: Tag = 123;
pub const DELIVER_TO_COMP_ID: Tag = 128;
pub const DELIVER_TO_SUB_ID: Tag = 129;
pub const RESET_SEQ_NUM_FLAG: Tag = 141;
pub const SENDER_LOCATION_ID: Tag = 142;
pub const TARGET_LOCATION_ID: Tag = 143;
pub const ON_BEHALF_OF_LOCATION_ID: Tag = 144;
pub const DELIVER_TO_LOCATION_ID: Tag = 145;
pub const HEADLINE: Tag = 148;
pub const XML_DATA_LEN: Tag = 212;
pub const XML_DATA: Tag = 213;
pub const MESSAGE_ENCODING: Tag = 347;
pub const ENCODED_HEADLINE_LEN: Tag = 358;
pub const ENCODED_HEADLINE: Tag = 359;
pub const REF_TAG_ID: Tag = 371;
pub const REF_MSG_TYPE: Tag = 372;
pub const SESSION_REJECT_REASON: Tag = 373;
pub const BUSINESS_REJECT_REASON: Tag = 380;

/// Message types the session layer handles itself.
pub mod msg_type {
    pub const HEARTBEAT: &str = "0";
    pub const TEST_REQUEST: &str = "1";
    pub const RESEND_REQUEST: &str = "2";
    pub const REJECT: &str = "3";
    pub const SEQUENCE_RESET: &str = "4";
    pub const LOGOUT: &str = "5";
    pub const LOGON: &str = "A";
    pub const XML_NON_FIX: &str = "n";
    pub const NEWS: &str = "B";
    pub const BUSINESS_MESSAGE_REJECT: &str = "j";
}

/// Whether a message type is a session-level (administrative) one. XMLnonFIX
/// (`n`) counts as administrative, as it does in the QuickFIX engines.
pub fn is_admin_msg_type(msg_type: &[u8]) -> bool {
    matches!(
        msg_type,
        b"0" | b"A" | b"1" | b"2" | b"3" | b"4" | b"5" | b"n"
    )
}

/// SessionRejectReason (373) values and the Text (58) wording that goes with
/// each; peers and conformance scripts compare that wording exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionRejectReason {
    InvalidTagNumber = 0,
    RequiredTagMissing = 1,
    TagNotDefinedForMessageType = 2,
    UndefinedTag = 3,
    TagSpecifiedWithoutValue = 4,
    ValueIsIncorrect = 5,
    IncorrectDataFormat = 6,
    DecryptionProblem = 7,
    SignatureProblem = 8,
    CompIdProblem = 9,
    SendingTimeAccuracyProblem = 10,
    InvalidMsgType = 11,
    TagAppearsMoreThanOnce = 13,
    TagSpecifiedOutOfRequiredOrder = 14,
    RepeatingGroupFieldsOutOfOrder = 15,
    IncorrectNumInGroupCount = 16,
    NonDataValueIncludesFieldDelimiter = 17,
    Other = 99,
}

impl SessionRejectReason {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn text(self) -> &'static str {
        use SessionRejectReason::*;
        match self {
            InvalidTagNumber => "Invalid tag number",
            RequiredTagMissing => "Required tag missing",
            TagNotDefinedForMessageType => "Tag not defined for this message type",
            UndefinedTag => "Undefined Tag",
            TagSpecifiedWithoutValue => "Tag specified without a value",
            ValueIsIncorrect => "Value is incorrect (out of range) for this tag",
            IncorrectDataFormat => "Incorrect data format for value",
            DecryptionProblem => "Decryption problem",
            SignatureProblem => "Signature problem",
            CompIdProblem => "CompID problem",
            SendingTimeAccuracyProblem => "SendingTime accuracy problem",
            InvalidMsgType => "Invalid MsgType",
            TagAppearsMoreThanOnce => "Tag appears more than once",
            TagSpecifiedOutOfRequiredOrder => "Tag specified out of required order",
            RepeatingGroupFieldsOutOfOrder => "Repeating group fields out of order",
            IncorrectNumInGroupCount => "Incorrect NumInGroup count for repeating group",
            NonDataValueIncludesFieldDelimiter => {
                "Non Data value includes field delimiter (SOH character)"
            }
            Other => "Other",
        }
    }
}

/// BusinessRejectReason (380) values used by the session and the echo
/// application, with their Text (58) wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusinessRejectReason {
    Other = 0,
    UnknownId = 1,
    UnknownSecurity = 2,
    UnsupportedMessageType = 3,
    ApplicationNotAvailable = 4,
    ConditionallyRequiredFieldMissing = 5,
}

impl BusinessRejectReason {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn text(self) -> &'static str {
        use BusinessRejectReason::*;
        match self {
            Other => "Other",
            UnknownId => "Unknown ID",
            UnknownSecurity => "Unknown Security",
            UnsupportedMessageType => "Unsupported Message Type",
            ApplicationNotAvailable => "Application not available",
            ConditionallyRequiredFieldMissing => "Conditionally required field missing",
        }
    }
}
