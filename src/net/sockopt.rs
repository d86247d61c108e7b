//! The socket a request came in on, and the one option set on it that no safe crate sets: `SO_RCVLOWAT`, the
//! receive low-water mark. One of the sidecar's two `unsafe` blocks is the `setsockopt` call here (the other is in
//! [`super::timer`]).
//!
//! On Linux (4.18 and later) a TCP socket whose low-water mark is N neither reports readable nor wakes its
//! `epoll` waiter until N bytes are queued, or the peer closed, or an error is pending, or the receive window is
//! nearly shut; a read still returns whatever is queued. Lowering the mark wakes the waiter at once if enough
//! bytes are already there.
#![allow(unsafe_code)]

use std::os::fd::RawFd;

/// The TCP socket a plain (not TLS) request came in on, put in the request's extensions by the accept loop: the
/// relay tunes how it is woken for it (the streamer's ack wakeups). Valid while the connection is, which an upgraded
/// request's handler owns.
#[derive(Debug, Clone, Copy)]
pub struct ClientSocket(pub RawFd);

/// Sets `fd`'s receive low-water mark to `bytes` (at least 1).
pub fn set_receive_low_water(fd: RawFd, bytes: u32) -> std::io::Result<()> {
    let value = libc::c_int::try_from(bytes.max(1)).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a pointer to a live c_int on this stack frame; an
    // fd that is not a socket (or not open) makes it fail with an error, not misbehave.
    let result = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether `fd` sends each write at once (`TCP_NODELAY`), for tests of the sockets the sidecar sets up.
#[cfg(test)]
pub fn no_delay(fd: RawFd) -> std::io::Result<bool> {
    use std::os::fd::FromRawFd;
    // SAFETY: the stream only borrows `fd` (ManuallyDrop: it is never closed here) for one getsockopt.
    let stream = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    stream.nodelay()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_nodelay(true).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    /// Whether the kernel reports `fd` readable within `timeout_ms`, as `epoll` would wake for it.
    fn readable(fd: RawFd, timeout_ms: i32) -> bool {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, and its count.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
        assert!(ready >= 0, "{}", std::io::Error::last_os_error());
        ready == 1
    }

    #[test]
    fn a_socket_is_not_readable_below_its_low_water_mark() {
        let (mut client, mut server) = pair();
        set_receive_low_water(server.as_raw_fd(), 20).unwrap();
        client.write_all(&[0; 10]).unwrap();
        assert!(!readable(server.as_raw_fd(), 200));
        client.write_all(&[0; 10]).unwrap();
        assert!(readable(server.as_raw_fd(), 5_000));
        // What is queued is read whole; a read below the mark returns what there is too.
        let mut buf = [0; 64];
        assert_eq!(server.read(&mut buf).unwrap(), 20);
        client.write_all(&[0; 5]).unwrap();
        server.set_nonblocking(true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(server.read(&mut buf).unwrap(), 5);
    }

    #[test]
    fn lowering_the_mark_wakes_a_waiting_reader() {
        let (mut client, server) = pair();
        let fd = server.as_raw_fd();
        set_receive_low_water(fd, 100).unwrap();
        client.write_all(&[0; 10]).unwrap();
        // Nothing more is sent: only the option can wake the waiter.
        let waiter = std::thread::spawn(move || readable(fd, 10_000));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!waiter.is_finished());
        set_receive_low_water(fd, 1).unwrap();
        assert!(waiter.join().unwrap());
        drop(server);
    }

    #[test]
    fn a_closing_peer_wakes_the_reader_below_the_mark() {
        let (client, server) = pair();
        set_receive_low_water(server.as_raw_fd(), 100).unwrap();
        drop(client);
        assert!(readable(server.as_raw_fd(), 5_000));
    }

    #[test]
    fn a_bad_descriptor_is_an_error() {
        assert!(set_receive_low_water(-1, 10).is_err());
    }
}
