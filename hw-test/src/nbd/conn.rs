//! One client connection: the fixed newstyle negotiation, then requests served one at a time in
//! arrival order (so every write answered before a flush arrived is covered by that flush).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

use super::proto::*;
use super::server::Shared;

/// A Unix or TCP stream; the server treats both alike.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Ends the connection from the server's side (the power went): the peer sees it closed.
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// Why a connection ended.
#[derive(Debug)]
pub enum End {
    /// The client disconnected (NBD_CMD_DISC, NBD_OPT_ABORT or end of stream).
    Client,
    /// The power was cut while it was open.
    Cut,
    /// The client sent something the server cannot follow; the connection was dropped.
    Bad(String),
    Io(io::Error),
}

impl From<io::Error> for End {
    fn from(e: io::Error) -> End {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            End::Client
        } else {
            End::Io(e)
        }
    }
}

pub struct Conn<'a> {
    pub shared: &'a Shared,
    pub stream: Stream,
    /// The power cycle the connection was opened in; a cut ends it.
    pub generation: u64,
}

fn transmission_flags() -> u16 {
    TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA
}

/// A read or write request's flags, alignment and range; `past_end` is the error for a range
/// beyond the export (EINVAL for reads, ENOSPC for writes, as the protocol asks).
fn check_request(size: u64, req: &Request, past_end: u32) -> Result<(), u32> {
    if req.flags & !CMD_FLAG_FUA != 0 {
        return Err(EINVAL);
    }
    check_range(size, req.offset, req.length, past_end)
}

fn check_range(size: u64, offset: u64, length: u32, past_end: u32) -> Result<(), u32> {
    if length > MAX_REQUEST {
        return Err(EINVAL);
    }
    if !offset.is_multiple_of(u64::from(MIN_BLOCK)) || !length.is_multiple_of(MIN_BLOCK) {
        return Err(EINVAL);
    }
    if offset
        .checked_add(u64::from(length))
        .is_none_or(|end| end > size)
    {
        return Err(past_end);
    }
    Ok(())
}

impl Conn<'_> {
    pub fn serve(&mut self) -> End {
        match self.negotiate() {
            Ok(true) => {}
            Ok(false) => return End::Client,
            Err(e) => return e,
        }
        loop {
            if let Err(e) = self.one_request() {
                return e;
            }
        }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), End> {
        self.stream.read_exact(buf).map_err(End::from)
    }

    fn option_reply(&mut self, option: u32, kind: u32, data: &[u8]) -> Result<(), End> {
        write_option_reply(&mut self.stream, option, kind, data)?;
        Ok(())
    }

    fn option_error(&mut self, option: u32, kind: u32, why: &str) -> Result<(), End> {
        self.option_reply(option, kind, why.as_bytes())
    }

    /// True when the client moved to transmission, false when it aborted.
    fn negotiate(&mut self) -> Result<bool, End> {
        let mut hello = Vec::with_capacity(18);
        hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
        hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
        hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        self.stream.write_all(&hello)?;
        let cflags = read_u32(&mut self.stream)?;
        if cflags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
            return Err(End::Bad(format!("unknown client flags {cflags:#x}")));
        }
        let no_zeroes = cflags & CLIENT_NO_ZEROES != 0;
        let size = self.shared.size;
        loop {
            let magic = read_u64(&mut self.stream)?;
            if magic != IHAVEOPT {
                return Err(End::Bad(format!("option magic {magic:#x}, not IHAVEOPT")));
            }
            let option = read_u32(&mut self.stream)?;
            let len = read_u32(&mut self.stream)?;
            if len > MAX_OPTION_LEN {
                return Err(End::Bad(format!(
                    "option {option} carries {len} bytes (limit {MAX_OPTION_LEN})"
                )));
            }
            let mut data = vec![0u8; len as usize];
            self.read_exact(&mut data)?;
            match option {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).into_owned();
                    if !self.shared.knows_export(&name) {
                        // This option has no error reply: the protocol says to hang up.
                        return Err(End::Bad(format!("unknown export {name:?}")));
                    }
                    let mut reply = Vec::with_capacity(134);
                    reply.extend_from_slice(&size.to_be_bytes());
                    reply.extend_from_slice(&transmission_flags().to_be_bytes());
                    if !no_zeroes {
                        reply.extend_from_slice(&[0u8; 124]);
                    }
                    self.stream.write_all(&reply)?;
                    self.shared.log(&format!(
                        "export {name:?} entered through NBD_OPT_EXPORT_NAME"
                    ));
                    return Ok(true);
                }
                OPT_ABORT => {
                    let _ = self.option_reply(option, REP_ACK, &[]);
                    return Ok(false);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        self.option_error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                        continue;
                    }
                    let name = self.shared.export_name.as_bytes();
                    let mut entry = Vec::with_capacity(4 + name.len());
                    entry.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    entry.extend_from_slice(name);
                    self.option_reply(option, REP_SERVER, &entry)?;
                    self.option_reply(option, REP_ACK, &[])?;
                }
                OPT_INFO | OPT_GO => {
                    let Some((name, infos)) = parse_info_request(&data) else {
                        self.option_error(option, REP_ERR_INVALID, "malformed info request")?;
                        continue;
                    };
                    if !self.shared.knows_export(&name) {
                        let why = format!("no export named {name:?}");
                        self.option_error(option, REP_ERR_UNKNOWN, &why)?;
                        continue;
                    }
                    let mut export = Vec::with_capacity(12);
                    export.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                    export.extend_from_slice(&size.to_be_bytes());
                    export.extend_from_slice(&transmission_flags().to_be_bytes());
                    self.option_reply(option, REP_INFO, &export)?;
                    if infos.contains(&INFO_BLOCK_SIZE) {
                        let mut b = Vec::with_capacity(14);
                        b.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                        for v in [MIN_BLOCK, PREFERRED_BLOCK, MAX_REQUEST] {
                            b.extend_from_slice(&v.to_be_bytes());
                        }
                        self.option_reply(option, REP_INFO, &b)?;
                    }
                    self.option_reply(option, REP_ACK, &[])?;
                    if option == OPT_GO {
                        self.shared
                            .log(&format!("export {name:?} entered through NBD_OPT_GO"));
                        return Ok(true);
                    }
                }
                _ => {
                    // Structured replies, meta contexts, TLS...: not offered; the client falls
                    // back to simple replies.
                    self.option_error(option, REP_ERR_UNSUP, "not supported by nvmq-nbd")?;
                }
            }
        }
    }

    fn reply(&mut self, error: u32, handle: u64, data: &[u8]) -> Result<(), End> {
        let mut b = Vec::with_capacity(16 + data.len());
        write_simple_reply(&mut b, error, handle)?;
        b.extend_from_slice(data);
        self.stream.write_all(&b)?;
        Ok(())
    }

    fn one_request(&mut self) -> Result<(), End> {
        let mut head = [0u8; Request::LEN];
        self.read_exact(&mut head)?;
        let Some(req) = Request::decode(&head) else {
            return Err(End::Bad("request magic is wrong".into()));
        };
        let size = self.shared.size;
        match req.kind {
            CMD_DISC => Err(End::Client),
            CMD_READ => {
                if let Err(errno) = check_request(size, &req, EINVAL) {
                    return self.reply(errno, req.handle, &[]);
                }
                let mut buf = vec![0u8; req.length as usize];
                let res = self
                    .shared
                    .with_power(self.generation, |store| store.read(req.offset, &mut buf))?;
                self.answer(res, "read", req.handle, &buf)
            }
            CMD_WRITE => {
                if req.length > MAX_REQUEST {
                    // Its payload cannot be skipped safely without reading it all: hang up.
                    return Err(End::Bad(format!(
                        "write of {} bytes at {} (limit {MAX_REQUEST})",
                        req.length, req.offset
                    )));
                }
                let mut data = vec![0u8; req.length as usize];
                self.read_exact(&mut data)?;
                if let Err(errno) = check_request(size, &req, ENOSPC) {
                    return self.reply(errno, req.handle, &[]);
                }
                if data.is_empty() {
                    return self.reply(0, req.handle, &[]);
                }
                let fua = req.flags & CMD_FLAG_FUA != 0;
                let res = self
                    .shared
                    .with_power(self.generation, |store| store.write(req.offset, data, fua))?;
                self.answer(res, "write", req.handle, &[])
            }
            CMD_FLUSH => {
                // A slow flush: the writes it covers stay volatile until it is done.
                if !self.shared.flush_delay.is_zero() {
                    std::thread::sleep(self.shared.flush_delay);
                }
                let res = self
                    .shared
                    .with_power(self.generation, |store| store.flush())?;
                self.answer(res, "flush", req.handle, &[])
            }
            _ => self.reply(EINVAL, req.handle, &[]),
        }
    }

    /// The reply to a request the store served: its data on success, EIO (logged) on failure.
    fn answer(
        &mut self,
        res: Result<(), super::NbdError>,
        what: &str,
        handle: u64,
        data: &[u8],
    ) -> Result<(), End> {
        match res {
            Ok(()) => self.reply(0, handle, data),
            Err(e) => {
                self.shared.log(&format!("{what} failed: {e}"));
                self.reply(EIO, handle, &[])
            }
        }
    }
}

/// NBD_OPT_INFO / NBD_OPT_GO data: name length, name, count of info requests, the requests.
fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    let name = data.get(4..4usize.checked_add(name_len)?)?;
    let rest = &data[4 + name_len..];
    let count = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let reqs = &rest[2..];
    if reqs.len() != count * 2 {
        return None;
    }
    let infos = reqs
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((String::from_utf8_lossy(name).into_owned(), infos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_requests_parse_and_malformed_ones_do_not() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(
            parse_info_request(&d),
            Some(("abc".to_string(), vec![INFO_BLOCK_SIZE]))
        );
        assert_eq!(parse_info_request(&d[..d.len() - 1]), None);
        let mut long = d.clone();
        long[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_info_request(&long), None);
        assert_eq!(parse_info_request(&[]), None);
    }

    #[test]
    fn ranges_are_checked_for_alignment_size_and_overflow() {
        assert_eq!(check_range(4096, 0, 4096, ENOSPC), Ok(()));
        assert_eq!(check_range(4096, 512, 4096, ENOSPC), Err(ENOSPC));
        assert_eq!(check_range(4096, 1, 512, ENOSPC), Err(EINVAL));
        assert_eq!(check_range(4096, u64::MAX - 511, 512, EINVAL), Err(EINVAL));
        assert_eq!(
            check_range(1 << 40, 0, MAX_REQUEST + 512, ENOSPC),
            Err(EINVAL)
        );
    }
}
