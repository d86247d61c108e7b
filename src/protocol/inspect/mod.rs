//! Reading just enough of a relayed change-stream frame to follow a subscriber's acknowledgements (docs/protocol.md, "A
//! subscriber's acknowledged watermark"): which frames are commits, with their id and watermark. Pure, no I/O.
//!
//! The relay sees every downstream frame, and most are data messages carrying rows of any size. Only the frame's
//! head is scanned to find the message tag (`msg[0]`), in either key order: `{"id":N,"msg":["commit",…` (Zero
//! ≥ 1.6, and what the sidecar itself writes) or `{"msg":["commit",…],"id":N}` (Zero 0.20). Only commits, which
//! are small, are parsed in full, in one pass that reads the id and `msg[2].watermark` and skips everything else
//! (numbers included) without interpreting it. A frame whose head does not have the expected shape is parsed the
//! same way as a fallback; what cannot be read at all is reported as such and still relayed untouched.

use serde::Deserialize;

/// What a downstream frame means for ack tracking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Downstream {
    /// A `commit` message: acknowledging `id` makes `watermark` durable on the subscriber.
    Commit { id: u64, watermark: String },
    /// Any other message (status, begin, data, rollback, error).
    Other,
    /// Not a frame of the change stream's shape; relayed as is, the subscriber decides.
    Unreadable,
}

/// Classifies one complete text message sent by the change-streamer.
pub fn inspect(frame: &[u8]) -> Downstream {
    match read_head(frame) {
        Some(Head::Other) => Downstream::Other,
        Some(Head::Commit { id, at }) => {
            read_commit(frame, id, at).unwrap_or_else(|| parse_full(frame))
        }
        // A head of an unexpected shape: read the whole frame.
        None => parse_full(frame),
    }
}

/// What a frame's head shows.
enum Head {
    Other,
    /// A commit: its id if it came before `msg`, and where the message continues after its tag.
    Commit {
        id: Option<u64>,
        at: usize,
    },
}

/// The message tag from the frame's head, or `None` if the head is not of the plain shape Zero writes (then the
/// caller parses the frame in full).
fn read_head(frame: &[u8]) -> Option<Head> {
    if let Some(head) = zero_head(frame) {
        return Some(head);
    }
    let mut s = Scanner { b: frame, i: 0 };
    s.ws();
    s.consume(b'{')?;
    let mut id = None;
    // At most `id` then `msg`; any other key means an unusual frame.
    for _ in 0..2 {
        s.ws();
        let key = s.plain_string()?;
        s.ws();
        s.consume(b':')?;
        s.ws();
        match key {
            b"msg" => {
                s.consume(b'[')?;
                s.ws();
                return Some(if s.plain_string()? == b"commit" {
                    Head::Commit { id, at: s.i }
                } else {
                    Head::Other
                });
            }
            b"id" => {
                // An id that is not a plain u64 is left to the full parse.
                id = Some(s.id()?);
                s.ws();
                s.consume(b',')?;
            }
            _ => return None,
        }
    }
    None
}

/// The head exactly as Zero writes it, `{"id":N,"msg":["tag"`, matched as fixed text around the id and the tag:
/// every message the relay passes down goes through here. `None` for any other spelling, which [`read_head`]
/// then reads key by key.
fn zero_head(frame: &[u8]) -> Option<Head> {
    const ID: &[u8] = br#"{"id":"#;
    const MSG: &[u8] = br#","msg":[""#;
    let mut s = Scanner {
        b: frame,
        i: ID.len(),
    };
    frame.starts_with(ID).then_some(())?;
    let id = s.id()?;
    frame.get(s.i..)?.starts_with(MSG).then_some(())?;
    s.i += MSG.len() - 1;
    Some(if s.plain_string()? == b"commit" {
        Head::Commit {
            id: Some(id),
            at: s.i,
        }
    } else {
        Head::Other
    })
}

/// Reads the rest of a commit in the exact shape Zero writes, `…,{…},{"watermark":"W"}]` then the id if it comes
/// last, without a JSON parser; `None` for anything else (the caller then parses in full). The second element is
/// skipped structurally, not validated: a subscriber never acknowledges a frame it cannot parse, so a malformed
/// frame taken for a commit here never moves its acknowledged watermark.
fn read_commit(frame: &[u8], id: Option<u64>, at: usize) -> Option<Downstream> {
    let mut s = Scanner { b: frame, i: at };
    s.ws();
    s.consume(b',')?;
    s.ws();
    s.skip_value()?;
    s.ws();
    s.consume(b',')?;
    s.ws();
    s.consume(b'{')?;
    s.ws();
    (s.plain_string()? == b"watermark").then_some(())?;
    s.ws();
    s.consume(b':')?;
    s.ws();
    let watermark = std::str::from_utf8(s.plain_string()?).ok()?.to_string();
    s.ws();
    s.consume(b'}')?;
    s.ws();
    s.consume(b']')?;
    s.ws();
    let id = match id {
        Some(id) => id,
        None => {
            s.consume(b',')?;
            s.ws();
            (s.plain_string()? == b"id").then_some(())?;
            s.ws();
            s.consume(b':')?;
            s.ws();
            let id = s.id()?;
            s.ws();
            id
        }
    };
    s.consume(b'}')?;
    s.ws();
    (s.i == frame.len()).then_some(Downstream::Commit { id, watermark })
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// Steps over `byte` if it comes next; `None` (and no step) otherwise.
    fn consume(&mut self, byte: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&byte)).then(|| self.i += 1)
    }

    /// A JSON string without escapes; `None` for anything else (an escaped string is left to the full parse).
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.consume(b'"')?;
        let start = self.i;
        let len = self.b[start..].iter().position(|&b| b == b'"')?;
        let text = &self.b[start..start + len];
        if text.contains(&b'\\') {
            return None;
        }
        self.i = start + len + 1;
        Some(text)
    }

    /// A message id as Zero writes it: a JSON integer that fits in a u64, followed by no other number character.
    /// Leaves the position unchanged when it returns `None`.
    fn id(&mut self) -> Option<u64> {
        let start = self.i;
        let digits = self.b[start..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.b[start..start + digits];
        let next = self.b.get(start + digits);
        if digits == 0
            || (digits > 1 && text[0] == b'0')
            || matches!(next, Some(b'.' | b'e' | b'E' | b'-' | b'+'))
        {
            return None;
        }
        let id = text.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        self.i = start + digits;
        Some(id)
    }

    /// Skips one JSON value by its structure: strings (escapes included) and nesting are followed, nothing is
    /// validated.
    fn skip_value(&mut self) -> Option<()> {
        match *self.b.get(self.i)? {
            b'"' => self.skip_string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    // Runs of bytes that change nothing are stepped over eight at a time.
                    self.i = find(
                        self.b,
                        self.i,
                        |w| {
                            has_byte(w, b'"')
                                | has_byte(w, b'{')
                                | has_byte(w, b'[')
                                | has_byte(w, b'}')
                                | has_byte(w, b']')
                                != 0
                        },
                        |b| matches!(b, b'"' | b'{' | b'[' | b'}' | b']'),
                    )?;
                    match self.b[self.i] {
                        b'"' => {
                            self.skip_string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        _ => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                    }
                    self.i += 1;
                }
            }
            _ => {
                let start = self.i;
                while let Some(&b) = self.b.get(self.i) {
                    if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }

    fn skip_string(&mut self) -> Option<()> {
        self.consume(b'"')?;
        loop {
            self.i = find(
                self.b,
                self.i,
                |w| has_byte(w, b'"') | has_byte(w, b'\\') != 0,
                |b| b == b'"' || b == b'\\',
            )?;
            if self.b[self.i] == b'"' {
                self.i += 1;
                return Some(());
            }
            // An escape: the byte after the backslash is never the string's end.
            self.i += 2;
        }
    }
}

/// The position of the first byte at or after `from` for which `hit` holds. Whole words of eight bytes are ruled
/// out at once with `word_hits`, which must hold exactly when `hit` holds for one of the word's bytes: a commit's
/// second element is skipped this way, and byte by byte it was most of the cost of reading a commit.
fn find(
    b: &[u8],
    from: usize,
    word_hits: impl Fn(u64) -> bool,
    hit: impl Fn(u8) -> bool,
) -> Option<usize> {
    let mut i = from;
    while let Some(word) = b.get(i..i + 8) {
        if word_hits(u64::from_le_bytes(word.try_into().ok()?)) {
            break;
        }
        i += 8;
    }
    b.get(i..)?.iter().position(|&c| hit(c)).map(|at| i + at)
}

/// Non-zero exactly when one of the eight bytes of `word` is `byte` (the high bit of a byte that went from zero to
/// negative when one was taken from each; a borrow can mark bytes above a match, never mark a word without one).
fn has_byte(word: u64, byte: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// A frame with only what ack tracking needs, read in one pass in either key order; other keys are skipped.
#[derive(Deserialize)]
struct Frame {
    id: u64,
    msg: Message,
}

enum Message {
    Commit { watermark: String },
    Other,
}

#[derive(Deserialize)]
struct Position {
    watermark: String,
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(MessageVisitor)
    }
}

struct MessageVisitor;

impl<'de> serde::de::Visitor<'de> for MessageVisitor {
    type Value = Message;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a message array [tag, ...]")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let tag: String = seq
            .next_element()?
            .ok_or_else(|| A::Error::invalid_length(0, &self))?;
        let message = if tag == "commit" {
            seq.next_element::<IgnoredAny>()?
                .ok_or_else(|| A::Error::invalid_length(1, &self))?;
            let position: Position = seq
                .next_element()?
                .ok_or_else(|| A::Error::invalid_length(2, &self))?;
            Message::Commit {
                watermark: position.watermark,
            }
        } else {
            Message::Other
        };
        // Later additions to a message do not make it unreadable.
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(message)
    }
}

fn parse_full(frame: &[u8]) -> Downstream {
    match serde_json::from_slice::<Frame>(frame) {
        Ok(Frame {
            id,
            msg: Message::Commit { watermark },
        }) => Downstream::Commit { id, watermark },
        Ok(Frame {
            msg: Message::Other,
            ..
        }) => Downstream::Other,
        Err(_) => Downstream::Unreadable,
    }
}

#[cfg(test)]
mod tests;
