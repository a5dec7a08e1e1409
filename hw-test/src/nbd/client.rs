//! A minimal NBD client (fixed newstyle, simple replies, one request at a time): enough to test
//! the server and to read an export back from a controller without a kernel NBD module.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use super::error::NbdError;
use super::proto::*;

pub struct Client {
    stream: UnixStream,
    peer: String,
    size: u64,
    flags: u16,
    next_handle: u64,
}

/// How the client ends negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enter {
    Go,
    ExportName,
}

impl Client {
    /// Connects to `socket` and enters transmission on `export` with NBD_OPT_GO.
    pub fn connect(socket: &Path, export: &str) -> Result<Client, NbdError> {
        Client::open(socket, export, Enter::Go)
    }

    /// As [`Client::connect`], through the older NBD_OPT_EXPORT_NAME.
    pub fn connect_export_name(socket: &Path, export: &str) -> Result<Client, NbdError> {
        Client::open(socket, export, Enter::ExportName)
    }

    fn open(socket: &Path, export: &str, how: Enter) -> Result<Client, NbdError> {
        let mut c = Client::unnegotiated(socket)?;
        c.handshake(export, how)?;
        Ok(c)
    }

    /// A connected client before the server's greeting has been read.
    fn unnegotiated(socket: &Path) -> Result<Client, NbdError> {
        let peer = socket.display().to_string();
        let stream = UnixStream::connect(socket).map_err(|source| NbdError::Socket {
            op: "connecting to",
            addr: peer.clone(),
            source,
        })?;
        Ok(Client {
            stream,
            peer,
            size: 0,
            flags: 0,
            next_handle: 1,
        })
    }

    /// Reads the greeting of a fixed newstyle server and answers it; true if the server
    /// leaves out the 124 zero bytes after NBD_OPT_EXPORT_NAME.
    fn greet(&mut self) -> Result<bool, NbdError> {
        let magic = read_u64(&mut self.stream).map_err(self.io("reading the greeting"))?;
        let opt = read_u64(&mut self.stream).map_err(self.io("reading the greeting"))?;
        let hflags = read_u16(&mut self.stream).map_err(self.io("reading the greeting"))?;
        if magic != NBDMAGIC || opt != IHAVEOPT || hflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(self.bad(format!(
                "not a fixed newstyle server ({magic:#x} {opt:#x} flags {hflags:#x})"
            )));
        }
        let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
        let cflags = CLIENT_FIXED_NEWSTYLE | if no_zeroes { CLIENT_NO_ZEROES } else { 0 };
        self.send(&cflags.to_be_bytes())?;
        Ok(no_zeroes)
    }

    fn bad(&self, reason: impl Into<String>) -> NbdError {
        NbdError::Protocol {
            peer: self.peer.clone(),
            reason: reason.into(),
        }
    }

    fn io(&self, what: &str) -> impl FnOnce(std::io::Error) -> NbdError + '_ {
        let what = what.to_string();
        move |e| self.bad(format!("{what}: {e}"))
    }

    fn handshake(&mut self, export: &str, how: Enter) -> Result<(), NbdError> {
        let no_zeroes = self.greet()?;
        match how {
            Enter::ExportName => {
                self.send_option(OPT_EXPORT_NAME, export.as_bytes())?;
                self.size = read_u64(&mut self.stream).map_err(self.io("reading the export"))?;
                self.flags = read_u16(&mut self.stream).map_err(self.io("reading the export"))?;
                if !no_zeroes {
                    let mut z = [0u8; 124];
                    self.stream
                        .read_exact(&mut z)
                        .map_err(self.io("reading the export"))?;
                }
            }
            Enter::Go => {
                let mut data = Vec::new();
                data.extend_from_slice(&(export.len() as u32).to_be_bytes());
                data.extend_from_slice(export.as_bytes());
                data.extend_from_slice(&1u16.to_be_bytes());
                data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                self.send_option(OPT_GO, &data)?;
                loop {
                    let (kind, data) = self.option_reply(OPT_GO)?;
                    match kind {
                        REP_ACK => break,
                        REP_INFO if data.len() == 12 && data[0..2] == INFO_EXPORT.to_be_bytes() => {
                            self.size =
                                u64::from_be_bytes(data[2..10].try_into().unwrap_or_default());
                            self.flags = u16::from_be_bytes([data[10], data[11]]);
                        }
                        REP_INFO => {}
                        k => {
                            return Err(self.bad(format!(
                                "NBD_OPT_GO refused ({k:#x}): {}",
                                String::from_utf8_lossy(&data)
                            )))
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, b: &[u8]) -> Result<(), NbdError> {
        let peer = self.peer.clone();
        self.stream.write_all(b).map_err(|e| NbdError::Protocol {
            peer,
            reason: format!("writing: {e}"),
        })
    }

    fn send_option(&mut self, option: u32, data: &[u8]) -> Result<(), NbdError> {
        let mut b = Vec::with_capacity(16 + data.len());
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b)
    }

    fn option_reply(&mut self, option: u32) -> Result<(u32, Vec<u8>), NbdError> {
        let magic = read_u64(&mut self.stream).map_err(self.io("reading an option reply"))?;
        let opt = read_u32(&mut self.stream).map_err(self.io("reading an option reply"))?;
        let kind = read_u32(&mut self.stream).map_err(self.io("reading an option reply"))?;
        let len = read_u32(&mut self.stream).map_err(self.io("reading an option reply"))?;
        if magic != OPT_REPLY_MAGIC || opt != option || len > MAX_OPTION_LEN {
            return Err(self.bad(format!(
                "bad option reply (magic {magic:#x}, option {opt}, {len} bytes)"
            )));
        }
        let mut data = vec![0u8; len as usize];
        self.stream
            .read_exact(&mut data)
            .map_err(self.io("reading an option reply"))?;
        Ok((kind, data))
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The transmission flags the server advertised.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Sends one request (a write's payload after it) and returns the reply's error number and,
    /// for a successful read, `read_len` bytes of data.
    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        read_len: usize,
    ) -> Result<(u32, Vec<u8>), NbdError> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let head = Request {
            flags,
            kind,
            handle,
            offset,
            length,
        }
        .encode();
        let mut b = Vec::with_capacity(head.len() + payload.len());
        b.extend_from_slice(&head);
        b.extend_from_slice(payload);
        self.send(&b)?;
        let mut reply = [0u8; 16];
        self.stream
            .read_exact(&mut reply)
            .map_err(self.io("reading a reply"))?;
        let magic = u32::from_be_bytes([reply[0], reply[1], reply[2], reply[3]]);
        let errno = u32::from_be_bytes([reply[4], reply[5], reply[6], reply[7]]);
        let got = u64::from_be_bytes(reply[8..16].try_into().unwrap_or_default());
        if magic != SIMPLE_REPLY_MAGIC || got != handle {
            return Err(self.bad(format!(
                "bad reply (magic {magic:#x}, handle {got} for {handle})"
            )));
        }
        let mut data = Vec::new();
        if errno == 0 && read_len > 0 {
            data = vec![0u8; read_len];
            self.stream
                .read_exact(&mut data)
                .map_err(self.io("reading read data"))?;
        }
        Ok((errno, data))
    }

    fn check(op: &'static str, offset: u64, length: u32, errno: u32) -> Result<(), NbdError> {
        if errno == 0 {
            Ok(())
        } else {
            Err(NbdError::Request {
                op,
                offset,
                length,
                errno,
            })
        }
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, NbdError> {
        let (errno, data) = self.request(CMD_READ, 0, offset, len, &[], len as usize)?;
        Client::check("read", offset, len, errno)?;
        Ok(data)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), NbdError> {
        let len = u32::try_from(data.len()).map_err(|_| self.bad("write over 4 GiB"))?;
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let (errno, _) = self.request(CMD_WRITE, flags, offset, len, data, 0)?;
        Client::check("write", offset, len, errno)
    }

    pub fn flush(&mut self) -> Result<(), NbdError> {
        let (errno, _) = self.request(CMD_FLUSH, 0, 0, 0, &[], 0)?;
        Client::check("flush", 0, 0, errno)
    }

    /// NBD_CMD_DISC: the server closes the connection (no flush is implied).
    pub fn disconnect(mut self) -> Result<(), NbdError> {
        let head = Request {
            flags: 0,
            kind: CMD_DISC,
            handle: 0,
            offset: 0,
            length: 0,
        }
        .encode();
        self.send(&head)
    }
}

/// The export names a server lists (NBD_OPT_LIST), then NBD_OPT_ABORT.
pub fn list_exports(socket: &Path) -> Result<Vec<String>, NbdError> {
    let mut c = Client::unnegotiated(socket)?;
    c.greet()?;
    c.send_option(OPT_LIST, &[])?;
    let mut names = Vec::new();
    loop {
        let (kind, data) = c.option_reply(OPT_LIST)?;
        match kind {
            REP_ACK => break,
            REP_SERVER if data.len() >= 4 => {
                let n = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                let name = data
                    .get(4..4 + n)
                    .ok_or_else(|| c.bad("short export name"))?;
                names.push(String::from_utf8_lossy(name).into_owned());
            }
            k => return Err(c.bad(format!("NBD_OPT_LIST reply {k:#x}"))),
        }
    }
    c.send_option(OPT_ABORT, &[])?;
    Ok(names)
}
