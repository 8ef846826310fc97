//! A small blocking client for the daemon's Unix socket, used by the CLI, the demo, the bench
//! and the tests.

use crate::error::ServerError;
use crate::wire::{Request, Response};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(socket: &Path) -> Result<Client, ServerError> {
        let s = UnixStream::connect(socket).map_err(|source| ServerError::DaemonUnreachable {
            path: socket.display().to_string(),
            source,
        })?;
        Ok(Client {
            reader: BufReader::new(s.try_clone().map_err(ServerError::Connection)?),
            writer: s,
        })
    }

    /// One request and its response, a refusal included.
    pub fn call(&mut self, req: &Request) -> Result<Response, ServerError> {
        let mut line = serde_json::to_vec(req).map_err(|e| ServerError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.raw(&line)
    }

    /// One request and its result; a refusal is `ServerError::Refused`.
    pub fn request(&mut self, req: &Request) -> Result<Value, ServerError> {
        self.call(req)?.into_result()
    }

    /// Send raw bytes (tests use this for malformed input) and read one response line.
    pub fn raw(&mut self, bytes: &[u8]) -> Result<Response, ServerError> {
        if let Err(e) = self.writer.write_all(bytes) {
            // The daemon answers an oversized request and closes before reading the rest:
            // its answer is still there to read.
            if !matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                return Err(ServerError::Connection(e));
            }
            let mut out = String::new();
            return match self.reader.read_line(&mut out) {
                Ok(n) if n > 0 => serde_json::from_str(&out)
                    .map_err(|e| ServerError::Protocol(format!("{e}: {out}"))),
                _ => Err(ServerError::Connection(e)),
            };
        }
        let mut out = String::new();
        if self
            .reader
            .read_line(&mut out)
            .map_err(ServerError::Connection)?
            == 0
        {
            return Err(ServerError::Protocol("connection closed".into()));
        }
        serde_json::from_str(&out).map_err(|e| ServerError::Protocol(format!("{e}: {out}")))
    }
}
