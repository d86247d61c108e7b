//! Stands in for litestream's metrics page, whose progress gauge only Zero's fork serves.

use super::*;

/// Stands in for litestream's metrics endpoint (the Zero fork cannot run here): serves whatever page the test
/// sets, with the status the test sets, or misbehaves as the test sets (see [`Misbehave`]).
#[derive(Clone)]
pub struct MetricsServer {
    pub addr: SocketAddr,
    state: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    misbehave: std::sync::Arc<std::sync::Mutex<Option<Misbehave>>>,
    pub requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The most body bytes of one [`Misbehave::Huge`] page handed to its connection (the test may reset it).
    pub huge_most_sent: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: CancellationToken,
}

/// How the stand-in misbehaves instead of serving its page.
#[derive(Clone, Debug)]
pub enum Misbehave {
    /// Accepts the connection and reads the request, then never answers.
    Hang,
    /// Answers 200 and sends `prefix` as the start of a body that never ends.
    HangMidBody { prefix: String },
    /// A 200 page of `bytes` bytes: `prefix`, then comment lines, produced as it is sent (never held whole), with
    /// a `Content-Length` when `declared`, chunked otherwise.
    Huge {
        prefix: String,
        bytes: u64,
        declared: bool,
    },
}

type TestBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

impl MetricsServer {
    pub async fn start(page: &str) -> MetricsServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = MetricsServer {
            addr,
            state: std::sync::Arc::new(std::sync::Mutex::new((200, page.to_string()))),
            misbehave: Default::default(),
            requests: Default::default(),
            huge_most_sent: Default::default(),
            stop: CancellationToken::new(),
        };
        let shared = server.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    accepted = listener.accept() => accepted.unwrap(),
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let stop = shared.stop.clone();
                    let service = hyper::service::service_fn(move |_req| {
                        let shared = shared.clone();
                        async move { Ok::<_, std::convert::Infallible>(shared.respond().await) }
                    });
                    let serve = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = serve => {}
                    }
                });
            }
        });
        server
    }

    async fn respond(&self) -> hyper::Response<TestBody> {
        use http_body_util::BodyExt;
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let misbehave = self.misbehave.lock().unwrap().clone();
        let (status, body, length) = match misbehave {
            None => {
                let (status, page) = self.state.lock().unwrap().clone();
                let body = http_body_util::Full::new(bytes::Bytes::from(page)).boxed();
                (status, body, None)
            }
            Some(Misbehave::Hang) => std::future::pending().await,
            Some(Misbehave::HangMidBody { prefix }) => {
                let first = futures_util::stream::once(async move {
                    Ok(hyper::body::Frame::data(bytes::Bytes::from(prefix)))
                });
                let body = first.chain(futures_util::stream::pending());
                (
                    200,
                    BodyExt::boxed(http_body_util::StreamBody::new(body)),
                    Some(1 << 20),
                )
            }
            Some(Misbehave::Huge {
                prefix,
                bytes,
                declared,
            }) => {
                let most = self.huge_most_sent.clone();
                let filler = bytes::Bytes::from(format!("# {}\n", "x".repeat(65533)));
                let chunks = futures_util::stream::unfold(
                    (Some(bytes::Bytes::from(prefix)), 0u64),
                    move |(prefix, done)| {
                        let most = most.clone();
                        let filler = filler.clone();
                        async move {
                            if done >= bytes {
                                return None;
                            }
                            let chunk = prefix.unwrap_or(filler);
                            let chunk = chunk.slice(..chunk.len().min((bytes - done) as usize));
                            let done = done + chunk.len() as u64;
                            most.fetch_max(done, std::sync::atomic::Ordering::SeqCst);
                            Some((
                                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(chunk)),
                                (None, done),
                            ))
                        }
                    },
                );
                let body = BodyExt::boxed(http_body_util::StreamBody::new(chunks));
                (200, body, declared.then_some(bytes))
            }
        };
        let mut response = hyper::Response::new(body);
        *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
        response.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        if let Some(length) = length {
            response
                .headers_mut()
                .insert("content-length", hyper::header::HeaderValue::from(length));
        }
        response
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    /// Serves `page` (and stops misbehaving).
    pub fn set_page(&self, page: &str) {
        self.state.lock().unwrap().1 = page.to_string();
        self.misbehave(None);
    }

    pub fn set_status(&self, status: u16) {
        self.state.lock().unwrap().0 = status;
    }

    /// Misbehaves from the next request on (`None`: serves the page again).
    pub fn misbehave(&self, how: Option<Misbehave>) {
        *self.misbehave.lock().unwrap() = how;
    }

    /// Stops accepting: the port is closed, as when litestream is down.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// A litestream_replica_progress page in the Zero fork's format (docs/protocol.md, "litestream's progress gauge").
pub fn progress_page(samples: &[(&str, f64)]) -> String {
    let mut page = String::from(
        "# HELP litestream_db_size The current size of the real DB\n# TYPE litestream_db_size gauge\n\
         litestream_db_size{db=\"/var/lib/zero/replica.db\"} 12288\n\
         # HELP litestream_replica_progress The last replicated watermark and time of replication\n\
         # TYPE litestream_replica_progress gauge\n",
    );
    for (watermark, time) in samples {
        page.push_str(&format!(
            "litestream_replica_progress{{db=\"/var/lib/zero/replica.db\",name=\"file\",watermark=\"{watermark}\"}} {time:e}\n"
        ));
    }
    page
}

/// A backup time `secs` seconds ago, for metrics pages.
pub fn seconds_ago(secs: f64) -> f64 {
    epoch_now() - secs
}

/// Backed up two minutes ago: older than the 30 s minimum cleanup delay.
pub fn aged() -> f64 {
    seconds_ago(120.0)
}

/// Now as epoch seconds, for backup times in metrics pages.
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
