//! The PROXY protocol header (HAProxy's spec, versions 1 and 2:
//! <https://www.haproxy.org/download/2.8/doc/proxy-protocol.txt>), read from the start of an
//! accepted connection before TLS or HTTP.
//!
//! A load balancer that terminates TCP (AWS NLB, HAProxy in `mode tcp`) hides the client's
//! address: the gateway's peer is the balancer. The balancer prepends one header telling the
//! original addresses. It is trusted only because the listener is configured for it, so the
//! header is required there, parsed strictly, and anything else closes the connection.
//!
//! The split: a sync core (`parse_v1`, `parse_v2`) decides what a complete header means;
//! [`read_header`] only frames it off the stream, never reading past its last byte, so the TLS
//! ClientHello or HTTP request behind it reaches its own parser intact.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// What the PROXY header said about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxied {
    /// A proxied TCP connection over IPv4/IPv6: the original client's address.
    Client(SocketAddr),
    /// `PROXY UNKNOWN` (v1), the LOCAL command (v2, health checks), or a v2 family other than
    /// TCP over IPv4/IPv6 (UDP, UNIX): the connection's own peer stands.
    Local,
}

/// Why no PROXY header was read. Every one means the caller closes the connection: the bytes
/// already consumed are gone, and a listener configured for PROXY requires the header.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Reading failed, or the peer closed before the header was complete (`UnexpectedEof`;
    /// the message tells whether any byte had arrived, since balancers' TCP health checks
    /// often connect and close without sending anything).
    #[error("reading the PROXY header: {0}")]
    Io(std::io::Error),
    /// The whole header did not arrive within the caller's timeout.
    #[error("the PROXY header did not arrive in time")]
    Timeout,
    /// The bytes are not a PROXY header the spec allows.
    #[error("invalid PROXY header: {0}")]
    Invalid(&'static str),
}

/// The longest v1 line, CRLF included (spec 2.1: `PROXY UNKNOWN` with two full-length IPv6
/// addresses and two 5-digit ports).
pub const V1_MAX_LINE: usize = 107;

/// The most v2 address and TLV bytes accepted after the 16-byte fixed header. The spec allows
/// up to 65535, but the address blocks take at most 216 bytes and what real senders add as
/// TLVs (AWS NLB's VPC endpoint id, HAProxy's ALPN, authority, unique id, SSL details) stays
/// well under 1 KiB; 4 KiB leaves room for that and bounds what an unauthenticated peer can
/// make the gateway buffer per connection.
pub const V2_MAX_LEN: usize = 4096;

/// v1 starts with this (spec 2.1).
const V1_SIG: &[u8; 6] = b"PROXY ";

/// v2 starts with this 12-byte signature (spec 2.2); it cannot begin any HTTP request or TLS
/// record, nor a v1 line.
const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// The refusal of a connection that starts with neither signature: most often a listener
/// configured for PROXY behind a balancer that does not send it.
const NOT_PROXY: &str =
    "the connection does not start with a PROXY header (is the load balancer configured to send one?)";

/// Read exactly the PROXY header (v1 or v2, told apart by the first bytes) and nothing more, so the
/// bytes after it (TLS ClientHello or HTTP request) stay unread in the stream.
///
/// The whole read, not each byte, is bounded by `timeout`: a peer that trickles the header
/// must not hold the connection open longer than that.
pub async fn read_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
) -> Result<Proxied, ProxyError> {
    tokio::time::timeout(timeout, read_any(stream))
        .await
        .unwrap_or(Err(ProxyError::Timeout))
}

/// Tell v1 from v2 by the first byte (`P` or CR), so a connection that sends neither (plain
/// HTTP, a TLS ClientHello) is refused at once instead of waiting for more bytes.
async fn read_any<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Proxied, ProxyError> {
    let mut first = [0u8; 1];
    fill(stream, &mut first, Progress::Nothing).await?;
    match first[0] {
        b'P' => read_v1(stream).await,
        b'\r' => read_v2(stream).await,
        _ => Err(ProxyError::Invalid(NOT_PROXY)),
    }
}

/// Frame a v1 line (its `P` already read) and parse it.
///
/// Never reads past the CRLF: the line ends at its first LF, so until then, if the last byte
/// read is not CR, at least two more bytes (the CRLF) belong to the line and are read together;
/// after a CR only one is. That halves the reads of byte-by-byte without a buffer that could
/// swallow the request behind the header. (Only a malformed line, with a bare LF, may lose the
/// byte after it; it is refused anyway.)
async fn read_v1<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Proxied, ProxyError> {
    let mut line = [0u8; V1_MAX_LINE];
    line[0] = b'P';
    // The shortest line, `PROXY UNKNOWN\r\n`, is 15 bytes: the signature's other 5 are inside.
    fill(stream, &mut line[1..V1_SIG.len()], Progress::Started).await?;
    if &line[..V1_SIG.len()] != V1_SIG {
        return Err(ProxyError::Invalid(NOT_PROXY));
    }
    let mut n = V1_SIG.len();
    loop {
        let step = if line[n - 1] == b'\r' { 1 } else { 2 };
        if n + step > V1_MAX_LINE {
            return Err(ProxyError::Invalid(
                "v1 line longer than 107 bytes without CRLF",
            ));
        }
        fill(stream, &mut line[n..n + step], Progress::Started).await?;
        let start = n;
        n += step;
        if let Some(i) = (start..n).find(|&i| line[i] == b'\n') {
            // A properly ended line has its LF as the last byte read (see above).
            if line[i - 1] != b'\r' {
                return Err(ProxyError::Invalid("v1 line ends with LF, not CRLF"));
            }
            debug_assert_eq!(i + 1, n);
            return parse_v1(&line[..n]);
        }
    }
}

/// Frame a v2 header (its first byte already read): the 16-byte fixed part, then exactly the
/// length it announces. The fixed part is validated before the rest is read, so a bad header
/// is refused without waiting for (or buffering) a body it announces.
async fn read_v2<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Proxied, ProxyError> {
    let mut header = [0u8; 16];
    header[0] = b'\r';
    // Every v2 header is at least these 16 bytes.
    fill(stream, &mut header[1..], Progress::Started).await?;
    let len = v2_len(&header)?;
    let mut body = vec![0u8; len];
    fill(stream, &mut body, Progress::Started).await?;
    parse_v2(&header, &body)
}

/// How far the header had come when the peer closed: nothing at all is likely a health check
/// or a port scan, a part is a broken sender.
#[derive(Clone, Copy)]
enum Progress {
    Nothing,
    Started,
}

/// `read_exact`, with an end of stream told as such (std's message, "failed to fill whole
/// buffer", does not say what was being read).
async fn fill<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
    progress: Progress,
) -> Result<(), ProxyError> {
    match stream.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            let msg = match progress {
                Progress::Nothing => "connection closed before sending anything",
                Progress::Started => "connection closed in the middle of the header",
            };
            Err(ProxyError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                msg,
            )))
        }
        Err(e) => Err(ProxyError::Io(e)),
    }
}

/// Parse one complete v1 line, CRLF included (spec 2.1):
/// `PROXY TCP4|TCP6 <src addr> <dst addr> <src port> <dst port>\r\n`, fields separated by
/// exactly one space, or `PROXY UNKNOWN` followed by anything up to the CRLF.
///
/// Strict where the spec is: the header is the only proof of the client's address, so a line
/// a lenient parser would guess at (extra spaces, `+80`, `080`, a hostname) is refused.
pub(crate) fn parse_v1(line: &[u8]) -> Result<Proxied, ProxyError> {
    if line.len() > V1_MAX_LINE {
        return Err(ProxyError::Invalid("v1 line longer than 107 bytes"));
    }
    let Some(rest) = line.strip_prefix(V1_SIG) else {
        return Err(ProxyError::Invalid("v1 line does not start with `PROXY `"));
    };
    let Some(rest) = rest.strip_suffix(b"\r\n") else {
        return Err(ProxyError::Invalid("v1 line does not end with CRLF"));
    };
    if rest.contains(&b'\n') {
        return Err(ProxyError::Invalid("v1 line ends with LF, not CRLF"));
    }
    // `UNKNOWN` is for a sender that cannot tell the addresses; the rest is to be ignored.
    if rest == b"UNKNOWN" || rest.starts_with(b"UNKNOWN ") {
        return Ok(Proxied::Local);
    }
    if rest.is_empty() {
        return Err(ProxyError::Invalid("v1 line has no protocol"));
    }
    let fields: Vec<&[u8]> = rest.split(|&b| b == b' ').collect();
    if fields.iter().any(|f| f.is_empty()) {
        return Err(ProxyError::Invalid(
            "v1 fields must be separated by exactly one space",
        ));
    }
    let [proto, src, dst, src_port, dst_port] = fields[..] else {
        return Err(ProxyError::Invalid(
            "v1 line must have a protocol, two addresses and two ports",
        ));
    };
    let (src, _dst): (IpAddr, IpAddr) = match proto {
        b"TCP4" => (
            v1_addr::<Ipv4Addr>(src, "v1 TCP4 source is not an IPv4 address")?.into(),
            v1_addr::<Ipv4Addr>(dst, "v1 TCP4 destination is not an IPv4 address")?.into(),
        ),
        b"TCP6" => (
            v1_addr::<Ipv6Addr>(src, "v1 TCP6 source is not an IPv6 address")?.into(),
            v1_addr::<Ipv6Addr>(dst, "v1 TCP6 destination is not an IPv6 address")?.into(),
        ),
        _ => {
            return Err(ProxyError::Invalid(
                "v1 protocol must be TCP4, TCP6 or UNKNOWN",
            ))
        }
    };
    let src_port = v1_port(src_port)?;
    v1_port(dst_port)?;
    Ok(Proxied::Client(SocketAddr::new(src, src_port)))
}

/// An address in standard text form; std's parsers are strict (dotted quad without leading
/// zeros, RFC 4291 IPv6 without a zone), and the type decides the family.
fn v1_addr<A: std::str::FromStr>(field: &[u8], err: &'static str) -> Result<A, ProxyError> {
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid(err))
}

/// A port: decimal digits only (std's parser would take a `+`), no leading zero unless it is
/// `0` itself, at most 65535.
fn v1_port(field: &[u8]) -> Result<u16, ProxyError> {
    if !field.iter().all(u8::is_ascii_digit) {
        return Err(ProxyError::Invalid("v1 port is not a decimal number"));
    }
    if field.len() > 1 && field[0] == b'0' {
        return Err(ProxyError::Invalid("v1 port has a leading zero"));
    }
    std::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProxyError::Invalid("v1 port is above 65535"))
}

/// Validate a v2 fixed header (spec 2.2) and return how many bytes follow it: signature,
/// version 2, command LOCAL or PROXY, length within [`V2_MAX_LEN`]. The spec tells receivers
/// to drop connections with any other version or command.
fn v2_len(header: &[u8; 16]) -> Result<usize, ProxyError> {
    if &header[..12] != V2_SIG {
        return Err(ProxyError::Invalid("v2 signature mismatch"));
    }
    if header[12] >> 4 != 2 {
        return Err(ProxyError::Invalid("v2 version is not 2"));
    }
    if header[12] & 0x0F > 1 {
        return Err(ProxyError::Invalid("v2 command is neither LOCAL nor PROXY"));
    }
    let len = usize::from(u16::from_be_bytes([header[14], header[15]]));
    if len > V2_MAX_LEN {
        return Err(ProxyError::Invalid(
            "v2 length above 4096 bytes (the most this gateway accepts)",
        ));
    }
    Ok(len)
}

/// Parse a v2 header: the 16-byte fixed part and the `len` bytes after it (spec 2.2).
///
/// LOCAL (the balancer's own health checks) ignores the family entirely, as the spec says.
/// PROXY over TCP/IPv4 or TCP/IPv6 gives the source address and port; the other defined
/// families (UNSPEC, UDP, UNIX, and combinations the spec does not list) fall back to the
/// connection's own peer, which the spec allows. A family or transport nibble the spec does
/// not define is refused, as it says. TLVs after the addresses are skipped: nothing here needs
/// them.
pub(crate) fn parse_v2(header16: &[u8; 16], body: &[u8]) -> Result<Proxied, ProxyError> {
    let len = v2_len(header16)?;
    if body.len() != len {
        return Err(ProxyError::Invalid(
            "v2 body length differs from the header's",
        ));
    }
    if header16[12] & 0x0F == 0 {
        return Ok(Proxied::Local);
    }
    let family = header16[13] >> 4;
    let transport = header16[13] & 0x0F;
    if family > 3 {
        return Err(ProxyError::Invalid("v2 address family is undefined"));
    }
    if transport > 2 {
        return Err(ProxyError::Invalid("v2 transport protocol is undefined"));
    }
    match header16[13] {
        // TCP over IPv4: src addr (4), dst addr (4), src port (2), dst port (2).
        0x11 => {
            let Some(a) = body.first_chunk::<12>() else {
                return Err(ProxyError::Invalid(
                    "v2 length too short for TCP over IPv4 addresses (12 bytes)",
                ));
            };
            let ip = Ipv4Addr::from([a[0], a[1], a[2], a[3]]);
            let port = u16::from_be_bytes([a[8], a[9]]);
            Ok(Proxied::Client(SocketAddr::new(ip.into(), port)))
        }
        // TCP over IPv6: src addr (16), dst addr (16), src port (2), dst port (2).
        0x21 => {
            let Some(a) = body.first_chunk::<36>() else {
                return Err(ProxyError::Invalid(
                    "v2 length too short for TCP over IPv6 addresses (36 bytes)",
                ));
            };
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&a[..16]);
            let port = u16::from_be_bytes([a[32], a[33]]);
            Ok(Proxied::Client(SocketAddr::new(
                Ipv6Addr::from(ip).into(),
                port,
            )))
        }
        _ => Ok(Proxied::Local),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use tokio::io::AsyncWriteExt;

    const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n";
    /// The start of a TLS record carrying a ClientHello: what follows the header on a TLS
    /// listener.
    const CLIENT_HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];
    const T: Duration = Duration::from_secs(5);

    fn sa(s: &str) -> Proxied {
        Proxied::Client(s.parse().unwrap())
    }

    fn invalid(r: Result<Proxied, ProxyError>) -> &'static str {
        match r {
            Err(ProxyError::Invalid(m)) => m,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn eof(r: Result<Proxied, ProxyError>) -> String {
        match r {
            Err(ProxyError::Io(e)) if e.kind() == ErrorKind::UnexpectedEof => e.to_string(),
            other => panic!("expected Io(UnexpectedEof), got {other:?}"),
        }
    }

    /// A v2 header: signature, version/command byte, family byte, big-endian length, body.
    fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIG.to_vec();
        h.push(ver_cmd);
        h.push(fam);
        h.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    fn parse_v2_bytes(h: &[u8]) -> Result<Proxied, ProxyError> {
        let header: &[u8; 16] = h[..16].try_into().unwrap();
        parse_v2(header, &h[16..])
    }

    /// 192.0.2.1:56324 -> 198.51.100.7:443.
    const V4_ADDRS: [u8; 12] = [192, 0, 2, 1, 198, 51, 100, 7, 0xdc, 0x04, 0x01, 0xbb];

    /// [2001:db8::1]:56324 -> [2001:db8::2]:443.
    fn v6_addrs() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        b.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        b.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        b
    }

    /// Two TLVs (spec 2.2.x): AWS's VPC endpoint id (0xEA) and a NOOP (0x04).
    const TLVS: &[u8] = b"\xea\x00\x16\x01vpce-08d2bf15fbd6e1ec\x04\x00\x02\x00\x00";

    // ---- spec 2.1: v1, valid ----

    #[test]
    fn v1_tcp4() {
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n");
        assert_eq!(r.unwrap(), sa("192.0.2.1:56324"));
    }

    #[test]
    fn v1_tcp6() {
        let r = parse_v1(b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n");
        assert_eq!(r.unwrap(), sa("[2001:db8::1]:56324"));
    }

    #[test]
    fn v1_tcp6_longest_addresses() {
        let line = b"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff \
                     ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        let r = parse_v1(line).unwrap();
        assert_eq!(r, sa("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"));
    }

    #[test]
    fn v1_tcp6_ipv4_mapped_stays_v6() {
        let r = parse_v1(b"PROXY TCP6 ::ffff:192.0.2.1 ::1 1 2\r\n");
        assert_eq!(r.unwrap(), sa("[::ffff:192.0.2.1]:1"));
    }

    #[test]
    fn v1_port_bounds() {
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 0 65535\r\n");
        assert_eq!(r.unwrap(), sa("192.0.2.1:0"));
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 65535 0\r\n");
        assert_eq!(r.unwrap(), sa("192.0.2.1:65535"));
    }

    #[test]
    fn v1_unknown_bare() {
        assert_eq!(parse_v1(b"PROXY UNKNOWN\r\n").unwrap(), Proxied::Local);
    }

    #[test]
    fn v1_unknown_with_anything() {
        // Spec 2.1: after UNKNOWN the receiver ignores everything up to the CRLF.
        for line in [
            &b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"[..],
            b"PROXY UNKNOWN  double  spaces and junk \x01\xff\r\n",
            b"PROXY UNKNOWN \r\n",
        ] {
            assert_eq!(parse_v1(line).unwrap(), Proxied::Local, "{line:?}");
        }
    }

    #[test]
    fn v1_unknown_at_the_107_byte_limit() {
        // The spec's worst case: 107 bytes with the CRLF.
        let line = b"PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff \
                     ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
        assert_eq!(line.len(), V1_MAX_LINE);
        assert_eq!(parse_v1(line).unwrap(), Proxied::Local);
    }

    // ---- spec 2.1: v1, malformed ----

    #[test]
    fn v1_double_spaces() {
        for line in [
            &b"PROXY  TCP4 192.0.2.1 198.51.100.7 1 2\r\n"[..],
            b"PROXY TCP4  192.0.2.1 198.51.100.7 1 2\r\n",
            b"PROXY TCP4 192.0.2.1  198.51.100.7 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.7  1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1  2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2 \r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2  \r\n",
        ] {
            assert_eq!(
                invalid(parse_v1(line)),
                "v1 fields must be separated by exactly one space",
                "{line:?}"
            );
        }
    }

    #[test]
    fn v1_other_separators() {
        for line in [
            &b"PROXY TCP4\t192.0.2.1 198.51.100.7 1 2\r\n"[..],
            b"PROXY\tTCP4 192.0.2.1 198.51.100.7 1 2\r\n",
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\r\r\n",
        ] {
            invalid(parse_v1(line));
        }
    }

    #[test]
    fn v1_missing_crlf() {
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2");
        assert_eq!(invalid(r), "v1 line does not end with CRLF");
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\r");
        assert_eq!(invalid(r), "v1 line does not end with CRLF");
    }

    #[test]
    fn v1_lf_only() {
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\n");
        assert_eq!(invalid(r), "v1 line does not end with CRLF");
        let r = parse_v1(b"PROXY UNKNOWN\nx\r\n");
        assert_eq!(invalid(r), "v1 line ends with LF, not CRLF");
    }

    #[test]
    fn v1_too_long() {
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LINE - 1, b'x');
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), 108);
        assert_eq!(invalid(parse_v1(&line)), "v1 line longer than 107 bytes");
    }

    #[test]
    fn v1_bad_signature() {
        for line in [
            &b"proxy TCP4 192.0.2.1 198.51.100.7 1 2\r\n"[..],
            b"PROXY\r\n",
            b"PROXYTCP4 192.0.2.1 198.51.100.7 1 2\r\n",
            b"GET / HTTP/1.1\r\n",
        ] {
            assert_eq!(
                invalid(parse_v1(line)),
                "v1 line does not start with `PROXY `"
            );
        }
    }

    #[test]
    fn v1_bad_protocol() {
        for line in [
            &b"PROXY TCP5 192.0.2.1 198.51.100.7 1 2\r\n"[..],
            b"PROXY tcp4 192.0.2.1 198.51.100.7 1 2\r\n",
            b"PROXY UDP4 192.0.2.1 198.51.100.7 1 2\r\n",
            b"PROXY UNKNOWNX 192.0.2.1 198.51.100.7 1 2\r\n",
        ] {
            assert_eq!(
                invalid(parse_v1(line)),
                "v1 protocol must be TCP4, TCP6 or UNKNOWN",
                "{line:?}"
            );
        }
        // UNKNOWN glued to more text is not UNKNOWN.
        let r = parse_v1(b"PROXY UNKNOWNX\r\n");
        assert_eq!(
            invalid(r),
            "v1 line must have a protocol, two addresses and two ports"
        );
        assert_eq!(invalid(parse_v1(b"PROXY \r\n")), "v1 line has no protocol");
    }

    #[test]
    fn v1_wrong_field_count() {
        for line in [
            &b"PROXY TCP4 192.0.2.1 198.51.100.7 1\r\n"[..],
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2 3\r\n",
            b"PROXY TCP4\r\n",
        ] {
            assert_eq!(
                invalid(parse_v1(line)),
                "v1 line must have a protocol, two addresses and two ports",
                "{line:?}"
            );
        }
    }

    #[test]
    fn v1_bad_address() {
        for (line, msg) in [
            (
                &b"PROXY TCP4 192.0.2.256 198.51.100.7 1 2\r\n"[..],
                "v1 TCP4 source is not an IPv4 address",
            ),
            (
                b"PROXY TCP4 192.0.2 198.51.100.7 1 2\r\n",
                "v1 TCP4 source is not an IPv4 address",
            ),
            (
                b"PROXY TCP4 192.0.2.01 198.51.100.7 1 2\r\n",
                "v1 TCP4 source is not an IPv4 address",
            ),
            (
                b"PROXY TCP4 localhost 198.51.100.7 1 2\r\n",
                "v1 TCP4 source is not an IPv4 address",
            ),
            (
                b"PROXY TCP4 192.0.2.1 198.51.100.x 1 2\r\n",
                "v1 TCP4 destination is not an IPv4 address",
            ),
            (
                b"PROXY TCP6 2001:db8:::1 ::1 1 2\r\n",
                "v1 TCP6 source is not an IPv6 address",
            ),
            (
                b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",
                "v1 TCP6 source is not an IPv6 address",
            ),
            (
                b"PROXY TCP6 [::1] ::1 1 2\r\n",
                "v1 TCP6 source is not an IPv6 address",
            ),
            (
                b"PROXY TCP6 ::1 \xff::1 1 2\r\n",
                "v1 TCP6 destination is not an IPv6 address",
            ),
        ] {
            assert_eq!(invalid(parse_v1(line)), msg, "{line:?}");
        }
    }

    #[test]
    fn v1_family_mismatch() {
        let r = parse_v1(b"PROXY TCP4 2001:db8::1 198.51.100.7 1 2\r\n");
        assert_eq!(invalid(r), "v1 TCP4 source is not an IPv4 address");
        let r = parse_v1(b"PROXY TCP4 192.0.2.1 ::1 1 2\r\n");
        assert_eq!(invalid(r), "v1 TCP4 destination is not an IPv4 address");
        let r = parse_v1(b"PROXY TCP6 192.0.2.1 ::1 1 2\r\n");
        assert_eq!(invalid(r), "v1 TCP6 source is not an IPv6 address");
        let r = parse_v1(b"PROXY TCP6 ::1 198.51.100.7 1 2\r\n");
        assert_eq!(invalid(r), "v1 TCP6 destination is not an IPv6 address");
    }

    #[test]
    fn v1_bad_ports() {
        for (port, msg) in [
            ("65536", "v1 port is above 65535"),
            ("99999999999", "v1 port is above 65535"),
            ("080", "v1 port has a leading zero"),
            ("00", "v1 port has a leading zero"),
            ("-1", "v1 port is not a decimal number"),
            ("+80", "v1 port is not a decimal number"),
            ("8o", "v1 port is not a decimal number"),
            ("0x50", "v1 port is not a decimal number"),
            ("８０", "v1 port is not a decimal number"),
        ] {
            let src = format!("PROXY TCP4 192.0.2.1 198.51.100.7 {port} 443\r\n");
            assert_eq!(invalid(parse_v1(src.as_bytes())), msg, "source {port}");
            let dst = format!("PROXY TCP4 192.0.2.1 198.51.100.7 443 {port}\r\n");
            assert_eq!(invalid(parse_v1(dst.as_bytes())), msg, "destination {port}");
        }
    }

    // ---- spec 2.2: v2, valid ----

    #[test]
    fn v2_tcp4() {
        let h = v2(0x21, 0x11, &V4_ADDRS);
        assert_eq!(parse_v2_bytes(&h).unwrap(), sa("192.0.2.1:56324"));
    }

    #[test]
    fn v2_tcp4_with_tlvs() {
        let body = [&V4_ADDRS[..], TLVS].concat();
        let h = v2(0x21, 0x11, &body);
        assert_eq!(parse_v2_bytes(&h).unwrap(), sa("192.0.2.1:56324"));
    }

    #[test]
    fn v2_tcp6() {
        let h = v2(0x21, 0x21, &v6_addrs());
        assert_eq!(parse_v2_bytes(&h).unwrap(), sa("[2001:db8::1]:56324"));
    }

    #[test]
    fn v2_tcp6_with_tlvs() {
        let body = [&v6_addrs()[..], TLVS].concat();
        let h = v2(0x21, 0x21, &body);
        assert_eq!(parse_v2_bytes(&h).unwrap(), sa("[2001:db8::1]:56324"));
    }

    #[test]
    fn v2_local() {
        // Spec 2.2: LOCAL discards the block, family included.
        for (fam, body) in [
            (0x00, &[][..]),
            (0x11, &V4_ADDRS[..]),
            (0x11, &[][..]),
            (0xff, b"anything"),
        ] {
            let h = v2(0x20, fam, body);
            assert_eq!(parse_v2_bytes(&h).unwrap(), Proxied::Local, "{fam:#x}");
        }
    }

    #[test]
    fn v2_unspec() {
        assert_eq!(
            parse_v2_bytes(&v2(0x21, 0x00, &[])).unwrap(),
            Proxied::Local
        );
        let h = v2(0x21, 0x00, TLVS);
        assert_eq!(parse_v2_bytes(&h).unwrap(), Proxied::Local);
    }

    #[test]
    fn v2_udp() {
        let h = v2(0x21, 0x12, &V4_ADDRS);
        assert_eq!(parse_v2_bytes(&h).unwrap(), Proxied::Local);
        let h = v2(0x21, 0x22, &v6_addrs());
        assert_eq!(parse_v2_bytes(&h).unwrap(), Proxied::Local);
    }

    #[test]
    fn v2_unix() {
        let body = [0u8; 216];
        assert_eq!(
            parse_v2_bytes(&v2(0x21, 0x31, &body)).unwrap(),
            Proxied::Local
        );
        assert_eq!(
            parse_v2_bytes(&v2(0x21, 0x32, &body)).unwrap(),
            Proxied::Local
        );
    }

    #[test]
    fn v2_unlisted_combinations_fall_back() {
        // Defined nibbles in combinations spec 2.2 does not list: the connection's peer stands.
        for fam in [0x01, 0x02, 0x10, 0x20, 0x30] {
            let h = v2(0x21, fam, &v6_addrs());
            assert_eq!(parse_v2_bytes(&h).unwrap(), Proxied::Local, "{fam:#x}");
        }
    }

    #[test]
    fn v2_length_at_the_limit() {
        let mut body = V4_ADDRS.to_vec();
        body.resize(V2_MAX_LEN, 0);
        let h = v2(0x21, 0x11, &body);
        assert_eq!(parse_v2_bytes(&h).unwrap(), sa("192.0.2.1:56324"));
    }

    // ---- spec 2.2: v2, malformed ----

    #[test]
    fn v2_bad_signature() {
        let mut h = v2(0x21, 0x11, &V4_ADDRS);
        h[11] = b'\r';
        assert_eq!(invalid(parse_v2_bytes(&h)), "v2 signature mismatch");
    }

    #[test]
    fn v2_bad_version() {
        for ver_cmd in [0x01, 0x11, 0x31, 0xf1, 0x10, 0x30] {
            let h = v2(ver_cmd, 0x11, &V4_ADDRS);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 version is not 2",
                "{ver_cmd:#x}"
            );
        }
    }

    #[test]
    fn v2_bad_command() {
        for ver_cmd in [0x22, 0x23, 0x2f] {
            let h = v2(ver_cmd, 0x11, &V4_ADDRS);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 command is neither LOCAL nor PROXY",
                "{ver_cmd:#x}"
            );
        }
    }

    #[test]
    fn v2_undefined_family_or_transport() {
        for fam in [0x41, 0x51, 0xf1] {
            let h = v2(0x21, fam, &V4_ADDRS);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 address family is undefined"
            );
        }
        for fam in [0x13, 0x1f, 0x03] {
            let h = v2(0x21, fam, &V4_ADDRS);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 transport protocol is undefined"
            );
        }
    }

    #[test]
    fn v2_short_length() {
        for len in [0, 1, 11] {
            let h = v2(0x21, 0x11, &V4_ADDRS[..len]);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 length too short for TCP over IPv4 addresses (12 bytes)"
            );
        }
        for len in [0, 12, 35] {
            let h = v2(0x21, 0x21, &v6_addrs()[..len]);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 length too short for TCP over IPv6 addresses (36 bytes)"
            );
        }
    }

    #[test]
    fn v2_oversized_length() {
        for len in [V2_MAX_LEN + 1, 65535] {
            let h = v2(0x21, 0x11, &vec![0; len]);
            assert_eq!(
                invalid(parse_v2_bytes(&h)),
                "v2 length above 4096 bytes (the most this gateway accepts)"
            );
        }
        // The message names the constant's value.
        assert_eq!(V2_MAX_LEN, 4096);
    }

    #[test]
    fn v2_body_must_match_length() {
        let h = v2(0x21, 0x11, &V4_ADDRS);
        let header: &[u8; 16] = h[..16].try_into().unwrap();
        assert_eq!(
            invalid(parse_v2(header, &V4_ADDRS[..11])),
            "v2 body length differs from the header's"
        );
    }

    // ---- read_header: frames exactly the header, leaves the rest ----

    /// Read a header from `input` through a `&[u8]` reader (which hands over as much as asked,
    /// so any over-read would show) and return what was left.
    async fn read_slice(input: &[u8]) -> (Result<Proxied, ProxyError>, Vec<u8>) {
        let mut r = input;
        let res = read_header(&mut r, T).await;
        (res, r.to_vec())
    }

    #[tokio::test]
    async fn v1_leaves_the_request_unread() {
        let header = b"PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n";
        let (res, rest) = read_slice(&[&header[..], REQUEST].concat()).await;
        assert_eq!(res.unwrap(), sa("192.0.2.1:56324"));
        assert_eq!(rest, REQUEST);
    }

    #[tokio::test]
    async fn v1_tcp6_leaves_the_client_hello_unread() {
        let header = b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n";
        let (res, rest) = read_slice(&[&header[..], CLIENT_HELLO].concat()).await;
        assert_eq!(res.unwrap(), sa("[2001:db8::1]:56324"));
        assert_eq!(rest, CLIENT_HELLO);
    }

    #[tokio::test]
    async fn v1_every_line_length_is_framed_exactly() {
        // UNKNOWN lines of every length from 15 to 107 bytes, odd and even, some with CRs
        // inside: the header ends at the CRLF whatever its parity.
        for k in 0..=(V1_MAX_LINE - 15) {
            for filler in [b'x', b'\r'] {
                let mut line = b"PROXY UNKNOWN".to_vec();
                if k > 0 {
                    line.push(b' ');
                    line.resize(13 + k, filler);
                }
                line.extend_from_slice(b"\r\n");
                assert!(line.len() <= V1_MAX_LINE);
                let (res, rest) = read_slice(&[&line[..], REQUEST].concat()).await;
                assert_eq!(res.unwrap(), Proxied::Local, "{line:?}");
                assert_eq!(rest, REQUEST, "{line:?}");
            }
        }
    }

    #[tokio::test]
    async fn v1_longer_than_107_is_refused() {
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LINE - 1, b'x');
        line.extend_from_slice(b"\r\n");
        let (res, _) = read_slice(&[&line[..], REQUEST].concat()).await;
        assert_eq!(invalid(res), "v1 line longer than 107 bytes without CRLF");
        // No line end at all: refused after 107 bytes, not read on.
        let mut line = b"PROXY UNKNOWN ".to_vec();
        line.resize(V1_MAX_LINE + 50, b'x');
        let (res, _) = read_slice(&line).await;
        assert_eq!(invalid(res), "v1 line longer than 107 bytes without CRLF");
    }

    #[tokio::test]
    async fn v1_lf_only_is_refused() {
        for line in [
            &b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\n"[..],
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 22\n",
        ] {
            let (res, _) = read_slice(&[line, REQUEST].concat()).await;
            assert_eq!(invalid(res), "v1 line ends with LF, not CRLF", "{line:?}");
        }
    }

    #[tokio::test]
    async fn v1_malformed_is_refused_through_the_reader() {
        let line = b"PROXY TCP4 192.0.2.1 198.51.100.7 080 443\r\n";
        let (res, _) = read_slice(&[&line[..], REQUEST].concat()).await;
        assert_eq!(invalid(res), "v1 port has a leading zero");
        let (res, _) = read_slice(b"PROXX TCP4 192.0.2.1 198.51.100.7 1 2\r\n").await;
        invalid(res);
    }

    #[tokio::test]
    async fn v2_leaves_the_request_unread() {
        let header = v2(0x21, 0x11, &V4_ADDRS);
        let (res, rest) = read_slice(&[&header[..], REQUEST].concat()).await;
        assert_eq!(res.unwrap(), sa("192.0.2.1:56324"));
        assert_eq!(rest, REQUEST);
    }

    #[tokio::test]
    async fn v2_with_tlvs_leaves_the_client_hello_unread() {
        let header = v2(0x21, 0x21, &[&v6_addrs()[..], TLVS].concat());
        let (res, rest) = read_slice(&[&header[..], CLIENT_HELLO].concat()).await;
        assert_eq!(res.unwrap(), sa("[2001:db8::1]:56324"));
        assert_eq!(rest, CLIENT_HELLO);
    }

    #[tokio::test]
    async fn v2_local_skips_its_body_exactly() {
        let header = v2(0x20, 0x00, TLVS);
        let (res, rest) = read_slice(&[&header[..], REQUEST].concat()).await;
        assert_eq!(res.unwrap(), Proxied::Local);
        assert_eq!(rest, REQUEST);
    }

    #[tokio::test]
    async fn v2_oversized_is_refused_before_reading_the_body() {
        let mut header = v2(0x21, 0x11, &V4_ADDRS);
        header[14..16].copy_from_slice(&65535u16.to_be_bytes());
        let (res, rest) = read_slice(&[&header[..16], &V4_ADDRS[..], REQUEST].concat()).await;
        invalid(res);
        assert_eq!(rest, [&V4_ADDRS[..], REQUEST].concat());
    }

    /// Send `input` through a duplex pipe whose buffer holds one byte, so every read sees at
    /// most one byte: the header arrives in pieces, as over a slow network.
    async fn read_trickled(input: Vec<u8>) -> (Result<Proxied, ProxyError>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(1);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.unwrap();
            // Dropping `client` ends the stream.
        });
        let res = read_header(&mut server, T).await;
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        writer.await.unwrap();
        (res, rest)
    }

    #[tokio::test]
    async fn v1_trickled_through_a_duplex() {
        let header = b"PROXY TCP4 192.0.2.1 198.51.100.7 56324 443\r\n";
        let (res, rest) = read_trickled([&header[..], REQUEST].concat()).await;
        assert_eq!(res.unwrap(), sa("192.0.2.1:56324"));
        assert_eq!(rest, REQUEST);
    }

    #[tokio::test]
    async fn v2_trickled_through_a_duplex() {
        let header = v2(0x21, 0x11, &[&V4_ADDRS[..], TLVS].concat());
        let (res, rest) = read_trickled([&header[..], CLIENT_HELLO].concat()).await;
        assert_eq!(res.unwrap(), sa("192.0.2.1:56324"));
        assert_eq!(rest, CLIENT_HELLO);
    }

    #[tokio::test]
    async fn not_a_header_is_refused_at_once() {
        // The writer stays open: the refusal must come from the first byte, not from the
        // timeout or the end of the stream.
        for first in [&b"GET / HTTP/1.1\r\n"[..], CLIENT_HELLO, b"\x00"] {
            let (mut client, mut server) = tokio::io::duplex(64);
            client.write_all(first).await.unwrap();
            let res = read_header(&mut server, T).await;
            assert_eq!(
                invalid(res),
                "the connection does not start with a PROXY header \
                 (is the load balancer configured to send one?)"
            );
            drop(client);
        }
    }

    #[tokio::test]
    async fn http_starting_with_p_is_refused() {
        let (res, _) = read_slice(b"POST /upload HTTP/1.1\r\n\r\n").await;
        invalid(res);
        let (res, _) = read_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        invalid(res);
    }

    #[tokio::test]
    async fn timeout_when_nothing_arrives() {
        let (_client, mut server) = tokio::io::duplex(64);
        let res = read_header(&mut server, Duration::from_millis(50)).await;
        assert!(matches!(res, Err(ProxyError::Timeout)), "{res:?}");
    }

    #[tokio::test]
    async fn timeout_bounds_a_partial_header() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"PROXY TCP4 192.0.2.1 ").await.unwrap();
        let res = read_header(&mut server, Duration::from_millis(50)).await;
        assert!(matches!(res, Err(ProxyError::Timeout)), "{res:?}");
    }

    #[tokio::test]
    async fn eof_before_anything() {
        let (res, _) = read_slice(b"").await;
        assert_eq!(eof(res), "connection closed before sending anything");
    }

    #[tokio::test]
    async fn eof_mid_header() {
        let v2_full = v2(0x21, 0x11, &V4_ADDRS);
        for input in [
            &b"P"[..],
            b"PRO",
            b"PROXY TCP4 192.0.2.1",
            b"PROXY TCP4 192.0.2.1 198.51.100.7 1 2\r",
            b"\r",
            &v2_full[..10],
            &v2_full[..16],
            &v2_full[..27],
        ] {
            let (res, _) = read_slice(input).await;
            assert_eq!(
                eof(res),
                "connection closed in the middle of the header",
                "{input:?}"
            );
        }
    }

    #[test]
    fn error_messages_read_well() {
        assert_eq!(
            ProxyError::Invalid("v2 version is not 2").to_string(),
            "invalid PROXY header: v2 version is not 2"
        );
        assert_eq!(
            ProxyError::Timeout.to_string(),
            "the PROXY header did not arrive in time"
        );
        let io = ProxyError::Io(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            "connection closed before sending anything",
        ));
        assert_eq!(
            io.to_string(),
            "reading the PROXY header: connection closed before sending anything"
        );
    }
}
