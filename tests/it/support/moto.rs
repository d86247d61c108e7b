//! A real S3-compatible server on loopback for the backup tests: PyPI's `moto_server` (found or installed by
//! scripts/moto.sh), one process per [`Moto`], killed when it is dropped (also when a test panics).
//!
//! Setup goes through plain HTTP while moto accepts anything; [`Moto::enforce_auth`] then makes it check every
//! request's signature against the IAM keys created before, so that wrong credentials are refused as S3 would.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `moto_server` to run: $MOTO_SERVER, else whatever scripts/moto.sh finds or installs.
fn moto_server() -> String {
    if let Ok(path) = std::env::var("MOTO_SERVER") {
        if !path.is_empty() {
            return path;
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/moto.sh");
    let out = Command::new(script)
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/moto.sh runs");
    assert!(out.status.success(), "scripts/moto.sh failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

impl Moto {
    /// Starts moto on a free loopback port and waits (up to 60 s) until it answers.
    pub async fn start() -> Moto {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(moto_server())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let moto = Moto { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Ok((status, _))) = tokio::time::timeout(
                Duration::from_secs(2),
                moto.request("GET", "/moto-api/data.json", &[], b""),
            )
            .await
            {
                if status == 200 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "moto_server did not answer");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One HTTP/1.1 request; the status and body.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).await?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.port,
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let (status, body) = self
            .request("PUT", &format!("/{bucket}"), &[], b"")
            .await
            .unwrap();
        assert_eq!(status, 200, "create bucket {bucket}: {body}");
    }

    /// Writes an object (its last-modified time is now).
    pub async fn put(&self, bucket: &str, key: &str, body: &[u8]) {
        let (status, text) = self
            .request("PUT", &format!("/{bucket}/{key}"), &[], body)
            .await
            .unwrap();
        assert_eq!(status, 200, "put {bucket}/{key}: {text}");
    }

    /// An IAM query API call (moto tells services apart by the credential scope of the Authorization header).
    async fn iam(&self, form: &str) -> String {
        let auth = "AWS4-HMAC-SHA256 Credential=AKIASETUP/20240101/us-east-1/iam/aws4_request, \
                    SignedHeaders=host, Signature=0";
        let (status, body) = self
            .request(
                "POST",
                "/",
                &[
                    ("Authorization", auth),
                    ("Content-Type", "application/x-www-form-urlencoded"),
                ],
                format!("{form}&Version=2010-05-08").as_bytes(),
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "{form}: {body}");
        body
    }

    /// A user allowed everything on S3, and its access key: `(access key id, secret access key)`.
    pub async fn access_key(&self, user: &str) -> (String, String) {
        self.iam(&format!("Action=CreateUser&UserName={user}"))
            .await;
        let policy = url_encode(
            r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]}"#,
        );
        self.iam(&format!(
            "Action=PutUserPolicy&UserName={user}&PolicyName=s3&PolicyDocument={policy}"
        ))
        .await;
        let body = self
            .iam(&format!("Action=CreateAccessKey&UserName={user}"))
            .await;
        let field = |name: &str| {
            let start = body.find(&format!("<{name}>")).unwrap() + name.len() + 2;
            let end = body.find(&format!("</{name}>")).unwrap();
            body[start..end].to_string()
        };
        (field("AccessKeyId"), field("SecretAccessKey"))
    }

    /// From now on every request must be signed with a key created by [`Moto::access_key`].
    pub async fn enforce_auth(&self) {
        let (status, body) = self
            .request(
                "POST",
                "/moto-api/reset-auth",
                &[("Content-Type", "text/plain")],
                b"0",
            )
            .await
            .unwrap();
        assert_eq!(status, 200, "reset-auth: {body}");
    }
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
