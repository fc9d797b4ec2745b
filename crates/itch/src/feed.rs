//! The publishing side, sans-I/O: events are projected, numbered, kept in the retransmission
//! window and packed into MoldUDP64 packets handed to a sender; retransmission requests are
//! answered from the window.

use crate::mold::{parse_request, PacketBuilder, Session, HEADER_BYTES};
use crate::msg::Message;
use crate::project::{Projection, ProjectionStats};
use crate::window::{Refusal, Window};
use bourse_core::{Event, Instrument};
use std::sync::{Arc, Mutex};

/// The limits of one feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedLimits {
    /// Largest UDP payload sent, live or retransmitted.
    pub packet_bytes_max: usize,
    /// Messages kept for retransmission.
    pub window_messages: usize,
    /// Retransmission requests answered per second (all requesters together); the rest are
    /// refused and counted.
    pub requests_per_s_max: u32,
    /// Longest a message waits for later ones to share its packet, in microseconds (the SBE
    /// feed's 1 ms channel does the same). 0: every entry's messages leave before the next
    /// entry is read, so light load sends about one message per packet.
    #[serde(default)]
    pub coalesce_us_max: u64,
}

impl Default for FeedLimits {
    fn default() -> FeedLimits {
        FeedLimits {
            packet_bytes_max: crate::mold::PACKET_BYTES_DEFAULT,
            window_messages: 1 << 20,
            requests_per_s_max: 1_000,
            coalesce_us_max: 0,
        }
    }
}

/// Why a retransmission request was not answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    Malformed,
    WrongSession,
    RateLimited,
    Refused(Refusal),
}

/// Requests answered and refused, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestStats {
    pub answered: u64,
    pub messages_resent: u64,
    pub malformed: u64,
    pub wrong_session: u64,
    pub rate_limited: u64,
    pub too_old: u64,
    pub not_yet_sent: u64,
    pub empty: u64,
}

impl RequestStats {
    pub fn count(&mut self, e: RequestError) {
        match e {
            RequestError::Malformed => self.malformed += 1,
            RequestError::WrongSession => self.wrong_session += 1,
            RequestError::RateLimited => self.rate_limited += 1,
            RequestError::Refused(Refusal::TooOld { .. }) => self.too_old += 1,
            RequestError::Refused(Refusal::NotYetSent { .. }) => self.not_yet_sent += 1,
            RequestError::Refused(Refusal::Empty) => self.empty += 1,
        }
    }
}

/// A window shared by the publisher and the request server.
pub type SharedWindow = Arc<Mutex<Window>>;

/// Projection, numbering and packing. See the module documentation.
pub struct Feed {
    projection: Projection,
    builder: PacketBuilder,
    window: SharedWindow,
    messages: Vec<Message>,
    encoded: Vec<u8>,
    packets_sent: u64,
    coalesce_ns: u64,
    /// When the open packet (coalescing) got its first message.
    open_since_ns: Option<u64>,
}

impl Feed {
    pub fn new(
        session: Session,
        limits: FeedLimits,
        default_price_scale: u8,
    ) -> Result<Feed, String> {
        if limits.window_messages == 0 {
            return Err("the retransmission window must keep at least one message".into());
        }
        Ok(Feed {
            projection: Projection::new(default_price_scale),
            builder: PacketBuilder::new(session, limits.packet_bytes_max)?,
            window: Arc::new(Mutex::new(Window::new(limits.window_messages))),
            messages: Vec::with_capacity(1024),
            encoded: Vec::with_capacity(64),
            packets_sent: 0,
            coalesce_ns: limits.coalesce_us_max.saturating_mul(1_000),
            open_since_ns: None,
        })
    }

    pub fn session(&self) -> Session {
        self.builder.session()
    }

    pub fn window(&self) -> SharedWindow {
        self.window.clone()
    }

    pub fn projection(&self) -> &Projection {
        &self.projection
    }

    pub fn stats(&self) -> ProjectionStats {
        self.projection.stats()
    }

    pub fn packets_sent(&self) -> u64 {
        self.packets_sent
    }

    /// The next sequence number.
    pub fn next_sequence(&self) -> u64 {
        self.window.lock().expect("window lock").next_sequence()
    }

    pub fn start(&mut self, ts_ns: u64, send: &mut dyn FnMut(&[u8])) {
        self.projection.start(ts_ns, &mut self.messages);
        self.flush(send);
    }

    pub fn define(&mut self, def: &Instrument, ts_ns: u64, send: &mut dyn FnMut(&[u8])) {
        self.projection.define(def, ts_ns, &mut self.messages);
        self.flush(send);
    }

    /// One committed entry's (or request's) events: their messages leave in as few packets
    /// as fit, before this returns.
    pub fn publish(&mut self, events: &[Event], send: &mut dyn FnMut(&[u8])) {
        self.projection.on_events(events, &mut self.messages);
        self.flush(send);
    }

    /// Whether this feed coalesces (`coalesce_us_max` above 0).
    pub fn coalescing(&self) -> bool {
        self.coalesce_ns > 0
    }

    /// One committed entry's events, coalesced (when `coalesce_us_max` is above 0): packets
    /// that fill leave now, the last one stays open for the next entries' messages until it
    /// fills or [`Feed::flush_due`] finds it has waited `coalesce_us_max`. Without coalescing
    /// this is [`Feed::publish`].
    pub fn publish_at(&mut self, events: &[Event], now_ns: u64, send: &mut dyn FnMut(&[u8])) {
        if !self.coalescing() {
            return self.publish(events, send);
        }
        self.projection.on_events(events, &mut self.messages);
        self.pack(send);
        if self.builder.is_empty() {
            self.open_since_ns = None;
        } else if self.open_since_ns.is_none() {
            self.open_since_ns = Some(now_ns);
        }
        self.flush_due(now_ns, send);
    }

    /// Sends the open packet if its first message has waited `coalesce_us_max` by `now_ns`.
    pub fn flush_due(&mut self, now_ns: u64, send: &mut dyn FnMut(&[u8])) {
        if let Some(since) = self.open_since_ns {
            if now_ns.saturating_sub(since) >= self.coalesce_ns {
                self.flush_open(send);
            }
        }
    }

    /// Sends the open packet, if any, now.
    pub fn flush_open(&mut self, send: &mut dyn FnMut(&[u8])) {
        self.open_since_ns = None;
        if let Some(p) = self.builder.take() {
            send(p);
            self.packets_sent += 1;
        }
    }

    /// End of Messages, then the end-of-session packet.
    pub fn end(&mut self, ts_ns: u64, send: &mut dyn FnMut(&[u8])) {
        self.projection.end(ts_ns, &mut self.messages);
        self.flush(send);
        self.end_of_session(send);
    }

    /// The end-of-session packet alone.
    pub fn end_of_session(&mut self, send: &mut dyn FnMut(&[u8])) {
        // What it announces as sent must have been.
        self.flush_open(send);
        let mut p = Vec::with_capacity(HEADER_BYTES);
        self.builder
            .empty_packet(self.next_sequence(), true, &mut p);
        send(&p);
    }

    /// A heartbeat: the next sequence number, no messages (an open packet leaves first, so
    /// the number announced was sent).
    pub fn heartbeat(&mut self, send: &mut dyn FnMut(&[u8])) {
        self.flush_open(send);
        let mut p = Vec::with_capacity(HEADER_BYTES);
        self.builder
            .empty_packet(self.next_sequence(), false, &mut p);
        send(&p);
    }

    /// Packs the pending messages, sending every packet that fills, then the last one.
    fn flush(&mut self, send: &mut dyn FnMut(&[u8])) {
        self.pack(send);
        self.flush_open(send);
    }

    /// Numbers the pending messages into the window and packs them, sending every packet
    /// that fills; the last one stays open.
    fn pack(&mut self, send: &mut dyn FnMut(&[u8])) {
        if self.messages.is_empty() {
            return;
        }
        let mut window = self.window.lock().expect("window lock");
        for m in self.messages.drain(..) {
            self.encoded.clear();
            m.encode(&mut self.encoded);
            if !self.builder.fits(self.encoded.len()) {
                if let Some(p) = self.builder.take() {
                    send(p);
                    self.packets_sent += 1;
                }
            }
            let seq = window.push(&self.encoded);
            self.builder.push(seq, &self.encoded);
        }
    }
}

/// Answers one retransmission request from `window`: a packet of `session` with the messages
/// asked for, as many as fit in `packet_bytes_max`, written to `out`.
pub fn answer_request(
    request: &[u8],
    session: Session,
    window: &Window,
    packet_bytes_max: usize,
    out: &mut Vec<u8>,
) -> Result<u16, RequestError> {
    let r = parse_request(request).map_err(|_| RequestError::Malformed)?;
    if r.session != session {
        return Err(RequestError::WrongSession);
    }
    let mut b =
        PacketBuilder::new(session, packet_bytes_max).map_err(|_| RequestError::Malformed)?;
    let given = window
        .read(r.sequence, r.count, |seq, m| {
            if !b.fits(m.len()) {
                return false;
            }
            b.push(seq, m);
            true
        })
        .map_err(RequestError::Refused)?;
    out.clear();
    out.extend_from_slice(b.take().unwrap_or_default());
    Ok(given)
}

/// A token bucket: at most `per_s` requests a second, in bursts of up to `per_s`.
#[derive(Debug)]
pub struct RateLimit {
    per_s: u32,
    tokens: u32,
    refilled_ns: u64,
}

impl RateLimit {
    pub fn new(per_s: u32) -> RateLimit {
        RateLimit {
            per_s,
            tokens: per_s,
            refilled_ns: 0,
        }
    }

    /// Whether one more request may be answered at `now_ns`.
    pub fn allow(&mut self, now_ns: u64) -> bool {
        let elapsed = now_ns.saturating_sub(self.refilled_ns);
        let new = (elapsed as u128 * u128::from(self.per_s) / 1_000_000_000) as u64;
        if new > 0 {
            self.tokens = (u64::from(self.tokens) + new).min(u64::from(self.per_s)) as u32;
            self.refilled_ns = now_ns;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::*;

    fn add(id: u64) -> Event {
        Event::OrderLog(OrderLog {
            rec: id,
            seq: id,
            action: OrderLogAction::New,
            status: OrderStatus::New,
            order_id: OrderId(id),
            instrument: InstrumentId(1),
            account: AccountId(1),
            firm: FirmId(1),
            cl_ord_id: ClOrdId(id),
            side: Side::Sell,
            price: Price(10_000 + id as i64),
            qty_display: Qty(10),
            qty_leaves: Qty(10),
            qty_filled: Qty(0),
            qty_total: Qty(10),
            ts_ns: 1,
        })
    }

    /// Message counts of the packets sent.
    fn counts(sent: &[Vec<u8>]) -> Vec<u16> {
        sent.iter()
            .map(|p| crate::mold::Packet::parse(p).unwrap().header.count)
            .collect()
    }

    #[test]
    fn coalescing_holds_messages_until_the_delay_or_a_full_packet_and_never_past_a_heartbeat() {
        let limits = FeedLimits {
            coalesce_us_max: 1_000,
            ..FeedLimits::default()
        };
        let mut feed = Feed::new(*b"C         ", limits, 4).unwrap();
        let mut sent: Vec<Vec<u8>> = Vec::new();
        let t0 = 1_000_000_000;
        // The first entry defines the stock (R) and adds an order (A); the second adds one.
        feed.publish_at(&[add(1)], t0, &mut |p| sent.push(p.to_vec()));
        feed.publish_at(&[add(2)], t0 + 500_000, &mut |p| sent.push(p.to_vec()));
        feed.flush_due(t0 + 999_999, &mut |p| sent.push(p.to_vec()));
        assert!(sent.is_empty(), "nothing waited 1 ms yet");
        feed.flush_due(t0 + 1_000_000, &mut |p| sent.push(p.to_vec()));
        assert_eq!(counts(&sent), vec![3], "one packet for both entries");
        // A heartbeat never announces a number not sent: the open packet goes first.
        sent.clear();
        feed.publish_at(&[add(3)], t0 + 2_000_000, &mut |p| sent.push(p.to_vec()));
        feed.heartbeat(&mut |p| sent.push(p.to_vec()));
        assert_eq!(counts(&sent), vec![1, 0]);
        let hb = crate::mold::Packet::parse(&sent[1]).unwrap().header;
        assert_eq!(hb.sequence, 5, "after R, A, A, A");
        // A packet that fills leaves at once; the rest waits.
        sent.clear();
        let many: Vec<Event> = (10..60).map(add).collect();
        feed.publish_at(&many, t0 + 3_000_000, &mut |p| sent.push(p.to_vec()));
        let full = (1_472 - crate::mold::HEADER_BYTES) / (2 + 36);
        assert_eq!(counts(&sent), vec![full as u16]);
        feed.flush_open(&mut |p| sent.push(p.to_vec()));
        assert_eq!(counts(&sent), vec![full as u16, (50 - full) as u16]);
        // Without the limit, every entry leaves at once.
        let mut plain = Feed::new(*b"P         ", FeedLimits::default(), 4).unwrap();
        let mut sent = Vec::new();
        plain.publish_at(&[add(1)], t0, &mut |p| sent.push(p.to_vec()));
        assert_eq!(counts(&sent), vec![2]);
    }

    #[test]
    fn the_rate_limit_allows_a_burst_then_refills_with_time() {
        let mut r = RateLimit::new(3);
        let t0 = 5_000_000_000;
        assert!((0..3).all(|_| r.allow(t0)));
        assert!(!r.allow(t0), "the fourth in the same instant is refused");
        assert!(
            r.allow(t0 + 340_000_000),
            "a third of a second gives one back"
        );
        assert!(!r.allow(t0 + 340_000_000));
        assert!(
            (0..3).all(|_| r.allow(t0 + 10_000_000_000)),
            "never more than the burst"
        );
        assert!(!r.allow(t0 + 10_000_000_000));
    }

    #[test]
    fn requests_are_answered_from_the_window_or_refused_by_reason() {
        let mut w = Window::new(4);
        for k in 1..=6u8 {
            w.push(&[k; 21]);
        }
        let s = *b"S         ";
        let request = |seq: u64, count: u16| {
            let mut r = Vec::new();
            crate::mold::PacketHeader {
                session: s,
                sequence: seq,
                count,
            }
            .encode(&mut r);
            r
        };
        let mut out = Vec::new();
        assert_eq!(answer_request(&request(4, 2), s, &w, 200, &mut out), Ok(2));
        let p = crate::mold::Packet::parse(&out).unwrap();
        let got: Vec<_> = p.messages().map(|(q, m)| (q, m.to_vec())).collect();
        assert_eq!(got, vec![(4, vec![4; 21]), (5, vec![5; 21])]);
        assert_eq!(
            answer_request(&request(2, 1), s, &w, 200, &mut out),
            Err(RequestError::Refused(Refusal::TooOld { oldest: 3 }))
        );
        assert_eq!(
            answer_request(&request(7, 1), s, &w, 200, &mut out),
            Err(RequestError::Refused(Refusal::NotYetSent { next: 7 }))
        );
        assert_eq!(
            answer_request(&request(4, 1), *b"OTHER     ", &w, 200, &mut out),
            Err(RequestError::WrongSession)
        );
        assert_eq!(
            answer_request(&[1, 2, 3], s, &w, 200, &mut out),
            Err(RequestError::Malformed)
        );
        // One packet per request: what does not fit is asked for again.
        let two_blocks = crate::mold::PACKET_BYTES_MIN;
        assert_eq!(
            answer_request(&request(3, 4), s, &w, two_blocks, &mut out),
            Ok(2)
        );
    }
}
