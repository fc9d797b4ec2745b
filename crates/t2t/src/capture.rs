//! Reading a capture: classic pcap files (the format `bourse md record` and tcpdump write) into
//! memory, as UDP datagrams with their addresses and times.
//!
//! The driver replays from memory, as the seed's driver does, so the whole file is read before
//! the first packet is sent. Records that are not IPv4/UDP (ARP, TCP, IPv6) are counted and
//! left out; a record cut short by the snap length keeps what was captured (the client must
//! then count it as truncated); a file that ends inside a record (a recorder killed while
//! writing) keeps every whole record and counts the torn tail. Anything else wrong with the
//! file is an error naming the byte offset.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Link types this reader understands.
const LINKTYPE_NULL: u32 = 0;
const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_IPV4: u32 = 228;

const GLOBAL_HEADER_BYTES: usize = 24;
const RECORD_HEADER_BYTES: usize = 16;
/// Largest record accepted: a capture of jumbo frames at most.
pub const RECORD_BYTES_MAX: usize = 262_144;

/// One UDP datagram of a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// Capture time, ns since the epoch.
    pub ts_ns: u64,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// The UDP payload as captured (shorter than the UDP length says when the capture's snap
    /// length cut it).
    pub payload: Vec<u8>,
}

/// A whole capture in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    pub datagrams: Vec<Datagram>,
    /// Records that were not IPv4/UDP, or whose IP/UDP headers were damaged.
    pub records_skipped: u64,
    /// Whether the file ended inside a record (the torn record is left out).
    pub torn_tail: bool,
}

/// Why a file is not a capture this reader can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureError {
    /// Shorter than the 24-byte global header.
    NoHeader {
        file_bytes: usize,
    },
    /// The first four bytes are not a pcap magic number (pcapng is not read).
    NotPcap {
        magic: u32,
    },
    UnsupportedLinkType {
        link_type: u32,
    },
    /// A record header announces more than [`RECORD_BYTES_MAX`] bytes.
    RecordTooLarge {
        offset: usize,
        record_bytes: usize,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::NoHeader { file_bytes } => {
                write!(f, "not a pcap file: {file_bytes} bytes, shorter than the 24-byte header")
            }
            CaptureError::NotPcap { magic } => write!(
                f,
                "not a classic pcap file: magic {magic:#010x} (pcapng is not read; convert with `editcap -F pcap`)"
            ),
            CaptureError::UnsupportedLinkType { link_type } => write!(
                f,
                "pcap link type {link_type} is not read (Ethernet, raw IPv4, Linux cooked and BSD loopback are)"
            ),
            CaptureError::RecordTooLarge {
                offset,
                record_bytes,
            } => write!(
                f,
                "pcap record at byte {offset} claims {record_bytes} bytes, more than {RECORD_BYTES_MAX}"
            ),
        }
    }
}

impl std::error::Error for CaptureError {}

/// Reads a capture file into memory.
pub fn read_pcap_file(path: &std::path::Path) -> Result<Capture, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    parse_pcap(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn u32_at(b: &[u8], at: usize, big_endian: bool) -> u32 {
    let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
    if big_endian {
        u32::from_be_bytes(w)
    } else {
        u32::from_le_bytes(w)
    }
}

/// Parses a classic pcap file held in memory.
pub fn parse_pcap(bytes: &[u8]) -> Result<Capture, CaptureError> {
    if bytes.len() < GLOBAL_HEADER_BYTES {
        return Err(CaptureError::NoHeader {
            file_bytes: bytes.len(),
        });
    }
    let magic_le = u32_at(bytes, 0, false);
    let (big_endian, nanos) = match magic_le {
        0xa1b2_c3d4 => (false, false),
        0xa1b2_3c4d => (false, true),
        0xd4c3_b2a1 => (true, false),
        0x4d3c_b2a1 => (true, true),
        magic => return Err(CaptureError::NotPcap { magic }),
    };
    let link_type = u32_at(bytes, 20, big_endian) & 0x0fff_ffff;
    if !matches!(
        link_type,
        LINKTYPE_NULL | LINKTYPE_ETHERNET | LINKTYPE_RAW | LINKTYPE_LINUX_SLL | LINKTYPE_IPV4
    ) {
        return Err(CaptureError::UnsupportedLinkType { link_type });
    }
    let mut capture = Capture::default();
    let mut at = GLOBAL_HEADER_BYTES;
    while at < bytes.len() {
        if bytes.len() - at < RECORD_HEADER_BYTES {
            capture.torn_tail = true;
            break;
        }
        let ts_s = u64::from(u32_at(bytes, at, big_endian));
        let ts_frac = u64::from(u32_at(bytes, at + 4, big_endian));
        let incl = u32_at(bytes, at + 8, big_endian) as usize;
        if incl > RECORD_BYTES_MAX {
            return Err(CaptureError::RecordTooLarge {
                offset: at,
                record_bytes: incl,
            });
        }
        let body_at = at + RECORD_HEADER_BYTES;
        let Some(frame) = bytes.get(body_at..body_at + incl) else {
            capture.torn_tail = true;
            break;
        };
        let ts_ns = ts_s * 1_000_000_000 + if nanos { ts_frac } else { ts_frac * 1_000 };
        match udp_of_frame(frame, link_type) {
            Some((src, dst, payload)) => capture.datagrams.push(Datagram {
                ts_ns,
                src,
                dst,
                payload: payload.to_vec(),
            }),
            None => capture.records_skipped += 1,
        }
        at = body_at + incl;
    }
    Ok(capture)
}

/// The IPv4 packet inside a link-layer frame.
fn ipv4_of_frame(frame: &[u8], link_type: u32) -> Option<&[u8]> {
    match link_type {
        LINKTYPE_ETHERNET => {
            let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
            let mut at = 14;
            // One or two VLAN tags (802.1Q, 802.1ad) may sit before the IP type.
            while ethertype == 0x8100 || ethertype == 0x88a8 {
                ethertype = u16::from_be_bytes([*frame.get(at + 2)?, *frame.get(at + 3)?]);
                at += 4;
            }
            (ethertype == 0x0800).then(|| frame.get(at..)).flatten()
        }
        LINKTYPE_LINUX_SLL => {
            let protocol = u16::from_be_bytes([*frame.get(14)?, *frame.get(15)?]);
            (protocol == 0x0800).then(|| frame.get(16..)).flatten()
        }
        LINKTYPE_NULL => {
            // The address family in the capturing host's byte order: 2 is AF_INET on every OS.
            let family = frame.get(..4)?;
            (family == [2, 0, 0, 0] || family == [0, 0, 0, 2])
                .then(|| frame.get(4..))
                .flatten()
        }
        _ => Some(frame),
    }
}

/// The addresses and payload of a UDP datagram in a frame, or `None` when the frame holds
/// something else or its headers do not add up.
fn udp_of_frame(frame: &[u8], link_type: u32) -> Option<(SocketAddrV4, SocketAddrV4, &[u8])> {
    let ip = ipv4_of_frame(frame, link_type)?;
    let version_ihl = *ip.first()?;
    if version_ihl >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < 20 || *ip.get(9)? != 17 {
        return None;
    }
    // A fragment other than the first carries no UDP header.
    let fragment = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
    if fragment & 0x1fff != 0 {
        return None;
    }
    let src_ip = Ipv4Addr::new(*ip.get(12)?, ip[13], ip[14], ip[15]);
    let dst_ip = Ipv4Addr::new(*ip.get(16)?, ip[17], ip[18], ip[19]);
    let udp = ip.get(ihl..)?;
    let src_port = u16::from_be_bytes([*udp.first()?, *udp.get(1)?]);
    let dst_port = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    let udp_len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    if udp_len < 8 {
        return None;
    }
    // What was captured of the payload: up to the UDP length, less if the snap length cut it.
    let end = udp_len.min(udp.len());
    let payload = udp.get(8..end.max(8))?;
    Some((
        SocketAddrV4::new(src_ip, src_port),
        SocketAddrV4::new(dst_ip, dst_port),
        payload,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_marketdata::pcap::PcapWriter;
    use proptest::prelude::*;

    fn addr(port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)
    }

    #[test]
    fn what_the_marketdata_writer_writes_reads_back() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_udp(1_700_000_000_123_456_000, addr(1), addr(31400), b"abc")
            .unwrap();
        w.write_udp(1_700_000_000_123_457_000, addr(2), addr(31401), b"")
            .unwrap();
        let c = parse_pcap(&w.into_inner()).unwrap();
        assert_eq!(c.datagrams.len(), 2);
        assert_eq!(c.datagrams[0].payload, b"abc");
        assert_eq!(c.datagrams[0].dst, addr(31400));
        assert_eq!(c.datagrams[0].ts_ns, 1_700_000_000_123_456_000);
        assert_eq!(c.datagrams[1].src, addr(2));
        assert!(c.datagrams[1].payload.is_empty());
        assert!(!c.torn_tail);
    }

    #[test]
    fn a_torn_last_record_is_counted_and_the_rest_kept() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_udp(1, addr(1), addr(2), b"first").unwrap();
        w.write_udp(2, addr(1), addr(2), b"second").unwrap();
        let mut bytes = w.into_inner();
        bytes.truncate(bytes.len() - 3);
        let c = parse_pcap(&bytes).unwrap();
        assert_eq!(c.datagrams.len(), 1);
        assert!(c.torn_tail);
    }

    #[test]
    fn other_formats_are_refused_by_name() {
        assert_eq!(
            parse_pcap(&[0u8; 10]),
            Err(CaptureError::NoHeader { file_bytes: 10 })
        );
        let mut ng = vec![0x0a, 0x0d, 0x0d, 0x0a];
        ng.resize(40, 0);
        assert!(matches!(
            parse_pcap(&ng),
            Err(CaptureError::NotPcap { magic: 0x0a0d_0d0a })
        ));
    }

    proptest! {
        #[test]
        fn datagrams_round_trip_through_writer_and_reader(
            records in proptest::collection::vec(
                (any::<u32>(), any::<u16>(), any::<u16>(), proptest::collection::vec(any::<u8>(), 0..1500)),
                0..20,
            )
        ) {
            let mut w = PcapWriter::new(Vec::new()).unwrap();
            for (ts_us, sp, dp, payload) in &records {
                w.write_udp(u64::from(*ts_us) * 1_000, addr(*sp), addr(*dp), payload).unwrap();
            }
            let c = parse_pcap(&w.into_inner()).unwrap();
            prop_assert_eq!(c.datagrams.len(), records.len());
            for (d, (ts_us, sp, dp, payload)) in c.datagrams.iter().zip(&records) {
                prop_assert_eq!(d.ts_ns, u64::from(*ts_us) * 1_000);
                prop_assert_eq!(d.src, addr(*sp));
                prop_assert_eq!(d.dst, addr(*dp));
                prop_assert_eq!(&d.payload, payload);
            }
        }

        #[test]
        fn any_bytes_after_a_valid_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut bytes = PcapWriter::new(Vec::new()).unwrap().into_inner();
            bytes.extend_from_slice(&tail);
            let _ = parse_pcap(&bytes);
        }

        #[test]
        fn any_bytes_at_all_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_pcap(&bytes);
        }
    }
}
