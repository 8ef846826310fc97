//! `room api`: the daemon's API as lines, for scripts and workers. Each line read on stdin is
//! one request (the socket protocol's JSON object); each response goes to stdout as one line,
//! in order. The socket is `ROOM_SOCKET` when set (a worker's broker), else the state
//! directory's. A launch's broker admits Room's own binary, so a worker's script reaches Room
//! through this bridge rather than opening the socket itself.

use room_core::{Code, Refusal};
use room_server::client::Client;
use room_server::wire::{REQUEST_BYTES_MAX, Request, Response};
use std::io::{BufRead, Write};
use std::path::Path;

/// Bridge stdin to the daemon at `socket` until stdin ends.
pub fn run(socket: &Path) -> i32 {
    match bridge(socket) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            3
        }
    }
}

fn bridge(socket: &Path) -> Result<(), String> {
    let mut client = Client::connect(socket).map_err(|e| e.to_string())?;
    let mut input = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = std::io::Read::take(&mut input, REQUEST_BYTES_MAX as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("stdin: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        let resp = if line.len() > REQUEST_BYTES_MAX && !line.ends_with(b"\n") {
            // the rest of the oversized line is not a request either
            skip_line(&mut input)?;
            Response::refused(
                Refusal::new(
                    Code::PayloadTooLarge,
                    format!("a request line is longer than {REQUEST_BYTES_MAX} bytes"),
                )
                .detail(serde_json::json!({"field": "request"})),
            )
        } else if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        } else {
            match serde_json::from_slice::<Request>(&line) {
                Ok(req) => client.call(&req).map_err(|e| e.to_string())?,
                Err(e) => Response::refused(Refusal::invalid(
                    "request",
                    format!("not a request object: {e}"),
                )),
            }
        };
        let mut bytes = serde_json::to_vec(&resp).expect("responses serialize");
        bytes.push(b'\n');
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))?;
    }
}

fn skip_line(input: &mut impl BufRead) -> Result<(), String> {
    loop {
        let buf = input.fill_buf().map_err(|e| format!("stdin: {e}"))?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(i) => {
                input.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                input.consume(n);
            }
        }
    }
}
