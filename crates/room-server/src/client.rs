//! A small blocking client for the daemon's Unix socket, used by the CLI, the demo, the bench
//! and the tests.

use crate::wire::{Request, Response};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no daemon answers at {path}: {err}")]
    Unreachable { path: String, err: std::io::Error },
    #[error("daemon connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("daemon sent a malformed response: {0}")]
    Malformed(String),
}

impl Client {
    pub fn connect(socket: &Path) -> Result<Client, ClientError> {
        let s = UnixStream::connect(socket).map_err(|err| ClientError::Unreachable {
            path: socket.display().to_string(),
            err,
        })?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        let mut line =
            serde_json::to_vec(req).map_err(|e| ClientError::Malformed(e.to_string()))?;
        line.push(b'\n');
        self.raw(&line)
    }

    /// Send raw bytes (tests use this for malformed input) and read one response line.
    pub fn raw(&mut self, bytes: &[u8]) -> Result<Response, ClientError> {
        self.writer.write_all(bytes)?;
        let mut out = String::new();
        if self.reader.read_line(&mut out)? == 0 {
            return Err(ClientError::Malformed("connection closed".into()));
        }
        serde_json::from_str(&out).map_err(|e| ClientError::Malformed(format!("{e}: {out}")))
    }
}
