//! A classic pcap writer (the libpcap format tshark and Wireshark read), so a recorded feed can
//! be opened in the usual tools. Each datagram is wrapped in Ethernet, IPv4 and UDP headers
//! (link type 1), with a correct IPv4 header checksum and a zero (absent) UDP checksum.

use std::io::{self, Write};
use std::net::SocketAddrV4;

/// Link type Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
const SNAPLEN_BYTES: u32 = 65_535;
const ETHERNET_BYTES: usize = 14;
const IPV4_BYTES: usize = 20;
const UDP_BYTES: usize = 8;

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
        let udp_len = UDP_BYTES + payload.len();
        let ip_len = IPV4_BYTES + udp_len;
        if ip_len > usize::from(u16::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "datagram too large",
            ));
        }
        let frame_len = ETHERNET_BYTES + ip_len;
        let mut h = [0u8; ETHERNET_BYTES + IPV4_BYTES + UDP_BYTES];
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
        ip[9] = 17; // UDP
        ip[12..16].copy_from_slice(&src.ip().octets());
        ip[16..20].copy_from_slice(&dst_ip);
        let sum = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        let udp = &mut h[ETHERNET_BYTES + IPV4_BYTES..];
        udp[0..2].copy_from_slice(&src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        let ts_us = ts_ns / 1_000;
        self.out
            .write_all(&((ts_us / 1_000_000) as u32).to_le_bytes())?;
        self.out
            .write_all(&((ts_us % 1_000_000) as u32).to_le_bytes())?;
        self.out.write_all(&(frame_len as u32).to_le_bytes())?;
        self.out.write_all(&(frame_len as u32).to_le_bytes())?;
        self.out.write_all(&h)?;
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
}
