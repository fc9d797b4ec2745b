//! A small FIX 4.4 dictionary for tests (here and in crates that drive a
//! session), so they need no file outside the crate: the session messages
//! and a NewOrderSingle with one repeating group.

use crate::dictionary::Dictionary;

pub const SMALL_FIX44_XML: &str = r#"<fix major="4" minor="4">
  <header>
    <field name="BeginString" required="Y"/>
    <field name="BodyLength" required="Y"/>
    <field name="MsgType" required="Y"/>
    <field name="SenderCompID" required="Y"/>
    <field name="TargetCompID" required="Y"/>
    <field name="MsgSeqNum" required="Y"/>
    <field name="PossDupFlag" required="N"/>
    <field name="PossResend" required="N"/>
    <field name="SendingTime" required="Y"/>
    <field name="OrigSendingTime" required="N"/>
  </header>
  <trailer>
    <field name="CheckSum" required="Y"/>
  </trailer>
  <messages>
    <message name="Heartbeat" msgtype="0" msgcat="admin"><field name="TestReqID" required="N"/></message>
    <message name="TestRequest" msgtype="1" msgcat="admin"><field name="TestReqID" required="Y"/></message>
    <message name="ResendRequest" msgtype="2" msgcat="admin">
      <field name="BeginSeqNo" required="Y"/><field name="EndSeqNo" required="Y"/>
    </message>
    <message name="Reject" msgtype="3" msgcat="admin">
      <field name="RefSeqNum" required="Y"/><field name="RefTagID" required="N"/>
      <field name="RefMsgType" required="N"/><field name="SessionRejectReason" required="N"/>
      <field name="Text" required="N"/>
    </message>
    <message name="SequenceReset" msgtype="4" msgcat="admin">
      <field name="GapFillFlag" required="N"/><field name="NewSeqNo" required="Y"/>
    </message>
    <message name="Logout" msgtype="5" msgcat="admin"><field name="Text" required="N"/></message>
    <message name="Logon" msgtype="A" msgcat="admin">
      <field name="EncryptMethod" required="Y"/><field name="HeartBtInt" required="Y"/>
      <field name="ResetSeqNumFlag" required="N"/>
    </message>
    <message name="BusinessMessageReject" msgtype="j" msgcat="app">
      <field name="RefSeqNum" required="N"/><field name="RefMsgType" required="Y"/>
      <field name="BusinessRejectReason" required="Y"/><field name="Text" required="N"/>
    </message>
    <message name="NewOrderSingle" msgtype="D" msgcat="app">
      <field name="ClOrdID" required="Y"/>
      <component name="Parties" required="N"/>
      <field name="Side" required="Y"/>
      <field name="Symbol" required="Y"/>
      <field name="OrderQty" required="N"/>
    </message>
  </messages>
  <components>
    <component name="Parties">
      <group name="NoPartyIDs" required="N">
        <field name="PartyID" required="Y"/>
        <field name="PartyRole" required="N"/>
      </group>
    </component>
  </components>
  <fields>
    <field number="7" name="BeginSeqNo" type="SEQNUM"/>
    <field number="8" name="BeginString" type="STRING"/>
    <field number="9" name="BodyLength" type="LENGTH"/>
    <field number="10" name="CheckSum" type="STRING"/>
    <field number="11" name="ClOrdID" type="STRING"/>
    <field number="16" name="EndSeqNo" type="SEQNUM"/>
    <field number="34" name="MsgSeqNum" type="SEQNUM"/>
    <field number="35" name="MsgType" type="STRING"/>
    <field number="36" name="NewSeqNo" type="SEQNUM"/>
    <field number="38" name="OrderQty" type="QTY"/>
    <field number="43" name="PossDupFlag" type="BOOLEAN"/>
    <field number="45" name="RefSeqNum" type="SEQNUM"/>
    <field number="49" name="SenderCompID" type="STRING"/>
    <field number="52" name="SendingTime" type="UTCTIMESTAMP"/>
    <field number="54" name="Side" type="CHAR"><value enum="1" description="BUY"/><value enum="2" description="SELL"/></field>
    <field number="55" name="Symbol" type="STRING"/>
    <field number="56" name="TargetCompID" type="STRING"/>
    <field number="58" name="Text" type="STRING"/>
    <field number="97" name="PossResend" type="BOOLEAN"/>
    <field number="98" name="EncryptMethod" type="INT"><value enum="0" description="NONE"/></field>
    <field number="108" name="HeartBtInt" type="INT"/>
    <field number="112" name="TestReqID" type="STRING"/>
    <field number="122" name="OrigSendingTime" type="UTCTIMESTAMP"/>
    <field number="123" name="GapFillFlag" type="BOOLEAN"/>
    <field number="141" name="ResetSeqNumFlag" type="BOOLEAN"/>
    <field number="371" name="RefTagID" type="INT"/>
    <field number="372" name="RefMsgType" type="STRING"/>
    <field number="373" name="SessionRejectReason" type="INT"/>
    <field number="380" name="BusinessRejectReason" type="INT"/>
    <field number="448" name="PartyID" type="STRING"/>
    <field number="452" name="PartyRole" type="INT"/>
    <field number="453" name="NoPartyIDs" type="NUMINGROUP"/>
  </fields>
</fix>"#;

pub fn small_dictionary() -> Dictionary {
    Dictionary::from_xml(SMALL_FIX44_XML).expect("the test dictionary is valid")
}
