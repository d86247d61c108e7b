//! The view-syncers' side: WebSocket clients (a well-behaved one, and one that writes raw frames for input no
//! well-behaved library will send) and plain HTTP requests to the sidecar.

use super::*;

pub type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

pub async fn connect(url: &str) -> Client {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(256 << 20);
    config.max_frame_size = Some(256 << 20);
    let (ws, response) = tokio_tungstenite::connect_async_with_config(url, Some(config), false)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    assert_eq!(response.status(), 101);
    ws
}

/// A refused upgrade: the HTTP status and body.
pub async fn refused(url: &str) -> (u16, String) {
    match tokio_tungstenite::connect_async(url).await {
        Ok(_) => panic!("{url}: upgrade was accepted"),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status().as_u16();
            let body = response
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            (status, body)
        }
        Err(e) => panic!("{url}: unexpected error {e}"),
    }
}

pub async fn next_text(ws: &mut Client) -> String {
    match next_message(ws).await {
        Some(Message::Text(text)) => text.to_string(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// What the peer's close frame said: `Some((code, reason))`, or `None` for a close without a status code
/// (reported as 1005 by browsers and `ws`).
pub async fn expect_close(ws: &mut Client) -> Option<(u16, String)> {
    match next_message(ws).await {
        Some(Message::Close(frame)) => frame.map(|f| (u16::from(f.code), f.reason.to_string())),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

pub async fn send_text(ws: &mut Client, text: &str) {
    ws.send(Message::Text(text.into())).await.unwrap();
}

pub fn close_code(code: u16) -> CloseCode {
    CloseCode::from(code)
}

/// Plain HTTP GET (or another method): status and body.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .expect("response within 10s")
        .unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A WebSocket client that writes frames byte by byte as told, for input well-behaved libraries refuse to send.
pub struct RawClient {
    pub stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr, path: &str) -> RawClient {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "connection closed during the handshake");
            buffer.extend_from_slice(&chunk[..n]);
            if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        buffer.drain(..head_end);
        RawClient { stream, buffer }
    }

    /// Writes one masked frame header for `len` payload bytes; the payload follows with `write_payload`.
    pub async fn write_header(&mut self, fin: bool, opcode: u8, len: u64) {
        let mut head = vec![(if fin { 0x80 } else { 0 }) | opcode];
        if len < 126 {
            head.push(0x80 | len as u8);
        } else if len <= u16::MAX as u64 {
            head.push(0x80 | 126);
            head.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            head.push(0x80 | 127);
            head.extend_from_slice(&len.to_be_bytes());
        }
        // An all-zero mask leaves the payload as is.
        head.extend_from_slice(&[0, 0, 0, 0]);
        self.stream.write_all(&head).await.unwrap();
    }

    pub async fn write_frame(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        self.write_header(fin, opcode, payload.len() as u64).await;
        self.stream.write_all(payload).await.unwrap();
    }

    async fn fill(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 65536];
        while self.buffer.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return false,
                Ok(Ok(read)) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(_) => panic!("no data within 10s"),
            }
        }
        true
    }

    /// Reads one unmasked server frame: `(opcode, payload)`, or `None` at end of stream.
    pub async fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        if !self.fill(2).await {
            return None;
        }
        let opcode = self.buffer[0] & 0x0f;
        let (len, head) = match self.buffer[1] & 0x7f {
            126 => {
                if !self.fill(4).await {
                    return None;
                }
                (
                    u16::from_be_bytes([self.buffer[2], self.buffer[3]]) as usize,
                    4,
                )
            }
            127 => {
                if !self.fill(10).await {
                    return None;
                }
                (
                    u64::from_be_bytes(self.buffer[2..10].try_into().unwrap()) as usize,
                    10,
                )
            }
            n => (n as usize, 2),
        };
        if !self.fill(head + len).await {
            return None;
        }
        let payload = self.buffer[head..head + len].to_vec();
        self.buffer.drain(..head + len);
        Some((opcode, payload))
    }

    /// Skips the status and pings; returns the close code and reason of the server's close frame.
    pub async fn read_close(&mut self) -> Option<(u16, String)> {
        loop {
            let (opcode, payload) = self.read_frame().await?;
            if opcode == 0x8 {
                if payload.len() < 2 {
                    return Some((1005, String::new()));
                }
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                return Some((code, String::from_utf8_lossy(&payload[2..]).into_owned()));
            }
        }
    }

    /// True once the server has dropped the TCP connection (after any frames it sent).
    pub async fn is_dropped(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk)).await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

/// Reads frames, answering pings, until a text frame arrives; `None` if `pings` pings came first.
pub async fn text_after_pings(raw: &mut RawClient, pings: usize) -> Option<String> {
    let mut seen = 0;
    loop {
        let (opcode, payload) = raw.read_frame().await.expect("the socket stays open");
        match opcode {
            0x9 => {
                raw.write_frame(true, 0xA, b"").await;
                seen += 1;
                if seen >= pings {
                    return None;
                }
            }
            0x1 => return Some(String::from_utf8(payload).unwrap()),
            other => panic!("unexpected opcode {other}"),
        }
    }
}
