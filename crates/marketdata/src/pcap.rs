//! A classic pcap writer (the libpcap format tshark and Wireshark read), so a recorded feed can
//! be opened in the usual tools. Each datagram is wrapped in Ethernet, IPv4 and UDP headers
//! (link type 1), with a correct IPv4 header checksum and a zero (absent) UDP checksum; TCP
//! segments (for a capture of both directions of a conversation) likewise, with a zero TCP
//! checksum.

use std::io::{self, Write};
use std::net::SocketAddrV4;

/// Link type Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
const SNAPLEN_BYTES: u32 = 65_535;
const ETHERNET_BYTES: usize = 14;
const IPV4_BYTES: usize = 20;
const UDP_BYTES: usize = 8;
const TCP_BYTES: usize = 20;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Writes pcap records to any `Write`.
pub struct PcapWriter<W: Write> {
    out: W,
    ip_id: u16,
    pub packets: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header.
    pub fn new(mut out: W) -> io::Result<PcapWriter<W>> {
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?; // magic, microsecond timestamps
        out.write_all(&2u16.to_le_bytes())?; // version 2.4
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?; // thiszone
        out.write_all(&0u32.to_le_bytes())?; // sigfigs
        out.write_all(&SNAPLEN_BYTES.to_le_bytes())?;
        out.write_all(&LINKTYPE_ETHERNET.to_le_bytes())?;
        Ok(PcapWriter {
            out,
            ip_id: 0,
            packets: 0,
        })
    }

    /// Writes one UDP datagram from `src` to `dst` received at `ts_ns` (ns since the epoch).
    pub fn write_udp(
        &mut self,
        ts_ns: u64,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> io::Result<()> {
        let mut udp = [0u8; UDP_BYTES];
        udp[0..2].copy_from_slice(&src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        let udp_len = u16::try_from(UDP_BYTES + payload.len()).unwrap_or(u16::MAX);
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        self.write_ipv4(ts_ns, src, dst, IPPROTO_UDP, &udp, payload)
    }

    /// Writes one TCP segment (flags PSH and ACK, no options, a zero checksum) from `src` to
    /// `dst` at `ts_ns`. `seq` is the sequence number of the first payload byte and `ack` the
    /// next byte expected from the peer: a caller that keeps both running writes a stream
    /// tshark reassembles.
    pub fn write_tcp(
        &mut self,
        ts_ns: u64,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        seq: u32,
        ack: u32,
        payload: &[u8],
    ) -> io::Result<()> {
        let mut tcp = [0u8; TCP_BYTES];
        tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
        tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[8..12].copy_from_slice(&ack.to_be_bytes());
        tcp[12] = ((TCP_BYTES / 4) as u8) << 4;
        tcp[13] = 0x18; // PSH, ACK
        tcp[14..16].copy_from_slice(&u16::MAX.to_be_bytes()); // window
        self.write_ipv4(ts_ns, src, dst, IPPROTO_TCP, &tcp, payload)
    }

    fn write_ipv4(
        &mut self,
        ts_ns: u64,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        protocol: u8,
        l4_header: &[u8],
        payload: &[u8],
    ) -> io::Result<()> {
        let ip_len = IPV4_BYTES + l4_header.len() + payload.len();
        if ip_len > usize::from(u16::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "datagram too large",
            ));
        }
        let frame_len = ETHERNET_BYTES + ip_len;
        let mut h = [0u8; ETHERNET_BYTES + IPV4_BYTES];
        // Ethernet: a multicast-style destination MAC for multicast, else zeros; IPv4 type.
        let dst_ip = dst.ip().octets();
        if dst.ip().is_multicast() {
            h[0..6].copy_from_slice(&[0x01, 0x00, 0x5e, dst_ip[1] & 0x7f, dst_ip[2], dst_ip[3]]);
        }
        h[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut h[ETHERNET_BYTES..ETHERNET_BYTES + IPV4_BYTES];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&self.ip_id.to_be_bytes());
        self.ip_id = self.ip_id.wrapping_add(1);
        ip[6] = 0x40; // don't fragment
        ip[8] = 1; // TTL
        ip[9] = protocol;
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst_ip);
        let sum = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let ts_us = ts_ns / 1_000;
        self.out
            .write_all(&((ts_us / 1_000_000) as u32).to_le_bytes())?;
        self.out
            .write_all(&((ts_us % 1_000_000) as u32).to_le_bytes())?;
        self.out.write_all(&(frame_len as u32).to_le_bytes())?;
        self.out.write_all(&(frame_len as u32).to_le_bytes())?;
        self.out.write_all(&h)?;
        self.out.write_all(l4_header)?;
        self.out.write_all(payload)?;
        self.packets += 1;
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in header.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn records_have_the_classic_layout_and_a_valid_ip_checksum() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
        let b = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000);
        w.write_udp(1_500_000_000_123_456_789, a, b, b"hello")
            .unwrap();
        let bytes = w.into_inner();
        assert_eq!(bytes.len(), 24 + 16 + 14 + 20 + 8 + 5);
        assert_eq!(&bytes[0..4], &0xa1b2_c3d4u32.to_le_bytes());
        let ip = &bytes[24 + 16 + 14..24 + 16 + 14 + 20];
        assert_eq!(
            ipv4_checksum(ip),
            0,
            "a header with its checksum sums to zero"
        );
    }

    #[test]
    fn tcp_segments_carry_their_ports_sequence_and_payload() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
        let b = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000);
        w.write_tcp(1, a, b, 77, 5, b"8=FIX").unwrap();
        let bytes = w.into_inner();
        assert_eq!(bytes.len(), 24 + 16 + 14 + 20 + 20 + 5);
        let ip = &bytes[24 + 16 + 14..24 + 16 + 14 + 20];
        assert_eq!((ip[9], ipv4_checksum(ip)), (6, 0));
        let tcp = &bytes[24 + 16 + 14 + 20..24 + 16 + 14 + 40];
        assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), 2000);
        assert_eq!(u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]), 77);
        assert_eq!(&bytes[bytes.len() - 5..], b"8=FIX");
    }
}
