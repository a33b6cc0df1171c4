//! A minimal synchronous RESP2 client: [`Resp`] replies, a blocking [`Conn`] to one Redis
//! or sentinel on 127.0.0.1, and [`info_field`] for `INFO`-style text.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// A simple or bulk string as UTF-8; panics (showing the reply) on anything else.
    pub fn as_str(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(Some(b)) => String::from_utf8(b.clone())
                .unwrap_or_else(|_| panic!("reply is not UTF-8: {self:?}")),
            _ => panic!("expected a string reply, got {self:?}"),
        }
    }

    /// An integer reply, or a simple/bulk string holding one; panics otherwise.
    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(n) => *n,
            Resp::Simple(_) | Resp::Bulk(Some(_)) => self
                .as_str()
                .parse()
                .unwrap_or_else(|_| panic!("expected an integer reply, got {self:?}")),
            _ => panic!("expected an integer reply, got {self:?}"),
        }
    }

    /// The elements of a (non-nil) array reply; panics otherwise.
    pub fn as_array(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(items)) => items.clone(),
            _ => panic!("expected an array reply, got {self:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

/// Bulk strings shown as text so panic messages are readable.
impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Simple(s) => write!(f, "Simple({s:?})"),
            Resp::Error(e) => write!(f, "Error({e:?})"),
            Resp::Int(n) => write!(f, "Int({n})"),
            Resp::Bulk(None) | Resp::Array(None) => f.write_str("Nil"),
            Resp::Bulk(Some(b)) => write!(f, "Bulk({:?})", String::from_utf8_lossy(b)),
            Resp::Array(Some(items)) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A blocking connection to one Redis (or sentinel) on 127.0.0.1.
pub struct Conn {
    pub port: u16,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// `INFO commandstats` as command → (calls, failed calls).
    pub fn commandstats(&mut self) -> BTreeMap<String, (u64, u64)> {
        let text = self.cmd_ok(&["INFO", "commandstats"]).as_str();
        text.lines()
            .filter_map(|l| {
                let (name, rest) = l.trim().strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |f: &str| {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse().ok())
                        .unwrap_or(0u64)
                };
                Some((name.to_string(), (field("calls"), field("failed_calls"))))
            })
            .collect()
    }

    /// Connect to 127.0.0.1:`port`; panics if nothing answers.
    pub fn connect(port: u16) -> Conn {
        Conn::try_connect(port)
            .unwrap_or_else(|e| panic!("cannot connect to redis at 127.0.0.1:{port}: {e}"))
    }

    /// Like [`Conn::connect`], for polling a server that may not be up (yet, or any more).
    pub fn try_connect(port: u16) -> io::Result<Conn> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        // A wedged server fails the test instead of hanging it.
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            port,
            reader: BufReader::new(stream),
        })
    }

    /// Send `args` as one command and read its reply (which may be a `Resp::Error`);
    /// panics on I/O errors.
    pub fn cmd(&mut self, args: &[&str]) -> Resp {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis 127.0.0.1:{} {args:?}: {e}", self.port))
    }

    /// Like [`Conn::cmd`], but panics on an error reply too.
    pub fn cmd_ok(&mut self, args: &[&str]) -> Resp {
        let reply = self.cmd(args);
        if let Resp::Error(e) = &reply {
            panic!("redis 127.0.0.1:{} {args:?} failed: {e}", self.port);
        }
        reply
    }

    /// Like [`Conn::cmd`], returning I/O errors (for polling).
    pub fn try_cmd(&mut self, args: &[&str]) -> io::Result<Resp> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        read_resp(&mut self.reader)
    }
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_resp<R: BufRead>(r: &mut R) -> io::Result<Resp> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    line.truncate(line.len() - 2);
    let Some((&kind, rest)) = line.split_first() else {
        return Err(bad_data("empty reply line".into()));
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let int = || {
        text.parse::<i64>()
            .map_err(|_| bad_data(format!("bad integer {text:?}")))
    };
    Ok(match kind {
        b'+' => Resp::Simple(text.clone()),
        b'-' => Resp::Error(text.clone()),
        b':' => Resp::Int(int()?),
        b'$' => match usize::try_from(int()?) {
            Err(_) => Resp::Bulk(None),
            Ok(len) => {
                let mut data = vec![0; len + 2];
                r.read_exact(&mut data)?;
                data.truncate(len);
                Resp::Bulk(Some(data))
            }
        },
        b'*' => match usize::try_from(int()?) {
            Err(_) => Resp::Array(None),
            Ok(n) => Resp::Array(Some(
                (0..n)
                    .map(|_| read_resp(r))
                    .collect::<io::Result<Vec<_>>>()?,
            )),
        },
        other => return Err(bad_data(format!("unknown reply type {:?}", other as char))),
    })
}

/// `field` from an `INFO`/`CLUSTER INFO` text (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}
